"""Site-wide figures for monitoring and exports: every account's credit now, who belongs
where, and when the meter last charged a running job.

Few aggregate queries whatever the number of accounts, without locks: a scrape or an
export reads a consistent-enough picture and never queues behind the hot path. The
figures are the ones `balance` shows for "now" (free part of active grants less debt,
earmarks held), computed for all accounts at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ledger.books.balance import available_credit
from ledger.money import UCREDITS_PER_CREDIT
from ledger.store.models import HoldStatus
from ledger.store.sums import joined, split_sum
from ledger.store.tables import accounts_t, grants_t, holds_t, members_t

__all__ = ["AccountTotals", "account_totals", "memberships"]


@dataclass(frozen=True)
class AccountTotals:
    """One customer account's credit at one moment, in micro-credits."""

    account: str
    available_ucredits: int  # spendable now; negative when the account is in debt
    held_ucredits: int  # earmarked by active holds
    active_holds: int

    @property
    def available_whole_credits(self) -> int:
        """Available credit rounded down to whole credits (a debt of 0.5 is -1)."""
        return self.available_ucredits // UCREDITS_PER_CREDIT


def account_totals(s: Session, at: datetime) -> list[AccountTotals]:
    """Every customer account's available, held and active holds at `at`, by name."""
    available = available_credit(s, at)
    held = {
        account_id: joined(high, low)
        for account_id, high, low in s.execute(
            select(grants_t.c.account_id, *split_sum(grants_t.c.earmarked_ucredits))
            .where(grants_t.c.earmarked_ucredits > 0)
            .group_by(grants_t.c.account_id)
        )
    }
    active = {
        account_id: int(count)
        for account_id, count in s.execute(
            select(holds_t.c.account_id, func.count())
            .where(holds_t.c.state == HoldStatus.ACTIVE)
            .group_by(holds_t.c.account_id)
        )
    }
    names = s.execute(
        select(accounts_t.c.id, accounts_t.c.name)
        .where(accounts_t.c.kind == "customer")
        .order_by(accounts_t.c.name)
    )
    return [
        AccountTotals(name, available.get(id_, 0), held.get(id_, 0), active.get(id_, 0))
        for id_, name in names
    ]


def memberships(s: Session, user: str | None = None) -> list[tuple[str, str]]:
    """(user, account) for every member of every customer account (or only `user`'s)."""
    query = (
        select(members_t.c.user, accounts_t.c.name)
        .join(accounts_t, accounts_t.c.id == members_t.c.account_id)
        .where(accounts_t.c.kind == "customer")
        .order_by(members_t.c.user, accounts_t.c.name)
    )
    if user is not None:
        query = query.where(members_t.c.user == user)
    return [(row.user, row.name) for row in s.execute(query)]
