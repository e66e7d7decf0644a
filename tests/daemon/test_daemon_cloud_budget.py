"""The monthly cloud budget end to end, without Slurm: job_submit.lua under lua5.1 asks a
real daemon (served from a thread on a real ledger), which quotes from its snapshot with
the budgeted account's cloud spend read in (docs/routing.md "Cloud budgets").

physics may spend 10.00 credits a month in the cloud; an a100 hour costs 5.00 there and
2.00 on-premise. Between submissions a hold is taken in the ledger, as a prolog would,
and the daemon's picture refreshed: the next quote sees the spend.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from accounting_bridge.slurm.slurmcmd import FakeRunner
from gpucredit.daemon.burst_keeper import SQUEUE, BurstKeeper
from gpucredit.daemon.server import Daemon
from ledger import api
from ledger.pricing.cloud_budget import month_of
from ledger.timeutil import utcnow
from slurm_hooks.client import DaemonClient
from slurmtext import format_time
from tests.support.daemon import NO_VAL, PARTITIONS, running, sinfo_runner
from tests.support.fakedaemon import sockdir as sockdir
from tests.support.lua_job_submit import INFINITE, JOB_DESC, require_lua, run_script, run_submissions

SINCE = datetime(2026, 1, 1, tzinfo=UTC)
SITES = {"onprem": {"site": "onprem"}, "cloud": {"site": "cloud"}}
ROUTING = {"accounts": {"physics": {"cloud_budget": "10"}}}
LUA_PARTITIONS = {
    "onprem": {"name": "onprem", "default_time": NO_VAL, "max_time": INFINITE, "flag_default": 1},
    "cloud": {"name": "cloud", "default_time": 60, "max_time": 240, "flag_default": 0},
}
# sbatch -A physics -p cloud --gres=gpu:a100:1 -t 1:00:00: 5.00 credits in the cloud
IN_CLOUD = {
    **JOB_DESC,
    "account": "physics",
    "partition": "cloud",
    "tres_per_node": "gres:gpu:a100:1",
    "gres": "gres:gpu:a100:1",
    "time_limit": 60,
}


@pytest.fixture
def lua() -> None:
    require_lua()


@pytest.fixture
def daemon(db_url: str, tx: Callable[[], Any], sockdir: Path) -> Iterator[Daemon]:
    with tx() as s:
        api.set_price(s, "a100", "2.00", effective_at=SINCE)
        api.set_price(s, "a100", "5.00", partition="cloud", effective_at=SINCE)
        api.set_price(s, "h100", "3.60", effective_at=SINCE)
        api.create_account(s, "physics")
        api.add_member(s, "alice", "physics")
        api.topup(s, "physics", "100", effective_at=SINCE)
    with running(db_url, sockdir, sinfo_runner(), partitions=SITES, routing=ROUTING) as served:
        assert served.slurm_facts.learned.wait(10), "the daemon never read the partitions"
        yield served


def hold_in_cloud(tx: Callable[[], Any], daemon: Daemon, job_id: int, seconds: int) -> Callable[[], None]:
    """What a prolog does for a run in the cloud, then the daemon's next picture."""

    def act() -> None:
        with tx() as s:
            request = api.HoldRequest(
                "physics", user="alice", job_id=job_id, gpus="a100:1", seconds=seconds, partition="cloud"
            )
            api.create_hold(s, request)
        daemon.snapshots.refresh()

    return act


