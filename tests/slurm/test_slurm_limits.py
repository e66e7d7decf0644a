"""Slurm's own limits from the ledger, on the real box (docs/limits-sync.md).

tests/slurm/conftest.py's `cluster` (hooks, this module's ledger and accounts), with this
module's daemon running the limits keeper (`limits_sync.in_daemon`) on a clock the tests
move, and scarcity caps on partition onprem (8 GPUs on node1-2, QOS gpucredit-onprem).
The keeper's full sync is hourly here, so only the CLI's `limits sync` (and a block that
changes) moves Slurm and every sync's output can be asserted exactly.

Each `limits sync` runs twice: the second changes nothing and runs no sacctmgr modify.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from gpucredit.daemon import Daemon
from ledger import api
from ledger.config import load_config
from ledger.timeutil import utcnow
from tests.support.cluster import Cluster, make_box

pytestmark = pytest.mark.slurm
BOX = make_box()  # a handle on the session's box (tests/slurm/conftest.py's slurm_box)

QOS = "gpucredit-onprem"
LIMITS_CONFIG = """
[limits_sync]
in_daemon = true
interval_seconds = 3600.0
[scarcity]
partitions = ["onprem"]
"""
NO_GPU = "gres/gpu=0,gres/gpu:a100=0,gres/gpu:h100=0"
# Output to /dev/null: job ids restart when the box is rebuilt, and another user's
# slurm-N.out left in the shared (sticky) job directory would fail the launch.
ONPREM = ("-p", "onprem", "-o", "/dev/null")
LONG = ("-t", "5", "--wrap", "sleep 300")


class Clock:
    """The keeper's clock: the wall clock, moved by `offset`."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return utcnow() + self.offset


def configure(c: Cluster, policy: str) -> None:
    c.write_config(policy)
    c.config_path.write_text(c.config_path.read_text() + LIMITS_CONFIG)


def start_daemon(c: Cluster, clock: Clock) -> None:
    """Like Cluster.start_daemon, with the limits keeper on `clock`."""
    config = load_config(c.config_path)
    ready = threading.Event()
    c.daemon_stop = threading.Event()
    c.daemon_thread = threading.Thread(
        target=Daemon(config, limits_clock=clock).serve,
        args=(config["daemon"]["socket"],),
        kwargs={"release_interval": 1.0, "ready": ready, "stop": c.daemon_stop},
        daemon=True,
    )
    c.daemon_thread.start()
    assert ready.wait(10), "gpucredit daemon did not start"


def clear_qos() -> None:
    lift = ["MaxTRESPerUser=gres/gpu=-1", "MaxTRESPerAccount=gres/gpu=-1"]
    BOX.run(["sacctmgr", "-i", "modify", "qos", "where", f"name={QOS}", "set", *lift])


@pytest.fixture(scope="module")
def clock(cluster: Cluster) -> Iterator[Clock]:
    """This module's daemon, keeper included; at the end the QOS loses any cap."""
    moved = Clock()
    cluster.stop_daemon()
    configure(cluster, "reject")
    start_daemon(cluster, moved)
    try:
        yield moved
    finally:
        cluster.stop_daemon()
        cancel(cluster.accounts)
        clear_qos()


def cancel(accounts: list[str]) -> None:
    for line in BOX.run(["squeue", "-h", "-o", "%i|%a"]).stdout.splitlines():
        job_id, _sep, account = line.partition("|")
        if account in accounts:
            BOX.run(["scancel", job_id])


@pytest.fixture
def jobs(cluster: Cluster, clock: Clock) -> Iterator[list[int]]:
    """Jobs a test starts; cancelled after it, so the next one finds onprem idle."""
    started: list[int] = []
    yield started
    if started:
        BOX.run(["scancel", *map(str, started)])
        wait_for(lambda: not running(*started), "the test's jobs end")


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll `condition` until it is true (bounded); returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"not after {timeout:.0f} s: {what}"
        time.sleep(0.2)


def state(job: int) -> str:
    return BOX.run(["squeue", "-h", "-j", str(job), "-o", "%T|%r"]).stdout.strip()


def wait_state(job: int, wanted: str) -> None:
    """Until squeue shows `wanted` (`PENDING|AssocGrpGRES`, `RUNNING|None`, ...)."""
    wait_for(lambda: state(job) == wanted, f"job {job} {wanted} (last {state(job)!r})")


def gpu_limits(account: str, user: str = "") -> str:
    text = BOX.run(
        ["sacctmgr", "-nP", "show", "assoc", "where", f"account={account}", "format=user,grptres"], check=True
    ).stdout
    return dict(line.split("|") for line in text.splitlines())[user]


def add_member(c: Cluster, user: str, account: str) -> None:
    BOX.run(["sacctmgr", "-i", "add", "user", user, f"account={account}"], check=True)
    with c.tx() as s:
        api.add_member(s, user, account)


