"""ledger.store.bulk's multi-row writes store exactly what they were given: strings with quotes,
backslashes, braces and commas, the text "NULL" and real NULLs, timestamps, integers past
32 bits; through `unnest` of array literals on PostgreSQL, executemany elsewhere."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    select,
)
from sqlalchemy.exc import IntegrityError

from ledger.store.bulk import deferred_writes, insert_rows, insert_rows_referencing, update_rows
from ledger.store.models import UTCDateTime

metadata = MetaData()
sample = Table(
    "bulk_sample",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(200)),
    Column("big", BigInteger),
    Column("at", UTCDateTime()),
    Column("flag", Boolean),
)

# A parent found by a unique pair of columns, and its children, as journal entries
# (account, seq) and their postings.
parent = Table(
    "bulk_parent",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("owner", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    UniqueConstraint("owner", "seq"),
)
child = Table(
    "bulk_child",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("parent_id", ForeignKey("bulk_parent.id"), nullable=False),
    Column("amount", BigInteger),
)

AWKWARD = [
    'quote " inside',
    "back\\slash \\\\ twice",
    "{braces},commas",
    "NULL",
    "",
    "  spaced  ",
    "ünïcödé ✓",
    "new\nline\ttab",
    None,
]


def rows() -> list[dict[str, Any]]:
    return [
        {
            "id": i + 1,
            "name": name,
            "big": None if i == 3 else 2**40 + i,
            "at": None if i == 2 else datetime(2026, 12, 2, 10, 0, i, 123456 * (i % 2), tzinfo=UTC),
            "flag": None if i == 1 else i % 2 == 0,
        }
        for i, name in enumerate(AWKWARD)
    ]


def stored(s: Any) -> list[dict[str, Any]]:
    return [dict(row._mapping) for row in s.execute(select(sample).order_by(sample.c.id))]


def test_insert_and_update_rows_store_exactly_what_they_were_given(engine, tx) -> None:  # type: ignore[no-untyped-def]
    metadata.create_all(engine)
    with tx() as s:
        insert_rows(s, sample, rows())
    with tx() as s:
        assert stored(s) == rows()
    changed = [{"id": row["id"], "name": (row["name"] or "") + ' "x"\\', "big": -1} for row in rows()]
    with tx() as s, deferred_writes(s):
        update_rows(s, sample, ("id",), changed)
    with tx() as s:
        assert [(row["name"], row["big"]) for row in stored(s)] == [(r["name"], -1) for r in changed]


def test_a_failed_write_in_deferred_writes_fails_the_transaction_and_stores_none_of_it(engine, tx) -> None:  # type: ignore[no-untyped-def]
    # On PostgreSQL the block's writes are sent as they are built: the duplicate key is
    # found while the update after it is on its way, and neither may be committed.
    metadata.create_all(engine)
    with tx() as s:
        insert_rows(s, sample, rows()[:2])
    duplicate = [{**rows()[2], "id": 5}, {**rows()[3], "id": 1}]
    with pytest.raises((IntegrityError, psycopg.errors.UniqueViolation)), tx() as s, deferred_writes(s):
        insert_rows(s, sample, duplicate)
        update_rows(s, sample, ("id",), [{"id": 2, "big": 7}, {"id": 1, "big": 8}])
    with tx() as s:
        assert stored(s) == rows()[:2]


# Elsewhere insert_rows_referencing declines (the caller inserts with ids it read back).
@pytest.mark.parametrize("store", ["postgres"])
def test_rows_referencing_rows_of_the_same_block_get_their_ids_and_a_missing_one_fails_the_write(
    engine, tx
) -> None:  # type: ignore[no-untyped-def]
    metadata.create_all(engine)
    parents = [{"owner": owner, "seq": seq} for owner in (1, 2) for seq in (1, 2, 3)]
    children = [{"ref_owner": 2, "ref_seq": 3, "amount": 10}, {"ref_owner": 1, "ref_seq": 1, "amount": -10}]
    with tx() as s, deferred_writes(s):
        insert_rows(s, parent, parents)
        assert insert_rows_referencing(s, child, children, "parent_id", parent, ("owner", "seq"))
    with tx() as s:
        ids = {(r.owner, r.seq): r.id for r in s.execute(select(parent))}
        got = [(r.parent_id, r.amount) for r in s.execute(select(child).order_by(child.c.id))]
    assert got == [(ids[(2, 3)], 10), (ids[(1, 1)], -10)]
    # A child whose parent is not there is refused with the whole write, never left out:
    # a posting dropped silently would leave its entry unbalanced.
    orphan = [{"ref_owner": 1, "ref_seq": 2, "amount": 5}, {"ref_owner": 1, "ref_seq": 9, "amount": -5}]
    with pytest.raises((IntegrityError, psycopg.errors.NotNullViolation)), tx() as s, deferred_writes(s):
        insert_rows_referencing(s, child, orphan, "parent_id", parent, ("owner", "seq"))
    with tx() as s:
        assert len(s.execute(select(child)).all()) == 2
