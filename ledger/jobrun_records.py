"""The Slurm record each stored job run was reconciled from, read in bulk, compactly.

Re-reading a window of sacct finds most runs unchanged since the last round. Telling
them apart costs one range read of `job_runs` per batch (its (cluster, job_id, ...)
index), returning the values a record is compared on as the driver's own tuples: no
row objects. Submit times come back as whole epoch seconds computed by the database:
converting 100,000 datetimes per read in Python costs more than the rest of the check
(`datetime.replace` alone is ~1.5 µs a call; `timestamp()` on the run's side, 0.2 µs).
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import BigInteger, cast, extract, func, select
from sqlalchemy.orm import Session

from ledger.jobruns import JobKey, _id_ranges, _plain_rows, job_runs_t

__all__ = ["StoredKey", "StoredRecord", "stored_records"]

# (cluster, job_id, run, submitted_at in epoch seconds): an attempt. Slurm's times are
# whole seconds, so an aware submit time's timestamp() is an integral float, which
# equals (and hashes as) the stored integer.
StoredKey = tuple[str, int, int, float]
# (state, elapsed_seconds, gpus as stored, flags as stored)
StoredRecord = tuple[str, int, str, str]


def stored_records(s: Session, jobs: Collection[JobKey]) -> dict[StoredKey, StoredRecord]:
    """The stored record of every attempt under these job ids (and maybe of other jobs in
    the same id ranges: a lookup by attempt never meets them), by attempt."""
    column = job_runs_t.c.submitted_at
    if s.get_bind().dialect.name == "postgresql":
        submitted = cast(extract("epoch", column), BigInteger)
    else:  # SQLite keeps naive UTC as text
        submitted = cast(func.strftime("%s", column), BigInteger)
    query = select(
        job_runs_t.c.cluster,
        job_runs_t.c.job_id,
        job_runs_t.c.run,
        submitted,
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
        for cluster, job_id, run, submitted_at, state, elapsed, gpus, flags in rows:
            found[(cluster, job_id, run, submitted_at)] = (state, elapsed, gpus, flags)
    return found