def sync_twice(c: Cluster, *args: str) -> dict[str, Any]:
    """`limits sync` twice: the first's plan; the second must change nothing."""
    first = json.loads(c.gpucredit("limits", "sync", "--format", "json", *args))
    second = json.loads(c.gpucredit("limits", "sync", "--format", "json", *args))
    assert (second["changes"], second["commands"]) == ([], []), second
    return first


def running(*jobs: int) -> bool:
    """Whether any of `jobs` still holds GPUs (running or completing)."""
    argv = ["squeue", "-h", "-t", "R,CG", "-j", ",".join(map(str, jobs))]
    return bool(BOX.run(argv).stdout.strip())


def onprem_idle() -> bool:
    return not BOX.run(["squeue", "-h", "-p", "onprem", "-t", "R,CG,CF"]).stdout.strip()


# -- GPU caps hold in Slurm without gpucredit ----------------------------------------------------


def test_a_user_over_their_gpu_cap_waits_in_slurm_even_with_the_daemon_stopped(
    cluster: Cluster, clock: Clock, jobs: list[int]
) -> None:
    account = cluster.new_account("20")
    add_member(cluster, "bob", account)
    cluster.gpucredit("limits", "set", account, "--user", "alice", "--max-gpus", "2")
    plan = sync_twice(cluster)
    changes = {c["name"]: (c["new"], c["reason"]) for c in plan["changes"]}
    assert changes[f"alice@{account}"] == (
        "gres/gpu=2,gres/gpu:a100=2,gres/gpu:h100=2",
        "cap of 2 GPUs for alice",
    )
    assert gpu_limits(account, "alice") in (
        "gres/gpu=2,gres/gpu:a100=2,gres/gpu:h100=2",
        "gres/gpu:a100=2,gres/gpu:h100=2,gres/gpu=2",
    )
    jobs += [
        cluster.box.submit(["-A", account, *ONPREM, f"--gres=gpu:{t}:1", *LONG]) for t in ("a100", "h100")
    ]
    for job in jobs:
        wait_state(job, "RUNNING|None")
    cluster.stop_daemon()
    configure(cluster, "accept")  # the ledger unreachable, and the site lets jobs through
    try:
        typed = cluster.box.submit(["-A", account, *ONPREM, "--gres=gpu:h100:1", *LONG])
        untyped = cluster.box.submit(["-A", account, *ONPREM, "--gres=gpu:1", *LONG])
        bobs = cluster.box.submit(["-A", account, *ONPREM, "--gres=gpu:1", *LONG], user="bob")
        jobs += [typed, untyped, bobs]
        wait_state(typed, "PENDING|AssocGrpGRES")
        wait_state(untyped, "PENDING|AssocGrpGRES")
        wait_state(bobs, "RUNNING|None")  # bob has no cap: the limit is alice's own
        assert (state(typed), state(untyped)) == ("PENDING|AssocGrpGRES", "PENDING|AssocGrpGRES")
    finally:
        configure(cluster, "reject")
        start_daemon(cluster, clock)


# -- blocks: no credit, daily cap ----------------------------------------------------------------


def test_an_account_out_of_credit_is_blocked_in_slurm_and_a_top_up_starts_its_job(
    cluster: Cluster, clock: Clock, jobs: list[int]
) -> None:
    account = cluster.new_account("1")
    job = cluster.box.submit(
        ["-A", account, *ONPREM, "--hold", "--gres=gpu:h100:1", "-t", "1", "--wrap", "sleep 2"]
    )
    jobs.append(job)
    with cluster.tx() as s:
        api.consume(s, account, "1")  # spent elsewhere: nothing left
    wait_for(lambda: gpu_limits(account) != "", "the daemon blocks the account")
    assert set(gpu_limits(account).split(",")) == set(NO_GPU.split(","))
    BOX.run(["scontrol", "release", str(job)], check=True)
    wait_state(job, "PENDING|AssocGrpGRES")
    assert "gpucredit:" not in cluster.box.scontrol_job(job).get("Comment", "")  # no prolog ran
    balance = cluster.gpucredit("balance", account).splitlines()
    assert balance[1] == "blocked: no credit left (0.00 available, 0.00 held); GPU jobs wait in Slurm"
    assert json.loads(cluster.gpucredit("limits", "sync", "--format", "json"))["changes"] == []
    cluster.gpucredit("topup", account, "1")
    wait_for(lambda: gpu_limits(account) == "", "the daemon unblocks the account", timeout=10)
    cluster.box.wait_state(job, "COMPLETED", timeout=60)


