"""How a GPU node's agent hands its samples to the controller without ledger credentials.

The agent wraps each batch of usage rows in a MUNGE credential (munge.py) and sends it
over TCP to a controller's `gpucredit daemon` (`agent.send_to`, tried in order), whose
receiver (receiver.py) checks the credential with its own munged and writes the rows.
No GPU node holds the database's address or password, and the controller holds the
only database connections (one pool, not one per node).

Wire: one line each way. The agent sends the credential's text and a newline; the
receiver answers one JSON line, {"ok": true, "result": {"rows": N}} or {"ok": false,
"error": {"code", "message"}}. Inside the credential, the payload is JSON:

    {"v": 1, "node": "gpu17", "rows": [[cluster, job_id, run, gres, allocated_gpu_seconds,
     busy_gpu_seconds, energy_joules, peak_memory_bytes], ...]}

Rows are increments (the peak memory is a peak), as `ledger.api.add_gpu_usage` adds
them. So a batch written twice would count twice, and the receiver answers a
credential it has already written with its first answer instead (receiver.py); the
agent resends the very same credential when a send's answer was lost (`Unsure`), to
the same receiver, and only munged's replay cache could answer "replayed" after that.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Sequence
from typing import Any

from accounting_bridge.nvml.munge import Munge, MungeError
from ledger.api import UsageDelta

__all__ = [
    "CREDENTIAL_TTL_SECONDS",
    "DEFAULT_PORT",
    "MAX_LINE_BYTES",
    "MAX_ROWS",
    "MungeSender",
    "NotSent",
    "Unsure",
    "decode_usage",
    "encode_usage",
    "parse_address",
]

DEFAULT_PORT = 9468
# A credential lives this long: the receiver refuses older ones, and an agent that could
# not learn a batch's fate within it counts the batch as written (never twice).
CREDENTIAL_TTL_SECONDS = 60
MAX_ROWS = 2_000  # rows in one credential: a node has a handful of runs and GPU types
MAX_LINE_BYTES = 512 * 1024  # a credential of MAX_ROWS rows, base64, fits with room
_FIELDS = ("cluster", "job_id", "run", "gres")
_NUMBERS = ("allocated_gpu_seconds", "busy_gpu_seconds", "energy_joules", "peak_memory_bytes")


class NotSent(Exception):
    """No receiver took the batch: nothing was written (send it again)."""


class Unsure(Exception):
    """The batch went out but no answer came back: it may have been written."""


def parse_address(text: str) -> tuple[str, int]:
    """`host:port`, `host` (DEFAULT_PORT) or `[v6]:port`."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":") or str(DEFAULT_PORT)
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, str(DEFAULT_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port: {text!r}")
    return host, int(port)


def encode_usage(node: str, deltas: Sequence[UsageDelta]) -> bytes:
    rows = [[*(getattr(d, f) for f in _FIELDS), *(getattr(d, n) for n in _NUMBERS)] for d in deltas]
    return json.dumps({"v": 1, "node": node, "rows": rows}, separators=(",", ":")).encode()


def decode_usage(payload: bytes) -> tuple[str, list[UsageDelta]]:
    """The node and its rows; ValueError for anything else (the ledger checks the values)."""
    document = json.loads(payload)
    if not isinstance(document, dict) or document.get("v") != 1:
        raise ValueError("not a version 1 usage payload")
    node, rows = document.get("node"), document.get("rows")
    if not isinstance(node, str) or not node or not isinstance(rows, list) or len(rows) > MAX_ROWS:
        raise ValueError(f"a payload names its node and at most {MAX_ROWS} rows")
    deltas = []
    for row in rows:
        if not isinstance(row, list) or len(row) != 8:
            raise ValueError("a usage row has 8 fields")
        cluster, job_id, run, gres, *numbers = row
        if not isinstance(cluster, str) or not isinstance(gres, str):
            raise ValueError("a row's cluster and GPU type are text")
        if any(not isinstance(v, int) or isinstance(v, bool) for v in (job_id, run, *numbers)):
            raise ValueError("a row's job, run and figures are integers")
        deltas.append(UsageDelta(cluster, job_id, run, node, gres, *numbers))
    return node, deltas


class MungeSender:
    """The agent's end: `send(deltas)` returns once a receiver has written them; raises
    NotSent (nothing written, try again) or Unsure (maybe written: `settle` learns it)."""

    def __init__(
        self,
        munge: Munge,
        addresses: Sequence[tuple[str, int]],
        node: str,
        *,
        timeout_seconds: float = 10.0,
        clock: Any = time.monotonic,
    ) -> None:
        if not addresses:
            raise ValueError("agent.send_to names no receiver")
        self.munge = munge
        self.addresses = list(addresses)
        self.node = node
        self.timeout_seconds = timeout_seconds
        self.clock = clock
        # The credential whose answer was lost: where it went, and when it stops counting.
        self.unsure: tuple[str, tuple[str, int], float] | None = None

    def send(self, deltas: Sequence[UsageDelta]) -> int:
        written = 0
        for start in range(0, len(deltas), MAX_ROWS):
            part = deltas[start : start + MAX_ROWS]
            try:
                credential = self.munge.encode(encode_usage(self.node, part), CREDENTIAL_TTL_SECONDS)
            except MungeError as error:  # munged down on this node: nothing went out
                raise NotSent(f"munge: {error.message}") from None
            written += self._send_one(credential)
        return written

    def _send_one(self, credential: str) -> int:
        failures = []
        for address in self.addresses:
            try:
                connection = socket.create_connection(address, timeout=self.timeout_seconds)
            except OSError as error:
                failures.append(f"{address[0]}:{address[1]}: {error.strerror or error}")
                continue
            try:
                reply = self._exchange(connection, credential)
            except OSError as error:  # it went out; whether it was written is not known
                self.unsure = (credential, address, self.clock() + CREDENTIAL_TTL_SECONDS)
                raise Unsure(f"{address[0]}:{address[1]}: no answer ({error})") from None
            return self._rows(reply, address)
        raise NotSent("; ".join(failures))

    def _exchange(self, connection: socket.socket, credential: str) -> bytes:
        with connection:
            connection.sendall(credential.encode("ascii") + b"\n")
            connection.shutdown(socket.SHUT_WR)
            reply = b""
            while not reply.endswith(b"\n") and len(reply) < 65536:
                chunk = connection.recv(65536)
                if not chunk:
                    break
                reply += chunk
        if not reply.endswith(b"\n"):
            raise ConnectionError("the receiver closed without an answer")
        return reply

    def _rows(self, reply: bytes, address: tuple[str, int]) -> int:
        try:
            answer = json.loads(reply)
        except ValueError:
            raise NotSent(f"{address[0]}:{address[1]}: not an answer: {reply[:80]!r}") from None
        if isinstance(answer, dict) and answer.get("ok") is True:
            return int(answer.get("result", {}).get("rows", 0))
        error = answer.get("error", {}) if isinstance(answer, dict) else {}
        raise NotSent(f"{address[0]}:{address[1]} refused: {error.get('code')}: {error.get('message')}")

    def settle(self) -> bool:
        """Whether the batch whose answer was lost was written: resend its credential to the
        same receiver, which answers a credential it wrote with its first answer. True when
        written, or when its fate can no longer be learnt (counted once, never twice);
        False when the receiver never wrote it. Raises NotSent while still unknown."""
        if self.unsure is None:
            return False
        credential, address, expires = self.unsure
        if self.clock() >= expires:
            self.unsure = None
            return True
        try:
            connection = socket.create_connection(address, timeout=self.timeout_seconds)
            reply = self._exchange(connection, credential)
        except OSError as error:
            raise NotSent(f"{address[0]}:{address[1]}: {error}") from None
        self.unsure = None
        try:
            self._rows(reply, address)
        except NotSent:  # refused: expired or replayed without a write, or never valid
            return False
        return True
