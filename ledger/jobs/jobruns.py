"""What the accounting bridge stores and reads in bulk: the `job_runs` projection, the
`cursors` of its readers, and lean views of holds for reconciliation.

None of this moves money: charges go through :mod:`ledger.api` (which locks the payer).
The SQL lives here, beside the schema, because the tables and their keys are the
ledger's (models.py, the migrations): when a migration changes a key, as 0004 did,
one package changes with it, and no other package imports a table.

A job run is one attempt of one job incarnation, ``(cluster, job_id, run,
submitted_at)`` (an :data:`AttemptKey`): Slurm reuses job ids and resets SubmitTime on
every requeue. Rows written before migration 0004, and attempts whose submit time is
unknown, carry :data:`UNKNOWN_SUBMIT`.

Reads return the driver's own tuples, wrapped in NamedTuples: re-reading a window of
runs fetches one row per run, and building SQLAlchemy Rows cost more than the rest of
the check. Times come back as aware UTC whatever the driver.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, NamedTuple

from sqlalchemy import insert, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ledger.pricing.prices import format_gpus, parse_pairs
from ledger.store.models import UNKNOWN_SUBMIT
from ledger.store.tables import cursors_t, holds_t, job_runs_t
from ledger.timeutil import aware_utc, format_time, naive_utc, parse_time

__all__ = [
    "UNKNOWN_SUBMIT",
    "AttemptKey",
    "HoldView",
    "JobRunRow",
    "StoredRun",
    "adopt_submit_times",
    "format_gpus",
    "hold_starts",
    "insert_job_runs",
    "job_run_flags",
    "job_runs_page",
    "load_hold_views",
    "load_job_runs",
    "parse_pairs",
    "read_cursor",
    "upsert_job_runs",
    "write_cursor",
]


AttemptKey = tuple[str, int, int, datetime]  # (cluster, job_id, run, submitted_at)
JobKey = tuple[str, int]  # (cluster, job_id): every incarnation and attempt under one id

# Job ids per range read (see _id_ranges).
_RANGE_SPAN_IDS = 10_000
# From this many rows, PostgreSQL upserts go through COPY and a temporary table.
_COPY_MIN_ROWS = 200


class JobRunRow(NamedTuple):
    """One `job_runs` row to write, in column order (COPY writes it by position)."""

    cluster: str
    job_id: int
    run: int
    submitted_at: datetime
    display_id: str
    account: str
    user: str
    partition: str | None
    state: str
    start_at: datetime | None
    end_at: datetime | None
    elapsed_seconds: int
    gpus: str
    nodes: str
    hold_id: int | None
    flags: str
    charged_ucredits: int
    ingested_at: datetime

    @property
    def key(self) -> AttemptKey:
        return (self.cluster, self.job_id, self.run, self.submitted_at)


_KEY_COLUMNS = ("cluster", "job_id", "run", "submitted_at")
_UPDATE_COLUMNS = tuple(c for c in JobRunRow._fields if c not in _KEY_COLUMNS)
# An error row leaves the last successful result (hold, charge) in place.
_UPDATE_COLUMNS_KEEP_CHARGE = tuple(c for c in _UPDATE_COLUMNS if c not in ("hold_id", "charged_ucredits"))


class StoredRun(NamedTuple):
    """What reconciliation compares a fresh sacct record with."""

    cluster: str
    job_id: int
    run: int
    submitted_at: datetime
    start_at: datetime | None
    state: str
    elapsed_seconds: int
    gpus: str
    flags: str
    hold_id: int | None

    @property
    def key(self) -> AttemptKey:
        return (self.cluster, self.job_id, self.run, self.submitted_at)


class HoldView(NamedTuple):
    """What reconciliation needs of a hold (a tuple: cheap to build by the 100,000).

    `ucredits_per_gpu_hour` are the prices, by GPU type, the run was sold at;
    `submitted_at` names the attempt (UNKNOWN_SUBMIT: a hold taken without one).
    """

    id: int
    account_id: int
    run: int
    submitted_at: datetime
    state: str
    ucredits_per_gpu_hour: Mapping[str, int]
    rate_ucredits_per_hour: int
    charged_ucredits: int


# --------------------------------------------------------------------------- reads


def _id_ranges(jobs: Collection[JobKey]) -> Iterator[tuple[list[str], int, int]]:
    """Job-id ranges covering `jobs`, each spanning at most _RANGE_SPAN_IDS ids.

    A range scan of the (cluster, job_id, ...) index costs the same whatever the
    planner believes about the table; a long IN list did not (a freshly filled,
    not yet analyzed job_runs got a filter over the whole table per query).
    Slurm numbers jobs in sequence, so a window's jobs are mostly dense ranges.
    """
    clusters = sorted({cluster for cluster, _ in jobs})
    for low, high in _job_id_ranges([job_id for _, job_id in jobs]):
        yield clusters, low, high


def _job_id_ranges(job_ids: Collection[int]) -> list[tuple[int, int]]:
    """_id_ranges of some job ids: one range when they span few enough ids (the usual
    window), without sorting them."""
    if not job_ids:
        return []
    low, high = min(job_ids), max(job_ids)
    if high - low < _RANGE_SPAN_IDS:
        return [(low, high)]
    ranges: list[list[int]] = []
    for job_id in sorted(set(job_ids)):
        if ranges and job_id - ranges[-1][0] < _RANGE_SPAN_IDS:
            ranges[-1][1] = job_id
        else:
            ranges.append([job_id, job_id])
    return [(low, high) for low, high in ranges]


def _plain_rows(s: Session, query: Any) -> list[tuple[Any, ...]]:
    """The driver's own tuples (see the module docstring)."""
    result = s.connection().execute(query)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


