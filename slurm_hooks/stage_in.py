"""A cloud node's stage-in, run by the node Prolog (hooks.py) where `[hooks] stage_dir`
and `[agent] send_to` are set: ask the controller's daemon which paths the job wants
(accounting_bridge/nvml/stage_wire.py, over the agents' MUNGE channel: a node holds no
ledger credentials), copy them as the job's user into STAGE_DIR/job_<id>/, and say what
was copied, how many bytes and how long it took.

The copy runs in a child process with the job user's uid, gid and groups (`python -m
slurm_hooks.stage_in DEST PATH...`): a path the user cannot read fails as it would for
them, and root's rights never reach a user's path. A failed copy is recorded with its
reason and the job still starts (its script finds its data missing, as it would have
without the stage-in); the Prolog never fails a job or drains a node for a user's path.

Each path lands under its last name: /data/set.tar -> STAGE_DIR/job_<id>/set.tar, a
directory with its tree (symbolic links copied as links); anything but regular files and
directories (a device, a pipe) is refused. The copy is given `hooks.stage_timeout_seconds`
(600 s), which a site keeps below Slurm's PrologEpilogTimeout. STAGE_DIR must be root's
and writable by no one else (it is made so when missing): root makes, chowns and removes
only `job_<id>` inside it, through a descriptor of it, so no user can point root
elsewhere. The node Epilog removes the job's folder.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

CREDENTIAL_TTL_SECONDS = 60  # accounting_bridge/nvml/channel.py's
COPY_TIMEOUT_SECONDS = 600  # the default of hooks.stage_timeout_seconds
PENDING_WAIT_SECONDS = 30  # for paths still being submitted (stage_wire.py's "pending")
MAX_REPLY_BYTES = 1 << 20


class StageError(Exception):
    """The daemon could not be asked or refused: nothing was staged."""


def job_folder(stage_dir: str, node: str, job_id: int) -> str:
    return os.path.join(stage_dir.replace("%n", node), f"job_{job_id}")


def ask(addresses: Sequence[str], munge_socket: str | None, document: dict[str, Any], timeout: float) -> Any:
    """Send `document` in a MUNGE credential to the first daemon that answers; its result."""
    argv = [
        "munge",
        "--ttl",
        str(CREDENTIAL_TTL_SECONDS),
        *(["--socket", munge_socket] if munge_socket else []),
    ]
    try:  # munge(1), not libmunge: a hook process imports the standard library only
        made = subprocess.run(
            argv,
            input=json.dumps(document, separators=(",", ":")),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise StageError(f"munge: {error}") from None
    if made.returncode != 0:
        raise StageError(f"munge: {made.stderr.strip() or made.returncode}")
    credential = made.stdout.strip()
    failures = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as connection:
                connection.sendall(credential.encode("ascii") + b"\n")
                connection.shutdown(socket.SHUT_WR)
                reply = b""
                while not reply.endswith(b"\n") and len(reply) < MAX_REPLY_BYTES:
                    chunk = connection.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
        except (OSError, ValueError) as error:
            failures.append(f"{address}: {error}")
            continue
        try:
            answer = json.loads(reply)
        except ValueError:
            raise StageError(f"{address}: not an answer: {reply[:80]!r}") from None
        if isinstance(answer, dict) and answer.get("ok") is True:
            return answer.get("result")
        said = answer.get("error", {}) if isinstance(answer, dict) else {}
        raise StageError(f"{address} refused: {said.get('code')}: {said.get('message')}")
    raise StageError("; ".join(failures) or "agent.send_to names no daemon")


def _stage_root(stage_dir: str, node: str, *, make: bool) -> int | None:
    """An fd of the node's stage folder (made when `make` and missing; None when missing),
    refused unless it is a directory, not a link, of root's that no one else may write:
    root acts only inside it, on names it made, so no user can point it elsewhere."""
    path = stage_dir.replace("%n", node)
    if make:
        os.makedirs(path, mode=0o755, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    info = os.fstat(fd)
    if info.st_uid != 0 or info.st_mode & 0o022:
        os.close(fd)
        mode = f"{info.st_mode & 0o7777:o}"
        raise OSError(f"{path} is not root's alone (uid {info.st_uid}, mode {mode}): nothing staged there")
    return fd


def stage(
    stage_dir: str,
    node: str,
    job_id: int,
    user: str,
    paths: Sequence[str],
    timeout: float = COPY_TIMEOUT_SECONDS,
) -> tuple[str, int, int, int, str | None]:
    """Copy `paths` as `user` into the node's stage folder: (the job's folder, files, bytes,
    milliseconds, error or None). OSError when the stage folder is unsafe or unusable."""
    started = time.monotonic()
    folder = job_folder(stage_dir, node, job_id)
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        return folder, 0, 0, 0, f"no user {user} on this node"
    root = _stage_root(stage_dir, node, make=True)
    assert root is not None
    name = f"job_{job_id}"
    try:
        shutil.rmtree(name, dir_fd=root, ignore_errors=True)  # a requeued run's, if its Epilog left it
        os.mkdir(name, 0o700, dir_fd=root)
        os.chown(name, account.pw_uid, account.pw_gid, dir_fd=root, follow_symlinks=False)
    finally:
        os.close(root)
    try:
        child = subprocess.run(
            # -I: the user's site-packages and environment never reach this interpreter
            [sys.executable, "-I", "-m", "slurm_hooks.stage_in", folder, *paths],
            user=account.pw_uid,
            group=account.pw_gid,
            extra_groups=os.getgrouplist(user, account.pw_gid),
            env={"PATH": "/usr/bin:/bin", "HOME": account.pw_dir, "LANG": "C.UTF-8"},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        result = json.loads(child.stdout) if child.returncode == 0 else None
        if not isinstance(result, dict):
            why = (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1]
            raise ValueError(why)
        files, size, error = int(result["files"]), int(result["bytes"]), result.get("error")
    except subprocess.TimeoutExpired:
        files, size, error = 0, 0, f"not copied within {timeout:g} s (hooks.stage_timeout_seconds)"
    except (OSError, ValueError, KeyError, TypeError) as failure:
        files, size, error = 0, 0, f"the copy failed: {failure}"
    return folder, files, size, int((time.monotonic() - started) * 1000), error


def remove(stage_dir: str, node: str, job_id: int) -> None:
    """The Epilog's: the job's folder, inside the node's stage folder (when it is safe)."""
    root = _stage_root(stage_dir, node, make=False)
    if root is None:
        return
    try:  # fd-based: a user's link inside is removed, never followed
        shutil.rmtree(f"job_{job_id}", dir_fd=root, ignore_errors=True)
    finally:
        os.close(root)


