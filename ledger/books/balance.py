"""Balances: "now" from the maintained remainders, any other time from the journal.

"Now" reads the account row, its grants with credit left (a partial index: used-up
grants are not read) and nothing of the journal, so its cost does not grow with history.
Any other time reads the nearest balance checkpoint and the entries around it
(ledger/books/checkpoints.py), never the whole journal.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ledger.books.checkpoints import sums_at
from ledger.books.grants import load_grants
from ledger.errors import NotFound
from ledger.money import format_credits
from ledger.store.models import HoldStatus
from ledger.store.sums import joined, split_sum
from ledger.store.tables import accounts_t, grants_t, holds_t
from ledger.timeutil import format_time, utcnow


def _account_row(s: Session, name: str) -> Any:
    row = s.execute(
        select(accounts_t).where(accounts_t.c.name == name, accounts_t.c.kind == "customer")
    ).first()
    if row is None:
        raise NotFound(f"account {name!r} does not exist", details={"account": name})
    return row


def balance(s: Session, account: str, at: datetime | None = None) -> dict[str, Any]:
    """What is spendable at `at` (default now), what is held, and each grant active then.

    At any time but "now" the figures come from journal postings effective at or
    before `at`, so adding operations effective later never changes them.
    """
    row = _account_row(s, account)
    if at is None:
        return _balance_now(s, row, utcnow())
    return _balance_from_journal(s, row, at)


def _balance_now(s: Session, row: Any, at: datetime) -> dict[str, Any]:
    grants = [g for g in load_grants(s, row.id) if g.active_at(at)]
    # Earmarked credit is part of the remainder, so only live grants can hold any.
    held = joined(
        *s.execute(
            select(*split_sum(grants_t.c.earmarked_ucredits)).where(
                grants_t.c.account_id == row.id, grants_t.c.remaining_ucredits > 0
            )
        ).one()
    )
    available = sum(g.free_ucredits for g in grants) - row.debt_ucredits
    return _shape(
        row.name,
        at,
        available,
        int(held),
        row.debt_ucredits,
        [(g.as_dict(), g.remaining_ucredits) for g in grants],
    )


def _balance_from_journal(s: Session, row: Any, at: datetime) -> dict[str, Any]:
    sums = sums_at(s, row.id, row.entry_count, row.created_at, at)
    # Only the grants in force at `at` are read: expired ones pile up with history.
    active_ids = set(
        s.execute(
            select(grants_t.c.id).where(
                grants_t.c.account_id == row.id,
                grants_t.c.effective_at <= at,
                grants_t.c.expires_at.is_(None) | (grants_t.c.expires_at > at),
            )
        ).scalars()
    )
    grants = [g for g in load_grants(s, row.id, with_remaining=False, ids=active_ids) if g.active_at(at)]
    debt = -sums.get((None, "debt"), 0)
    held = sum(v for (_g, bucket), v in sums.items() if bucket == "held")
    available = sum(sums.get((g.id, "available"), 0) for g in grants) - debt
    shown = []
    for g in grants:
        remaining = sums.get((g.id, "available"), 0) + sums.get((g.id, "held"), 0)
        shown.append(({**g.as_dict(), "remaining": format_credits(remaining)}, remaining))
    return _shape(row.name, at, available, held, debt, shown)


def _shape(
    name: str, at: datetime, available: int, held: int, debt: int, grants: list[tuple[dict[str, Any], int]]
) -> dict[str, Any]:
    return {
        "account": name,
        "at": format_time(at),
        "available": format_credits(available),
        "held": format_credits(held),
        "debt": format_credits(debt),
        "grants": [g for g, _remaining in grants],
    }


def available_credit(s: Session, at: datetime, account_ids: Collection[int] | None = None) -> dict[int, int]:
    """Micro-credits spendable at `at` per customer account (all, or `account_ids`): the
    free part of grants active then, less recorded debt.

    Aggregate reads without a lock, for quotes and the job_submit snapshot; a hold
    checks the same figure again under its account's lock (`grants.available_now`).
    """
    free_query = (
        select(
            grants_t.c.account_id,
            *split_sum(grants_t.c.remaining_ucredits - grants_t.c.earmarked_ucredits),
        )
        .where(
            grants_t.c.remaining_ucredits > 0,
            grants_t.c.effective_at <= at,
            (grants_t.c.expires_at.is_(None)) | (grants_t.c.expires_at > at),
        )
        .group_by(grants_t.c.account_id)
    )
    accounts_query = select(accounts_t.c.id, accounts_t.c.debt_ucredits).where(
        accounts_t.c.kind == "customer"
    )
    if account_ids is not None:
        free_query = free_query.where(grants_t.c.account_id.in_(list(account_ids)))
        accounts_query = accounts_query.where(accounts_t.c.id.in_(list(account_ids)))
    free = {account_id: joined(high, low) for account_id, high, low in s.execute(free_query)}
    return {account_id: free.get(account_id, 0) - int(debt) for account_id, debt in s.execute(accounts_query)}


def account_summary(s: Session, account: str) -> dict[str, Any]:
    row = _account_row(s, account)
    active = s.execute(
        select(func.count())
        .select_from(holds_t)
        .where(holds_t.c.account_id == row.id, holds_t.c.state == HoldStatus.ACTIVE)
    ).scalar_one()
    return {**balance(s, account), "active_holds": int(active), "entries": row.entry_count}
