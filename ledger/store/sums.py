"""Sums of micro-credits that cannot overflow, on SQLite as on PostgreSQL.

SQLite adds integers in 64 bits and fails the whole statement ("integer overflow") once
a SUM passes 2**63 - 1. In a read grouped by account, one account whose figures add up
past that fails every account's: the job_submit snapshot, /metrics and the fairshare
inputs all stop. The bounds in ledger.money keep every account's sums far below that
for what the ledger writes; the reads that take every account at once sum with
`split_sum`, which stays exact whatever is stored (a database written before the
bounds, a row written by hand), so one bad account never takes the others with it.

Each value x is taken as x / 2**32 and x % 2**32, which both stores divide the same way
(truncating toward zero, the remainder taking x's sign), so x = high * 2**32 + low
exactly; the database adds each half without overflow (a high half is below 2**31, a
low one below 2**32: billions of rows before either sum could overflow) and `joined`
puts them together in Python, whose integers have no bound. PostgreSQL's SUM of a
BIGINT is NUMERIC and never overflows; the halves cost it two cheap aggregates.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, func, literal_column
from sqlalchemy.sql.elements import ColumnElement

__all__ = ["HALF", "joined", "split_sum"]

HALF = 2**32
_HALF_SQL = literal_column(str(HALF), BigInteger)


def split_sum(expression: Any) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    """SUM(expression) as two columns, (high, low); `joined(high, low)` is the sum.

    Plain `/` (op, not Python's true division, which SQLAlchemy renders as a NUMERIC
    division on PostgreSQL) so both stores divide integers."""
    grouped = expression.self_group()  # a custom operator would not parenthesise x - y
    high = func.coalesce(func.sum(grouped.op("/", precedence=8)(_HALF_SQL)), 0)
    low = func.coalesce(func.sum(grouped % _HALF_SQL), 0)
    return high, low


def joined(high: Any, low: Any) -> int:
    """The exact sum from `split_sum`'s two columns (None, from no rows, is 0)."""
    return int(high or 0) * HALF + int(low or 0)
