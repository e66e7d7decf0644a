"""The Slurm record each stored job run was reconciled from, read in bulk, compactly.

Re-reading a window of sacct finds most runs unchanged since the last round. Telling
them apart costs one range read of `job_runs` per batch (its (cluster, job_id, ...)
index), returning the values a record is compared on as the driver's own tuples: no
row objects. Submit times come back as whole epoch seconds computed by the database:
converting 100,000 datetimes per read in Python costs more than the rest of the check
(`datetime.replace` alone is ~1.5 µs a call; `timestamp()` on the run's side, 0.2 µs).

On PostgreSQL the batches' reads overlap the caller's work: each is sent before the
one before it is handed over (psycopg's pipeline mode), so the database reads the next
batch while the caller checks this one; in turn, they were a sixth of a re-read.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Iterable
from typing import Any

from sqlalchemy import BigInteger, bindparam, cast, extract, func, select
from sqlalchemy.orm import Session

from ledger.jobruns import JobKey, _id_ranges, _plain_rows, job_runs_t

__all__ = ["StoredKey", "StoredRecord", "stored_records_in_turn"]

# (cluster, job_id, run, submitted_at in epoch seconds): an attempt. Slurm's times are
# whole seconds, so an aware submit time's timestamp() is an integral float, which
# equals (and hashes as) the stored integer.
StoredKey = tuple[str, int, int, float]
# (state, elapsed_seconds, gpus as stored, flags as stored)
StoredRecord = tuple[str, int, str, str]


def stored_records_in_turn(
    session_factory: Callable[[], Session], batches: Iterable[Collection[JobKey]]
) -> Generator[dict[StoredKey, StoredRecord], None, None]:
    """For each batch of jobs in turn, the stored record of every attempt under its job
    ids (and maybe of other jobs in the same id ranges: a lookup by attempt never meets
    them), by attempt."""
    with session_factory() as s:
        postgresql = s.get_bind().dialect.name == "postgresql"
    if not postgresql:  # a read at a time, each in its own transaction: SQLite's writer waits on none
        for jobs in batches:
            with session_factory() as s, s.begin():
                found = _read(s, jobs)
            yield found
        return
    with session_factory() as s, s.begin():
        connection = s.connection().connection.driver_connection
        if connection is None:
            raise RuntimeError("no PostgreSQL driver connection for the pipelined read")
        where = (
            job_runs_t.c.cluster == bindparam("cluster"),
            job_runs_t.c.job_id.between(bindparam("low"), bindparam("high")),
        )
        sql = str(_query(s).where(*where).compile(dialect=s.get_bind().dialect))
        with connection.pipeline():
            sent: list[Any] | None = None
            for jobs in batches:
                cursors = []
                for clusters, low, high in _id_ranges(jobs):
                    for cluster in clusters:
                        cursors.append(
                            connection.execute(sql, {"cluster": cluster, "low": low, "high": high})
                        )
                if sent is not None:
                    yield _by_attempt(cursor.fetchall() for cursor in sent)
                sent = cursors
            if sent is not None:
                yield _by_attempt(cursor.fetchall() for cursor in sent)


def _query(s: Session) -> Any:
    column = job_runs_t.c.submitted_at
    if s.get_bind().dialect.name == "postgresql":
        submitted = cast(extract("epoch", column), BigInteger)
    else:  # SQLite keeps naive UTC as text
        submitted = cast(func.strftime("%s", column), BigInteger)
    return select(
        job_runs_t.c.cluster,
        job_runs_t.c.job_id,
        job_runs_t.c.run,
        submitted,
        job_runs_t.c.state,
        job_runs_t.c.elapsed_seconds,
        job_runs_t.c.gpus,
        job_runs_t.c.flags,
    )


def _read(s: Session, jobs: Collection[JobKey]) -> dict[StoredKey, StoredRecord]:
    query = _query(s)
    return _by_attempt(
        _plain_rows(
            s, query.where(job_runs_t.c.cluster.in_(clusters), job_runs_t.c.job_id.between(low, high))
        )
        for clusters, low, high in _id_ranges(jobs)
    )


def _by_attempt(reads: Iterable[Iterable[tuple[Any, ...]]]) -> dict[StoredKey, StoredRecord]:
    found: dict[StoredKey, StoredRecord] = {}
    for rows in reads:
        for cluster, job_id, run, submitted_at, state, elapsed, gpus, flags in rows:
            found[(cluster, job_id, run, submitted_at)] = (state, elapsed, gpus, flags)
    return found