def _aware(value: datetime | str) -> datetime:
    """A driver's timestamp as aware UTC. Both stores keep naive UTC (UTCDateTime); SQLite
    hands it back as text."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return aware_utc(value)


@functools.lru_cache(maxsize=4096)
def _unit_prices(text: str) -> Mapping[str, int]:
    # A few distinct price lists serve every hold: parse each once, share it read-only.
    return MappingProxyType(parse_pairs(text))


def load_hold_views(s: Session, jobs: Collection[JobKey]) -> dict[JobKey, list[HoldView]]:
    """Every hold taken under these job ids (all incarnations, all attempts), by job."""
    found: dict[JobKey, list[HoldView]] = {}
    query = select(
        holds_t.c.id,
        holds_t.c.account_id,
        holds_t.c.cluster,
        holds_t.c.job_id,
        holds_t.c.run,
        holds_t.c.submitted_at,
        holds_t.c.state,
        holds_t.c.unit_prices,
        holds_t.c.rate_ucredits_per_hour,
        holds_t.c.charged_ucredits,
    )
    for clusters, low, high in _id_ranges(jobs):
        where = (holds_t.c.cluster.in_(clusters), holds_t.c.job_id.between(low, high))
        for hold_id, account_id, cluster, job_id, run, submitted, state, prices, rate, charged in _plain_rows(
            s, query.where(*where)
        ):
            key = (cluster, job_id)
            if key in jobs:
                found.setdefault(key, []).append(
                    HoldView(
                        hold_id,
                        account_id,
                        run,
                        _aware(submitted),
                        state,
                        _unit_prices(prices),
                        rate,
                        charged,
                    )
                )
    return found


def hold_starts(s: Session, hold_ids: Sequence[int]) -> dict[int, datetime]:
    """When each hold's run started (the hooks' record)."""
    query = select(holds_t.c.id, holds_t.c.started_at).where(holds_t.c.id.in_(hold_ids))
    return {hold_id: started_at for hold_id, started_at in s.execute(query).all()}


def load_job_runs(s: Session, jobs: Collection[JobKey]) -> dict[AttemptKey, StoredRun]:
    """The stored rows of every attempt under these job ids, by attempt."""
    found: dict[AttemptKey, StoredRun] = {}
    query = select(
        job_runs_t.c.cluster,
        job_runs_t.c.job_id,
        job_runs_t.c.run,
        job_runs_t.c.submitted_at,
        job_runs_t.c.start_at,
        job_runs_t.c.state,
        job_runs_t.c.elapsed_seconds,
        job_runs_t.c.gpus,
        job_runs_t.c.flags,
        job_runs_t.c.hold_id,
    )
    for clusters, low, high in _id_ranges(jobs):
        where = (job_runs_t.c.cluster.in_(clusters), job_runs_t.c.job_id.between(low, high))
        for cluster, job_id, run, submitted, start, state, elapsed, gpus, flags, hold_id in _plain_rows(
            s, query.where(*where)
        ):
            if (cluster, job_id) in jobs:
                submitted = _aware(submitted)
                started = None if start is None else _aware(start)
                found[(cluster, job_id, run, submitted)] = StoredRun(
                    cluster, job_id, run, submitted, started, state, elapsed, gpus, flags, hold_id
                )
    return found


def job_run_flags(s: Session, key: AttemptKey) -> str | None:
    """The flags stored for one attempt, or None when it has no row."""
    cluster, job_id, run, submitted_at = key
    return s.execute(
        select(job_runs_t.c.flags).where(
            job_runs_t.c.cluster == cluster,
            job_runs_t.c.job_id == job_id,
            job_runs_t.c.run == run,
            job_runs_t.c.submitted_at == submitted_at,
        )
    ).scalar()


def job_runs_page(
    s: Session, after_id: int, limit: int, *, failed_only: bool, ended_since: datetime | None = None
) -> list[Any]:
    """Up to `limit` stored runs with id > `after_id`, in id order (rows with attributes
    named as the columns, plus `id`): all, or only those left failed (flag `error`)."""
    query = select(job_runs_t).where(job_runs_t.c.id > after_id).order_by(job_runs_t.c.id).limit(limit)
    if failed_only:
        query = query.where(job_runs_t.c.flags.contains("error"))
    if ended_since is not None:
        query = query.where(job_runs_t.c.end_at >= ended_since)
    return list(s.execute(query).all())


# --------------------------------------------------------------------------- writes


def adopt_submit_times(s: Session, keys: Collection[AttemptKey]) -> None:
    """Give rows written before migration 0004 (UNKNOWN_SUBMIT) their attempt's submit
    time, so the next write of the same attempt updates them instead of adding a twin."""
    for cluster, job_id, run, submitted_at in keys:
        s.execute(
            update(job_runs_t)
            .where(
                job_runs_t.c.cluster == cluster,
                job_runs_t.c.job_id == job_id,
                job_runs_t.c.run == run,
                job_runs_t.c.submitted_at == UNKNOWN_SUBMIT,
            )
            .values(submitted_at=submitted_at)
        )


def _as_dict(row: JobRunRow) -> dict[str, Any]:
    return row._asdict()


def upsert_job_runs(s: Session, rows: Sequence[JobRunRow], *, keep_charge: bool = False) -> None:
    """Insert or update rows by attempt; the last row of a key wins.

    `keep_charge` leaves an existing row's hold and charge alone (for runs that failed).
    """
    if not rows:
        return
    unique = list({row.key: row for row in rows}.values())
    dialect = s.get_bind().dialect.name
    update_columns = _UPDATE_COLUMNS_KEEP_CHARGE if keep_charge else _UPDATE_COLUMNS
    if dialect == "postgresql" and len(unique) >= _COPY_MIN_ROWS:
        _copy_upsert(s, unique, update_columns)
        return
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as upsert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as upsert  # type: ignore[assignment]
    else:
        raise RuntimeError(f"job_runs upserts support postgresql and sqlite, not {dialect}")
    statement = upsert(job_runs_t)
    statement = statement.on_conflict_do_update(
        index_elements=list(_KEY_COLUMNS),
        set_={column: statement.excluded[column] for column in update_columns},
    )
    s.execute(statement, [_as_dict(row) for row in unique])


def insert_job_runs(s: Session, rows: Sequence[JobRunRow]) -> None:
    """Insert rows for attempts not stored yet; IntegrityError if one is there after all.

    Half the cost of an upsert on PostgreSQL (COPY straight into the table). The
    caller rolls back and upserts when another writer got there first.
    """
    if not rows:
        return
    if s.get_bind().dialect.name == "postgresql" and len(rows) >= _COPY_MIN_ROWS:
        dbapi = s.get_bind().dialect.loaded_dbapi
        try:
            with _driver_cursor(s) as cursor:
                _copy_rows(s, cursor, "job_runs", rows)
        except dbapi.IntegrityError as error:  # the driver's own: say it the way SQLAlchemy does
            raise IntegrityError("COPY job_runs", None, error) from error
        return
    if s.get_bind().dialect.name == "sqlite" and len(rows) >= _COPY_MIN_ROWS:
        _sqlite_insert(s, rows)
        return
    s.execute(insert(job_runs_t), [_as_dict(row) for row in rows])


def _sqlite_text(value: datetime | None) -> str | None:
    """A time as SQLAlchemy binds a UTCDateTime on SQLite (naive UTC, microseconds spelt out)."""
    if value is not None and value.tzinfo is UTC:  # the text without its "+00:00": no conversion
        return value.isoformat(" ", "microseconds")[:26]
    naive = _naive_utc(value)
    return None if naive is None else naive.isoformat(" ", "microseconds")


def _sqlite_insert(s: Session, rows: Sequence[JobRunRow]) -> None:
    """Many rows through the driver's executemany: SQLAlchemy's per-value bind processing
    (four times per row) cost more than SQLite's own insert. The rows are the same text."""
    quote = s.get_bind().dialect.identifier_preparer.quote
    sql = (
        f"INSERT INTO job_runs ({', '.join(quote(c) for c in JobRunRow._fields)}) "
        f"VALUES ({', '.join('?' for _ in JobRunRow._fields)})"
    )
    values = []
    ingested: tuple[datetime | None, str | None] = (None, None)  # a batch's rows share one
    for row in rows:
        if row.ingested_at is not ingested[0]:
            ingested = (row.ingested_at, _sqlite_text(row.ingested_at))
        values.append(
            (
                *row[:3],
                _sqlite_text(row.submitted_at),
                *row[4:9],
                _sqlite_text(row.start_at),
                _sqlite_text(row.end_at),
                *row[11:17],
                ingested[1],
            )
        )
    s.connection().exec_driver_sql(sql, values)


