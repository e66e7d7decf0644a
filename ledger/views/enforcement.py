"""What the ledger implies for Slurm's own enforcement: GPU caps and blocks.

Slurm can refuse GPUs without asking the ledger (association limits), so it keeps
refusing when the ledger is unreachable. This module answers, for every account and
member at one moment, the two ledger questions that decide those limits; the bridge
(accounting_bridge/sync/limits_sync.py) only maps the answers onto Slurm.

Blocks, the decision table (an account or member with a block may start no GPU job)::

    scope    condition at `at`                                    block       lifted by
    account  available + held <= 0 (no credit left, or debt)     no_credit   a top-up, a grant
                                                                               becoming active
    account  account's daily cap set, spent today >= cap          daily_cap   the next UTC day
    member   member's daily cap set, their spend today >= cap     daily_cap   the next UTC day

"Spent today" is what `limits` calls it: charges net of refunds effective on `at`'s UTC
day, running jobs' cost so far included (`ledger.holds.accrual`). Holds are not counted: a
running job's hold may still return credit, and a block that followed holds would
switch on and off as jobs start. Reaching the cap (not only
passing it) blocks, because reserve admits a hold only while spent + held + new <= cap,
so at the cap no GPU job can start anyway. A cap of 0 blocks all day.

Concurrent-GPU caps are the `limits set --max-gpus` values as they are. Everything is
read in a few aggregate queries without locks, whatever the number of accounts.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.books.journal import REVENUE
from ledger.holds.accrual import accrued_between
from ledger.money import format_credits
from ledger.store.sums import joined, split_sum
from ledger.store.tables import accounts_t, entries_t, limits_t, members_t, postings_t
from ledger.timeutil import day_bounds, format_time
from ledger.views.totals import account_totals

__all__ = ["AccountEnforcement", "Block", "MemberEnforcement", "enforcement"]


@dataclass(frozen=True)
class Block:
    """Why an account or member may start no GPU job now, and until when (None: until
    credit arrives)."""

    code: str  # "no_credit" | "daily_cap"
    message: str
    until: datetime | None = None


@dataclass(frozen=True)
class MemberEnforcement:
    user: str
    max_gpus: int | None
    blocks: tuple[Block, ...] = ()


@dataclass(frozen=True)
class AccountEnforcement:
    account: str
    max_gpus: int | None
    blocks: tuple[Block, ...]
    members: tuple[MemberEnforcement, ...]

    def member(self, user: str) -> MemberEnforcement | None:
        return self._by_user.get(user)

    @cached_property
    def _by_user(self) -> dict[str, MemberEnforcement]:
        return {m.user: m for m in self.members}


def enforcement(
    s: Session, at: datetime, accounts: Collection[str] | None = None
) -> list[AccountEnforcement]:
    """Caps and blocks of every customer account (or those named) and its members at `at`,
    by account name; members by name. Members with no row of their own get no cap."""
    wanted = None if accounts is None else set(accounts)
    totals = {t.account: t for t in account_totals(s, at) if wanted is None or t.account in wanted}
    ids = {
        row.name: row.id
        for row in s.execute(
            select(accounts_t.c.id, accounts_t.c.name).where(accounts_t.c.kind == "customer")
        )
        if row.name in totals
    }
    names = {account_id: name for name, account_id in ids.items()}
    caps: dict[tuple[int, str | None], tuple[int | None, int | None]] = {
        (row.account_id, row.user): (row.max_gpus, row.daily_cap_ucredits)
        for row in s.execute(
            select(limits_t.c.account_id, limits_t.c.user, limits_t.c.max_gpus, limits_t.c.daily_cap_ucredits)
        )
        if row.account_id in names
    }
    members: dict[int, list[str]] = {}
    for account_id, user in s.execute(
        select(members_t.c.account_id, members_t.c.user).order_by(members_t.c.user)
    ):
        if account_id in names:
            members.setdefault(account_id, []).append(user)
    capped = {account_id for (account_id, _), (_, cap) in caps.items() if cap is not None}
    spent = _spent_on_day(s, capped, at)
    _, day_end = day_bounds(at)
    result = []
    for name in sorted(totals):
        account_id = ids[name]
        total = totals[name]
        account_gpus, account_cap = caps.get((account_id, None), (None, None))
        blocks = []
        if total.available_ucredits + total.held_ucredits <= 0:
            blocks.append(
                Block(
                    "no_credit",
                    f"no credit left ({format_credits(total.available_ucredits)} available, "
                    f"{format_credits(total.held_ucredits)} held)",
                )
            )
        account_spent = sum(amount for (owner, _), amount in spent.items() if owner == account_id)
        if account_cap is not None and account_spent >= account_cap:
            blocks.append(_cap_block(account_spent, account_cap, day_end))
        member_rows = []
        for user in members.get(account_id, []):
            user_gpus, user_cap = caps.get((account_id, user), (None, None))
            user_spent = spent.get((account_id, user), 0)
            user_blocks = (
                (_cap_block(user_spent, user_cap, day_end),)
                if user_cap is not None and user_spent >= user_cap
                else ()
            )
            member_rows.append(MemberEnforcement(user, user_gpus, user_blocks))
        result.append(AccountEnforcement(name, account_gpus, tuple(blocks), tuple(member_rows)))
    return result


def _cap_block(spent_ucredits: int, cap_ucredits: int, day_end: datetime) -> Block:
    return Block(
        "daily_cap",
        f"daily cap of {format_credits(cap_ucredits)} reached ({format_credits(spent_ucredits)} "
        f"spent today) until {format_time(day_end)}",
        day_end,
    )


def _spent_on_day(
    s: Session, account_ids: Collection[int], at: datetime
) -> dict[tuple[int, str | None], int]:
    """Charges net of refunds effective on `at`'s UTC day, per (account, user), for the
    accounts that have a daily cap somewhere: one grouped query."""
    if not account_ids:
        return {}
    start, end = day_bounds(at)
    query = (
        select(entries_t.c.account_id, entries_t.c.user, *split_sum(postings_t.c.amount_ucredits))
        .join(entries_t, entries_t.c.id == postings_t.c.entry_id)
        .where(
            postings_t.c.account_id == REVENUE,
            entries_t.c.account_id.in_(list(account_ids)),
            entries_t.c.effective_at >= start,
            entries_t.c.effective_at < end,
        )
        .group_by(entries_t.c.account_id, entries_t.c.user)
    )
    spent = {(account_id, user): joined(high, low) for account_id, user, high, low in s.execute(query)}
    for key, amount in accrued_between(s, start, end, at, account_ids=account_ids).items():
        spent[key] = spent.get(key, 0) + amount
    return spent
