"""A munged of the test's own: its own key, socket and files in a folder, so tests never
touch the host's (or the Slurm box's) munged. Debian's `munge` package provides it."""

from __future__ import annotations

import os
import pwd
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


def encode(socket: str, payload: bytes, *, uid: int | None = None, ttl: int | None = None) -> str:
    """A credential from the munged at `socket`; as `uid` (its gid: its passwd entry's,
    else the same number) when given, which `munge` allows root alone."""
    argv = ["munge", f"--socket={socket}"]
    if uid is not None:
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = uid
        argv += [f"--uid={uid}", f"--gid={gid}"]
    if ttl is not None:
        argv.append(f"--ttl={ttl}")
    done = subprocess.run(argv, input=payload, capture_output=True, timeout=10, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr.decode(errors='replace')}")
    return done.stdout.decode("ascii").strip()


def plain_user() -> pwd.struct_passwd:
    """A user with a passwd entry who is not root: this one, or `nobody` when the tests
    run as root (who encodes credentials for it with --uid)."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    return pwd.getpwnam("nobody")


def as_user(user: pwd.struct_passwd) -> int | None:
    """The --uid that `encode` needs to speak as `user`: none when it is this process's."""
    return None if user.pw_uid == os.geteuid() else user.pw_uid


@contextmanager
def users_munged(key: bytes | None = None) -> Iterator[str]:
    """`munged` in a folder every user may reach, as on a node: `munge --uid` speaks as
    that user, and pytest's tmp_path is root's alone. Removed after."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="gpucredit-munge-"))
    folder.chmod(0o755)
    try:
        with munged(folder, key) as socket:
            yield socket
    finally:
        shutil.rmtree(folder, ignore_errors=True)
