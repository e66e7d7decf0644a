"""Pooled credit through the resident daemon, as Slurm's hooks reach it: job_submit's
quote names what the pool would lend ("0.00 in grpc + 20.00 from dept's pool"), the
prolog's hold borrows it through the group commit, the epilog's settle gives back what
the job did not spend."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ledger import api
from slurm_hooks.client import DaemonClient, DaemonRefused
from tests.support.daemon import NO_VAL, PARTITIONS, running, sinfo_runner
from tests.support.fakedaemon import sockdir as sockdir

JAN = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def client(db_url: str, tx, sockdir: Path) -> Iterator[DaemonClient]:  # type: ignore[no-untyped-def]
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=JAN)
        api.create_account(s, "dept")
        api.create_account(s, "grpc")
        api.set_parent(s, "grpc", "dept")
        api.topup(s, "dept", "100", effective_at=JAN)
        api.set_pool(s, "dept", True, "20", at=JAN)
    with running(db_url, sockdir, sinfo_runner()) as daemon:
        assert daemon.slurm_facts.learned.wait(10), "the daemon never read the partitions"
        yield DaemonClient(str(sockdir / "daemon.sock"), 5.0)


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def submit(client: DaemonClient, **fields) -> dict:  # type: ignore[no-untyped-def]
    base = {
        "user_name": "alice",
        "user_id": 1001,
        "account": "grpc",
        "partitions": PARTITIONS,
        "num_tasks": NO_VAL,
        "min_nodes": NO_VAL,
    }
    return client.call("submit", **{**base, **fields})


def test_job_submit_quotes_what_the_pool_would_lend_and_refuses_past_it(client: DaemonClient) -> None:
    assert submit(client, tres_per_node="gres:gpu:h100:2", time_limit=60) == {
        "decision": "accept",
        "message": "gpucredit: ~7.20 credits (2×h100 × 1 h), 0.00 in grpc + 20.00 from dept's pool",
    }
    assert submit(client, tres_per_node="gres:gpu:h100:2", time_limit=180) == {
        "decision": "reject",
        "message": "gpucredit: this job would cost ~21.60 credits (2×h100 × 3 h) but only "
        "0.00 in grpc + 20.00 from dept's pool. Top up: gpucredit topup grpc AMOUNT.",
    }


def test_the_prolog_hold_borrows_and_the_epilog_settle_gives_back(client: DaemonClient, tx) -> None:  # type: ignore[no-untyped-def]
    job = {"cluster": "lab", "job_id": 41, "run": 0, "account": "grpc", "user": "alice", "partition": None}
    start = datetime.now(UTC).replace(microsecond=0)
    held = client.call("hold", **job, gpus={"h100": 2}, seconds=3600, nodes=1, start=stamp(start))
    assert held["amount"] == "7.20"
    with tx() as s:
        assert (api.balance(s, "dept")["available"], api.balance(s, "grpc")["held"]) == ("92.80", "7.20")
    client.call("settle", cluster="lab", job_id=41, run=0, end=stamp(start + timedelta(seconds=900)))  # 1.80
    with tx() as s:
        assert (api.balance(s, "dept")["available"], api.balance(s, "grpc")["available"]) == ("98.20", "0.00")
        assert api.pool_uses(s) == {("dept", "grpc"): 1_800_000}
        assert api.verify(s).ok
    with pytest.raises(DaemonRefused) as refused:  # 21.60 > the 18.20 its cap leaves
        client.call("hold", **{**job, "job_id": 42}, gpus={"h100": 2}, seconds=3 * 3600, nodes=1)
    assert refused.value.code == "insufficient_credits"
    assert "(0.00 in grpc + 18.20 from dept's pool)" in refused.value.message


def test_a_cap_on_the_parent_refuses_a_childs_hold_through_the_group_commit(client: DaemonClient, tx) -> None:  # type: ignore[no-untyped-def]
    with tx() as s:
        api.set_limits(s, "dept", max_gpus=2)
    start = datetime.now(UTC).replace(microsecond=0)
    job = {
        "cluster": "lab",
        "run": 0,
        "account": "grpc",
        "user": "alice",
        "partition": None,
        "start": stamp(start),
    }
    client.call("hold", **job, job_id=51, gpus={"h100": 2}, seconds=600, nodes=1)
    with pytest.raises(DaemonRefused) as refused:
        client.call("hold", **job, job_id=52, gpus={"h100": 1}, seconds=600, nodes=1)
    assert refused.value.code == "concurrent_gpus"
    assert refused.value.message.startswith("account dept (with the accounts below it): 3 concurrent GPUs")
