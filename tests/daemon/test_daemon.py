"""The daemon end to end over its Unix socket, with the hooks' own client."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from accounting_bridge.slurm.slurmcmd import FakeResponse, FakeRunner, SlurmCommandError, SlurmCommandTimeout
from gpucredit.daemon.retry_keeper import SQUEUE as RETRY_SQUEUE
from gpucredit.daemon.server import MAX_REQUEST_BYTES, top_up_hint
from gpucredit.daemon.slurm_facts import SINFO_ARGV, SlurmFacts
from ledger import api
from ledger.config import load_config
from ledger.store.db import make_engine, make_sessionmaker
from slurm_hooks.admin.slurmconf import MAX_JOB_SUBMIT_TIMEOUT_SECONDS
from slurm_hooks.client import DaemonClient, DaemonRefused, DaemonUnreachable
from slurmtext import SlurmTextError
from tests.support.daemon import NO_VAL, PARTITIONS, SINFO, running, sinfo_runner
from tests.support.fakedaemon import sockdir as sockdir


def seed(tx) -> None:  # type: ignore[no-untyped-def]
    with tx() as s:
        api.set_price(s, "a100", "2.00", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.topup(s, "physics", "20", effective_at=datetime(2026, 1, 1, tzinfo=UTC))


@pytest.fixture
def client(db_url: str, tx, sockdir: Path) -> Iterator[DaemonClient]:
    seed(tx)
    with running(db_url, sockdir, sinfo_runner()) as daemon:
        assert daemon.slurm_facts.learned.wait(10), "the daemon never read the partitions"
        yield DaemonClient(str(sockdir / "daemon.sock"), 5.0)


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
        "20.00 are available in physics. Top up: gpucredit topup physics AMOUNT.",
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


def test_submit_refuses_a_gpu_type_the_partition_lacks_before_slurm_does(client) -> None:
    """Slurm would refuse it after job_submit: a quote printed first reads as an error
    (`sbatch: error: gpucredit: ~...`), so the daemon says what is wrong instead."""
    assert submit(client, tres_per_node="gres:gpu:h100:1", partition="cloud") == {
        "decision": "reject",
        "message": "gpucredit: partition cloud has no h100 GPUs (GPU types there: a100); "
        "ask for a type it has",
    }
    assert submit(client, tres_per_node="gres:gpu:a100:1", partition="cloud")["decision"] == "accept"


def test_submit_tells_an_exclusive_job_without_gpus_it_is_charged_for_the_nodes_gpus(client) -> None:
    exclusive = submit(client, shared=0)
    assert exclusive == {
        "decision": "accept",
        "message": "gpucredit: --exclusive gives this job every GPU of its node(s), and they are charged "
        "from when it starts; ask for GPUs with --gres to be quoted",
    }
    assert submit(client, shared=65534) == {"decision": "accept", "message": ""}  # not exclusive


def test_submit_tells_a_job_over_a_cap_beside_what_runs_that_it_waits(db_url: str, tx, sockdir: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 26, S4: every limit is checked at submit from the snapshot. Over a cap on its
    own: refused. Over it only beside what runs now: accepted, told it waits (Slurm queues
    it, as it queues a job over the caps `limits sync` writes; the prolog holds it)."""
    seed(tx)
    with tx() as s:
        api.add_member(s, "alice", "physics")
        api.set_limits(s, "physics", user="alice", daily_cap="10")
        api.create_hold(
            s, api.HoldRequest("physics", user="alice", job_id=7, gpus={"h100": 1}, seconds=7200)
        )  # 7.20 held
    with running(db_url, sockdir, sinfo_runner()):
        client = DaemonClient(str(sockdir / "daemon.sock"), 5.0)
        _over_a_cap(client)


def _over_a_cap(client: DaemonClient) -> None:
    over_alone = submit(client, tres_per_node="gres:gpu:h100:2")  # 14.40 > 10
    assert over_alone["decision"] == "reject"
    assert over_alone["message"] == (
        "gpucredit: daily_cap: 14.40 credits exceed the daily cap of 10.00 for user alice (job: 2×h100 × 2 h)"
    )
    waits = submit(client, tres_per_node="gres:gpu:h100:1", time_limit=60)  # 3.60 + 7.20 held > 10
    assert waits == {
        "decision": "accept",
        "message": "gpucredit: ~3.60 credits (1×h100 × 1 h), 12.80 available in physics; it waits to start: "
        "daily_cap: user alice in account physics: 10.80 credits today would exceed the daily cap of 10.00 "
        "(0.00 spent + 7.20 held + 3.60 for this job)",
    }


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


