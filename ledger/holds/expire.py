"""Holds past their time limit and grace resolve as expired, so a lost epilog never
strands credit.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.books.accounts import lock_account
from ledger.holds.resolve import release_hold
from ledger.store.tables import accounts_t, holds_t


def expire_holds(s: Session, account_name: str, at: datetime) -> list[int]:
    """Resolve holds past time limit + grace, so a lost epilog never strands credit."""
    lock_account(s, account_name)
    ids = list(
        s.execute(
            select(holds_t.c.id)
            .join(accounts_t, accounts_t.c.id == holds_t.c.account_id)
            .where(accounts_t.c.name == account_name, holds_t.c.state == "active", holds_t.c.expires_at <= at)
        ).scalars()
    )
    for hold_id in ids:
        release_hold(s, hold_id, at, state="expired")
    return ids
