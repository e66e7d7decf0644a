"""The bridge on the real Slurm box: sacct reconciliation after hook outages, the meter
on running jobs, and cancelling a job that runs past what its account may spend.

Charges are checked against sacct's ElapsedRaw x price, the figure a user is promised
(see tests/slurm/test_slurm_e2e.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from ledger import api
from ledger.holds.accrual import seconds_run
from ledger.money import charge_for
from ledger.store.models import JobRun, table_of
from ledger.store.tables import entries_t
from ledger.timeutil import utcnow
from tests.support.cluster import PRICES, Books, Cluster, sacct_runs, submit

pytestmark = pytest.mark.slurm
job_runs_t = table_of(JobRun)
DISABLED = "#!/bin/sh\n# gpucredit disabled for this test (a simulated outage)\nexit 0\n"


@pytest.fixture
def gc(cluster: Cluster) -> Iterator:
    """`gpucredit ...` against the cluster's config, with the bridge's grace set to 0."""
    config = cluster.config_path.read_text()
    cluster.config_path.write_text(
        config.replace("[policy]\n", "[policy]\nepilog_grace_seconds = 0\n")
        + "[meter]\ninterval_seconds = 1\n"
    )

    yield cluster.gpucredit
    cluster.config_path.write_text(config)


def _journal_size(cluster: Cluster) -> int:
    with cluster.tx() as s:
        return int(s.execute(select(func.count()).select_from(entries_t)).scalar_one())


def _bridge(gc, since: str) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(gc("bridge", "sacct", "--since", since, "--format", "json", others_may_fail=True))


def test_runs_no_hook_saw_are_charged_once_by_the_bridge_and_flagged(cluster: Cluster, gc) -> None:
    account = cluster.new_account("10")
    since = (utcnow() - timedelta(seconds=2)).isoformat()  # this test's jobs only
    with (
        cluster.box.custom_hook("prolog-slurmctld", DISABLED),
        cluster.box.custom_hook("epilog-slurmctld", DISABLED),
    ):
        job = submit(cluster.box, "-A", account, "--gres=gpu:a100:2", "-t", "1", "--wrap", "sleep 2")
        cluster.box.wait_state(job, "COMPLETED", timeout=60)
    assert cluster.holds(job, account) == []
    [row] = sacct_runs(cluster.box, job, account)
    _bridge(gc, since)
    [hold] = cluster.holds(job, account)
    expected = charge_for(2 * PRICES["a100"], int(row["ElapsedRaw"]))
    assert (hold.state, hold.charged_ucredits) == ("settled", expected)
    with cluster.tx() as s:
        flags = s.execute(select(job_runs_t.c.flags).where(job_runs_t.c.job_id == job)).scalar_one()
    assert "unreserved" in flags.split(",")
    before = _journal_size(cluster)
    _bridge(gc, since)
    assert _journal_size(cluster) == before  # running the bridge again changes nothing
    assert cluster.holds(job, account)[0].charged_ucredits == hold.charged_ucredits


def test_a_settle_that_differs_from_sacct_gets_one_linked_adjustment(cluster: Cluster, gc) -> None:
    account = cluster.new_account("10")
    since = (utcnow() - timedelta(seconds=2)).isoformat()  # this test's jobs only
    with cluster.box.custom_hook("epilog-slurmctld", DISABLED):
        job = submit(cluster.box, "-A", account, "--gres=gpu:h100:1", "-t", "1", "--wrap", "sleep 3")
        cluster.box.wait_state(job, "COMPLETED", timeout=60)
    [hold] = cluster.holds(job, account)
    gc("hold", "settle", str(hold.id), "--elapsed", "1")  # an epilog that got the time wrong
    [row] = sacct_runs(cluster.box, job, account)
    expected = charge_for(PRICES["h100"], int(row["ElapsedRaw"]))
    assert expected != charge_for(PRICES["h100"], 1)
    _bridge(gc, since)
    with cluster.tx() as s:
        settle = s.execute(
            select(entries_t).where(entries_t.c.hold_id == hold.id, entries_t.c.kind == "settle")
        ).one()
        [adjustment] = s.execute(
            select(entries_t).where(entries_t.c.hold_id == hold.id, entries_t.c.kind == "adjust")
        ).all()
        assert adjustment.links_entry_id == settle.id
        assert api.get_hold(s, hold.id).charged_ucredits == expected
    before = _journal_size(cluster)
    _bridge(gc, since)
    assert _journal_size(cluster) == before


def test_the_meter_charges_a_running_job_and_the_final_charge_is_sacct_s(
    cluster: Cluster, gc, books: Books
) -> None:
    account = cluster.new_account("10")
    job = submit(cluster.box, "-A", account, "--gres=gpu:h100:2", "-t", "2", "--wrap", "sleep 12")
    cluster.box.wait_state(job, "RUNNING", timeout=30)
    time.sleep(3)
    gc("bridge", "meter", "--once")
    [hold] = cluster.holds(job, account)
    assert hold.accrues_to_seconds == api.ACCRUES_NOW  # seen running: read to now
    assert hold.charged_ucredits == 0  # the meter posts nothing for a job within its hold
    seen = []
    for later in (0, 2):  # the cost so far grows with the clock, by the ledger's own rounding
        at = utcnow() + timedelta(seconds=later)
        seconds = seconds_run(hold.started_at, hold.limit_seconds, at)
        seen.append(api.cost_so_far(hold, at))
        assert seen[-1] == charge_for(2 * PRICES["h100"], seconds)
    assert 0 < seen[0] < seen[1]
    cluster.box.wait_state(job, "COMPLETED", timeout=60)
    [[hold]] = books.check(account, {job: 2 * PRICES["h100"]}).values()
    assert hold.charged_ucredits >= seen[1]


def test_a_job_past_its_daily_cap_is_cancelled_with_a_reason(cluster: Cluster, gc) -> None:
    account = cluster.new_account("10")
    job = submit(cluster.box, "-A", account, "--gres=gpu:h100:2", "-t", "2", "--wrap", "sleep 60")
    cluster.box.wait_state(job, "RUNNING", timeout=30)
    time.sleep(3)
    gc("limits", "set", account, "--user", "alice", "--daily-cap", "0.001")
    gc("bridge", "meter", "--once")
    cluster.box.wait_state(job, "CANCELLED", timeout=60)
    [row] = sacct_runs(cluster.box, job, account)
    assert row["Comment"].startswith("gpucredit: cancelled:")
    assert "daily cap" in row["Comment"]
    cluster.box.run(["scancel", str(job)])