def test_a_settle_charges_its_holds_account_whatever_account_it_names(client, tx) -> None:
    """The epilog's account only says where the daemon queues the settle (and which
    account it locks first); a wrong or unknown one never moves the charge."""
    with tx() as s:
        api.create_account(s, "chemistry")
        api.topup(s, "chemistry", "5", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
    job = {"cluster": "lab", "run": 0, "start": "2026-12-02T10:00:00Z"}
    for job_id in (61, 62, 63):
        client.call(
            "hold", **job, job_id=job_id, account="physics", user="alice", gpus={"h100": 1}, seconds=3600
        )
    settled = [
        client.call("settle", **job, job_id=job_id, end="2026-12-02T10:30:00Z", account=named)
        for job_id, named in ((61, "chemistry"), (62, "nosuch"), (63, 7))
    ]
    assert [(done["account"], done["charged"]) for done in settled] == [("physics", "1.80")] * 3
    with tx() as s:
        assert api.balance(s, "physics")["available"] == "14.60"  # 20 - 3 x 1.80
        assert api.balance(s, "chemistry")["available"] == "5.00"


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


def test_database_down_answers_unavailable(sockdir: Path) -> None:
    """...and the job the prolog then parks is checked every release round, not only at
    the next full scan, so it runs as soon as the ledger is back."""
    with running("postgresql+psycopg://nobody@127.0.0.1:1/none", sockdir, sinfo_runner()) as daemon:
        client = DaemonClient(str(sockdir / "daemon.sock"), 5.0)
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
        assert set(daemon.credit_held) == {5}


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


# -- no Slurm command inside a request ------------------------------------------------------------


class BlockedSinfo:
    """A runner whose sinfo does not answer until the test releases it (as when
    slurmctld is busy or not up yet); the retry pass finds no failed job; any other
    command is a test failure."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, argv: Sequence[str], *, timeout_seconds: float | None = None) -> str:
        if tuple(argv) == RETRY_SQUEUE:
            return ""
        assert tuple(argv) == SINFO_ARGV, f"unexpected Slurm command {list(argv)}"
        self.entered.set()
        if not self.release.wait(30):
            raise SlurmCommandTimeout(argv, None, "", reason="the test never released sinfo")
        return self.stdout


def test_a_cold_start_answers_job_submit_while_sinfo_has_not_answered(db_url: str, tx, sockdir: Path) -> None:
    """job_submit.lua gives the daemon 1 s; the first untyped request after a start must
    not wait on sinfo. Until Slurm has been read, untyped GPUs are estimated at the
    dearest priced type, and the message says so."""
    seed(tx)
    sinfo = BlockedSinfo(SINFO)
    with running(db_url, sockdir, sinfo) as daemon:
        job_submit = DaemonClient(str(sockdir / "daemon.sock"), MAX_JOB_SUBMIT_TIMEOUT_SECONDS)
        untyped_cloud = {"tres_per_job": "gres:gpu:1", "partition": "cloud", "time_limit": 60}
        try:
            assert sinfo.entered.wait(10)  # the refresher is inside sinfo from here on
            assert submit(job_submit, **untyped_cloud) == {
                "decision": "accept",
                "message": "gpucredit: ~3.60 credits (1×h100 × 1 h); untyped GPUs estimated as h100, "
                "the dearest priced type (partitions not read from Slurm yet), 20.00 available in physics",
            }
            assert not daemon.slurm_facts.learned.is_set()
        finally:
            sinfo.release.set()
        assert daemon.slurm_facts.learned.wait(10)
        assert submit(job_submit, **untyped_cloud) == {
            "decision": "accept",
            "message": "gpucredit: ~2.00 credits (1×a100 × 1 h); untyped GPUs estimated as a100, "
            "the dearest type here, 20.00 available in physics",
        }


def test_partition_types_come_from_the_last_good_sinfo() -> None:
    runner = FakeRunner(
        {
            SINFO_ARGV: "onprem|gpu:a100:2,gpu:h100:2\nonprem|gpu:h100:4(S:0-1)\ncloud|gpu:a100:2(S:0)\n"
            "cpu|(null)\nmixed|gpu:4,mps:100,gpu:l40s:1\n"
        }
    )
    facts = SlurmFacts(runner, refresh_seconds=60)
    assert facts.gpu_types("onprem") is None  # nothing read yet
    facts.refresh()
    assert [facts.gpu_types(p) for p in ("onprem", "cloud", "cpu", "mixed")] == [
        ["a100", "h100"],
        ["a100"],
        [],
        ["l40s"],
    ]
    # The default partition (None) and a partition sinfo did not list: every type offered.
    assert facts.gpu_types(None) == facts.gpu_types("nosuch") == ["a100", "h100", "l40s"]
    for broken in ("not sinfo output\n", FakeResponse(returncode=1, stderr="slurmctld down")):
        runner.add(SINFO_ARGV, broken)
        with pytest.raises((SlurmCommandError, SlurmTextError)):
            facts.refresh()
        assert facts.gpu_types("cloud") == ["a100"]  # the last good table stays


# -- the top-up hint --------------------------------------------------------------------------------


def test_the_top_up_hint_names_the_portal_once_configured_else_the_command() -> None:
    config = load_config(Path("/dev/null"))
    assert top_up_hint(config) == "Ask your PI or an admin to add credit (gpucredit topup {account} AMOUNT)."
    config["portal"]["url"] = "https://gpucredit.example.org/"
    assert top_up_hint(config) == "Top up at https://gpucredit.example.org/ or ask your PI."
    config["daemon"]["top_up_hint"] = "Mail credits@example.org."
    assert top_up_hint(config) == "Mail credits@example.org."


# -- limits at submit -------------------------------------------------------------------------------


def test_caps_a_job_breaks_on_its_own_are_refused_at_submit(db_url: str, tx, sockdir: Path) -> None:
    """Worked-example caps for alice (4 GPUs, daily cap 30) and an account rate cap of
    0.003 credit/s; each refusal names the limit, the value and the cap."""
    seed(tx)
    with tx() as s:
        api.set_limits(s, "physics", user="alice", max_gpus=4, max_rate="0.005", daily_cap="30")
        api.set_limits(s, "physics", max_rate="0.003")
    with running(db_url, sockdir, sinfo_runner()):
        client = DaemonClient(str(sockdir / "daemon.sock"), 5.0)
        assert submit(client, tres_per_node="gres:gpu:h100:5") == {
            "decision": "reject",
            "message": "gpucredit: concurrent_gpus: 5 GPUs exceed the cap of 4 for user alice "
            "(job: 5×h100 × 2 h)",
        }
        assert submit(client, tres_per_node="gres:gpu:h100:4", time_limit=60) == {
            "decision": "reject",
            "message": "gpucredit: spend_rate: 0.004/s exceeds the cap of 0.003/s for the account "
            "(job: 4×h100 × 1 h)",
        }
        assert submit(client, tres_per_node="gres:gpu:a100:2", time_limit=480) == {
            "decision": "reject",
            "message": "gpucredit: daily_cap: 32.00 credits exceed the daily cap of 30.00 for user alice "
            "(job: 2×a100 × 8 h)",
        }
        assert submit(client, tres_per_node="gres:gpu:h100:2") == {
            "decision": "accept",
            "message": "gpucredit: ~14.40 credits (2×h100 × 2 h), 20.00 available in physics",
        }


# -- the wire protocol's refusals -------------------------------------------------------------------


def exchange(path: Path, payload: bytes) -> list[dict]:
    """Send raw bytes, half-close, and read every reply line until the daemon hangs up."""
    import json

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:  # it hung up with part of our request unread
                break
            if not chunk:
                break
            received += chunk
    return [json.loads(line) for line in received.splitlines()]


def refusal(code: str, message: str) -> dict:
    return {"ok": False, "error": {"code": code, "message": message, "details": {}}}


def test_malformed_requests_get_a_code_and_the_connection_stays_usable(client, sockdir: Path) -> None:
    replies = exchange(
        sockdir / "daemon.sock",
        b"this is not json\n"
        b"\xff\xfe\n"
        b'["op", "ping"]\n'
        b'{"op": 7}\n'
        b'{"op": "frobnicate"}\n'
        b'{"op": "hold", "seconds": 60}\n'
        b'{"op": "settle", "cluster": "lab"}\n'
        b'{"op": "ping"}\n',
    )
    assert replies == [
        refusal("bad_request", "request is not JSON"),
        refusal("bad_request", "request is not JSON"),
        refusal("bad_request", "a request is a JSON object with an 'op'"),
        refusal("bad_request", "a request is a JSON object with an 'op'"),
        refusal("unknown_op", "unknown op 'frobnicate'"),
        refusal("bad_request", "malformed hold request: KeyError('account')"),
        refusal("bad_request", "malformed settle request: KeyError('job_id')"),
        {"ok": True, "result": {"pong": True}},
    ]
    with pytest.raises(DaemonRefused) as unknown:
        client.call("frobnicate")
    assert (unknown.value.code, unknown.value.message) == ("unknown_op", "unknown op 'frobnicate'")


def test_an_oversized_request_is_refused_and_the_connection_closed(client, sockdir: Path) -> None:
    """The rest of an oversized line is never read as requests of its own."""
    oversized = b'{"op": "ping", "pad": "' + b"x" * MAX_REQUEST_BYTES + b'"}\n'
    assert exchange(sockdir / "daemon.sock", oversized + b'{"op": "ping"}\n') == [
        refusal("bad_request", f"request longer than {MAX_REQUEST_BYTES} bytes")
    ]
    exactly = b'{"op": "ping", "pad": "' + b"x" * (MAX_REQUEST_BYTES - 26) + b'"}\n'
    assert len(exactly) == MAX_REQUEST_BYTES
    assert exchange(sockdir / "daemon.sock", exactly) == [{"ok": True, "result": {"pong": True}}]


# -- `gpucredit daemon` as a real process -----------------------------------------------------------


def test_gpucredit_daemon_serves_the_hooks_and_stops_on_sigterm(
    sqlite_template: Path, tmp_path: Path, sockdir: Path
) -> None:
    import shutil

    database = tmp_path / "ledger.db"
    shutil.copy(sqlite_template, database)
    url = f"sqlite:///{database}"
    engine = make_engine(url)
    with make_sessionmaker(engine)() as s, s.begin():
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.topup(s, "physics", "20", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
    engine.dispose()
    bin_dir = tmp_path / "bin"  # the daemon's Slurm: an sinfo that prints one partition
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho 'gpu|gpu:h100:4'\n")
    (bin_dir / "sinfo").chmod(0o755)
    socket_path = sockdir / "daemon.sock"
    config = tmp_path / "gpucredit.toml"
    config.write_text(
        f'[database]\nurl = "{url}"\n[daemon]\nsocket = "{socket_path}"\n'
        f'[slurm]\ncluster = "lab"\nbin_dir = "{bin_dir}"\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "GPUCREDIT_DATABASE_URL"}
    env["GPUCREDIT_CONFIG"] = str(config)
    log_path = tmp_path / "daemon.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpucredit", "daemon", "--release-interval", "0"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        hooks = DaemonClient(str(socket_path), 5.0)
        deadline = time.monotonic() + 60  # a bound on start-up, not a measurement
        while True:
            try:
                assert hooks.call("ping") == {"pong": True}
                break
            except DaemonUnreachable:
                assert process.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.1)
        assert submit(hooks, tres_per_node="gres:gpu:h100:1", partition="gpu") == {
            "decision": "accept",
            "message": "gpucredit: ~7.20 credits (1×h100 × 2 h), 20.00 available in physics",
        }
        job = {"cluster": "lab", "job_id": 7, "run": 0, "account": "physics", "user": "alice"}
        held = hooks.call(
            "hold",
            **job,
            partition="gpu",
            gpus={"h100": 1},
            seconds=7200,
            nodes=1,
            start="2026-12-02T10:00:00Z",
        )
        assert (held["amount"], held["state"]) == ("7.20", "active")
        settled = hooks.call("settle", cluster="lab", job_id=7, run=0, end="2026-12-02T10:30:00Z")
        assert (settled["state"], settled["charged"]) == ("settled", "1.80")
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log_path.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert not socket_path.exists()
    assert "gpucredit daemon stopped" in log_path.read_text()
