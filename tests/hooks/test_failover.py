"""Hooks fail over between two daemons (two controllers) within one deadline.

`DaemonClient` given several sockets tries them in order; a missing, refusing,
hanging, garbling or `unavailable` daemon passes the request to the next, an answer
(result or refusal) is final, and the whole call stays within its timeout. The hooks
read the list from `daemon.sockets`. Fake daemons are real Unix-socket servers
(tests/support/fakedaemon.py); the two real daemons on one database are in
tests/daemon/test_two_daemons.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_hooks.client import DaemonClient, DaemonRefused, DaemonUnreachable
from slurm_hooks.hooks import HookConfig, hook_settings, load_config, main
from tests.support.fake_slurm import FakeSlurm, ctld_env, hold_object, ok, queue, queue_line, refused
from tests.support.fakedaemon import CLOSE, HANG, FakeDaemon, Responder
from tests.support.fakedaemon import sockdir as sockdir


@pytest.fixture
def daemons(sockdir: Path) -> Iterator[Callable[[str, Responder], FakeDaemon]]:
    """Start a fake daemon at sockdir/NAME."""
    started: list[FakeDaemon] = []

    def start(name: str, responder: Responder) -> FakeDaemon:
        daemon = FakeDaemon(str(sockdir / name), responder)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def answer(result: dict[str, Any]) -> Responder:
    return lambda request: ok({**result, "op": request["op"]})


def test_first_socket_missing_the_second_answers(
    sockdir: Path, daemons: Callable[[str, Responder], FakeDaemon]
) -> None:
    backup = daemons("backup.sock", answer({"by": "backup"}))
    client = DaemonClient([str(sockdir / "primary.sock"), backup.path], timeout=1)
    assert client.call("hold", job_id=7) == {"by": "backup", "op": "hold"}
    assert backup.requests == [{"op": "hold", "job_id": 7}]


def test_first_socket_refusing_the_second_answers(
    sockdir: Path, daemons: Callable[[str, Responder], FakeDaemon]
) -> None:
    backup = daemons("backup.sock", answer({"by": "backup"}))
    dead = str(sockdir / "primary.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(dead)  # a socket file nobody listens on: ECONNREFUSED (a killed daemon's)
        assert DaemonClient([dead, backup.path], timeout=1).call("settle") == {"by": "backup", "op": "settle"}


def test_first_daemon_hanging_the_second_answers_within_the_deadline(
    daemons: Callable[[str, Responder], FakeDaemon],
) -> None:
    """The hanging primary would hold the request for 10 s; the client gives it half of
    its 1 s and still gets the backup's answer inside the same deadline."""
    primary = daemons("primary.sock", lambda _: HANG)
    backup = daemons("backup.sock", answer({"by": "backup"}))
    assert DaemonClient([primary.path, backup.path], timeout=1).call("hold") == {"by": "backup", "op": "hold"}
    assert [r["op"] for r in primary.requests] == ["hold"]  # it was asked first


@pytest.mark.parametrize(
    "reply", [refused("unavailable", "the ledger database is unavailable"), b"garbage\n", CLOSE]
)
def test_a_daemon_that_cannot_answer_passes_to_the_other(
    daemons: Callable[[str, Responder], FakeDaemon], reply: Any
) -> None:
    primary = daemons("primary.sock", lambda _: reply)
    backup = daemons("backup.sock", answer({"by": "backup"}))
    assert DaemonClient([primary.path, backup.path], timeout=1).call("hold") == {"by": "backup", "op": "hold"}
    assert len(primary.requests) == len(backup.requests) == 1


def test_a_refusal_is_final_the_other_daemon_is_not_asked(
    daemons: Callable[[str, Responder], FakeDaemon],
) -> None:
    primary = daemons("primary.sock", lambda _: refused("insufficient_credits", "needs 1.40, has 0.00"))
    backup = daemons("backup.sock", answer({"by": "backup"}))
    with pytest.raises(DaemonRefused) as info:
        DaemonClient([primary.path, backup.path], timeout=1).call("hold")
    assert (info.value.code, info.value.message) == ("insufficient_credits", "needs 1.40, has 0.00")
    assert backup.requests == []


