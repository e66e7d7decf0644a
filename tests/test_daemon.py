"""The daemon end to end over its Unix socket, with the hooks' own client."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from accounting_bridge.slurmcmd import FakeRunner
from gpucredit.daemon import Daemon
from ledger import api
from ledger.config import load_config
from slurm_hooks.client import DaemonClient, DaemonRefused, DaemonUnreachable

NO_VAL = 4294967294
PARTITIONS = {
    "onprem": {"default_time": NO_VAL, "max_time": 4294967295, "default": True},
    "cloud": {"default_time": 60, "max_time": 240, "default": False},
}


def serve(url: str, tmp_path: Path, runner: FakeRunner | None = None) -> Iterator[DaemonClient]:
    config = load_config(Path("/dev/null"))
    config["database"]["url"] = url
    config["daemon"]["top_up_hint"] = "Top up: gpucredit topup ACCOUNT AMOUNT."
    socket_path = str(tmp_path / "d.sock")
    daemon = Daemon(config, runner or FakeRunner({}))
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=daemon.serve,
        args=(socket_path,),
        kwargs={"release_interval": None, "ready": ready, "stop": stop},
    )
    thread.start()
    assert ready.wait(10)
    yield DaemonClient(socket_path, 5.0)
    stop.set()
    thread.join(10)


@pytest.fixture
def client(db_url: str, tx, tmp_path: Path) -> Iterator[DaemonClient]:
    with tx() as s:
        api.set_price(s, "a100", "2.00", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.topup(s, "physics", "20", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
    runner = FakeRunner(
        {("sinfo", "-h", "-o", "%R|%G"): "onprem|gpu:a100:2,gpu:h100:2\ncloud|gpu:a100:2(S:0)\n"}
    )
    yield from serve(db_url, tmp_path, runner)


def submit(client: DaemonClient, **fields) -> dict:
    base = {
        "user_name": "alice",
        "user_id": 1001,
        "default_account": "physics",
        "partitions": PARTITIONS,
        "time_limit": 120,
        "num_tasks": NO_VAL,
        "min_nodes": NO_VAL,
    }
    return client.call("submit", **{**base, **fields})


def test_submit_estimates_and_refuses_with_cost_available_and_top_up(client) -> None:
    assert submit(client, tres_per_node="gres:gpu:h100:2") == {
        "decision": "accept",
        "message": "gpucredit: ~14.40 credits (2×h100 × 2 h), 20.00 available in physics",
    }
    assert submit(client, tres_per_node="gres:gpu:h100:2", array_inx="0-2") == {
        "decision": "reject",
        "message": "gpucredit: this job would cost ~43.20 credits (2×h100 × 2 h, × 3 tasks) but only "
        "20.00 are available in physics. Top up: gpucredit topup ACCOUNT AMOUNT.",
    }
    untyped = submit(client, tres_per_job="gres:gpu:2", time_limit=60)
    assert untyped["message"] == (
        "gpucredit: ~7.20 credits (2×h100 × 1 h); untyped GPUs estimated as "
        "h100, the dearest type here, 20.00 available in physics"
    )
    cloud = submit(client, tres_per_job="gres:gpu:1", partition="cloud", time_limit=NO_VAL)
    assert cloud["message"].startswith(
        "gpucredit: ~2.00 credits (1×a100 × 1 h); untyped GPUs estimated as a100"
    )
    assert submit(client, time_limit=NO_VAL) == {"decision": "accept", "message": ""}
    assert submit(client, tres_per_node="gres:gpu:h100:1", account="nosuch")["decision"] == "reject"
    assert submit(client, tres_per_node="gres:gpu:v100:1")["message"].startswith(
        "gpucredit: no price for GPU type 'v100'"
    )


def test_hold_and_settle_are_idempotent_per_run(client) -> None:
    request = {
        "cluster": "lab",
        "job_id": 42,
        "run": 0,
        "account": "physics",
        "user": "alice",
        "partition": "onprem",
        "gpus": {"h100": 2},
        "seconds": 3600,
        "nodes": 1,
        "start": "2026-12-02T10:00:00Z",  # Slurm's StartTime: the settle measures from it
    }
    first = client.call("hold", **request)
    assert (first["amount"], first["state"]) == ("7.20", "active")
    assert client.call("hold", **request)["id"] == first["id"]
    with pytest.raises(DaemonRefused) as refused:
        client.call("hold", **{**request, "job_id": 43, "seconds": 7200})
    assert refused.value.code == "insufficient_credits"
    assert "needs 14.40 credits" in refused.value.message and "12.80 are available" in refused.value.message
    settle = {
        "cluster": "lab",
        "job_id": 42,
        "run": 0,
        "start": "2026-12-02T10:00:00Z",
        "end": "2026-12-02T10:30:00Z",
    }
    done = client.call("settle", **settle)
    assert (done["state"], done["charged"]) == ("settled", "3.60")
    assert client.call("settle", **settle)["charged"] == "3.60"
    with pytest.raises(DaemonRefused) as missing:
        client.call("settle", **{**settle, "run": 1})
    assert missing.value.code == "not_found"


def test_unlimited_time_is_refused_with_a_reason(client) -> None:
    with pytest.raises(DaemonRefused) as refused:
        client.call(
            "hold",
            cluster="lab",
            job_id=5,
            run=0,
            account="physics",
            user="alice",
            partition=None,
            gpus={"a100": 1},
            seconds=None,
            nodes=1,
        )
    assert refused.value.code == "invalid_duration"


def test_database_down_answers_unavailable(tmp_path: Path) -> None:
    for client in serve("postgresql+psycopg://nobody@127.0.0.1:1/none", tmp_path):
        with pytest.raises(DaemonUnreachable):
            client.call(
                "hold",
                cluster="lab",
                job_id=5,
                run=0,
                account="physics",
                user="alice",
                partition=None,
                gpus={"a100": 1},
                seconds=60,
                nodes=1,
            )


def test_a_top_up_reaches_job_submit_through_the_refreshed_snapshot(client, tx) -> None:
    big = {"tres_per_node": "gres:gpu:h100:2", "time_limit": 600}  # 10 h: 72.00 credits
    assert submit(client, **big)["decision"] == "reject"
    with tx() as s:
        api.topup(s, "physics", "100")
    deadline = time.monotonic() + 10  # the daemon refreshes every second; allow a slow machine
    while submit(client, **big)["decision"] == "reject":
        assert time.monotonic() < deadline, "the top-up never reached job_submit"
        time.sleep(0.1)
    assert submit(client, **big)["message"] == (
        "gpucredit: ~72.00 credits (2×h100 × 10 h), 120.00 available in physics"
    )


def test_a_new_account_is_not_refused_from_an_old_snapshot(client, tx) -> None:
    """The snapshot refreshes every second; a refusal re-reads first, so credit given a
    moment ago counts at once."""
    assert submit(client, tres_per_node="gres:gpu:h100:1")["decision"] == "accept"  # snapshot taken
    with tx() as s:
        api.create_account(s, "fresh")
        api.topup(s, "fresh", "10")
    assert submit(client, tres_per_node="gres:gpu:h100:1", account="fresh") == {
        "decision": "accept",
        "message": "gpucredit: ~7.20 credits (1×h100 × 2 h), 10.00 available in fresh",
    }
