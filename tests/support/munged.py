"""A munged of the test's own: its own key, socket and files in a folder, so tests never
touch the host's (or the Slurm box's) munged. Debian's `munge` package provides it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.services import require

MUNGED = "/usr/sbin/munged"


@contextmanager
def munged(folder: Path, key: bytes | None = None) -> Iterator[str]:
    """Start munged with `key` (default: a new random one) in `folder`; yields its socket."""
    require(
        os.access(MUNGED, os.X_OK) and shutil.which("munge") is not None,
        "munged (Debian's munge package)",
        "apt-get install munge",
    )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    key_file = folder / "munge.key"
    key_file.write_bytes(key or os.urandom(1024))
    key_file.chmod(0o600)
    socket = folder / "munge.socket"
    process = subprocess.Popen(
        [
            MUNGED,
            "--foreground",
            "--force",
            f"--socket={socket}",
            f"--key-file={key_file}",
            f"--log-file={folder / 'munged.log'}",
            f"--pid-file={folder / 'munged.pid'}",
            f"--seed-file={folder / 'munged.seed'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while not socket.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                log = (folder / "munged.log").read_text() if (folder / "munged.log").exists() else ""
                raise RuntimeError(f"munged did not start (exit {process.poll()}): {log}")
            time.sleep(0.02)
        yield str(socket)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
