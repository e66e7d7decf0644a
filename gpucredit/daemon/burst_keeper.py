"""The burst pass: cloud partitions held back at submit are added once a job has waited.

With `[routing] burst_after_seconds`, job_submit gives a job allowed both sites only its
on-premise partitions and names the cloud ones in its AdminComment
(`gpucredit-burst=cloud,burst`: users cannot edit an AdminComment). Every tick the
daemon lists the pending jobs (`squeue --Format`, no free text asked) and, for each
marked one that was submitted at least that long ago, runs

    scontrol update JobId=N Partition=onprem,cloud AdminComment=gpucredit-burst-sent

so Slurm may now start it in the cloud. Routing itself happened at submit (its quote is
the dearest allowed run, cloud included); the pass only lets that decision take effect.
Only partitions tagged `site = "cloud"` in the config are ever added, whatever a mark
says. Why the daemon: it is resident on the controller, where scontrol may update jobs,
and it already ticks every couple of seconds to release held jobs.

A job the prolog held for credit carries that hold's AdminComment instead, so it is
not burst (released, it waits on-premise).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection
from datetime import datetime, timedelta

from accounting_bridge.slurm.slurmcmd import Runner, SlurmCommandError
from job_submit.route_answer import BURST_MARK
from ledger.timeutil import utcnow
from slurmtext import SlurmTextError, parse_format_rows, parse_time

__all__ = ["SENT_MARK", "BurstKeeper"]

log = logging.getLogger("gpucredit.daemon")

SENT_MARK = "gpucredit-burst-sent"
SENT = f"AdminComment={SENT_MARK}"
FIELDS = ("JobID", "SubmitTime", "Partition", "admin_comment")
SQUEUE = (
    "squeue",
    "--all",
    "--noheader",
    "--states=PENDING",
    "--Format=" + ",".join(f"{f}:|" for f in FIELDS),
)


class BurstKeeper:
    """No I/O until `tick`; the runner and the clock are injectable."""

    def __init__(
        self,
        run: Runner,
        burst_after_seconds: int,
        cloud_partitions: Collection[str],
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.run = run
        self.wait = timedelta(seconds=burst_after_seconds)
        self.cloud = frozenset(cloud_partitions)
        self.clock = clock

    def tick(self) -> list[int]:
        """One pass; the jobs given their cloud partitions."""
        now = self.clock()
        burst = []
        for line in self.run(SQUEUE).split("\n"):
            if not line.strip():
                continue
            try:
                [row] = parse_format_rows(line, FIELDS)
                due = self._due(row, now)
            except SlurmTextError as error:  # one unreadable job never stops the others
                log.warning("burst pass: squeue line %r: %s", line[:200], error)
                continue
            if due is None:
                continue
            job_id, partitions = due
            try:
                self.run(["scontrol", "update", f"JobId={job_id}", f"Partition={partitions}", SENT])
            except SlurmCommandError as error:  # it started meanwhile, or ended
                log.info("burst pass: job %s: %s", job_id, error)
                continue
            log.info("job %s waited %s on-premise; now it may run in %s", job_id, self.wait, partitions)
            burst.append(job_id)
        return burst

    def _due(self, row: dict[str, str], now: datetime) -> tuple[int, str] | None:
        """(job id, its new partition list) when the job's wait is over, else None."""
        mark = row["admin_comment"]
        if not mark.startswith(BURST_MARK) or not (row["JobID"].isascii() and row["JobID"].isdigit()):
            return None
        submitted = parse_time(row["SubmitTime"])
        if submitted is None or now - submitted < self.wait:
            return None
        current = [name for name in row["Partition"].split(",") if name]
        later = [name for name in mark.removeprefix(BURST_MARK).split(",") if name in self.cloud]
        added = [name for name in dict.fromkeys(later) if name not in current]
        if not current or not added:
            return None
        return int(row["JobID"]), ",".join([*current, *added])

    def run_forever(self, stop: threading.Event, interval: float) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except SlurmCommandError as error:
                log.warning("burst pass failed: %s", error)
            stop.wait(interval)
