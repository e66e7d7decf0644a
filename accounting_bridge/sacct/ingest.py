"""Incremental sacct ingestion: each round reads a window from a persisted cursor.

A round asks the job source for the finished runs of jobs active in
``[cursor - overlap, now]``, reconciles them (:mod:`accounting_bridge.sacct.reconcile`)
and moves the cursor (``cursors`` row ``sacct``) to ``now``. The overlap is there
because sacct rows surface late (a half-written record for a few seconds after a
short job ends; a job with a future ``--begin`` only once it became eligible);
reading a run twice is harmless, because reconciliation is idempotent on
``(cluster, job_id, run)`` and skips runs whose Slurm record is unchanged.

A run the daemon's retry pass requeued after it FAILED reads as REQUEUED in sacct, with
its End moved to the requeue (`scontrol requeue` of a finished job), seconds after the
GPUs were free: the round puts back the End the pass recorded from slurmctld before the
requeue (`ledger.jobs.retries.retried_run_ends`), and the run's state, FAILED, so it is
charged to when it ended. An End that does not fall inside the run is not used.

Malformed sacct lines are never dropped silently: the round returns them with
their line numbers, and the jobs they belong to are left for a clean read (their
run numbers may be off). In strict mode a malformed line stops the round before
anything changes, and the cursor stays, so the same window is read again.
A failing sacct (SlurmCommandError) or database error propagates: the cursor only
moves after a round completed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from accounting_bridge.sacct.reconcile import (
    DEFAULT_BATCH_RUNS,
    DEFAULT_POLICY,
    Policy,
    SessionFactory,
    Summary,
    reconcile_runs,
)
from accounting_bridge.slurm.backends import JobSource
from accounting_bridge.slurm.records import ParseError, SacctRun
from ledger.jobs import jobruns
from ledger.jobs.retries import retried_run_ends
from ledger.timeutil import format_time

__all__ = [
    "CURSOR_NAME",
    "DEFAULT_FIRST_WINDOW",
    "DEFAULT_OVERLAP",
    "RoundResult",
    "ingest_round",
    "read_cursor",
    "write_cursor",
]

CURSOR_NAME = "sacct"
DEFAULT_OVERLAP = timedelta(minutes=10)
# With no cursor yet (first start) and no --since, look back this far.
DEFAULT_FIRST_WINDOW = timedelta(days=1)


def with_retried_ends(session_factory: SessionFactory, runs: Sequence[SacctRun]) -> list[SacctRun]:
    """`runs`, each one the retry pass requeued given back its real End and state (above)."""
    requeued = {(run.cluster, run.job_id) for run in runs if run.state == "REQUEUED"}
    ends: dict[tuple[str, int, int], datetime] = {}
    if requeued:
        with session_factory() as s:
            for cluster in {cluster for cluster, _ in requeued}:
                ids = [job_id for c, job_id in requeued if c == cluster]
                for (job_id, index), at in retried_run_ends(s, cluster, ids).items():
                    ends[(cluster, job_id, index)] = at
    fixed = []
    for run in runs:
        ended = ends.get(run.key) if run.state == "REQUEUED" else None
        if (
            ended is not None
            and run.start is not None
            and run.end is not None
            and run.start <= ended <= run.end
        ):
            # Slurm's elapsed less the wait for the requeue (a suspension stays left out).
            elapsed = max(0, run.elapsed_seconds - int((run.end - ended).total_seconds()))
            run = replace(run, state="FAILED", end=ended, elapsed_seconds=elapsed)
        fixed.append(run)
    return fixed


def read_cursor(s: Session, name: str = CURSOR_NAME) -> datetime | None:
    return jobruns.read_cursor(s, name)


def write_cursor(s: Session, value: datetime, name: str = CURSOR_NAME, *, at: datetime) -> None:
    """Set the cursor; it never moves backwards (a slow round cannot undo a later one)."""
    jobruns.write_cursor(s, name, value, at=at)


def _output_of(error: ParseError) -> str:
    """Which sacct output a line number counts in.

    CommandsSource reads a window, then every attempt of the jobs it found by id;
    a bad row whose job id it could read is reported from the by-id output, any
    other from the window's (accounting_bridge/slurm/backends.py). Both are numbered
    from 1.
    """
    return "window" if error.job_id is None else "by job id"


@dataclass
class RoundResult:
    """One ingestion round: the window read, what reconciliation did, what could not be read."""

    since: datetime
    until: datetime
    summary: Summary
    malformed: list[ParseError] = field(default_factory=list)
    cursor_before: datetime | None = None
    cursor_after: datetime | None = None
    aborted: bool = False  # strict mode met malformed lines: nothing was reconciled

    def as_dict(self) -> dict[str, Any]:
        summary = self.summary.as_dict()
        return {
            "since": format_time(self.since),
            "until": format_time(self.until),
            "cursor_before": format_time(self.cursor_before),
            "cursor_after": format_time(self.cursor_after),
            "aborted": self.aborted,
            "counts": {**summary["counts"], "malformed": len(self.malformed)},
            "totals": summary["totals"],
            "runs": summary["runs"],
            "malformed": [
                {
                    "line_no": e.line_no,
                    "output": _output_of(e),
                    "reason": e.reason,
                    "job_id": e.job_id,
                    "line": e.line,
                }
                for e in self.malformed
            ],
        }


def ingest_round(
    session_factory: SessionFactory,
    source: JobSource,
    *,
    now: datetime,
    since: datetime | None = None,
    overlap: timedelta = DEFAULT_OVERLAP,
    first_window: timedelta = DEFAULT_FIRST_WINDOW,
    policy: Policy = DEFAULT_POLICY,
    strict: bool = False,
    batch_runs: int = DEFAULT_BATCH_RUNS,
) -> RoundResult:
    """Read one window of finished runs, reconcile them, and move the cursor to `now`.

    `since` overrides the cursor for this round (a backfill); otherwise the window
    starts at cursor - overlap, or now - first_window on the very first round.
    `batch_runs` bounds each read and bulk write of reconciliation (see reconcile_runs).
    """
    if overlap < timedelta(0) or first_window < timedelta(0):
        raise ValueError("overlap and first_window must not be negative")
    with session_factory() as s, s.begin():
        cursor = read_cursor(s)
    if since is None:
        since = cursor - overlap if cursor is not None else now - first_window
    since = min(since, now)  # a cursor ahead of this clock: read an empty window, not an error
    parsed = source.finished_runs(since, now)
    result = RoundResult(since, now, Summary(), list(parsed.errors), cursor_before=cursor)
    if strict and parsed.errors:
        result.aborted = True
        return result
    result.summary = reconcile_runs(
        session_factory,
        with_retried_ends(session_factory, parsed.runs),
        policy,
        suspect_job_ids=parsed.suspect_job_ids,
        now=now,
        batch_runs=batch_runs,
    )
    with session_factory() as s, s.begin():
        write_cursor(s, now, at=now)
        result.cursor_after = read_cursor(s)
    return result
