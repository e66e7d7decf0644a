"""ledger.jobs.jobruns: rows written by COPY (the bridge's bulk path) keep their exact times.

COPY bypasses the column type (UTCDateTime), so the bulk path converts every time to
naive UTC itself, in whatever zone it was given. A row reads back as the same
instants, whatever the session's TimeZone.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import insert, text

from ledger.jobs import jobruns
from ledger.jobs.jobruns import JobRunRow

T0 = datetime(2026, 12, 1, 3, 4, 5, tzinfo=UTC)
EAST = timezone(timedelta(hours=5, minutes=30))


def row(job_id: int, zone: Any, *, started: bool = True) -> JobRunRow:
    at = T0.astimezone(zone)
    return JobRunRow(
        "c1", job_id, 0, at - timedelta(seconds=30), str(job_id), "physics", "alice", "gpu", "COMPLETED",
        at if started else None, at + timedelta(seconds=60) if started else None, 60 if started else 0,
        "a100:1", "gpu0001", None, "", 0, at + timedelta(hours=1),
    )  # fmt: skip


def test_copied_rows_read_back_as_the_same_instants(tx_pg: Callable[[], Any]) -> None:
    rows = [row(1000 + n, (UTC, EAST)[n % 2], started=n % 3 != 0) for n in range(jobruns._COPY_MIN_ROWS)]
    with tx_pg() as s:
        s.execute(text("SET LOCAL TIME ZONE 'America/New_York'"))
        jobruns.insert_job_runs(s, rows)
    with tx_pg() as s:
        stored = jobruns.load_job_runs(s, {("c1", r.job_id) for r in rows})
        ingested = dict(s.execute(text("SELECT job_id, ingested_at FROM job_runs")).all())
    assert len(stored) == len(rows)
    for r in rows:
        got = stored[("c1", r.job_id, 0, r.submitted_at)]  # keys compare as instants
        assert got.submitted_at == T0 - timedelta(seconds=30)
        assert got.start_at == (T0 if r.start_at is not None else None)
        assert ingested[r.job_id] == (T0 + timedelta(hours=1)).replace(tzinfo=None)  # naive UTC, as stored


def test_bulk_rows_are_stored_as_the_one_by_one_path_stores_them(tx: Callable[[], Any]) -> None:
    """The bulk path (COPY on PostgreSQL, the driver's executemany on SQLite) writes the
    very values SQLAlchemy's own insert writes: same text of every time on SQLite."""
    bulk = [row(1000 + n, (UTC, EAST)[n % 2], started=n % 3 != 0) for n in range(jobruns._COPY_MIN_ROWS)]
    plain = [r._replace(job_id=r.job_id + 5000) for r in bulk]
    with tx() as s:
        jobruns.insert_job_runs(s, bulk)
        s.execute(insert(jobruns.job_runs_t), [r._asdict() for r in plain])
    columns = ", ".join(f'"{c}"' for c in JobRunRow._fields if c != "job_id")
    with tx() as s:
        stored = [tuple(r) for r in s.execute(text(f"SELECT {columns} FROM job_runs ORDER BY job_id"))]
    assert len(stored) == 2 * len(bulk)
    assert stored[: len(bulk)] == stored[len(bulk) :]
    assert stored[0][2] in ("2026-12-01 03:03:35.000000", datetime(2026, 12, 1, 3, 3, 35))  # submitted_at


def test_a_time_without_a_zone_is_refused(tx: Callable[[], Any]) -> None:
    rows = [row(1000 + n, UTC) for n in range(jobruns._COPY_MIN_ROWS)]
    rows[7] = rows[7]._replace(end_at=T0.replace(tzinfo=None))
    with tx() as s, pytest.raises(ValueError, match="naive datetime"):
        jobruns.insert_job_runs(s, rows)
    with tx() as s:
        assert s.execute(text("SELECT count(*) FROM job_runs")).scalar() == 0