def test_an_account_past_its_daily_cap_is_blocked_until_the_next_day(
    cluster: Cluster, clock: Clock, jobs: list[int]
) -> None:
    account = cluster.new_account(None)
    noon = (utcnow() - timedelta(days=1)).replace(hour=12, minute=0, second=0, microsecond=0)
    with cluster.tx() as s:
        api.topup(s, account, "10", effective_at=noon - timedelta(hours=1))
        api.set_limits(s, account, daily_cap="1")
        api.consume(s, account, "1", at=noon)  # yesterday's whole cap
    clock.offset = noon + timedelta(minutes=1) - utcnow()  # the keeper's clock: yesterday, 12:01
    try:
        wait_for(lambda: gpu_limits(account) != "", "the daemon blocks the account for its cap")
        at_noon = (noon + timedelta(minutes=1)).isoformat()
        shown = json.loads(
            cluster.gpucredit("limits", "sync", "--dry-run", "--at", at_noon, "--format", "json")
        )
        # Only this account: the keeper may still be blocking accounts an earlier test left
        # without credit (it syncs them in the background), which this test does not wait for.
        assert [c for c in shown["changes"] if c["name"] == account] == []
        job = cluster.box.submit(
            ["-A", account, *ONPREM, "--gres=gpu:h100:1", "-t", "1", "--wrap", "sleep 2"]
        )
        jobs.append(job)
        wait_state(job, "PENDING|AssocGrpGRES")
        midnight = (noon + timedelta(days=1)).replace(hour=0).isoformat()
        plan = json.loads(
            cluster.gpucredit("limits", "sync", "--dry-run", "--at", midnight, "--format", "json")
        )
        # Again only this account: at the keeper's clock (yesterday) the earlier tests' accounts
        # had no credit yet, and whether it has blocked them by now is a race this test ignores.
        assert [(c["name"], c["new"]) for c in plan["changes"] if c["name"] == account] == [(account, "-")]
    finally:
        clock.offset = timedelta()  # the day boundary passes for the keeper
    wait_for(lambda: gpu_limits(account) == "", "the daemon lifts the block")
    cluster.box.wait_state(job, "COMPLETED", timeout=60)


# -- scarcity ------------------------------------------------------------------------------------


def test_on_a_busy_partition_the_heaviest_users_next_job_waits_while_anothers_starts(
    cluster: Cluster, clock: Clock, jobs: list[int]
) -> None:
    wait_for(onprem_idle, "onprem idle")
    heavy, light = cluster.new_account("50"), cluster.new_account("50")
    add_member(cluster, "bob", light)
    submit = cluster.box.submit
    alices = [
        submit(["-A", heavy, *ONPREM, f"--gres=gpu:{g}", *LONG]) for g in ("a100:2", "h100:2", "a100:1")
    ]
    jobs += alices
    jobs.append(submit(["-A", light, *ONPREM, "--gres=gpu:h100:2", *LONG], user="bob"))
    for job in jobs:
        wait_state(job, "RUNNING|None")
    plan = sync_twice(cluster)
    [caps] = [c for c in plan["changes"] if c["scope"] == "partition"]
    assert caps == {
        "scope": "partition",
        "name": "onprem",
        "old": "-",
        "new": "per user gres/gpu=4, per account gres/gpu=6",
        "reason": "7 of 8 GPUs allocated (87%), more than 80%: "
        "at most 4 per user and 6 per account until below 60%",
    }
    waits = submit(["-A", heavy, *ONPREM, "--gres=gpu:1", *LONG])
    starts = submit(["-A", light, *ONPREM, "--gres=gpu:1", *LONG], user="bob")
    jobs += [waits, starts]
    wait_state(starts, "RUNNING|None")
    wait_state(waits, "PENDING|QOSMaxGRESPerUser")
    shown = json.loads(cluster.gpucredit("limits", "show", heavy, "--slurm", "--format", "json"))
    assert shown["slurm"]["partitions"][0]["in_slurm"] == "per user gres/gpu=4, per account gres/gpu=6"
    # bob's jobs end: 5 of 8 is not below 60%, so the caps stay (hysteresis)
    BOX.run(["scancel", str(jobs[3]), str(starts)], check=True)
    wait_for(lambda: not running(jobs[3], starts), "bob's jobs end")
    plan = sync_twice(cluster)
    assert [c for c in plan["changes"] if c["scope"] == "partition"] == []
    assert plan["scarcity"][0]["reason"] == (
        "5 of 8 GPUs allocated (62%), not below 60% yet: at most 4 per user and 6 per account until below 60%"
    )
    assert state(waits) == "PENDING|QOSMaxGRESPerUser"
    # one of alice's ends: 4 of 8 is below 60%: the caps lift and her waiting job starts
    BOX.run(["scancel", str(alices[2])], check=True)
    wait_for(lambda: not running(alices[2]), "alice's a100:1 ends")
    assert state(waits) == "PENDING|QOSMaxGRESPerUser"  # 4 held + 1 > 4: still capped
    plan = sync_twice(cluster)
    [lifted] = [c for c in plan["changes"] if c["scope"] == "partition"]
    assert (lifted["old"], lifted["new"]) == ("per user gres/gpu=4, per account gres/gpu=6", "-")
    assert lifted["reason"] == "4 of 8 GPUs allocated (50%), below 60%: no caps"
    wait_state(waits, "RUNNING|None")
