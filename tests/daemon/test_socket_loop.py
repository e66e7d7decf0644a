"""The daemon's socket loop on its own: answers from other threads, order per connection,
lines cut short, clients that go away, idle connections."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from gpucredit.daemon.socket_loop import Reply, SocketLoop
from tests.support.fakedaemon import sockdir as sockdir

MAX_LINE = 64


class Echo:
    """Answers `{"n": N}` with `{"n": N}`; `{"later": N}` from another thread, after the
    test releases it (as the group commit's writer answers holds)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.seen: list[bytes] = []

    def __call__(self, line: bytes, reply: Reply) -> None:
        self.seen.append(line)
        request = json.loads(line)
        if "later" in request:

            def answer_later() -> None:
                self.release.wait(10)
                reply.send(json.dumps({"n": request["later"]}).encode() + b"\n")

            threading.Thread(target=answer_later).start()
        else:
            reply.send(json.dumps({"n": request["n"]}).encode() + b"\n")


@contextlib.contextmanager
def serving(path: Path, dispatch, idle_seconds: float = 30.0) -> Iterator[SocketLoop]:  # type: ignore[no-untyped-def]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    loop = SocketLoop(
        listener, dispatch, max_line=MAX_LINE, too_long=b'"too long"\n', idle_seconds=idle_seconds
    )
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop, 0.05))
    thread.start()
    try:
        yield loop
    finally:
        stop.set()
        thread.join(10)
        listener.close()
        assert not thread.is_alive()


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(path))
    return sock


def read_all(sock: socket.socket) -> list[object]:
    """Every reply until the loop hangs up; then the client's end is closed too."""
    chunks = []
    with sock:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return [json.loads(line) for line in b"".join(chunks).splitlines()]


def test_replies_keep_the_order_of_their_requests_when_one_is_answered_later(sockdir: Path) -> None:
    echo = Echo()
    with serving(sockdir / "s", echo):
        sock = connect(sockdir / "s")
        sock.sendall(b'{"later": 1}\n{"n": 2}\n{"n": 3}\n')
        time.sleep(0.2)
        # The second line is not even dispatched while the first is owed.
        assert echo.seen == [b'{"later": 1}']
        echo.release.set()
        sock.shutdown(socket.SHUT_WR)
        assert read_all(sock) == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_other_connections_are_answered_while_one_waits(sockdir: Path) -> None:
    echo = Echo()
    with serving(sockdir / "s", echo):
        waiting = connect(sockdir / "s")
        waiting.sendall(b'{"later": 1}\n')
        quick = [connect(sockdir / "s") for _ in range(20)]
        for i, sock in enumerate(quick):
            sock.sendall(json.dumps({"n": i}).encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
        assert [read_all(sock) for sock in quick] == [[{"n": i}] for i in range(20)]
        echo.release.set()
        waiting.shutdown(socket.SHUT_WR)
        assert read_all(waiting) == [{"n": 1}]


def test_a_last_line_without_its_newline_is_answered(sockdir: Path) -> None:
    with serving(sockdir / "s", Echo()):
        sock = connect(sockdir / "s")
        sock.sendall(b'{"n": 1}\n{"n": 2}')
        sock.shutdown(socket.SHUT_WR)
        assert read_all(sock) == [{"n": 1}, {"n": 2}]


def test_a_line_too_long_is_refused_and_the_rest_never_read(sockdir: Path) -> None:
    echo = Echo()
    with serving(sockdir / "s", echo):
        exactly = b'{"n": 1, "pad": "' + b"x" * (MAX_LINE - 20) + b'"}\n'
        assert len(exactly) == MAX_LINE
        sock = connect(sockdir / "s")
        sock.sendall(exactly + b'{"n": 2, "pad": "' + b"x" * MAX_LINE + b'"}\n{"n": 3}\n')
        assert read_all(sock) == [{"n": 1}, "too long"]
        assert len(echo.seen) == 1


def test_a_client_gone_before_its_answer_costs_the_others_nothing(sockdir: Path) -> None:
    echo = Echo()
    with serving(sockdir / "s", echo):
        for _ in range(5):
            gone = connect(sockdir / "s")
            gone.sendall(b'{"later": 1}\n')
            gone.close()
        time.sleep(0.1)
        echo.release.set()
        sock = connect(sockdir / "s")
        sock.sendall(b'{"n": 7}\n')
        sock.shutdown(socket.SHUT_WR)
        assert read_all(sock) == [{"n": 7}]


def test_an_idle_connection_is_closed(sockdir: Path) -> None:
    with serving(sockdir / "s", Echo(), idle_seconds=0.3), connect(sockdir / "s") as sock:
        sock.sendall(b'{"n": 1}\n')
        assert sock.recv(100) == b'{"n": 1}\n'
        # Nothing more sent: the loop hangs up after its idle time, and the read ends.
        assert sock.recv(100) == b""


def test_calls_from_another_thread_run_on_the_loop_and_none_is_sent_once_it_closed(sockdir: Path) -> None:
    """The writer hands a batch's replies over with `call_soon`; once the loop has closed
    (the daemon stopping), a late reply is dropped, and its wake-up byte is not written to
    the closed pipe's descriptor (which a new file may own by then)."""
    echo = Echo()
    ran_on: list[threading.Thread] = []
    with serving(sockdir / "s", echo) as loop:
        handed = threading.Thread(
            target=loop.call_soon, args=(lambda: ran_on.append(threading.current_thread()),)
        )
        handed.start()
        handed.join(10)
        deadline = time.monotonic() + 10
        while not ran_on and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ran_on) == 1 and ran_on[0] is not handed and ran_on[0] is not threading.current_thread()
    late: list[BaseException] = []

    def reply_late() -> None:
        try:
            loop.call_soon(lambda: None)
        except Exception as error:  # the assertion below names it
            late.append(error)

    thread = threading.Thread(target=reply_late)
    thread.start()
    thread.join(10)
    assert late == []
