"""Pages of a list: `{"items": [...], "next_cursor": ... | null}`.

Lists read from the journal and the holds page by id (`before_id` = the cursor, the
last id of the previous page), so rows added meanwhile never shift a page; short
lists computed whole (accounts, prices, usage rows) page by position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from portal.api.registry import Page

T = TypeVar("T")


def by_id(
    rows: Sequence[T], page: Page, id_of: Callable[[T], int], shape: Callable[[T], Any]
) -> dict[str, Any]:
    """`rows` read newest first with one more than `page.limit`: the extra one says a
    next page exists."""
    shown = rows[: page.limit]
    more = len(rows) > page.limit
    return {"items": [shape(r) for r in shown], "next_cursor": str(id_of(shown[-1])) if more else None}


def by_position(items: Sequence[Any], page: Page) -> dict[str, Any]:
    start = page.cursor or 0
    end = start + page.limit
    return {"items": list(items[start:end]), "next_cursor": str(end) if end < len(items) else None}