def test_the_budget_allows_exactly_its_amount_then_refuses_naming_it(
    lua: None, daemon: Daemon, tx: Callable[[], Any], tmp_path: Path, sockdir: Path
) -> None:
    month = month_of(utcnow())[0]
    first, exactly, over = run_submissions(
        tmp_path,
        str(sockdir / "daemon.sock"),
        job_desc=IN_CLOUD,
        partitions=LUA_PARTITIONS,
        # 5.00 held, then 36 s more (0.05): 5.00 + 5.00 fits 10.00, 5.05 + 5.00 does not.
        between=[hold_in_cloud(tx, daemon, 1, 3600), hold_in_cloud(tx, daemon, 2, 36)],
    )
    assert (first.rc, first.written["partition"]) == (0, "cloud")
    assert (exactly.rc, exactly.written["partition"]) == (0, "cloud")
    refusal = (
        f"gpucredit: cloud_budget: account physics: cloud budget 10.00 credits for {month}, "
        "spent 5.05, this job 5.00 (job: 1×a100 × 1 h in cloud)"
    )
    assert (over.rc, over.user, over.written) == (-1, [refusal], {})
    assert over.info == [f"gpucredit: user alice: refused: {refusal}"]
    # The hooks' own client reads the same refusal from the daemon.
    client = DaemonClient(str(sockdir / "daemon.sock"), 5.0)
    fields = {"user_name": "alice", "user_id": 1001, "account": "physics", "partition": "cloud"}
    answer = client.call(
        "submit", **fields, partitions=PARTITIONS, time_limit=60, tres_per_node="gres:gpu:a100:1"
    )
    assert answer == {"decision": "reject", "message": refusal}


def test_past_the_budget_a_job_that_may_go_either_way_stays_on_premise(
    lua: None, daemon: Daemon, tx: Callable[[], Any], tmp_path: Path, sockdir: Path
) -> None:
    hold_in_cloud(tx, daemon, 1, 2 * 3600)()  # 10.00 held: the month's budget, all of it
    job = {**IN_CLOUD, "partition": None, "comment": "gpucredit:cloud=yes nightly"}
    outcome = run_script(tmp_path, str(sockdir / "daemon.sock"), job_desc=job, partitions=LUA_PARTITIONS)
    assert outcome.rc == 0
    assert outcome.user == [
        "gpucredit: ~2.00 credits (1×a100 × 1 h) in onprem; not cloud (~5.00, over the account's "
        "cloud budget); 90.00 available in physics"
    ]
    assert outcome.written == {
        "partition": "onprem",
        "comment": "gpucredit: routed to onprem (cloud allowed): onprem ~2.00 allowed, "
        "cloud ~5.00 over the account's cloud budget | nightly",
    }


# --------------------------------------------------------------------------- the burst pass


def test_the_burst_pass_checks_the_budget_again_counting_jobs_sent_and_not_started(
    daemon: Daemon, tx: Callable[[], Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Two jobs were quoted 5.00 in the cloud when 0.00 was spent; by the time they have
    waited, 5.00 is held. The first still fits the 10.00 budget and is sent; the second
    would pass it, counting the first (sent, not started): it stays on-premise, said
    once, and is looked at again each tick."""
    now = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    submitted = format_time(now - timedelta(seconds=900))
    waiting = [f"{job}|physics|{submitted}|onprem|gpucredit-burst=cloud:5000000|" for job in (71, 72)]
    runner = FakeRunner({SQUEUE: "\n".join(waiting) + "\n"})
    sent = (
        "scontrol",
        "update",
        "JobId=71",
        "Partition=onprem,cloud",
        "AdminComment=gpucredit-burst-sent=cloud:5000000",
    )
    runner.add(sent)
    burst = BurstKeeper(runner, 600, ["cloud"], budget=daemon._cloud_budget_breach, clock=lambda: now)
    hold_in_cloud(tx, daemon, 1, 3600)()  # 5.00 held in the cloud since the quotes
    month = month_of(utcnow())[0]
    with caplog.at_level(logging.INFO, logger="gpucredit.daemon"):
        assert burst.tick() == [71]
        runner.add(
            SQUEUE, f"71|physics|{submitted}|onprem,cloud|gpucredit-burst-sent=cloud:5000000|\n{waiting[1]}\n"
        )
        assert burst.tick() == []
    assert runner.calls == [SQUEUE, sent, SQUEUE]
    refusals = [r.getMessage() for r in caplog.records if "stays on-premise" in r.getMessage()]
    assert refusals == [
        f"job 72 stays on-premise: account physics: cloud budget 10.00 credits for {month}, spent 5.00, "
        "sent and not started 5.00, this job 5.00"
    ]
