"""Cloud partitions held back (`[routing] burst_after_seconds`, docs/routing.md), without
Slurm: job_submit.lua under lua5.1 asks a real daemon (a thread, a real ledger) what to
write, which is the on-premise partitions now and the cloud ones in the AdminComment;
and the burst pass, given squeue's lines, adds them once the job has waited.

An a100 hour costs 2.00 on-premise and 5.00 in the cloud; the site waits 600 s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from accounting_bridge.slurm.slurmcmd import FakeResponse, FakeRunner
from gpucredit.daemon.burst_keeper import SQUEUE, BurstKeeper
from gpucredit.daemon.server import Daemon
from job_submit.burst_mark import BurstMark
from ledger import api
from ledger.errors import InvalidInput
from ledger.pricing.routing import RoutingConfig
from slurmtext import format_time
from tests.support.daemon import NO_VAL, running, sinfo_runner
from tests.support.fakedaemon import sockdir as sockdir
from tests.support.lua_job_submit import INFINITE, JOB_DESC, require_lua, run_script

SINCE = datetime(2026, 1, 1, tzinfo=UTC)
SITES = {"onprem": {"site": "onprem"}, "cloud": {"site": "cloud"}}
ROUTING = {"accounts": {}, "burst_after_seconds": 600}
LUA_PARTITIONS = {
    "onprem": {"name": "onprem", "default_time": NO_VAL, "max_time": INFINITE, "flag_default": 1},
    "cloud": {"name": "cloud", "default_time": 60, "max_time": 240, "flag_default": 0},
}
# sbatch -A physics --gres=gpu:a100:1 -t 1:00:00 --comment="gpucredit:cloud=yes nightly"
MAY_BURST = {
    **JOB_DESC,
    "account": "physics",
    "partition": None,
    "tres_per_node": "gres:gpu:a100:1",
    "gres": "gres:gpu:a100:1",
    "time_limit": 60,
    "comment": "gpucredit:cloud=yes nightly",
}


@pytest.fixture
def lua() -> None:
    require_lua()


@pytest.fixture
def daemon(db_url: str, tx: Callable[[], Any], sockdir: Path) -> Iterator[Daemon]:
    with tx() as s:
        api.set_price(s, "a100", "2.00", effective_at=SINCE)
        api.set_price(s, "a100", "5.00", partition="cloud", effective_at=SINCE)
        api.create_account(s, "physics")
        api.add_member(s, "alice", "physics")
        api.topup(s, "physics", "100", effective_at=SINCE)
    runner = sinfo_runner()
    runner.add(SQUEUE, "")  # the daemon's own burst pass finds nothing pending
    with running(db_url, sockdir, runner, partitions=SITES, routing=ROUTING) as served:
        assert served.slurm_facts.learned.wait(10), "the daemon never read the partitions"
        yield served


def test_a_job_allowed_both_sites_gets_on_premise_now_and_cloud_in_its_admin_comment(
    lua: None, daemon: Daemon, tmp_path: Path, sockdir: Path
) -> None:
    outcome = run_script(
        tmp_path, str(sockdir / "daemon.sock"), job_desc=MAY_BURST, partitions=LUA_PARTITIONS
    )
    assert outcome.rc == 0
    assert outcome.user == [
        "gpucredit: ~5.00 credits at most (1×a100 × 1 h) in onprem (~2.00), or cloud (~5.00) if it has "
        "not started within 600 s; 100.00 available in physics"
    ]
    assert outcome.written == {
        "partition": "onprem",
        "comment": "gpucredit: routed to onprem, then cloud after 600 s (cloud allowed): onprem ~2.00 "
        "allowed, cloud ~5.00 allowed | nightly",
        "admin_comment": "gpucredit-burst=cloud:5000000",  # with its cost there, for the budget
    }


@pytest.mark.parametrize(
    ("change", "partition"),
    [
        ({"partition": "onprem,cloud"}, "onprem,cloud"),  # -p onprem,cloud: the user's own choice
        ({"array_inx": "0-3"}, "onprem,cloud"),  # an array: one pending record for every task
        ({"comment": "gpucredit:max_cost=3,cloud=yes"}, "onprem"),  # cloud over the limit: nothing to add
    ],
)
def test_nothing_is_held_back_from_a_job_that_names_its_partitions_an_array_or_one_without_cloud(
    lua: None, daemon: Daemon, tmp_path: Path, sockdir: Path, change: dict[str, str], partition: str
) -> None:
    job = {**MAY_BURST, **change}
    outcome = run_script(tmp_path, str(sockdir / "daemon.sock"), job_desc=job, partitions=LUA_PARTITIONS)
    assert outcome.rc == 0, outcome
    assert outcome.written["partition"] == partition
    assert "admin_comment" not in outcome.written
    assert "if it has not started within" not in outcome.user[0]


# --------------------------------------------------------------------------- the burst pass

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def line(job_id: str, waited: int, partition: str, mark: str, account: str = "physics") -> str:
    submitted = format_time(NOW - timedelta(seconds=waited))
    return f"{job_id}|{account}|{submitted}|{partition}|{mark}|"


def keeper(squeue: list[str]) -> tuple[BurstKeeper, FakeRunner]:
    runner = FakeRunner({SQUEUE: "\n".join(squeue) + "\n"})
    return BurstKeeper(runner, 600, ["cloud", "burst"], clock=lambda: NOW), runner


def update(job_id: int, partitions: str, sent: str = "") -> tuple[str, ...]:
    return (
        "scontrol",
        "update",
        f"JobId={job_id}",
        f"Partition={partitions}",
        f"AdminComment=gpucredit-burst-sent{sent}",
    )


def test_the_pass_adds_the_held_back_cloud_partitions_once_the_wait_is_over() -> None:
    burst, runner = keeper(
        [
            line("41", 600, "onprem", "gpucredit-burst=cloud:5000000,burst:6000000"),  # exactly the wait
            line("42", 599, "onprem", "gpucredit-burst=cloud:5000000"),  # a second early
            line("43", 900, "onprem", "gpucredit-hold"),  # held for credit: another mark
            line("44", 900, "onprem", ""),
            line("45", 900, "onprem", "gpucredit-burst-sent=cloud:5000000"),  # done before
            line("46", 900, "onprem", "gpucredit-burst=cloud"),  # marked before costs were
        ]
    )
    runner.add(update(41, "onprem,cloud,burst", "=cloud:5000000,burst:6000000"))
    runner.add(update(46, "onprem,cloud", "=cloud"))
    assert burst.tick() == [41, 46]
    assert runner.calls == [
        SQUEUE,
        update(41, "onprem,cloud,burst", "=cloud:5000000,burst:6000000"),
        update(46, "onprem,cloud", "=cloud"),
    ]


def test_only_partitions_the_config_tags_cloud_are_ever_added(caplog: pytest.LogCaptureFixture) -> None:
    burst, runner = keeper(
        [
            line("51", 900, "onprem", "gpucredit-burst=gpu-reserved:1,cloud:5"),
            line("52", 900, "onprem", "gpucredit-burst=gpu-reserved:1"),
            line("53", 900, "onprem,cloud", "gpucredit-burst=cloud:5"),  # already there
            "54|physics|not a time|onprem|gpucredit-burst=cloud:5|",
            line("55", 900, "onprem", "gpucredit-burst=cloud:5"),
        ]
    )
    runner.add(update(51, "onprem,cloud", "=cloud:5"))
    runner.add(
        update(55, "onprem,cloud", "=cloud:5"), FakeResponse(returncode=1, stderr="Job is no longer pending")
    )
    with caplog.at_level(logging.INFO, logger="gpucredit.daemon"):
        assert burst.tick() == [51]  # 55 started meanwhile: said, and the pass goes on
    assert "bad time 'not a time'" in caplog.text
    assert "job 55" in caplog.text and "no longer pending" in caplog.text


def test_a_bad_wait_stops_the_daemon_at_start_naming_the_key() -> None:
    for bad in (-1, "600", True, 1.5):
        with pytest.raises(InvalidInput, match=r"routing\.burst_after_seconds must be whole seconds"):
            RoutingConfig.from_config({"routing": {"burst_after_seconds": bad}})
    with pytest.raises(InvalidInput, match=r"routing\.burst_after is not a routing setting"):
        RoutingConfig.from_config({"routing": {"burst_after": 600}})
    assert RoutingConfig.from_config({"routing": {"burst_after_seconds": 30}}).burst_after_seconds == 30


@pytest.mark.parametrize(
    ("text", "sent", "costs"),
    [
        ("gpucredit-burst=cloud:5000000,burst:6000000", False, {"cloud": 5_000_000, "burst": 6_000_000}),
        ("gpucredit-burst-sent=cloud:5000000", True, {"cloud": 5_000_000}),
        ("gpucredit-burst=cloud", False, {"cloud": None}),  # written before costs were
        ("gpucredit-burst-sent", True, {}),
        ("gpucredit-burst=cloud:-5,burst:1e9,cloud2:٣,big:7", False, {"big": 7}),  # never guessed
    ],
)
def test_the_mark_reads_what_job_submit_and_the_pass_write(text: str, sent: bool, costs: dict) -> None:
    mark = BurstMark.parse(text)
    assert mark == BurstMark(sent, costs)
    if "-5" not in text:
        assert mark.text == text


def test_other_admin_comments_are_no_mark() -> None:
    for text in ("", "gpucredit-hold", "gpucredit-burst", "gpucredit-burst-sentinel=cloud:1", "site note"):
        assert BurstMark.parse(text) is None, text
