"""What the page modules share: page length, times from a form (who sees whose jobs
is portal.auth.own_user, one rule for pages, CSV and API)."""

from __future__ import annotations

from datetime import datetime, timedelta

from flask import current_app

from ledger.errors import InvalidInput
from ledger.money import parse_credits
from ledger.timeutil import parse_time
from portal.settings import portal_settings

DATE_LENGTH = len("2026-12-01")


def page_size() -> int:
    return max(1, int(portal_settings(current_app)["page_size"]))


def low_balance_ucredits() -> int:
    return parse_credits(
        str(portal_settings(current_app)["low_balance_credits"]),
        field="portal.low_balance_credits",
        allow_zero=True,
        allow_negative=True,
    )


def form_time(text: str | None, field: str, *, end_of_day: bool = False) -> datetime | None:
    """A time from a form field: empty is None; a plain date is its UTC midnight, or the
    next midnight with `end_of_day` (so "to 2026-12-09" includes that day)."""
    raw = (text or "").strip()
    if not raw:
        return None
    at = parse_time(raw, field=field)
    if end_of_day and len(raw) == DATE_LENGTH:
        at += timedelta(days=1)
    return at


def ucredits(amount: str) -> int:
    """A decimal string the ledger formatted, back to micro-credits (any sign)."""
    return parse_credits(amount, allow_zero=True, allow_negative=True)


MAX_ROW_ID = 2**31 - 1  # ids are 32-bit integers on PostgreSQL (portal.api.schemas.MAX_ID)


def row_id(value: str | None, field: str) -> int | None:
    """A row id from a query string (a page's cursor): empty is None; anything but a
    whole number 1..MAX_ROW_ID is a 422 naming the field, never a database overflow."""
    if not value:
        return None
    if not value.isdigit() or not 1 <= int(value) <= MAX_ROW_ID:
        raise InvalidInput(
            f"{field} must be a whole number from 1 to {MAX_ROW_ID}",
            code=f"invalid_{field}",
            details={"field": field, "value": value[:32], "cap": MAX_ROW_ID},
        )
    return int(value)


def choice(value: str | None, allowed: tuple[str, ...], field: str) -> str | None:
    """`value` if it is one of `allowed`; empty is None; anything else a 422."""
    if not value:
        return None
    if value not in allowed:
        raise InvalidInput(
            f"{field} {value!r} must be one of {', '.join(allowed)}",
            code=f"invalid_{field}",
            details={"field": field, "value": value},
        )
    return value
