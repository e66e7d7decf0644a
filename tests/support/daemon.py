"""A real gpucredit daemon for tests: one served from a thread (`running`, with a fake
sinfo), or one in a process of its own (`DaemonProcess`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from accounting_bridge.slurm.slurmcmd import FakeRunner
from gpucredit.daemon.retry_keeper import SQUEUE as RETRY_SQUEUE
from gpucredit.daemon.server import Daemon
from gpucredit.daemon.slurm_facts import SINFO_ARGV
from ledger.config import load_config
from slurm_hooks.client import DaemonClient, DaemonUnreachable

NO_VAL = 4294967294


PARTITIONS = {
    "onprem": {"default_time": NO_VAL, "max_time": 4294967295, "default": True},
    "cloud": {"default_time": 60, "max_time": 240, "default": False},
}


SINFO = "onprem|gpu:a100:2,gpu:h100:2\ncloud|gpu:a100:2(S:0)\n"


HINT = "Top up: gpucredit topup {account} AMOUNT."


def sinfo_runner() -> FakeRunner:
    """Slurm's partitions, and no failed job for the retry pass."""
    return FakeRunner({SINFO_ARGV: SINFO, RETRY_SQUEUE: ""})


@contextlib.contextmanager
def running(url: str, socket_dir: Path, runner, **sections) -> Iterator[Daemon]:  # type: ignore[no-untyped-def]
    """A Daemon served from a thread on `socket_dir`/daemon.sock until the block ends;
    `sections` replace the default config's top-level tables (e.g. partitions, routing)."""
    config = load_config(Path("/dev/null"))
    config["database"]["url"] = url
    config["daemon"]["top_up_hint"] = HINT
    config.update(sections)
    daemon = Daemon(config, runner)
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=daemon.serve,
        args=(str(socket_dir / "daemon.sock"),),
        kwargs={"release_interval": None, "ready": ready, "stop": stop},
    )
    thread.start()
    try:
        assert ready.wait(10)
        yield daemon
    finally:
        stop.set()
        thread.join(10)


GPUCREDIT = str(Path(sys.executable).with_name("gpucredit"))


@dataclass
class DaemonProcess:
    socket: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, config: Path, release_interval: float = 0) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [GPUCREDIT, "daemon", "--socket", self.socket, "--release-interval", str(release_interval)],
                env={**os.environ, "GPUCREDIT_CONFIG": str(config)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                DaemonClient(self.socket, 1).call("ping")
                return
            except DaemonUnreachable:
                assert self.proc.poll() is None, self.log.read_text()[-2000:]
                assert time.monotonic() < deadline, self.log.read_text()[-2000:]
                time.sleep(0.1)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
