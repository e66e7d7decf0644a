"""GPU nodes hold no ledger credentials: the agent sends its samples to the controller's
daemon over TCP, each batch a MUNGE credential, and the daemon's receiver believes only
what its own munged decodes, from root or the SlurmUser, fresh and never seen before.

Real parts: a munged of the test's own (tests/support/munged.py; a second one with another key
plays a host outside the cluster), the fake NVML of tests/bridge/test_agent.py, both stores.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from accounting_bridge.nvml.agent import Agent
from accounting_bridge.nvml.channel import MungeSender, NotSent, Unsure, encode_usage
from accounting_bridge.nvml.munge import Munge
from accounting_bridge.nvml.nvml_fake import FakeNvml
from accounting_bridge.nvml.receiver import UsageReceiver
from accounting_bridge.nvml.sampler import GpuRegistry, JobRunKey
from gpucredit.cli import _build
from ledger.api import UsageDelta
from ledger.store.db import make_engine, make_sessionmaker
from tests.support.agent import GiB, Monotonic, usage_rows
from tests.support.munged import munged

# tests/bridge/test_agent.py's three ticks, written by the agent itself.
THREE_TICKS = {(100, "a100"): (30, 15, 600, 12 * GiB), (101, "h100"): (60, 8, 200, 5 * GiB)}
ROW = UsageDelta("lab", 7, 0, "node1", "a100", 10, 5, 100, 2**30)


@pytest.fixture
def receiver(db_url: str, munge_socket: str) -> Iterator[UsageReceiver]:
    engine = make_engine(db_url)
    stop = threading.Event()
    receiver = UsageReceiver(Munge(munge_socket), make_sessionmaker(engine))
    receiver.serve("127.0.0.1", 0, stop)
    yield receiver
    stop.set()
    engine.dispose()


def two_more_ticks(agent: Agent, nvml: FakeNvml, clock: Monotonic) -> None:
    """As tests/bridge/test_agent.py's run_three_ticks, after its first tick."""
    for memory_gib in (12, 8):
        clock.now += 10
        nvml.gpus[0].add_energy(300)
        nvml.gpus[1].add_energy(999)
        nvml.gpus[2].add_energy(100)
        nvml.gpus[0].memory_used_bytes = memory_gib * GiB
        agent.tick()


def address(receiver: UsageReceiver) -> tuple[str, int]:
    return ("127.0.0.1", int(receiver.address[1]))


def send_line(receiver: UsageReceiver, line: bytes) -> dict[str, Any]:
    with socket.create_connection(address(receiver), timeout=10) as connection:
        connection.sendall(line)
        connection.shutdown(socket.SHUT_WR)
        answer: dict[str, Any] = json.loads(connection.makefile("rb").readline())
    return answer


def test_the_agent_sends_through_munge_what_it_would_write(
    tx: Callable[[], Any], node: tuple[FakeNvml, GpuRegistry], receiver: UsageReceiver, munge_socket: str
) -> None:
    """The same rows as an agent writing the database itself (tests/bridge/test_agent.py), through
    the receiver; the node's sender has no database at all."""
    nvml, registry = node
    clock = Monotonic()
    sender = MungeSender(Munge(munge_socket), [address(receiver)], "node1")
    agent = Agent(
        node="node1", nvml=nvml, registry=registry, sender=sender, interval_seconds=10, monotonic=clock
    )
    first = agent.tick()
    assert (first.units, first.charged_units, first.rows_written, first.problems) == (4, 3, 2, [])
    assert usage_rows(tx)[(101, "h100")][:2] == (20, 3)
    two_more_ticks(agent, nvml, clock)
    assert usage_rows(tx) == THREE_TICKS
    assert (receiver.batches_written, receiver.rows_written) == (3, 6)


