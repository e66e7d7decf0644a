"""A real `gpucredit serve` (or `make demo`) in a subprocess, for tests that meet the
portal as a browser or an operator does: waitress, a TOML file, a port
(`portal_config` writes one, `serve_portal` starts it).

`Server.start` returns once waitress prints that it is serving (or raises with the
process's output if it exits first); `stop` ends it with SIGINT, as Ctrl-C would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

STARTUP_SECONDS = 90.0  # a cold import of Flask, SQLAlchemy and argon2 on 2 busy cores
READY = "Serving on http://"  # waitress's line once its socket listens


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """One server process; its output is kept (drained by a thread, so it never blocks)."""

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        self.argv = list(argv)
        self.env = {**os.environ, **env}
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.process: subprocess.Popen[str] | None = None
        self._drainer = threading.Thread(target=self._drain, daemon=True)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def start(self) -> Server:
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # A test runner may ignore SIGINT; the server must take it as Ctrl-C.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self._drainer.start()
        if not self._ready.wait(STARTUP_SECONDS) or self.process.poll() is not None:
            self.stop()
            raise RuntimeError(f"{self.argv[0]} did not start serving:\n{self.output}")
        return self

    def _drain(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if READY in line:
                self._ready.set()
        self._ready.set()  # end of output: the process is gone

    def stop(self) -> int:
        """Ctrl-C, then SIGKILL if it does not stop within 20 s; its exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._drainer.join(timeout=20)  # reads to the end of output, then stops
        if self.process.stdout is not None and not self._drainer.is_alive():
            self.process.stdout.close()
        return self.process.returncode


def toml_value(value: object) -> str:
    """A TOML value for the few types a test's config holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def portal_config(path: Path, database_url: str, portal: dict[str, object]) -> Path:
    """A gpucredit.toml with the database and a [portal] table, as an admin writes one."""
    lines = ["[database]", f"url = {toml_value(database_url)}", "", "[portal]"]
    lines += [f"{key} = {toml_value(value)}" for key, value in portal.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def serve_portal(config: Path, port: int) -> Server:
    """`gpucredit serve` on 127.0.0.1:`port` with `config`, started (see Server.start)."""
    gpucredit = str(Path(sys.executable).parent / "gpucredit")
    return Server(
        [gpucredit, "serve", "--host", "127.0.0.1", "--port", str(port)],
        {"GPUCREDIT_CONFIG": str(config), "GPUCREDIT_DATABASE_URL": ""},
    ).start()