def test_the_primary_answers_when_it_is_up(daemons: Callable[[str, Responder], FakeDaemon]) -> None:
    primary = daemons("primary.sock", answer({"by": "primary"}))
    backup = daemons("backup.sock", answer({"by": "backup"}))
    assert DaemonClient([primary.path, backup.path], timeout=1).call("hold") == {
        "by": "primary",
        "op": "hold",
    }
    assert backup.requests == []


def test_both_down_is_unreachable_naming_each(sockdir: Path) -> None:
    first, second = str(sockdir / "primary.sock"), str(sockdir / "backup.sock")
    with pytest.raises(DaemonUnreachable) as info:
        DaemonClient([first, second], timeout=1).call("hold")
    message = str(info.value)
    assert message.startswith("no daemon answered: cannot reach " + first)
    assert f"; cannot reach {second}" in message


def test_both_hanging_is_unreachable_within_one_deadline(
    daemons: Callable[[str, Responder], FakeDaemon],
) -> None:
    """Each gets its share of the one deadline (0.2 s each of 0.4 s), never 0.4 s each."""
    primary = daemons("primary.sock", lambda _: HANG)
    backup = daemons("backup.sock", lambda _: HANG)
    with pytest.raises(DaemonUnreachable) as info:
        DaemonClient([primary.path, backup.path], timeout=0.4).call("hold")
    shares = [part.rsplit(" within ", 1)[1] for part in str(info.value).split("; ")]
    assert [float(s.removesuffix(" s")) <= 0.2 for s in shares] == [True, True], info.value
    assert float(shares[0].removesuffix(" s")) + float(shares[1].removesuffix(" s")) <= 0.4


def test_nothing_is_remembered_between_calls(daemons: Callable[[str, Responder], FakeDaemon]) -> None:
    """A hook process is one-shot: a primary that failed once is asked first next time."""
    answers = iter([CLOSE, ok({"by": "primary"})])
    primary = daemons("primary.sock", lambda _: next(answers))
    backup = daemons("backup.sock", answer({"by": "backup"}))
    client = DaemonClient([primary.path, backup.path], timeout=1)
    assert client.call("hold")["by"] == "backup"
    assert client.call("hold")["by"] == "primary"


def test_one_socket_keeps_its_old_errors(sockdir: Path) -> None:
    with pytest.raises(DaemonUnreachable, match=r"^cannot reach "):
        DaemonClient(str(sockdir / "primary.sock"), timeout=0.5).call("hold")
    with pytest.raises(ValueError):
        DaemonClient([], timeout=0.5)