def test_a_lost_answer_is_settled_and_never_counted_twice(
    tx: Callable[[], Any], node: tuple[FakeNvml, GpuRegistry], receiver: UsageReceiver, munge_socket: str
) -> None:
    """The batch is written but its answer is lost on the way back: the agent resends that
    very credential first, the receiver answers it again without writing, and the next
    rows are sent on top. The totals are exact, not doubled."""
    nvml, registry = node
    clock = Monotonic()
    sender = MungeSender(Munge(munge_socket), [address(receiver)], "node1")
    agent = Agent(
        node="node1", nvml=nvml, registry=registry, sender=sender, interval_seconds=10, monotonic=clock
    )
    real = sender._exchange
    lost = []

    def lose_the_answer(connection: socket.socket, credential: str) -> bytes:
        real(connection, credential)  # written...
        lost.append(credential)
        raise ConnectionResetError("the answer was lost")  # ...but the agent never hears so

    sender._exchange = lose_the_answer  # type: ignore[method-assign]
    with pytest.raises(Unsure):
        agent.tick()
    sender._exchange = real  # type: ignore[method-assign]
    assert usage_rows(tx)[(101, "h100")][:2] == (20, 3)
    two_more_ticks(agent, nvml, clock)
    assert usage_rows(tx) == THREE_TICKS
    assert receiver.batches_written == 3  # the resent credential wrote nothing
    assert send_line(receiver, lost[0].encode() + b"\n") == {"ok": True, "result": {"rows": 2}}


def test_an_unreachable_controller_loses_nothing(
    tx: Callable[[], Any], node: tuple[FakeNvml, GpuRegistry], db_url: str, munge_socket: str
) -> None:
    nvml, registry = node
    clock = Monotonic()
    with socket.socket() as taken:  # a port nobody listens on yet
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
    sender = MungeSender(Munge(munge_socket), [("127.0.0.1", port)], "node1", timeout_seconds=2)
    agent = Agent(
        node="node1", nvml=nvml, registry=registry, sender=sender, interval_seconds=10, monotonic=clock
    )
    with pytest.raises(NotSent, match=f"127.0.0.1:{port}: Connection refused"):
        agent.tick()
    clock.now += 10
    nvml.gpus[0].add_energy(300)
    nvml.gpus[1].add_energy(999)
    nvml.gpus[2].add_energy(100)
    nvml.gpus[0].memory_used_bytes = 12 * GiB
    agent._logged_tick()  # the service's loop logs it and keeps the figures
    engine = make_engine(db_url)
    stop = threading.Event()
    receiver = UsageReceiver(Munge(munge_socket), make_sessionmaker(engine))
    receiver.serve("127.0.0.1", port, stop)
    try:
        clock.now += 10
        nvml.gpus[0].add_energy(300)
        nvml.gpus[1].add_energy(999)
        nvml.gpus[2].add_energy(100)
        nvml.gpus[0].memory_used_bytes = 8 * GiB
        agent.tick()
    finally:
        stop.set()
        engine.dispose()
    assert usage_rows(tx) == THREE_TICKS


def test_the_receiver_believes_only_fresh_credentials_of_root_or_slurmuser(
    tx: Callable[[], Any], receiver: UsageReceiver, munge_socket: str, tmp_path: Path
) -> None:
    munge = Munge(munge_socket)
    payload = encode_usage("node1", [ROW])
    # A user's job can encode credentials too, as itself: refused.
    as_user = subprocess.run(
        ["munge", f"--socket={munge_socket}", "--string", payload.decode()],
        capture_output=True,
        text=True,
        user="nobody",
        check=True,
    ).stdout
    nobody = int(subprocess.run(["id", "-u", "nobody"], capture_output=True, text=True, check=True).stdout)
    assert send_line(receiver, as_user.encode()) == {
        "ok": False,
        "error": {"code": "forbidden", "message": f"uid {nobody} may not send GPU usage (root or SlurmUser)"},
    }
    # Decoded once elsewhere (a copy taken off the wire and used first): munged's replay cache.
    stolen = munge.encode(payload, 60)
    munge.decode(stolen)
    assert send_line(receiver, stolen.encode() + b"\n")["error"]["code"] == "replayed"
    # Altered on the way: the MAC fails.
    good = munge.encode(payload, 60)
    forged = good[:20] + ("A" if good[20] != "A" else "B") + good[21:]
    assert send_line(receiver, forged.encode() + b"\n")["error"]["code"] == "unauthenticated"
    # Made with another cluster's key.
    with munged(tmp_path / "other") as other_socket:
        foreign = Munge(other_socket).encode(payload, 60)
    assert send_line(receiver, foreign.encode() + b"\n")["error"] == {
        "code": "unauthenticated",
        "message": "Invalid credential",
    }
    # Older than a minute by the controller's clock (munged's TTL aside).
    late = UsageReceiver(munge, receiver.sessions, clock=lambda: time.time() + 120)
    assert late.answer(munge.encode(payload, 300).encode())["error"]["code"] == "expired"
    # Not a usage payload, and not a credential at all.
    assert send_line(receiver, munge.encode(b"[1]", 60).encode() + b"\n")["error"] == {
        "code": "bad_request",
        "message": "not a version 1 usage payload",
    }
    assert send_line(receiver, b"GET / HTTP/1.0\r\n")["error"]["code"] == "unauthenticated"
    assert usage_rows(tx) == {}  # nothing of it written
    # A good one is written once; the same credential again answers the same, writes nothing.
    assert send_line(receiver, good.encode() + b"\n") == {"ok": True, "result": {"rows": 1}}
    assert send_line(receiver, good.encode() + b"\n") == {"ok": True, "result": {"rows": 1}}
    assert usage_rows(tx) == {(7, "a100"): (10, 5, 100, 2**30)}