def _driver_cursor(s: Session) -> Any:
    driver = s.connection().connection.driver_connection
    if driver is None:
        raise RuntimeError("no PostgreSQL driver connection for COPY")
    return driver.cursor()


def _naive_utc(value: datetime | None) -> datetime | None:
    # What UTCDateTime stores; COPY bypasses the column type, so convert here.
    return None if value is None else naive_utc(value)


def _stored_times(row: JobRunRow) -> tuple[Any, ...]:
    """The row with its times as stored (naive UTC): binary COPY bypasses UTCDateTime.

    Positions 3, 9, 10 and 17 are submitted_at, start_at, end_at and ingested_at, spelt
    out: a comprehension over every field costs twice as much. A row whose layout moved
    fails here (a string has no tzinfo) or in binary COPY's types, not silently.
    """
    return (
        *row[:3], naive_utc(row[3]), *row[4:9], _naive_utc(row[9]), _naive_utc(row[10]),
        *row[11:17], naive_utc(row[17]),
    )  # fmt: skip


@functools.cache
def _copy_types() -> tuple[str, ...]:
    """The PostgreSQL type of each JobRunRow column, as binary COPY must be told them."""
    dialect = postgresql.dialect()
    return tuple(
        job_runs_t.c[name].type.compile(dialect=dialect).split("(")[0].lower() for name in JobRunRow._fields
    )