def test_concurrent_calls_spread_and_fail_over_independently(
    sockdir: Path, daemons: Callable[[str, Responder], FakeDaemon]
) -> None:
    backup = daemons("backup.sock", answer({"by": "backup"}))
    missing = str(sockdir / "primary.sock")
    results: list[str] = []

    def call() -> None:
        results.append(DaemonClient([missing, backup.path], timeout=2).call("hold")["by"])

    threads = [threading.Thread(target=call) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == ["backup"] * 32


# --- the hooks' config -------------------------------------------------------------------


def _config(tmp_path: Path, daemon_table: str) -> str:
    path = tmp_path / "gpucredit.toml"
    path.write_text(f'[daemon]\n{daemon_table}\n[policy]\non_ledger_unreachable = "reject"\n')
    return str(path)


def test_config_sockets_list_wins_over_socket(tmp_path: Path) -> None:
    path = _config(tmp_path, 'socket = "/run/a.sock"\nsockets = ["/run/p.sock", "/run/b.sock"]')
    config, problems = load_config({"GPUCREDIT_CONFIG": path})
    assert problems == []
    assert (config.socket_path, config.socket_paths) == ("/run/p.sock", ("/run/p.sock", "/run/b.sock"))


def test_config_single_socket_still_works(tmp_path: Path) -> None:
    config, problems = load_config({"GPUCREDIT_CONFIG": _config(tmp_path, 'socket = "/run/a.sock"')})
    assert problems == [] and config == HookConfig(socket_path="/run/a.sock")
    assert config.socket_paths == ("/run/a.sock",)


@pytest.mark.parametrize("value", ["[]", '["relative.sock"]', '"/run/one.sock"', "[1]"])
def test_config_bad_sockets_is_reported_and_falls_back_to_socket(tmp_path: Path, value: str) -> None:
    path = _config(tmp_path, f'socket = "/run/a.sock"\nsockets = {value}')
    config, problems = load_config({"GPUCREDIT_CONFIG": path})
    assert config.socket_paths == ("/run/a.sock",)
    assert len(problems) == 1 and "bad value" in problems[0] and "for sockets" in problems[0]


def test_the_shims_copy_carries_the_sockets_list() -> None:
    data = {
        "daemon": {"sockets": ["/run/p.sock", "/run/b.sock"], "socket": "/run/p.sock"},
        "database": {"url": "x"},
    }
    settings = hook_settings(data)
    assert settings == {"daemon": {"socket": "/run/p.sock", "sockets": ["/run/p.sock", "/run/b.sock"]}}
    config, problems = load_config({"GPUCREDIT_HOOK_SETTINGS": json.dumps(settings)})
    assert problems == [] and config.socket_paths == ("/run/p.sock", "/run/b.sock")


def test_prolog_slurmctld_holds_through_the_backup_when_the_primary_is_gone(
    tmp_path: Path, sockdir: Path, daemons: Callable[[str, Responder], FakeDaemon]
) -> None:
    backup = daemons("backup.sock", lambda _: ok(hold_object()))
    path = tmp_path / "gpucredit.toml"
    path.write_text(
        f'[daemon]\nsockets = ["{sockdir / "primary.sock"}", "{backup.path}"]\ntimeout_seconds = 1\n'
        '[policy]\non_ledger_unreachable = "reject"\n[slurm]\nbin_dir = "/usr/bin"\n'
    )
    slurm = FakeSlurm({queue(5): queue_line()})  # no `scontrol update`: the job is not held
    lines: list[str] = []
    rc = main(["prolog-slurmctld"], environ=ctld_env(str(path)), runner=slurm, log=lines.append)
    assert rc == 0, lines
    assert [r["op"] for r in backup.requests] == ["hold"]
    assert backup.requests[0]["job_id"] == 5


def test_a_full_listen_backlog_is_waited_for_not_taken_for_a_dead_daemon(sockdir: Path) -> None:
    """A burst of hooks (an array's tasks starting at once) can fill the daemon's listen
    backlog; a Unix socket with a timeout then fails connect with EAGAIN at once. The
    client waits for room within its deadline instead of applying the outage policy."""
    path = str(sockdir / "busy.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(0)
    fillers = []
    while True:  # fill the backlog: the next connect would fail with EAGAIN
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.setblocking(False)
        try:
            filler.connect(path)
        except BlockingIOError:
            filler.close()
            break
        fillers.append(filler)
    assert fillers  # the backlog really is full now
    client_started = threading.Event()

    def serve() -> None:
        client_started.wait(5)
        # Let the client meet the full backlog first (the test holds whatever the delay).
        time.sleep(0.3)
        server.settimeout(5)
        for _ in range(len(fillers) + 1):
            conn, _ = server.accept()
            with conn:
                conn.settimeout(0.2)
                try:
                    if conn.recv(65536):
                        conn.sendall(b'{"ok": true, "result": {"served": true}}\n')
                except TimeoutError:
                    pass  # a filler: it sends nothing

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        client_started.set()
        assert DaemonClient(path, timeout=3).call("hold") == {"served": True}
    finally:
        thread.join(10)
        for filler in fillers:
            filler.close()
        server.close()
