"""The Slurm record each stored job run was reconciled from, read in bulk, compactly.

Re-reading a window of sacct finds most runs unchanged since the last round. Telling
them apart costs one range read of `job_runs` per batch (its (cluster, job_id, ...)
index), returning the five values a record is compared on, as the driver's own
tuples: no row objects, no time zone conversion (see :func:`stored_records`).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.jobruns import JobKey, _id_ranges, _plain_rows, job_runs_t

__all__ = ["StoredKey", "StoredRecord", "naive_utc", "stored_records"]

# (cluster, job_id, run, submitted_at as naive UTC): an attempt, as stored.
StoredKey = tuple[str, int, int, datetime]
# (state, elapsed_seconds, gpus as stored, flags as stored)
StoredRecord = tuple[str, int, str, str]


def naive_utc(when: datetime) -> datetime:
    """An aware time in the stored form (naive UTC), to look a StoredKey up with."""
    return (when if when.tzinfo is UTC else when.astimezone(UTC)).replace(tzinfo=None)


def stored_records(s: Session, jobs: Collection[JobKey]) -> dict[StoredKey, StoredRecord]:
    """The stored record of every attempt under these job ids, by attempt.

    Submit times come back as naive UTC, the form both stores keep (SQLite's text is
    read with fromisoformat): converting 100,000 of them to aware times per read cost
    more than the rest of the check.
    """
    query = select(
        job_runs_t.c.cluster,
        job_runs_t.c.job_id,
        job_runs_t.c.run,
        job_runs_t.c.submitted_at,
        job_runs_t.c.state,
        job_runs_t.c.elapsed_seconds,
        job_runs_t.c.gpus,
        job_runs_t.c.flags,
    )
    found: dict[StoredKey, StoredRecord] = {}
    for clusters, low, high in _id_ranges(jobs):
        rows = _plain_rows(
            s, query.where(job_runs_t.c.cluster.in_(clusters), job_runs_t.c.job_id.between(low, high))
        )
        for cluster, job_id, run, submitted, state, elapsed, gpus, flags in rows:
            if (cluster, job_id) in jobs:
                if isinstance(submitted, str):
                    submitted = datetime.fromisoformat(submitted)
                found[(cluster, job_id, run, submitted)] = (state, elapsed, gpus, flags)
    return found
