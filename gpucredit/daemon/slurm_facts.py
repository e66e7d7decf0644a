"""What the daemon knows about Slurm, learned in the background: partitions and their GPU types.

The daemon answers job_submit.lua inside slurmctld's 1 s deadline, so no request may
wait on a Slurm command (`sinfo` alone can take seconds while slurmctld is busy, and
it waits on slurmctld's own locks). A background thread runs `sinfo` at start and
every `daemon.slurm_refresh_seconds`; a request only reads the current table.

Before the first refresh succeeds (a cold start, or slurmctld not answering yet),
`gpu_types` answers None: "not known yet". job_submit then estimates untyped GPUs at
the dearest GPU type the ledger has a price for, and says so in its message; the
estimate can only be too high, and the prolog's hold prices the job's real GPU types.
A refresh that fails later keeps the last table it learned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from accounting_bridge.slurm.slurmcmd import SlurmCommandError
from slurmtext import SlurmTextError, parse_sinfo_gpu_types

__all__ = ["SINFO_ARGV", "SlurmFacts"]

log = logging.getLogger("gpucredit.daemon")

SINFO_ARGV = ("sinfo", "-h", "-o", "%R|%G")
# Until the first refresh succeeds, retry at least this often: the daemon often starts
# before slurmctld answers, and the fallback estimate is the dearest type.
FIRST_REFRESH_RETRY_SECONDS = 5.0
ALL_PARTITIONS = "*"


class SlurmFacts:
    """The latest partition table; `run` refreshes it until stopped. No I/O until `refresh`."""

    def __init__(self, run: Callable[..., str], refresh_seconds: float = 60.0) -> None:
        if refresh_seconds <= 0:
            raise ValueError(f"daemon.slurm_refresh_seconds must be positive, got {refresh_seconds}")
        self._run = run
        self.refresh_seconds = float(refresh_seconds)
        # Replaced whole by the refresher, never mutated: a reader needs no lock.
        self._partition_types: Mapping[str, list[str]] | None = None
        self.learned = threading.Event()  # set once the first refresh has succeeded

    def gpu_types(self, partition: str | None) -> list[str] | None:
        """GPU types `partition` offers (every partition's types for the default or an
        unknown partition); None until Slurm has been read once."""
        table = self._partition_types
        if table is None:
            return None
        return list(table.get(partition or "", table.get(ALL_PARTITIONS, [])))

    @property
    def table(self) -> Mapping[str, list[str]] | None:
        """The latest table itself, replaced whole when a refresh finds it changed: what an
        answer kept for later (quote_memo) was worked out from."""
        return self._partition_types

    def refresh(self) -> None:
        """Run sinfo once and swap the table in. A failed command (SlurmCommandError) or
        output that does not parse (SlurmTextError) leaves the old table."""
        table: dict[str, list[str]] = parse_sinfo_gpu_types(self._run(list(SINFO_ARGV)))
        table[ALL_PARTITIONS] = sorted({t for types in table.values() for t in types})
        if table != self._partition_types:  # the same table stays the same object
            self._partition_types = table
        self.learned.set()

    def run(self, stop: threading.Event, on_error: Callable[[Any], None] | None = None) -> None:
        """Refresh now, then every `refresh_seconds` (sooner until the first success)."""
        while not stop.is_set():
            try:
                self.refresh()
            except (SlurmCommandError, SlurmTextError) as error:
                (on_error or _log_error)(error)
            wait = self.refresh_seconds
            if not self.learned.is_set():
                wait = min(wait, FIRST_REFRESH_RETRY_SECONDS)
            stop.wait(wait)


def _log_error(error: Any) -> None:
    log.warning("reading partitions from sinfo failed (%s); keeping what was known", error)
