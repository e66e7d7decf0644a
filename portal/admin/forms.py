"""Reading the admin and manager forms: text in, the ledger's argument types out.

Amounts stay decimal strings (the ledger parses them); times and whole numbers are
parsed here, and a bad one is refused as the ledger refuses its own input
(`InvalidInput`, 422), so every view treats a bad field the same way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import abort, request
from sqlalchemy.orm import Session

from ledger import api
from ledger.errors import InvalidInput
from ledger.timeutil import parse_time

MAX_WHOLE_NUMBER = 10**9


def text(field: str) -> str:
    return request.form.get(field, "").strip()


def optional_text(field: str) -> str | None:
    return text(field) or None


def idempotency_key() -> str:
    """The key the form was rendered with; a form without one is not one of ours."""
    key = text("idempotency_key")
    if not key:
        abort(400, "the form carries no idempotency key; reload the page and submit it again")
    return key


def optional_time(field: str, label: str) -> datetime | None:
    """An ISO 8601 time (UTC when it has no offset, as the browser's datetime-local sends)."""
    raw = text(field)
    return parse_time(raw, field=label) if raw else None


def optional_whole_number(field: str, label: str, *, code: str) -> int | None:
    raw = text(field)
    if not raw:
        return None
    if not raw.isdigit() or int(raw) > MAX_WHOLE_NUMBER:
        raise InvalidInput(
            f"{label} {raw!r} must be a whole number from 0 to {MAX_WHOLE_NUMBER}",
            code=code,
            details={"field": field, "value": raw},
        )
    return int(raw)


def whole_number(field: str, label: str, *, code: str) -> int:
    value = optional_whole_number(field, label, code=code)
    if value is None:
        raise InvalidInput(f"{label} is required", code=code, details={"field": field})
    return value


def set_member(s: Session, account: str) -> dict[str, Any]:
    """Add the form's user to `account`, or change their role there."""
    return api.add_member(
        s, text("user"), account, role=text("role") or "member", idempotency_key=idempotency_key()
    )


def set_limits(s: Session, account: str, user: str | None) -> dict[str, Any]:
    """The form's caps for `user` in `account` (None: the account's own caps). A blank
    field leaves its cap as it is; `clear` removes every cap of that user first."""
    return api.set_limits(
        s,
        account,
        user=user,
        max_gpus=optional_whole_number("max_gpus", "max GPUs", code="invalid_limit"),
        max_rate=optional_text("max_rate"),
        daily_cap=optional_text("daily_cap"),
        clear=text("clear") == "yes",
        idempotency_key=idempotency_key(),
    )
