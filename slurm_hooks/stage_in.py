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
directory with its tree (symbolic links copied as links). The node Epilog removes the
job's folder.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

CREDENTIAL_TTL_SECONDS = 60  # accounting_bridge/nvml/channel.py's
COPY_TIMEOUT_SECONDS = 3600
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


def stage(folder: str, user: str, paths: Sequence[str]) -> tuple[int, int, int, str | None]:
    """Copy `paths` into `folder` as `user`: (files, bytes, milliseconds, error or None)."""
    started = time.monotonic()
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        return 0, 0, 0, f"no user {user} on this node"
    os.makedirs(os.path.dirname(folder), mode=0o755, exist_ok=True)
    shutil.rmtree(folder, ignore_errors=True)  # a requeued run's copy, if its Epilog left one
    os.mkdir(folder, 0o700)
    os.chown(folder, account.pw_uid, account.pw_gid)
    try:
        child = subprocess.run(
            [sys.executable, "-m", "slurm_hooks.stage_in", folder, *paths],
            user=account.pw_uid,
            group=account.pw_gid,
            extra_groups=os.getgrouplist(user, account.pw_gid),
            env={"PATH": "/usr/bin:/bin", "HOME": account.pw_dir, "LANG": "C.UTF-8"},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=COPY_TIMEOUT_SECONDS,
            check=False,
        )
        result = json.loads(child.stdout or "{}")
        files, size, error = int(result["files"]), int(result["bytes"]), result.get("error")
    except subprocess.TimeoutExpired:
        files, size, error = 0, 0, f"not copied within {COPY_TIMEOUT_SECONDS} s"
    except (OSError, ValueError, KeyError, TypeError) as failure:
        files, size, error = 0, 0, f"the copy failed: {failure}"
    return files, size, int((time.monotonic() - started) * 1000), error


def copy(folder: str, paths: Sequence[str]) -> dict[str, Any]:
    """The child's work, as the job's user: each path under its last name."""
    files = size = 0
    names: set[str] = set()
    for path in paths:
        name = os.path.basename(path.rstrip("/"))
        if not name or name in names:
            return {"files": files, "bytes": size, "error": f"{path}: two paths would both be {name or '/'}"}
        names.add(name)
        target = os.path.join(folder, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.copytree(path, target, symlinks=True)
                for root, _dirs, found in os.walk(target):
                    for each in found:
                        stat = os.lstat(os.path.join(root, each))
                        files += 1
                        size += stat.st_size if not os.path.islink(os.path.join(root, each)) else 0
            else:
                shutil.copy2(path, target, follow_symlinks=True)
                files += 1
                size += os.stat(target).st_size
        except (OSError, shutil.Error) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            return {"files": files, "bytes": size, "error": f"{path}: {reason}"}
    return {"files": files, "bytes": size, "error": None}


if __name__ == "__main__":
    print(json.dumps(copy(sys.argv[1], sys.argv[2:])))