def _copy_rows(s: Session, cursor: Any, table: str, rows: Sequence[JobRunRow]) -> None:
    """COPY `rows` into `table`, in binary: a sixth of the text format's CPU (100,000
    rows: 0.1 s against 0.6 s), which the bridge's first read of a window spends on
    this alone. Binary COPY takes each column's exact type and naive UTC times."""
    quote = s.get_bind().dialect.identifier_preparer.quote
    columns = ", ".join(quote(c) for c in JobRunRow._fields)
    with cursor.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(_copy_types())
        for row in rows:
            copy.write_row(_stored_times(row))


def _copy_upsert(s: Session, rows: Sequence[JobRunRow], update_columns: Sequence[str]) -> None:
    """COPY into a temporary table, then one INSERT ... ON CONFLICT: ~3x executemany's rate."""
    quote = s.get_bind().dialect.identifier_preparer.quote
    columns = ", ".join(quote(c) for c in JobRunRow._fields)
    assignments = ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in update_columns)
    with _driver_cursor(s) as cursor:
        cursor.execute(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS bridge_job_runs_in ON COMMIT DROP AS "
            f"SELECT {columns} FROM job_runs WITH NO DATA"
        )
        cursor.execute("TRUNCATE bridge_job_runs_in")
        _copy_rows(s, cursor, "bridge_job_runs_in", rows)
        cursor.execute(
            f"INSERT INTO job_runs ({columns}) SELECT {columns} FROM bridge_job_runs_in "
            f"ON CONFLICT ({', '.join(_KEY_COLUMNS)}) DO UPDATE SET {assignments}"
        )


# --------------------------------------------------------------------------- cursors


def read_cursor(s: Session, name: str) -> datetime | None:
    value = s.execute(select(cursors_t.c.value).where(cursors_t.c.name == name)).scalar()
    return None if value is None else parse_time(value, field=f"cursor {name}")


def write_cursor(s: Session, name: str, value: datetime, *, at: datetime) -> None:
    """Set the cursor; it never moves backwards (a slow round cannot undo a later one)."""
    current = read_cursor(s, name)
    text = format_time(value)
    if current is None:
        s.execute(insert(cursors_t).values(name=name, value=text, updated_at=at))
    elif value > current:
        s.execute(update(cursors_t).where(cursors_t.c.name == name).values(value=text, updated_at=at))
