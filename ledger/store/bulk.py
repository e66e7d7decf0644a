"""Many rows in one statement: `unnest` of column arrays on PostgreSQL, executemany elsewhere.

The meter writes thousands of rows per account per tick (an entry, its postings, the
hold and its allocation per charge). psycopg's executemany sends one statement per
row -- pipelined, but each parsed, planned and executed on its own -- and a multi-row
VALUES with tens of thousands of parameters costs more to build than to run. Sent as
one array per column through `unnest`, the same rows are one statement with a few
parameters whatever their number. SQLite runs executemany in-process, already fast.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import Column, Table, any_, bindparam, func, insert, select, tuple_, update
from sqlalchemy import bindparam as _bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session
from sqlalchemy.types import TypeDecorator

__all__ = [
    "among",
    "among_pairs",
    "deferred_writes",
    "deferring",
    "insert_rows",
    "insert_rows_referencing",
    "pair_params",
    "select_many",
    "update_rows",
]

_DEFERRED = "ledger.store.bulk.deferred"


@contextmanager
def deferred_writes(s: Session) -> Iterator[None]:
    """On PostgreSQL, send the `insert_rows` (without `returning`) and `update_rows` of
    this block through one psycopg pipeline, each as soon as it is built, and wait for
    their results once, when the block ends: one round trip for the whole write phase of
    a batch instead of one per statement, and the server executes the first statements
    while the later ones are still being built.

    Errors of a sent statement are raised by a later write or at the end of the block; the
    caller's transaction is then rolled back. Elsewhere (SQLite) writes run as they come.
    """
    if s.get_bind().dialect.name != "postgresql" or _DEFERRED in s.info:
        yield
        return
    # The session's own connection, inside its transaction.
    driver = s.connection().connection.driver_connection
    assert driver is not None
    with driver.pipeline(), driver.cursor() as cursor:
        s.info[_DEFERRED] = cursor
        try:
            yield
        finally:
            del s.info[_DEFERRED]


def deferring(s: Session) -> bool:
    """Whether writes go through `deferred_writes`'s pipeline (PostgreSQL only)."""
    return _DEFERRED in s.info


def _send(s: Session, sql: str, params: dict[str, Any]) -> None:
    cursor = s.info.get(_DEFERRED)
    if cursor is None:
        s.connection().exec_driver_sql(sql, params)
    else:
        cursor.execute(sql, params)


def _unnest(s: Session, rows: Sequence[dict[str, Any]]) -> bool:
    # One row goes the plain way: the statement every single-charge path has always used.
    return len(rows) > 1 and s.get_bind().dialect.name == "postgresql"


