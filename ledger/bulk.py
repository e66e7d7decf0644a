"""Many rows in one statement: `unnest` of column arrays on PostgreSQL, executemany elsewhere.

The meter writes thousands of rows per account per tick (an entry, its postings, the
hold and its allocation per charge). psycopg's executemany sends one statement per
row -- pipelined, but each parsed, planned and executed on its own -- and a multi-row
VALUES with tens of thousands of parameters costs more to build than to run. Sent as
one array per column through `unnest`, the same rows are one statement with a few
parameters whatever their number. SQLite runs executemany in-process, already fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Column, Table, insert, update
from sqlalchemy import bindparam as _bindparam
from sqlalchemy.orm import Session
from sqlalchemy.types import TypeDecorator

__all__ = ["insert_rows", "update_rows"]


def _unnest(s: Session, rows: Sequence[dict[str, Any]]) -> bool:
    # One row goes the plain way: the statement every single-charge path has always used.
    return len(rows) > 1 and s.get_bind().dialect.name == "postgresql"


def _arrays(
    s: Session, table: Table, names: Sequence[str], rows: Sequence[dict[str, Any]]
) -> tuple[list[str], dict[str, Any]]:
    """`CAST(%(cN)b AS type[])` per column, and the column arrays bound as the column's type would.

    `%b` sends each array in binary: no text escaping of every element (5x faster here).
    """
    dialect = s.get_bind().dialect
    casts: list[str] = []
    params: dict[str, Any] = {}
    for i, name in enumerate(names):
        column: Column[Any] = table.c[name]
        values = [row[name] for row in rows]
        if isinstance(column.type, TypeDecorator):
            values = [column.type.process_bind_param(v, dialect) for v in values]
        casts.append(f"CAST(%(c{i})b AS {column.type.compile(dialect=dialect)}[])")
        params[f"c{i}"] = values
    return casts, params


def insert_rows(
    s: Session, table: Table, rows: Sequence[dict[str, Any]], returning: Sequence[str] = ()
) -> list[Any]:
    """Insert `rows` (dicts with the same keys); return the `returning` columns, in no set order."""
    if not rows:
        return []
    names = list(rows[0])
    if not _unnest(s, rows):
        if not returning:
            s.execute(insert(table), list(rows))
            return []
        statement = insert(table).returning(*(table.c[n] for n in returning))
        return list(s.execute(statement, list(rows)))
    quote = s.get_bind().dialect.identifier_preparer.quote
    casts, params = _arrays(s, table, names, rows)
    sql = (
        f"INSERT INTO {quote(table.name)} ({', '.join(quote(n) for n in names)}) "
        f"SELECT * FROM unnest({', '.join(casts)})"
    )
    if returning:
        sql += f" RETURNING {', '.join(quote(n) for n in returning)}"
        return list(s.connection().exec_driver_sql(sql, params))
    s.connection().exec_driver_sql(sql, params)
    return []


def update_rows(s: Session, table: Table, keys: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """Set the non-key columns of each row where the `keys` columns match its values."""
    if not rows:
        return
    names = list(rows[0])
    values = [n for n in names if n not in keys]
    if not _unnest(s, rows):
        statement = (
            update(table)
            .where(*(table.c[k] == _bindparam(f"k_{k}") for k in keys))
            .values({n: _bindparam(f"v_{n}") for n in values})
        )
        s.execute(
            statement, [{**{f"k_{k}": r[k] for k in keys}, **{f"v_{n}": r[n] for n in values}} for r in rows]
        )
        return
    quote = s.get_bind().dialect.identifier_preparer.quote
    casts, params = _arrays(s, table, names, rows)
    target = quote(table.name)
    sql = (
        f"UPDATE {target} SET {', '.join(f'{quote(n)} = v.{quote(n)}' for n in values)} "
        f"FROM unnest({', '.join(casts)}) AS v({', '.join(quote(n) for n in names)}) "
        f"WHERE {' AND '.join(f'{target}.{quote(k)} = v.{quote(k)}' for k in keys)}"
    )
    s.connection().exec_driver_sql(sql, params)