def _regular(source: str, target: str) -> str:
    """copytree's copy: regular files only (a device or a pipe would never end)."""
    if not stat.S_ISREG(os.stat(source).st_mode):
        raise OSError(errno.EINVAL, "not a regular file", source)
    return str(shutil.copy2(source, target))


def copy(folder: str, paths: Sequence[str]) -> dict[str, Any]:
    """The child's work, as the job's user: each path under its last name; regular files
    and directories only (links inside a directory are copied as links)."""
    files = size = 0
    names: set[str] = set()
    for path in paths:
        name = os.path.basename(path.rstrip("/"))
        if not name or name in names:
            return {"files": files, "bytes": size, "error": f"{path}: two paths would both be {name or '/'}"}
        names.add(name)
        target = os.path.join(folder, name)
        try:
            kind = os.stat(path).st_mode
            if stat.S_ISDIR(kind):
                shutil.copytree(path, target, symlinks=True, copy_function=_regular)
                for root, _dirs, found in os.walk(target):
                    for each in found:
                        entry = os.lstat(os.path.join(root, each))
                        files += 1
                        size += entry.st_size if stat.S_ISREG(entry.st_mode) else 0
            elif stat.S_ISREG(kind):
                shutil.copy2(path, target)
                files += 1
                size += os.stat(target).st_size
            else:
                return {"files": files, "bytes": size, "error": f"{path}: not a regular file or directory"}
        except shutil.Error as error:  # copytree's: every file that failed, the first said
            first = error.args[0][0] if error.args and error.args[0] else ("", "", str(error))
            return {"files": files, "bytes": size, "error": f"{path}: {first[2]}"}
        except OSError as error:
            return {"files": files, "bytes": size, "error": f"{path}: {error.strerror or error}"}
    return {"files": files, "bytes": size, "error": None}


if __name__ == "__main__":
    print(json.dumps(copy(sys.argv[1], sys.argv[2:])))
