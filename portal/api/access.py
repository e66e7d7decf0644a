"""Which accounts a token may name, and the typed values of checked input."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from ledger import api
from ledger.errors import NotFound
from ledger.timeutil import parse_seconds, parse_slurm_duration, parse_time
from portal.auth import Principal, require_account


def visible(s: Session, who: Principal, account: str, *, manage: bool = False) -> str:
    """`who`'s role in `account` (NotFound as if it did not exist when it may not see it).

    A service token (hooks, bridge) acts on any account that exists.
    """
    if who.is_service:
        if account not in api.account_names(s):
            raise NotFound(f"account {account} does not exist", details={"account": account})
        return "service"
    return require_account(s, who, account, manage=manage)


def time_of(values: dict[str, Any], name: str) -> datetime | None:
    """The ISO 8601 time under `name`, if given."""
    text = values.get(name)
    return None if text is None else parse_time(text, field=name)


def duration_of(value: int | str, name: str) -> int:
    """Seconds from a number of seconds or Slurm's [D-]HH:MM:SS."""
    if isinstance(value, int) or value.isdigit():
        return parse_seconds(value, field=name)
    return parse_slurm_duration(value, field=name)