def _arrays(
    s: Session,
    table: Table,
    names: Sequence[str],
    rows: Sequence[dict[str, Any]],
    others: dict[str, Column[Any]] | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """`CAST(%(cN)s AS type[])` per column, and the column arrays bound as the column's type would
    (`others`: the column whose type a name that is not `table`'s takes).

    Integers, strings and timestamps go as one array literal each, built with `str.join`:
    psycopg dumps a list element by element in Python, a third of the daemon writer's CPU.
    Other types go as psycopg's binary arrays (`%b`).
    """
    dialect = s.get_bind().dialect
    casts: list[str] = []
    params: dict[str, Any] = {}
    for i, name in enumerate(names):
        column: Column[Any] = others[name] if others and name in others else table.c[name]
        values = [row[name] for row in rows]
        if isinstance(column.type, TypeDecorator):
            bind = column.type.process_bind_param
            values = [bind(v, dialect) for v in values]
        literal = _array_literal(values)
        placeholder = f"%(c{i})b" if literal is None else f"%(c{i})s"
        casts.append(f"CAST({placeholder} AS {_type_name(column, dialect)}[])")
        params[f"c{i}"] = values if literal is None else literal
    return casts, params


# A column's SQL type name, compiled once (per statement it cost the writer ~4% of its CPU).
_TYPE_NAMES: dict[tuple[Column[Any], str], str] = {}


def _type_name(column: Column[Any], dialect: Any) -> str:
    key = (column, dialect.name)
    found = _TYPE_NAMES.get(key)
    if found is None:
        found = _TYPE_NAMES[key] = column.type.compile(dialect=dialect)
    return found


def _array_literal(values: Sequence[Any]) -> str | None:
    """`values` as a PostgreSQL array literal ('{1,NULL,"a \\"b\\""}'), or None when one is
    of a type this does not write (bools, decimals, ...: left to psycopg).

    The common cases (no NULL; strings with nothing to escape) are joined in one C call."""
    kinds = set(map(type, values))
    nulls = type(None) in kinds
    kinds.discard(type(None))
    if kinds <= {int}:
        if not nulls:
            return "{" + ",".join(map(str, values)) + "}"
        return "{" + ",".join(["NULL" if v is None else str(v) for v in values]) + "}"
    if kinds <= {str}:
        if not nulls:
            joined = '","'.join(values)
            if '"' not in joined and "\\" not in joined:
                return '{"' + joined + '"}'
        return "{" + ",".join(["NULL" if v is None else _quoted(v) for v in values]) + "}"
    if kinds <= {datetime} and all(v is None or v.tzinfo is None for v in values):
        return "{" + ",".join(["NULL" if v is None else f'"{v.isoformat(sep=" ")}"' for v in values]) + "}"
    return None


def _list_literal(value: Any) -> Any:
    """A list parameter (`= ANY(...)`, `among_pairs`) as its array literal where it can be."""
    if isinstance(value, list):
        literal = _array_literal(value)
        if literal is not None:
            return literal
    return value


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def insert_rows(
    s: Session, table: Table, rows: Sequence[dict[str, Any]], returning: Sequence[str] = ()
) -> list[Any]:
    """Insert `rows` (dicts with the same keys); return the `returning` columns, in no set order."""
    if not rows:
        return []
    names = list(rows[0])
    if not _unnest(s, rows) and (returning or _DEFERRED not in s.info):
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
    _send(s, sql, params)
    return []


def insert_rows_referencing(
    s: Session, table: Table, rows: Sequence[dict[str, Any]], column: str, target: Table, keys: Sequence[str]
) -> bool:
    """On PostgreSQL inside `deferred_writes`: send the insert of `rows` whose `column` is
    the id of the `target` row whose `keys` columns equal the row's `ref_<key>` values
    (a row inserted earlier in the same block, whose id was never read back). Returns
    False, doing nothing, anywhere else: the caller inserts with the ids themselves."""
    if _DEFERRED not in s.info:
        return False
    if not rows:
        return True
    quote = s.get_bind().dialect.identifier_preparer.quote
    names = list(rows[0])
    refs = {f"ref_{k}": target.c[k] for k in keys}
    casts, params = _arrays(s, table, names, rows, refs)
    own = [n for n in names if n not in refs]
    # Each row's id by a look-up of its own (the `keys` are unique: an index probe), not a
    # join, which the planner ran by hashing a sequential scan of the whole target table (the
    # journal, every batch) while it believed the table small. A row whose target is missing
    # gets a NULL id, which the NOT NULL column refuses, where a join would have dropped it.
    found = " AND ".join(f"t.{quote(k)} = v.{quote(f'ref_{k}')}" for k in keys)
    sql = (
        f"INSERT INTO {quote(table.name)} ({quote(column)}, {', '.join(quote(n) for n in own)}) "
        f"SELECT (SELECT t.id FROM {quote(target.name)} AS t WHERE {found}), "
        f"{', '.join(f'v.{quote(n)}' for n in own)} "
        f"FROM unnest({', '.join(casts)}) WITH ORDINALITY AS v({', '.join(quote(n) for n in names)}, ord_) "
        # In the rows' order, as every insert here: ids follow it (a chain hashes postings by id).
        "ORDER BY v.ord_"
    )
    _send(s, sql, params)
    return True


def update_rows(s: Session, table: Table, keys: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """Set the non-key columns of each row where the `keys` columns match its values."""
    if not rows:
        return
    names = list(rows[0])
    values = [n for n in names if n not in keys]
    if not _unnest(s, rows) and _DEFERRED not in s.info:
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
    _send(s, sql, params)


def among(column: Any, name: str, postgres: bool) -> Any:
    """`column` is one of the list parameter `name`: `= ANY(...)` on PostgreSQL (one SQL
    text whatever the list's length, as `select_many` needs), an expanding `IN` elsewhere."""
    if postgres:
        return column == any_(bindparam(name))
    return column.in_(bindparam(name, expanding=True))


def among_pairs(left: Any, right: Any, name: str, postgres: bool) -> Any:
    """(`left`, `right`) is one of the pairs bound as `name` (`pair_params`). On PostgreSQL
    an IN over the unnest of two arrays, which plans as one unique-index probe per pair
    whatever the table's statistics say: `a = ANY(...) AND b = ANY(...)` on a young table
    (no statistics yet) probed the index on `a` alone and filtered every row of it."""
    if postgres:
        pairs = (
            func.unnest(
                bindparam(f"{name}_0", type_=ARRAY(left.type)),
                bindparam(f"{name}_1", type_=ARRAY(right.type)),
            )
            .table_valued("a", "b")
            .render_derived(name="pairs")
        )
        return tuple_(left, right).in_(select(pairs.c.a, pairs.c.b))
    return tuple_(left, right).in_(bindparam(name, expanding=True))


def pair_params(name: str, pairs: Iterable[tuple[Any, Any]], postgres: bool) -> dict[str, Any]:
    """The parameters of `among_pairs(..., name, postgres)` for these pairs."""
    ordered = sorted(set(pairs))
    if postgres:
        return {f"{name}_0": [a for a, _ in ordered], f"{name}_1": [b for _, b in ordered]}
    return {name: ordered}


class _Row(tuple):
    """A fetched row read by column name, as SQLAlchemy's rows are (`row.id`, `row._mapping`)."""

    _fields: tuple[str, ...] = ()

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))


