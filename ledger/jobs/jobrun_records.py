"""The Slurm record each stored job run was reconciled from, read in bulk, one text per row.

Re-reading a window of sacct finds most runs unchanged since the last round. Telling
them apart costs one range read of `job_runs` per chunk of the window (its (cluster,
job_id, ...) index). The database renders each attempt with the values a record is
compared on as one text (`record_text`'s form), and a row flagged `error` (to be
retried) as "", which no run renders as: the caller renders its run the same way and
looks it up in a set.

One string per row is the least the driver can build, and one set lookup the least a
run can cost: eight columns per row, into tuples keyed by attempt, took twice as long.

On PostgreSQL the chunks' reads overlap the caller's work: each is sent before the
one before it is handed over (psycopg's pipeline mode), so the database reads the next
chunk while the caller checks this one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import BigInteger, String, bindparam, case, cast, func, literal_column, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from ledger.jobs.jobruns import _job_id_ranges, _plain_rows
from ledger.store.tables import job_runs_t

__all__ = ["StoredRecords", "record_text", "stored_records_in_turn"]

# Per cluster, the record text of every stored attempt ("" for those flagged `error`).
StoredRecords = dict[str, set[str]]


def record_text(job_id: int, run: int, submitted_epoch: int, state: str, elapsed: int, gpus: str) -> str:
    """An attempt (job id, run, whole seconds of its submit time) and the record it was
    reconciled from (state, elapsed seconds, GPUs as `format_gpus` writes them), in the
    form the read renders. Every field but the last is digits or a Slurm state name, so
    no two records share a text."""
    return f"{job_id}|{run}|{submitted_epoch}|{state}|{elapsed}|{gpus}"


def stored_records_in_turn(
    session_factory: Callable[[], Session], chunks: Iterable[Mapping[str, Collection[int]]]
) -> Generator[StoredRecords, None, None]:
    """For each chunk of jobs (job ids by cluster) in turn, the record text of every
    attempt under its job ids (and maybe of other jobs in the same id ranges: a lookup
    by attempt never meets them)."""
    with session_factory() as s:
        postgresql = s.get_bind().dialect.name == "postgresql"
    if not postgresql:  # a read at a time, each in its own transaction: SQLite's writer waits on none
        for jobs in chunks:
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
            sent: list[tuple[str, Any]] | None = None
            for jobs in chunks:
                cursors = []
                for cluster, job_ids in jobs.items():
                    for low, high in _job_id_ranges(job_ids):
                        params = {"cluster": cluster, "low": low, "high": high}
                        cursors.append((cluster, connection.execute(sql, params)))
                if sent is not None:
                    yield _by_cluster((cluster, cursor.fetchall()) for cluster, cursor in sent)
                sent = cursors
            if sent is not None:
                yield _by_cluster((cluster, cursor.fetchall()) for cluster, cursor in sent)


def _query(s: Session) -> Any:
    """`record_text` in SQL; "" for a row flagged `error`. Its constants are inlined: the
    pipelined read sends the compiled text with its own three parameters."""
    c = job_runs_t.c
    bar: ColumnElement[str] = literal_column("'|'")
    error: ColumnElement[str] = literal_column("'error'")
    text: ColumnElement[Any]
    submitted: ColumnElement[Any]
    if s.get_bind().dialect.name == "postgresql":
        submitted = cast(func.floor(func.date_part(literal_column("'epoch'"), c.submitted_at)), BigInteger)
        text = func.concat_ws(bar, c.job_id, c.run, submitted, c.state, c.elapsed_seconds, c.gpus)
        failed = func.strpos(c.flags, error) > literal_column("0")
    else:  # SQLite keeps naive UTC as text; `||` is its concatenation
        submitted = func.strftime(literal_column("'%s'"), c.submitted_at)
        text = cast(c.job_id, String)
        for part in (c.run, submitted, c.state, c.elapsed_seconds, c.gpus):
            text = text.op("||")(bar).op("||")(part)
        failed = func.instr(c.flags, error) > literal_column("0")
    return select(case((failed, literal_column("''")), else_=text))


def _read(s: Session, jobs: Mapping[str, Collection[int]]) -> StoredRecords:
    query, c = _query(s), job_runs_t.c
    return _by_cluster(
        (cluster, _plain_rows(s, query.where(c.cluster == cluster, c.job_id.between(low, high))))
        for cluster, job_ids in jobs.items()
        for low, high in _job_id_ranges(job_ids)
    )


def _by_cluster(reads: Iterable[tuple[str, Sequence[tuple[str]]]]) -> StoredRecords:
    """The texts read, by cluster; {} when nothing is stored (a first read)."""
    found: StoredRecords = {}
    for cluster, rows in reads:
        if rows:
            found.setdefault(cluster, set()).update(map(itemgetter(0), rows))
    return found
