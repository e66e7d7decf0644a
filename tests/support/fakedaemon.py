"""A fake gpucredit daemon for the hook and job_submit.lua tests: a threaded Unix-socket
server speaking the daemon's wire format (one JSON object per line each way), whose
replies a test decides. Import the fixtures into a test module to use them."""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HANG = object()  # responder result: never answer
CLOSE = object()  # responder result: close without answering

Responder = Callable[[dict[str, Any]], Any]


class FakeDaemon:
    """A threaded Unix-socket server; `responder(request)` decides each reply."""

    def __init__(self, path: str, responder: Responder) -> None:
        self.path = path
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self.raw_requests: list[bytes] = []
        self.connections = 0  # accepted so far
        self.open: set[socket.socket] = set()
        self.release = threading.Event()
        daemon = self

        class Handler(socketserver.StreamRequestHandler):
            def setup(self) -> None:
                super().setup()
                daemon.connections += 1
                daemon.open.add(self.request)

            def finish(self) -> None:
                daemon.open.discard(self.request)
                super().finish()

            def handle(self) -> None:
                for raw in self.rfile:
                    daemon.raw_requests.append(raw)
                    request = json.loads(raw)
                    daemon.requests.append(request)
                    reply = daemon.responder(request)
                    if reply is HANG:
                        daemon.release.wait(10)
                        return
                    if reply is CLOSE:
                        return
                    if not isinstance(reply, bytes):
                        reply = (json.dumps(reply, ensure_ascii=True) + "\n").encode()
                    self.wfile.write(reply)
                    self.wfile.flush()
                    if not reply.endswith(b"\n"):
                        return  # a reply without its newline: close right after it

        self.server = socketserver.ThreadingUnixStreamServer(path, Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def hang_up(self) -> None:
        """Close every open connection, as the daemon does with idle ones."""
        for sock in list(self.open):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self.release.set()
        self.hang_up()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def sockdir(tmp_path: Path) -> Iterator[Path]:
    # AF_UNIX paths are limited to ~107 bytes; long test names make tmp_path longer.
    if len(str(tmp_path / "daemon.sock")) < 100:
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="gc-", dir="/tmp") as short:
        yield Path(short)


@pytest.fixture
def fake_daemon(sockdir: Path) -> Iterator[Callable[[Responder], FakeDaemon]]:
    started: list[FakeDaemon] = []

    def start(responder: Responder) -> FakeDaemon:
        # The first is daemon.sock (tests name it); more (two controllers) get their own.
        name = "daemon.sock" if not started else f"daemon{len(started) + 1}.sock"
        daemon = FakeDaemon(str(sockdir / name), responder)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()
