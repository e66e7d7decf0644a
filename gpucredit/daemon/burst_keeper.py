"""The burst pass: cloud partitions held back at submit are added once a job has waited.

With `[routing] burst_after_seconds`, job_submit gives a job allowed both sites only its
on-premise partitions and names the cloud ones, with the job's cost in each, in its
AdminComment (`gpucredit-burst=cloud:5000000`, job_submit/burst_mark.py: users cannot edit
an AdminComment). Every tick the daemon lists the pending jobs (`squeue --Format`, no
free text asked) and, for each marked one that was submitted at least that long ago, runs

    scontrol update JobId=N Partition=onprem,cloud AdminComment=gpucredit-burst-sent=cloud:5000000

so Slurm may now start it in the cloud. Routing itself happened at submit (its quote is
the dearest allowed run, cloud included); the pass only lets that decision take effect.
Only partitions tagged `site = "cloud"` in the config are ever added, whatever a mark
says. Why the daemon: it is resident on the controller, where scontrol may update jobs,
and it already ticks every couple of seconds to release held jobs.

The account's monthly cloud budget is checked again here, since submit was a while ago:
the month's cloud spend as of the daemon's picture, plus what jobs sent before and not
yet started may spend (their sent marks), plus this job's cost there must fit. A
partition that does not fit is not added; the job waits on-premise and is looked at
again every tick (said once in the log). The rule is the ledger's (`cloud_budget_breach`).

A job the prolog held for credit carries that hold's AdminComment instead, so it is
not burst (released, it waits on-premise).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Collection
from datetime import datetime, timedelta

from accounting_bridge.slurm.slurmcmd import Runner, SlurmCommandError
from job_submit.burst_mark import BurstMark
from ledger.errors import LimitExceeded
from ledger.timeutil import utcnow
from slurmtext import SlurmTextError, parse_format_rows, parse_time

__all__ = ["BudgetCheck", "BurstKeeper"]

log = logging.getLogger("gpucredit.daemon")

FIELDS = ("JobID", "Account", "SubmitTime", "Partition", "admin_comment")
SQUEUE = (
    "squeue",
    "--all",
    "--noheader",
    "--states=PENDING",
    "--Format=" + ",".join(f"{f}:|" for f in FIELDS),
)
# (account, cost in micro-credits, what the account's jobs already sent may still spend)
# -> why that would pass its cloud budget, or None.
BudgetCheck = Callable[[str, int, int], LimitExceeded | None]


class BurstKeeper:
    """No I/O until `tick`; the runner and the clock are injectable."""

    def __init__(
        self,
        run: Runner,
        burst_after_seconds: int,
        cloud_partitions: Collection[str],
        *,
        budget: BudgetCheck | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.run = run
        self.wait = timedelta(seconds=burst_after_seconds)
        self.cloud = frozenset(cloud_partitions)
        self.budget = budget
        self.clock = clock
        self.over_budget: set[int] = set()  # jobs whose refusal has been logged

    def tick(self) -> list[int]:
        """One pass; the jobs given their cloud partitions."""
        now = self.clock()
        rows = []
        for line in self.run(SQUEUE).split("\n"):
            if not line.strip():
                continue
            try:
                [row] = parse_format_rows(line, FIELDS)
            except SlurmTextError as error:  # one unreadable job never stops the others
                log.warning("burst pass: squeue line %r: %s", line[:200], error)
                continue
            rows.append((row, BurstMark.parse(row["admin_comment"])))
        self.over_budget &= {int(row["JobID"]) for row, _ in rows if row["JobID"].isdigit()}
        sent: defaultdict[str, int] = defaultdict(int)  # account -> what its sent jobs may spend
        for row, mark in rows:
            if mark is not None and mark.sent:
                sent[row["Account"]] += mark.most
        burst = []
        for row, mark in rows:
            if mark is None or mark.sent:
                continue
            try:
                due = self._due(row, mark, now, sent)
            except SlurmTextError as error:
                log.warning("burst pass: job %s: %s", row["JobID"], error)
                continue
            if due is None:
                continue
            job_id, partitions, added = due
            note = BurstMark(sent=True, costs=added)
            try:
                self.run(
                    [
                        "scontrol",
                        "update",
                        f"JobId={job_id}",
                        f"Partition={partitions}",
                        f"AdminComment={note.text}",
                    ]
                )
            except SlurmCommandError as error:  # it started meanwhile, or ended
                log.info("burst pass: job %s: %s", job_id, error)
                continue
            sent[row["Account"]] += note.most
            log.info("job %s waited %s on-premise; now it may run in %s", job_id, self.wait, partitions)
            burst.append(job_id)
        return burst

    def _due(
        self, row: dict[str, str], mark: BurstMark, now: datetime, sent: dict[str, int]
    ) -> tuple[int, str, dict[str, int | None]] | None:
        """(job id, its new partition list, the partitions added and their costs) when the
        job's wait is over and some cloud partition fits its account's budget, else None."""
        if not (row["JobID"].isascii() and row["JobID"].isdigit()):
            return None
        submitted = parse_time(row["SubmitTime"])
        if submitted is None or now - submitted < self.wait:
            return None
        job_id = int(row["JobID"])
        current = [name for name in row["Partition"].split(",") if name]
        later = {
            name: cost for name, cost in mark.costs.items() if name in self.cloud and name not in current
        }
        if not current or not later:
            return None
        added = {name: cost for name, cost in later.items() if self._fits(job_id, row["Account"], cost, sent)}
        if not added:
            return None
        return job_id, ",".join([*current, *added]), added

    def _fits(self, job_id: int, account: str, cost: int | None, sent: dict[str, int]) -> bool:
        if self.budget is None or cost is None:  # no budget, or a mark from before costs
            return True
        breach = self.budget(account, cost, sent.get(account, 0))
        if breach is None:
            return True
        if job_id not in self.over_budget:
            self.over_budget.add(job_id)
            log.warning("job %s stays on-premise: %s", job_id, breach.message)
        return False

    def run_forever(self, stop: threading.Event, interval: float) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except SlurmCommandError as error:
                log.warning("burst pass failed: %s", error)
            stop.wait(interval)
