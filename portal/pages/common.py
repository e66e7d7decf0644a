"""What the page modules share: who sees whose jobs, page length, times from a form."""

from __future__ import annotations

from datetime import datetime, timedelta

from flask import current_app

from ledger.errors import InvalidInput
from ledger.money import parse_credits
from ledger.timeutil import parse_time
from portal.auth import Principal
from portal.settings import portal_settings

DATE_LENGTH = len("2026-12-01")


def own_user(role: str, who: Principal) -> str | None:
    """The user whose jobs and usage a member is limited to; None (everyone's) for the
    account's managers and admins."""
    return who.user if role == "member" else None


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
