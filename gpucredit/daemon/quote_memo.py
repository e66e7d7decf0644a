"""Replies to the submission lines job_submit.lua sent lately, worked out before they come again.

Inside slurmctld a quote's time is mostly the CPU fetching again what sbatch's own work
evicted: the whole answer (price, words, JSON) took ~150 µs of a ~0.35 ms check there,
sending a reply already made ~30 µs (bench.slurm_hooks). A site's submissions repeat a
few lines (nothing in one names the job: the same user, account, GPUs and time limit
give the same line), so the daemon keeps its reply to each line it lately accepted, and
works every kept line out again against each new picture of the ledger as the snapshot
thread takes it (every second), not when the line next comes.

Exact, not a guess: a kept reply is sent only while the picture and Slurm's partition
table are the very ones it was worked out from, and before the next price version takes
effect or the picture goes stale (Snapshot.quotes_hold_until). A refusal is never kept:
refusing first re-reads the ledger (Daemon._submit). The memo holds at most `max_lines`
lines and forgets one unused for `forget_after_seconds`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ledger.api import Snapshot

__all__ = ["Kept", "QuoteMemo"]

# A line's reply worked out against a snapshot, or None when the line is no quote (it gets
# the general path).
WorkOut = Callable[[bytes, Snapshot], "dict[str, Any] | None"]


class Kept:
    """One line's reply, and what it was worked out from."""

    __slots__ = ("encoded", "facts", "reply", "since", "snapshot", "until", "used")

    def __init__(
        self,
        snapshot: Snapshot,
        facts: object,
        window: tuple[float, float],
        reply: dict[str, Any],
        encoded: bytes,
        used: float,
    ) -> None:
        self.snapshot = snapshot
        self.facts = facts
        # time.time() from which, and until which, the reply is the one worked out then.
        self.since, self.until = window
        self.reply = reply
        self.encoded = encoded
        self.used = used


class QuoteMemo:
    """The kept replies, by line. `get` is called from the socket loop's thread, `keep`
    there too, `refill` from the snapshot thread; what `get` returns is read, never
    changed."""

    def __init__(
        self,
        work_out: WorkOut,
        facts: Callable[[], object],
        encode: Callable[[dict[str, Any]], bytes],
        *,
        max_lines: int = 256,
        forget_after_seconds: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._work_out = work_out
        self._facts = facts  # Slurm's partition table: replaced whole when re-read
        self._encode = encode
        self.max_lines = max_lines
        self.forget_after = forget_after_seconds
        self._clock = clock
        self._kept: dict[bytes, Kept] = {}
        # Taken to change the table; `get` reads one entry without it (and stamps `used`,
        # where a lost stamp only makes a line look idle a moment longer).
        self._lock = threading.Lock()
        self._window: tuple[Snapshot, tuple[float, float]] | None = None

    def get(self, line: bytes, snapshot: Snapshot) -> Kept | None:
        """The kept reply to `line` if it is still exactly the answer from `snapshot` now."""
        kept = self._kept.get(line)
        if kept is None or kept.snapshot is not snapshot or kept.facts is not self._facts():
            return None
        now = self._clock()
        if not kept.since <= now < kept.until:  # a clock stepped back is no later moment
            return None
        kept.used = now
        return kept

    def keep(
        self,
        line: bytes,
        snapshot: Snapshot,
        facts: object,
        reply: dict[str, Any],
        encoded: bytes,
    ) -> None:
        """Keep `reply` to `line`, worked out from `snapshot` and the partition table `facts`
        (read before it was worked out), if it accepts the job."""
        if not _accepts(reply):
            return
        kept = Kept(snapshot, facts, self._hold_window(snapshot), reply, encoded, self._clock())
        with self._lock:
            known = self._kept.get(line)
            if known is not None and known.snapshot.taken_at > snapshot.taken_at:
                return  # a refill got there first, from a newer picture
            self._kept[line] = kept
            self._trim()

    def refill(self, snapshot: Snapshot) -> None:
        """Work each line used lately out again against `snapshot`, the new picture; a line
        now refused, or no longer used, is dropped."""
        now = self._clock()
        with self._lock:
            lines = [line for line, kept in self._kept.items() if now - kept.used <= self.forget_after]
        window = self._hold_window(snapshot)
        fresh: dict[bytes, Kept] = {}
        for line in lines:
            facts = self._facts()
            reply = self._work_out(line, snapshot)
            if reply is not None and _accepts(reply):
                previous = self._kept.get(line)
                used = previous.used if previous is not None else now
                fresh[line] = Kept(snapshot, facts, window, reply, self._encode(reply), used)
            # Let the socket loop's thread have the interpreter between lines: a quote
            # arriving now waits for one line's work, not for the whole refill.
            time.sleep(0)
        with self._lock:
            # Lines kept meanwhile stay only if worked out from this picture as well.
            for line, kept in self._kept.items():
                if line not in fresh and kept.snapshot is snapshot:
                    fresh[line] = kept
            self._kept = fresh
            self._trim()

    def __len__(self) -> int:
        return len(self._kept)

    def _trim(self) -> None:
        """Drop the lines used longest ago beyond `max_lines` (under the lock)."""
        while len(self._kept) > self.max_lines:
            del self._kept[min(self._kept, key=lambda known: self._kept[known].used)]

    def _hold_window(self, snapshot: Snapshot) -> tuple[float, float]:
        known = self._window
        if known is None or known[0] is not snapshot:
            window = (snapshot.taken_at.timestamp(), snapshot.quotes_hold_until().timestamp())
            known = self._window = (snapshot, window)
        return known[1]


def _accepts(reply: Mapping[str, Any]) -> bool:
    result = reply.get("result")
    return reply.get("ok") is True and isinstance(result, Mapping) and result.get("decision") == "accept"
