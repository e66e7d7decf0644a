"""Holds past their time limit and grace resolve as expired, so a lost epilog never
strands credit (`expire_holds`); `sweep` is one account's upkeep: those holds, the free
credit of grants that expired, and recorded debt paid from active credit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.books import idempotency
from ledger.books.accounts import lock_account
from ledger.books.grants import expire_grants, pay_debt
from ledger.holds.resolve import release_hold
from ledger.money import format_credits
from ledger.store.models import HoldStatus
from ledger.store.tables import accounts_t, holds_t
from ledger.timeutil import format_time, utcnow


def expire_holds(s: Session, account_name: str, at: datetime) -> list[int]:
    """Resolve holds past time limit + grace, so a lost epilog never strands credit."""
    lock_account(s, account_name)
    ids = list(
        s.execute(
            select(holds_t.c.id)
            .join(accounts_t, accounts_t.c.id == holds_t.c.account_id)
            .where(
                accounts_t.c.name == account_name,
                holds_t.c.state == HoldStatus.ACTIVE,
                holds_t.c.expires_at <= at,
            )
        ).scalars()
    )
    for hold_id in ids:
        release_hold(s, hold_id, at, state=HoldStatus.EXPIRED)
    return ids


def sweep(
    s: Session, account: str, at: datetime | None = None, *, idempotency_key: str | None = None
) -> dict[str, Any]:
    """Expire holds past time limit + grace, post expired grant credit and pay debt from
    active credit, for one account. A repeat of a keyed sweep returns its first result."""
    scope = lock_account(s, account).id
    request = {"at": format_time(at)}
    first = idempotency.replay(s, scope, idempotency_key, "sweep", request)
    if first is not None:
        return first
    at = at or utcnow()
    expired_holds = expire_holds(s, account, at)
    acct = lock_account(s, account)
    expired = expire_grants(s, acct, at)
    paid = pay_debt(s, acct, at)
    result = {
        "account": account,
        "at": format_time(at),
        "expired_holds": expired_holds,
        "expired_credits": format_credits(expired),
        "debt_paid": format_credits(paid),
    }
    idempotency.remember(s, scope, idempotency_key, "sweep", request, result)
    return result
