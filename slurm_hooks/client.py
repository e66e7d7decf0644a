"""Client of the resident `gpucredit daemon` over its Unix socket.

Stdlib only and cheap to import: Slurm hooks start a fresh interpreter per
job, so nothing here may pull in click, SQLAlchemy or the ledger.

Failover (two controllers, docs/admin-guide.md "Two controllers"): the client may
be given several daemon sockets, tried in order within ONE overall deadline. A
daemon that is missing, refuses, hangs, garbles its reply or says `unavailable`
is skipped for the next; an answer (a result or a refusal) is final. Each try
gets an equal share of the time left, so a hanging first daemon still leaves the
next one half the deadline. Nothing is remembered between calls: hooks are
one-shot processes. Retrying on another daemon is safe because every request is
idempotent per job run and both daemons share one database.

Wire protocol: one UTF-8 JSON object per line with an "op" key; one reply
line, `{"ok": true, "result": {...}}` or
`{"ok": false, "error": {"code", "message", "details"}}`.

Errors::

    DaemonError
    ├── DaemonUnreachable   no answer we can use: missing socket, refused
    │                       connection, timeout, garbled reply, or the
    │                       daemon saying it is itself `unavailable`
    └── DaemonRefused       the daemon answered no: .code .message .details
"""

from __future__ import annotations

# The C module under `socket`: socket.py itself turns its constants into enums at
# import, ~3 ms in every hook process, and the hooks need only a Unix stream socket.
import _socket
import json
import time

# `typing` costs milliseconds to import and is needed only by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = [
    "DEFAULT_SOCKET",
    "DEFAULT_TIMEOUT_SECONDS",
    "DaemonClient",
    "DaemonError",
    "DaemonRefused",
    "DaemonUnreachable",
]

DEFAULT_SOCKET = "/run/gpucredit/daemon.sock"
DEFAULT_TIMEOUT_SECONDS = 2.0

# A reply longer than this is not one of ours.
MAX_REPLY_BYTES = 1 << 20

# Error codes meaning "the daemon is up but cannot answer" (e.g. its database
# is down): callers treat them like an unreachable daemon (site policy).
UNAVAILABLE_CODES = frozenset({"unavailable"})


class DaemonError(Exception):
    """Base of the client's errors."""


class DaemonUnreachable(DaemonError):
    """No usable answer from the daemon; the caller applies site policy."""


class DaemonRefused(DaemonError):
    """The daemon answered with an error (`insufficient_credits`, `not_found`...)."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details or {}


class DaemonClient:
    """One request per connection; `timeout` bounds the whole call, failovers included.

    `socket_path` is one path or a sequence of paths (primary first).
    """

    def __init__(
        self, socket_path: str | Sequence[str] = DEFAULT_SOCKET, timeout: float = DEFAULT_TIMEOUT_SECONDS
    ) -> None:
        paths = (socket_path,) if isinstance(socket_path, str) else tuple(socket_path)
        if not paths:
            raise ValueError("DaemonClient needs at least one socket path")
        self.socket_paths = paths
        self.socket_path = paths[0]
        self.timeout = timeout

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send `op` with `fields`; return the reply's `result` object.

        Tries each socket in order until one answers; raises DaemonUnreachable
        with every socket's reason when none does within `timeout`.
        """
        request = json.dumps({"op": op, **fields}, ensure_ascii=True, separators=(",", ":"))
        payload = request.encode("ascii") + b"\n"
        deadline = time.monotonic() + self.timeout
        failures: list[DaemonUnreachable] = []
        count = len(self.socket_paths)
        for index, path in enumerate(self.socket_paths):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                failures.append(
                    DaemonUnreachable(f"{path}: not tried, the {self.timeout:g} s deadline passed")
                )
                continue
            share = remaining / (count - index)  # equal shares of what is left
            try:
                return self._decode(path, self._exchange(path, payload, share))
            except DaemonUnreachable as e:
                failures.append(e)
        if len(failures) == 1:
            raise failures[0]
        raise DaemonUnreachable("no daemon answered: " + "; ".join(str(f) for f in failures))

    def _exchange(self, path: str, payload: bytes, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        try:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                self._connect(sock, path, deadline)
                sock.sendall(payload)
                chunks: list[bytes] = []
                received = 0
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DaemonUnreachable(f"no reply from {path} within {timeout:g} s")
                    sock.settimeout(remaining)
                    chunk = sock.recv(65536)
                    if not chunk:
                        break  # closed: take what we have
                    newline = chunk.find(b"\n")
                    if newline >= 0:
                        chunks.append(chunk[:newline])
                        break
                    chunks.append(chunk)
                    received += len(chunk)
                    if received > MAX_REPLY_BYTES:
                        raise DaemonUnreachable(f"reply from {path} is too long")
            finally:
                sock.close()
        except TimeoutError as e:
            raise DaemonUnreachable(f"no reply from {path} within {timeout:g} s") from e
        except OSError as e:  # missing socket, refused, reset, permission
            raise DaemonUnreachable(f"cannot reach {path}: {e}") from e
        return b"".join(chunks)

    @staticmethod
    def _connect(sock: _socket.socket, path: str, deadline: float) -> None:
        """Connect, waiting while the daemon's listen backlog is full.

        A Unix stream socket with a timeout does not wait for room in a full backlog:
        connect fails at once with EAGAIN (seen with 16 hooks at once against a
        backlog of 5). A burst of prologs (an array starting) must queue, not fail.
        """
        pause = 0.002
        while True:
            try:
                sock.connect(path)
                return
            except BlockingIOError:
                if time.monotonic() + pause >= deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.05)

    def _decode(self, path: str, raw: bytes) -> dict[str, Any]:
        if not raw.strip():
            raise DaemonUnreachable(f"empty reply from {path}")
        try:
            reply = json.loads(raw)
        except ValueError as e:  # includes UnicodeDecodeError
            raise DaemonUnreachable(f"garbled reply from {path}: {raw[:80]!r}") from e
        if not isinstance(reply, dict):
            raise DaemonUnreachable(f"garbled reply from {path}: {raw[:80]!r}")
        if reply.get("ok") is True and isinstance(reply.get("result"), dict):
            return reply["result"]
        error = reply.get("error")
        if reply.get("ok") is False and isinstance(error, dict):
            code = str(error.get("code") or "error")
            message = str(error.get("message") or code)
            details = error.get("details")
            if code in UNAVAILABLE_CODES:
                raise DaemonUnreachable(f"daemon at {path} unavailable: {message}")
            raise DaemonRefused(code, message, details if isinstance(details, dict) else None)
        raise DaemonUnreachable(f"garbled reply from {path}: {raw[:80]!r}")
