"""Client of the resident `gpucredit daemon` over its Unix socket.

Stdlib only and cheap to import: Slurm hooks start a fresh interpreter per
job, so nothing here may pull in click, SQLAlchemy or the ledger.

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
    """One request per connection; `timeout` bounds the whole exchange."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = DEFAULT_TIMEOUT_SECONDS):
        self.socket_path = socket_path
        self.timeout = timeout

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send `op` with `fields`; return the reply's `result` object."""
        request = json.dumps({"op": op, **fields}, ensure_ascii=True, separators=(",", ":"))
        raw = self._exchange(request.encode("ascii") + b"\n")
        return self._decode(raw)

    def _exchange(self, payload: bytes) -> bytes:
        deadline = time.monotonic() + self.timeout
        try:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                sock.settimeout(self.timeout)
                sock.connect(self.socket_path)
                sock.sendall(payload)
                chunks: list[bytes] = []
                received = 0
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DaemonUnreachable(f"no reply from {self.socket_path} within {self.timeout:g} s")
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
                        raise DaemonUnreachable(f"reply from {self.socket_path} is too long")
            finally:
                sock.close()
        except TimeoutError as e:
            raise DaemonUnreachable(f"no reply from {self.socket_path} within {self.timeout:g} s") from e
        except OSError as e:  # missing socket, refused, reset, permission
            raise DaemonUnreachable(f"cannot reach {self.socket_path}: {e}") from e
        return b"".join(chunks)

    def _decode(self, raw: bytes) -> dict[str, Any]:
        if not raw.strip():
            raise DaemonUnreachable(f"empty reply from {self.socket_path}")
        try:
            reply = json.loads(raw)
        except ValueError as e:  # includes UnicodeDecodeError
            raise DaemonUnreachable(f"garbled reply from {self.socket_path}: {raw[:80]!r}") from e
        if not isinstance(reply, dict):
            raise DaemonUnreachable(f"garbled reply from {self.socket_path}: {raw[:80]!r}")
        if reply.get("ok") is True and isinstance(reply.get("result"), dict):
            return reply["result"]
        error = reply.get("error")
        if reply.get("ok") is False and isinstance(error, dict):
            code = str(error.get("code") or "error")
            message = str(error.get("message") or code)
            details = error.get("details")
            if code in UNAVAILABLE_CODES:
                raise DaemonUnreachable(f"daemon unavailable: {message}")
            raise DaemonRefused(code, message, details if isinstance(details, dict) else None)
        raise DaemonUnreachable(f"garbled reply from {self.socket_path}: {raw[:80]!r}")