def test_bad_rows_are_refused_with_the_ledgers_reason(receiver: UsageReceiver, munge_socket: str) -> None:
    bad = UsageDelta("lab", 7, 0, "node1", "a100", -10, 5, 100, 0)
    credential = Munge(munge_socket).encode(encode_usage("node1", [bad]), 60)
    answer = send_line(receiver, credential.encode() + b"\n")
    assert answer["ok"] is False and answer["error"]["code"] == "invalid_usage"


def test_the_agent_command_sends_to_the_daemons_receiver(
    tx: Callable[[], Any],
    receiver: UsageReceiver,
    munge_socket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`gpucredit agent` with agent.send_to and no [database]: the node's config names
    the controller only."""
    spool = tmp_path / "spool" / "gpu1"
    GpuRegistry(spool).register(JobRunKey("lab", 9, 0), {0: "a100"})
    config = tmp_path / "node.toml"
    config.write_text(
        f'[agent]\nspool_dir = "{tmp_path / "spool" / "%n"}"\n'
        f'send_to = ["127.0.0.1:{address(receiver)[1]}"]\nmunge_socket = "{munge_socket}"\n'
    )
    monkeypatch.setenv("GPUCREDIT_CONFIG", str(config))
    monkeypatch.delenv("GPUCREDIT_DATABASE_URL", raising=False)
    result = CliRunner().invoke(_build(), ["agent", "--once", "--node", "gpu1", "--fake-nvml", "a100:2@50"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.splitlines()[-1])["rows_written"] == 1
    with tx() as s:
        rows = s.execute(
            text("SELECT node, job_id, allocated_gpu_seconds, busy_gpu_seconds FROM gpu_usage")
        ).all()
    assert [tuple(r) for r in rows] == [("gpu1", 9, 10, 5)]


def test_an_agent_with_neither_a_controller_nor_a_database_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "node.toml"
    config.write_text(f'[agent]\nspool_dir = "{tmp_path}"\n')
    monkeypatch.setenv("GPUCREDIT_CONFIG", str(config))
    monkeypatch.delenv("GPUCREDIT_DATABASE_URL", raising=False)
    result = CliRunner().invoke(_build(), ["agent", "--once", "--fake-nvml", "a100:1"])
    assert result.exit_code == 2
    assert (
        "set agent.send_to to the controller's daemon (host:port of its daemon.agent_listen" in result.output
    )


def test_an_agent_tick_that_cannot_be_sent_is_one_line_not_a_traceback(
    munge_socket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--once` against a controller that is not listening: exit 1 and say so (the
    looping agent logs the same and sends it with the next tick)."""
    spool = tmp_path / "spool" / "gpu1"
    GpuRegistry(spool).register(JobRunKey("lab", 9, 0), {0: "a100"})
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    config = tmp_path / "node.toml"
    config.write_text(
        f'[agent]\nspool_dir = "{tmp_path / "spool" / "%n"}"\n'
        f'send_to = ["127.0.0.1:{port}"]\nmunge_socket = "{munge_socket}"\n'
    )
    monkeypatch.setenv("GPUCREDIT_CONFIG", str(config))
    monkeypatch.delenv("GPUCREDIT_DATABASE_URL", raising=False)
    result = CliRunner().invoke(_build(), ["agent", "--once", "--node", "gpu1", "--fake-nvml", "a100:2@50"])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    (line,) = result.output.splitlines()
    assert line.startswith(f"error: GPU usage not sent: 127.0.0.1:{port}")
