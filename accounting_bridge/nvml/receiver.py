"""The controller's end of the agents' channel (channel.py): `gpucredit daemon` runs it on
`daemon.agent_listen` (host:port). Each connection carries one MUNGE credential; the
receiver believes it only when:

- the local munged decodes it (the cluster's key: not forged, not expired, not from the
  future, and never decoded before: munged's replay cache);
- it was encoded by root or by `daemon.socket_user` (the SlurmUser), not by a user's job;
- it is at most CREDENTIAL_TTL_SECONDS old by this host's clock (a replay after munged
  restarted, which empties its cache, is refused too);

and then writes its rows with `ledger.api.add_gpu_usage` in one transaction (or, for a
cloud node's stage-in, answers or records it: stage_wire.py). The answer
to a credential it wrote is kept until the credential expires: the agent resends a
credential whose answer it lost, and gets the first answer again, nothing written twice.
Refusals name what failed (`unauthenticated`, `expired`, `replayed`, `forbidden`,
`bad_request`, `unavailable`) and are logged with the peer's address.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from accounting_bridge.nvml.channel import CREDENTIAL_TTL_SECONDS, MAX_LINE_BYTES, decode_usage
from accounting_bridge.nvml.munge import (
    EMUNGE_CRED_EXPIRED,
    EMUNGE_CRED_REPLAYED,
    EMUNGE_CRED_REWOUND,
    Munge,
    MungeError,
)
from accounting_bridge.nvml.stage_wire import answer_stage, is_stage_payload
from ledger.api import add_gpu_usage
from ledger.errors import LedgerError

__all__ = ["UsageReceiver", "allowed_uids"]

log = logging.getLogger("gpucredit.daemon.agents")
READ_TIMEOUT_SECONDS = 10.0  # a sender that stalls mid-line is dropped
CLOCK_SKEW_SECONDS = 5  # a credential may say it was made this far in our future


def allowed_uids(socket_user: str | None) -> frozenset[int]:
    """root, and the SlurmUser the daemon's socket is given to (`daemon.socket_user`)."""
    uids = {0}
    if socket_user:
        import pwd

        uids.add(pwd.getpwnam(socket_user).pw_uid)
    return frozenset(uids)


def _error(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": code, "message": message}}


class UsageReceiver:
    def __init__(
        self,
        munge: Munge,
        sessions: Callable[[], Session],
        *,
        allowed: Collection[int] = frozenset({0}),
        clock: Callable[[], float] = time.time,
        writers: int = 2,
        cloud_partitions: Collection[str] = frozenset(),
    ) -> None:
        self.munge = munge
        self.cloud_partitions = frozenset(cloud_partitions)
        self.sessions = sessions
        self.allowed = frozenset(allowed)
        self.clock = clock
        # Writes at once: the hooks' batches share the daemon's connection pool.
        self._writers = threading.BoundedSemaphore(writers)
        self._lock = threading.Lock()
        self._answered: dict[bytes, tuple[float, dict[str, Any]]] = {}
        self.rows_written = 0
        self.batches_written = 0

    def answer(self, line: bytes, peer: str = "?") -> dict[str, Any]:
        """The answer to one credential line (what the server sends back)."""
        credential = line.strip()
        digest = hashlib.sha256(credential).digest()
        with self._lock:
            kept = self._answered.get(digest)
        if kept is not None:
            return kept[1]
        try:
            decoded = self.munge.decode(credential.decode("ascii"))
        except (UnicodeDecodeError, MungeError) as error:
            return self._refused(peer, *_munge_refusal(error))
        now = self.clock()
        if decoded.uid not in self.allowed:
            return self._refused(
                peer, "forbidden", f"uid {decoded.uid} may not send GPU usage (root or SlurmUser)"
            )
        if not now - CREDENTIAL_TTL_SECONDS <= decoded.encoded_at <= now + CLOCK_SKEW_SECONDS:
            return self._refused(
                peer,
                "expired",
                f"credential made {int(now - decoded.encoded_at)} s ago (at most {CREDENTIAL_TTL_SECONDS})",
            )
        try:
            document = json.loads(decoded.payload)
        except ValueError:
            document = None
        rows = 0
        try:
            if is_stage_payload(document):
                with self._writers, self.sessions() as s, s.begin():
                    result = answer_stage(s, document, self.cloud_partitions, datetime.now(UTC))
                node = str(document.get("node"))
            else:
                node, deltas = decode_usage(decoded.payload)
                with self._writers, self.sessions() as s, s.begin():
                    rows = add_gpu_usage(s, deltas)
                result = {"rows": rows}
        except ValueError as error:
            return self._refused(peer, "bad_request", str(error))
        except LedgerError as error:
            return self._refused(peer, error.code, error.message)
        except Exception as error:  # the database: nothing written, the agent sends again
            log.error("agent message from %s not written: %s", peer, error)
            return _error("unavailable", "the ledger database is unavailable")
        reply = {"ok": True, "result": result}
        log.debug("agent message from %s (%s) answered", node, peer)
        with self._lock:
            self._answered[digest] = (decoded.encoded_at + CREDENTIAL_TTL_SECONDS + CLOCK_SKEW_SECONDS, reply)
            self.rows_written += rows
            self.batches_written += 1 if "rows" in result else 0
            if len(self._answered) > 1024:
                self._answered = {k: v for k, v in self._answered.items() if v[0] >= now}
        return reply

    def _refused(self, peer: str, code: str, message: str) -> dict[str, Any]:
        log.warning("agent usage from %s refused: %s: %s", peer, code, message)
        return _error(code, message)

    def serve(
        self, host: str, port: int, stop: threading.Event, ready: threading.Event | None = None
    ) -> threading.Thread:
        """Listen on host:port in a thread of its own (a thread per connection) until `stop`."""
        receiver = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = READ_TIMEOUT_SECONDS

            def handle(self) -> None:
                peer = f"{self.client_address[0]}:{self.client_address[1]}"
                try:
                    line = self.rfile.readline(MAX_LINE_BYTES + 1)
                except OSError:
                    return
                if len(line) > MAX_LINE_BYTES:
                    reply = _error("bad_request", f"a credential line is at most {MAX_LINE_BYTES} bytes")
                else:
                    reply = receiver.answer(line, peer)
                with contextlib.suppress(OSError):  # the sender left: it will ask again
                    self.wfile.write(json.dumps(reply).encode() + b"\n")

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        server = Server((host, port), Handler)

        def run() -> None:
            def stop_serving() -> None:
                stop.wait()
                server.shutdown()

            threading.Thread(target=stop_serving, daemon=True).start()
            try:
                server.serve_forever(poll_interval=0.5)
            finally:
                server.server_close()

        thread = threading.Thread(target=run, name="gpucredit-agents", daemon=True)
        thread.start()
        log.info("taking the agents' GPU usage on %s:%s (MUNGE)", host, server.server_address[1])
        self.address = server.server_address
        if ready is not None:
            ready.set()
        return thread


def _munge_refusal(error: Exception) -> tuple[str, str]:
    if not isinstance(error, MungeError):
        return "unauthenticated", "not a MUNGE credential"
    if error.code == EMUNGE_CRED_REPLAYED:
        return "replayed", error.message
    if error.code in (EMUNGE_CRED_EXPIRED, EMUNGE_CRED_REWOUND):
        return "expired", error.message
    return "unauthenticated", error.message