def _row_class(fields: tuple[str, ...]) -> type[_Row]:
    attributes: dict[str, Any] = {"_fields": fields, "__slots__": ()}
    for i, name in enumerate(fields):
        attributes[name] = property(itemgetter(i))
    return type("Row", (_Row,), attributes)


# Per statement object: (SQL text, the row class, each column's result processor).
_COMPILED: dict[Any, tuple[str, dict[str, Any], type[_Row], list[Any]]] = {}


def _compiled(s: Session, statement: Any) -> tuple[str, dict[str, Any], type[_Row], list[Any]]:
    found = _COMPILED.get(statement)
    if found is None:
        dialect = s.get_bind().dialect
        compiled = statement.compile(dialect=dialect)
        columns = compiled._result_columns
        processors = [c.type._cached_result_processor(dialect, None) for c in columns]
        # The statement's own literals (`> 0`) are parameters too: sent with the caller's.
        fixed = dict(compiled.params)
        found = (compiled.string, fixed, _row_class(tuple(c.keyname for c in columns)), processors)
        _COMPILED[statement] = found
    return found


def select_many(s: Session, queries: Sequence[tuple[Any, dict[str, Any]]]) -> list[list[Any]]:
    """Run several independent SELECTs (statement, parameters); return each one's rows.

    On PostgreSQL they go together in one psycopg pipeline, one round trip for all, and
    come back as rows read by column name with each column's type applied as SQLAlchemy
    would. Statements must be built once and reused (their SQL is compiled once), and
    take list parameters as `= ANY(...)` there, `IN` with an expanding parameter elsewhere.
    """
    if s.get_bind().dialect.name != "postgresql":
        return [list(s.execute(statement, params)) for statement, params in queries]
    driver = s.connection().connection.driver_connection
    assert driver is not None
    plans = [_compiled(s, statement) for statement, _ in queries]
    cursors = [driver.cursor() for _ in queries]
    with driver.pipeline():
        for cursor, (sql, fixed, _, _), (_, params) in zip(cursors, plans, queries, strict=True):
            cursor.execute(sql, {**fixed, **{name: _list_literal(value) for name, value in params.items()}})
    results: list[list[Any]] = []
    for cursor, (_, _, row_class, processors) in zip(cursors, plans, strict=True):
        fetched = cursor.fetchall()
        cursor.close()
        if any(processors):
            fetched = [
                tuple(v if p is None or v is None else p(v) for p, v in zip(processors, row, strict=True))
                for row in fetched
            ]
        results.append([row_class(row) for row in fetched])
    return results
