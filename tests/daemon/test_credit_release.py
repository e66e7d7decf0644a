"""The daemon releases a held job once its holds would be taken, and only a job gpucredit
really held.

The mark is read from `squeue --json`, where users cannot write it (docs/slurm-facts.md
§13), not from scontrol's one-line text, where they can. "Would be taken" is the hold's own
rule tried and rolled back (`api.hold_refusal`): credit AND every limit, every part of a
heterogeneous job together. A job released on credit alone while a daily cap refused it
looped through requeues every ~11 s (issue 26, S4); a job over a cap on its own looped for
ever; a heterogeneous job whose parts fit alone but not together looped and was charged
for the part that got its hold each time (S5).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from accounting_bridge.slurm.records import parse_squeue_json
from accounting_bridge.slurm.slurmcmd import FakeRunner
from gpucredit.daemon import hook_service
from gpucredit.daemon.server import Daemon
from ledger import api
from ledger.config import load_config
from ledger.store.db import make_sessionmaker
from tests import support

FIXTURES = support.FIXTURES / "sacct"
SQUEUE = ("squeue", "--json")


def release_argv(spec: str) -> list[tuple[str, ...]]:
    clear = ("scontrol", "update", f"jobid={spec}", "comment=", "admincomment=")
    return [clear, ("scontrol", "release", spec)]


def squeue_json(*jobs: dict[str, Any]) -> str:
    """Job 15 of the box's recording (1×h100, 5 min, account physics), pending, once per
    entry of `jobs` with those fields changed."""
    document = json.loads((FIXTURES / "recorded_squeue_running.json").read_text())
    [recorded] = [j for j in document["jobs"] if j["job_id"] == 15]
    document["jobs"] = []
    for changes in jobs:
        job = json.loads(json.dumps(recorded))
        job.update(job_state="PENDING", admin_comment="gpucredit-hold", tres_alloc_str="")
        job.update(changes)
        document["jobs"].append(job)
    return json.dumps(document)


HET_PARTS = (
    {"job_id": 20, "het_job_id": 20, "het_job_offset": 0},
    {"job_id": 21, "het_job_id": 20, "het_job_offset": 1},
)


@pytest.fixture
def daemon(db_url: str, tx) -> Iterator[Daemon]:  # type: ignore[no-untyped-def]
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.add_member(s, "alice", "physics")
        api.topup(s, "physics", "1", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
    config = load_config(Path("/dev/null"))
    config["database"]["url"] = db_url
    daemon = Daemon(config, FakeRunner({}))
    yield daemon
    daemon.engine.dispose()


def round_with(daemon: Daemon, squeue: str, releases: list[str]) -> FakeRunner:
    """One release round against `squeue`; the runner knows only the releases expected."""
    argv = [argv for spec in releases for argv in release_argv(spec)]
    daemon.run = runner = FakeRunner({SQUEUE: squeue, **dict.fromkeys(argv, "")})
    assert daemon.release_startable() == releases
    assert runner.calls == [SQUEUE, *argv]
    return runner


def test_a_held_job_is_released_once_its_hold_would_be_taken(daemon: Daemon) -> None:
    round_with(daemon, squeue_json({}), ["15"])
    assert daemon.credit_held == {}


def test_a_job_name_that_spells_our_mark_is_not_released(daemon: Daemon) -> None:
    """`sbatch -J 'x AdminComment=gpucredit-hold'` on a job an admin held: squeue's
    admin_comment is empty, so the daemon leaves it alone."""
    round_with(daemon, squeue_json({"name": "x AdminComment=gpucredit-hold", "admin_comment": ""}), [])
    assert daemon.credit_held == {}


def test_a_job_held_as_unreadable_is_left_to_an_admin(daemon: Daemon) -> None:
    round_with(daemon, squeue_json({"admin_comment": "gpucredit-unreadable"}), [])


def test_a_job_the_account_cannot_pay_for_waits(daemon: Daemon, tx) -> None:  # type: ignore[no-untyped-def]
    with tx() as s:
        api.consume(s, "physics", "1")
    round_with(daemon, squeue_json({}), [])
    assert list(daemon.credit_held) == [15]


def test_a_job_refused_for_a_daily_cap_is_not_released_while_its_account_can_pay(daemon: Daemon, tx) -> None:  # type: ignore[no-untyped-def]
    """The loop of S4: credit enough (1.00 for a 0.30 job), the daily cap (0.20) not."""
    with tx() as s:
        api.set_limits(s, "physics", user="alice", daily_cap="0.2")
    round_with(daemon, squeue_json({}), [])
    [requests] = daemon.credit_held.values()
    refusal = daemon._hold_refusal(requests or [])
    assert refusal is not None and refusal.code == "daily_cap"
    assert refusal.details["alone"] is True  # the prolog told the job it never fits
    with tx() as s:  # the cap raised: the next round releases it
        api.set_limits(s, "physics", user="alice", daily_cap="0.5")
    assert daemon._some_would_start()
    round_with(daemon, squeue_json({}), ["15"])


def test_a_job_refused_for_its_gpu_cap_waits_until_gpus_free(daemon: Daemon, tx) -> None:  # type: ignore[no-untyped-def]
    with tx() as s:
        api.set_limits(s, "physics", user="alice", max_gpus=1)
        running = api.create_hold(
            s, api.HoldRequest("physics", user="alice", job_id=7, gpus={"h100": 1}, seconds=60)
        )
    round_with(daemon, squeue_json({}), [])
    assert not daemon._some_would_start()  # no squeue dump while nothing could start
    with tx() as s:
        api.settle_hold(s, running.id, 30)
    assert daemon._some_would_start()
    round_with(daemon, squeue_json({}), ["15"])


def test_a_heterogeneous_job_is_released_only_when_all_its_parts_fit(daemon: Daemon, tx) -> None:  # type: ignore[no-untyped-def]
    """Two parts of 0.30 each against 0.50 of credit: each fits alone, not together."""
    with tx() as s:
        api.consume(s, "physics", "0.5")
    round_with(daemon, squeue_json(*HET_PARTS), [])
    assert sorted(daemon.credit_held) == [20, 21]
    with tx() as s:
        api.topup(s, "physics", "0.1")
    round_with(daemon, squeue_json(*HET_PARTS), ["20"])


def test_untyped_gpus_are_priced_at_the_dearest_type(daemon: Daemon) -> None:
    [job] = parse_squeue_json(squeue_json({"tres_req_str": "cpu=1,node=1,gres/gpu=2"})).jobs
    request = hook_service.release_request(job, daemon._typed)
    assert request["gpus"] == {"h100": 2}
    who = (request["job_id"], request["account"], request["user"], request["seconds"])
    assert who == (15, "physics", "alice", 300)


def test_hold_refusal_writes_nothing(daemon: Daemon, engine) -> None:  # type: ignore[no-untyped-def]
    [job] = parse_squeue_json(squeue_json({})).jobs
    request = hook_service.release_request(job, daemon._typed)
    sessions = make_sessionmaker(engine)
    assert hook_service.hold_refusal(sessions, [request], grace_seconds=600) is None
    with sessions() as s:
        assert api.list_holds(s) == []
