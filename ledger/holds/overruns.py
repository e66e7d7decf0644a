"""Daily caps that running jobs have already crossed: what the meter checks each tick.

A hold is taken only while spent + held + new <= cap (ledger.limits.rules), and a
provisional charge only moves credit from held to spent, so in full mode a cap is
crossed only by a run past its hold or by a charge the bridge adds; in lease mode this
is what refuses a renewal. "Spent" here counts running jobs' cost so far
(ledger.holds.accrual), posted or not, which is why these checks live beside the holds
and not among the limit rules the holds themselves call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.holds.accrual import accrued_between
from ledger.limits.rules import spent_on_day
from ledger.store.tables import accounts_t, limits_t
from ledger.timeutil import day_bounds


@dataclass(frozen=True)
class CapOverrun:
    """A daily cap that today's charges already exceed (scope 'user' or 'account')."""

    scope: str
    user: str | None
    spent_ucredits: int
    cap_ucredits: int


def daily_cap_overruns(s: Session, account_id: int, users: Iterable[str], at: datetime) -> list[CapOverrun]:
    """The account's daily cap and those of `users` that charges on `at`'s day exceed.

    Reserve checks spent + held + new <= cap, and a provisional charge only moves credit
    from held to spent, so in full mode a cap is crossed only by a run past its hold or
    by a charge the bridge adds; in lease mode this is what refuses a renewal. Spent
    counts running jobs' cost so far (`ledger.holds.accrual`), posted or not. One query
    finds the caps; today's spend is summed only for scopes that have one.
    """
    wanted = set(users)
    overruns: list[CapOverrun] = []
    caps = s.execute(
        select(limits_t.c.user, limits_t.c.daily_cap_ucredits).where(
            limits_t.c.account_id == account_id, limits_t.c.daily_cap_ucredits.is_not(None)
        )
    ).all()
    for user, cap in sorted(caps, key=lambda row: (row.user is not None, row.user or "")):
        if user is not None and user not in wanted:
            continue
        spent = spent_on_day(s, account_id, user, at) + _running_today(s, account_id, user, at)
        if spent > cap:
            overruns.append(CapOverrun("user" if user else "account", user, spent, cap))
    return overruns


def _running_today(s: Session, account_id: int, user: str | None, at: datetime) -> int:
    """Running jobs' unposted cost that took effect on `at`'s UTC day, up to `at`."""

    start, end = day_bounds(at)
    running = accrued_between(s, start, end, at, account_ids=[account_id])
    return sum(amount for (_, owner), amount in running.items() if user is None or owner == user)


def capped_accounts(s: Session) -> dict[str, int]:
    """Accounts with a daily cap of their own or on a member (name -> id): the ones whose
    running jobs the meter checks against their caps."""
    query = (
        select(accounts_t.c.name, accounts_t.c.id)
        .join(limits_t, limits_t.c.account_id == accounts_t.c.id)
        .where(limits_t.c.daily_cap_ucredits.is_not(None))
    )
    return {name: account_id for name, account_id in s.execute(query)}
