"""The limit rules: what a new hold must pass, and what job_submit tells before it.

Concurrent GPUs (user, account), spend rate (sum of active burn rates + the new one
<= cap) and daily spend (spent today + held + the new hold <= cap). A refusal is a
`LimitExceeded` naming the limit, the current value and the cap; its details carry
`"alone": True` when the job breaks the cap on its own, whatever else runs, so that
it can never start under that cap (the prolog says so, and the daemon never
releases it: docs/design.md §4.12). The caps themselves are ledger.limits.caps; the
daily caps that running jobs cross, which the meter watches, ledger.holds.overruns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from ledger.books.journal import REVENUE, LockedAccount
from ledger.books.tree import account_parents, ancestors, subtree
from ledger.errors import LimitExceeded
from ledger.limits.caps import Limits, limits_of
from ledger.money import format_credits, format_rate
from ledger.store.models import HoldStatus
from ledger.store.sums import joined, split_sum
from ledger.store.tables import accounts_t, entries_t, holds_t, limits_t, postings_t
from ledger.timeutil import day_bounds


def _usage_of_active_holds(s: Session, account_id: int | list[int], user: str | None) -> tuple[int, int, int]:
    """(GPUs, rate per hour, uncharged held credit) of the active holds of an account (or
    several: a subtree) or of a user in it."""
    ids = account_id if isinstance(account_id, list) else [account_id]
    uncharged = holds_t.c.amount_ucredits - holds_t.c.charged_ucredits
    query = select(
        func.coalesce(func.sum(holds_t.c.gpu_count), 0),
        *split_sum(holds_t.c.rate_ucredits_per_hour),
        *split_sum(case((uncharged > 0, uncharged), else_=0)),
    ).where(holds_t.c.account_id.in_(ids), holds_t.c.state == HoldStatus.ACTIVE)
    if user is not None:
        query = query.where(holds_t.c.user == user)
    gpus, rate_high, rate_low, held_high, held_low = s.execute(query).one()
    return int(gpus), joined(rate_high, rate_low), joined(held_high, held_low)


def spent_on_day(s: Session, account_id: int | list[int], user: str | None, at: datetime) -> int:
    """Charges (net of refunds) effective on `at`'s UTC day, in an account (or several)."""
    ids = account_id if isinstance(account_id, list) else [account_id]
    start, end = day_bounds(at)
    query = (
        select(*split_sum(postings_t.c.amount_ucredits))
        .join(entries_t, entries_t.c.id == postings_t.c.entry_id)
        .where(
            entries_t.c.account_id.in_(ids),
            postings_t.c.account_id == REVENUE,
            entries_t.c.effective_at >= start,
            entries_t.c.effective_at < end,
        )
    )
    if user is not None:
        query = query.where(entries_t.c.user == user)
    return joined(*s.execute(query).one())


@dataclass(frozen=True)
class Usage:
    """What an account or a user has running now, as the limits see it: the active holds'
    GPUs, burn rate per hour and uncharged credit, and the day's charges so far."""

    gpus: int = 0
    rate_ucredits_per_hour: int = 0
    held_ucredits: int = 0
    spent_today_ucredits: int = 0


def capped_usage(s: Session, at: datetime) -> dict[tuple[int, str | None], Usage]:
    """Usage (see `Usage`) of every account that has a cap of its own or on a member,
    by (account id, user) and for the whole account under (account id, None): what the
    job_submit snapshot sets beside the caps. Four grouped reads, whatever the count."""
    return _usage_by_account(s, select(limits_t.c.account_id).distinct().scalar_subquery(), at)


def subtree_usage(s: Session, at: datetime) -> dict[tuple[str, str | None], Usage]:
    """Usage summed over the subtree of each capped account with accounts below it, by
    (its name, user) and (its name, None): what job_submit's snapshot sets beside a
    parent's caps, as `check_subtree_limits` reads it under the locks."""
    capped = capped_parents(s)
    if not capped:
        return {}
    parents = account_parents(s)
    members = {name: subtree(parents, name) for name in capped}
    wanted = sorted({m for names in members.values() for m in names})
    ids = {
        name: account_id
        for name, account_id in s.execute(
            select(accounts_t.c.name, accounts_t.c.id).where(accounts_t.c.name.in_(wanted))
        )
    }
    per_account = _usage_by_account(s, list(ids.values()), at)
    usage: dict[tuple[str, str | None], Usage] = {}
    for top, names in members.items():
        inside = {ids[name] for name in names}
        for (account_id, who), value in per_account.items():
            if account_id in inside:
                usage[(top, who)] = _plus(usage.get((top, who), Usage()), value)
    return usage


def _plus(a: Usage, b: Usage) -> Usage:
    return Usage(
        a.gpus + b.gpus,
        a.rate_ucredits_per_hour + b.rate_ucredits_per_hour,
        a.held_ucredits + b.held_ucredits,
        a.spent_today_ucredits + b.spent_today_ucredits,
    )


def _usage_by_account(s: Session, capped: Any, at: datetime) -> dict[tuple[int, str | None], Usage]:
    """Usage of the accounts `capped` selects (ids, or a subquery of them): four grouped reads."""
    uncharged = holds_t.c.amount_ucredits - holds_t.c.charged_ucredits
    usage: dict[tuple[int, str | None], Usage] = {}

    def add(key: tuple[int, str | None], more: Usage) -> None:
        usage[key] = _plus(usage.get(key, Usage()), more)

    holds = s.execute(
        select(
            holds_t.c.account_id,
            holds_t.c.user,
            func.sum(holds_t.c.gpu_count),
            func.sum(holds_t.c.rate_ucredits_per_hour),
            func.sum(case((uncharged > 0, uncharged), else_=0)),
        )
        .where(holds_t.c.state == HoldStatus.ACTIVE, holds_t.c.account_id.in_(capped))
        .group_by(holds_t.c.account_id, holds_t.c.user)
    )
    for account_id, user, gpus, rate, held in holds:
        for key in _scopes(account_id, user):
            add(key, Usage(int(gpus or 0), int(rate or 0), int(held or 0)))
    start, end = day_bounds(at)
    spent = s.execute(
        select(entries_t.c.account_id, entries_t.c.user, func.sum(postings_t.c.amount_ucredits))
        .join(entries_t, entries_t.c.id == postings_t.c.entry_id)
        .where(
            postings_t.c.account_id == REVENUE,
            entries_t.c.account_id.in_(capped),
            entries_t.c.effective_at >= start,
            entries_t.c.effective_at < end,
        )
        .group_by(entries_t.c.account_id, entries_t.c.user)
    )
    for account_id, user, amount in spent:
        for key in _scopes(account_id, user):
            add(key, Usage(spent_today_ucredits=int(amount or 0)))
    return usage


def _scopes(account_id: int, user: str | None) -> list[tuple[int, str | None]]:
    """The scopes a row counts in: the account, and its user's when it has one."""
    return [(account_id, None)] if user is None else [(account_id, user), (account_id, None)]


def check_limits(
    s: Session, account: LockedAccount, user: str, gpu_count: int, rate: int, amount: int, at: datetime
) -> None:
    """Refuse a new hold that would break a user or account cap, naming value and cap."""
    caps = limits_of(s, account.id, user)

    def usage(who: str | None) -> Usage:
        gpus, rate_now, held = _usage_of_active_holds(s, account.id, who)
        daily = caps[who].daily_cap_ucredits is not None
        return Usage(gpus, rate_now, held, spent_on_day(s, account.id, who, at) if daily else 0)

    breach = limit_breach(
        caps, usage, account=account.name, user=user, gpu_count=gpu_count, rate=rate, amount=amount
    )
    if breach is not None:
        raise breach


def capped_parents(s: Session) -> set[str]:
    """The accounts with caps of their own and accounts below them: one cheap read."""
    parent = accounts_t.alias("parent")
    child = accounts_t.alias("child")
    return set(
        s.execute(
            select(parent.c.name)
            .join(limits_t, limits_t.c.account_id == parent.c.id)
            .where(select(child.c.id).where(child.c.parent_id == parent.c.id).exists())
        ).scalars()
    )


def capped_ancestors(s: Session, account: str) -> list[str]:
    """The accounts above `account` with caps of their own, nearest first: a cap set on a
    parent caps its whole subtree. One cheap read where no parent is capped."""
    capped = capped_parents(s)
    if not capped:
        return []
    return [name for name in ancestors(account_parents(s), account) if name in capped]


def check_subtree_limits(
    s: Session, account: str, user: str, gpu_count: int, rate: int, amount: int, at: datetime
) -> None:
    """Refuse a new hold of `account` that would break a cap set on an account above it,
    counting what runs (and was spent today) anywhere in that account's subtree. The
    caller holds the locks of `account` and of those ancestors (`capped_ancestors`), so
    two jobs in sibling accounts cannot both pass a parent's cap."""
    for name in capped_ancestors(s, account):
        ancestor = s.execute(select(accounts_t.c.id).where(accounts_t.c.name == name)).scalar_one()
        caps = limits_of(s, ancestor, user)
        ids = list(
            s.execute(
                select(accounts_t.c.id).where(accounts_t.c.name.in_(subtree(account_parents(s), name)))
            ).scalars()
        )

        def usage(who: str | None, ids: list[int] = ids, caps: dict[str | None, Limits] = caps) -> Usage:
            gpus, rate_now, held = _usage_of_active_holds(s, ids, who)
            daily = caps[who].daily_cap_ucredits is not None
            return Usage(gpus, rate_now, held, spent_on_day(s, ids, who, at) if daily else 0)

        breach = subtree_breach(
            caps, usage, above=name, user=user, gpu_count=gpu_count, rate=rate, amount=amount
        )
        if breach is not None:
            raise breach


def subtree_breach(
    caps: Mapping[str | None, Limits],
    usage: Callable[[str | None], Usage],
    *,
    above: str,
    user: str,
    gpu_count: int,
    rate: int,
    amount: int,
) -> LimitExceeded | None:
    """The cap set on `above` that a new hold in an account below it would break, `usage`
    summed over `above`'s subtree: the one rule behind `check_subtree_limits` and
    job_submit's estimate (ledger.pricing.snapshot)."""
    breach = limit_breach(
        caps,
        usage,
        account=f"{above} (with the accounts below it)",
        user=user,
        gpu_count=gpu_count,
        rate=rate,
        amount=amount,
    )
    if breach is not None:
        breach.details["account"] = above
    return breach


def limit_breach(
    caps: Mapping[str | None, Limits],
    usage: Callable[[str | None], Usage],
    *,
    account: str,
    user: str,
    gpu_count: int,
    rate: int,
    amount: int,
) -> LimitExceeded | None:
    """The cap a new hold of `gpu_count` GPUs at `rate` per hour reserving `amount` would
    break, the user's before the account's, or None. `caps` are the account's (key None)
    and the user's (key `user`); `usage(who)` is asked only for a scope with a cap. The
    one rule behind both the hold (`check_limits`, usage read under the account's lock)
    and job_submit's estimate (the snapshot's usage)."""
    for scope, who in (("user", user), ("account", None)):
        limits = caps.get(who) or Limits()
        if limits == Limits():
            continue
        subject = f"user {user} in account {account}" if who else f"account {account}"
        now = usage(who)
        if limits.max_gpus is not None and now.gpus + gpu_count > limits.max_gpus:
            total_gpus = now.gpus + gpu_count
            return LimitExceeded(
                "concurrent_gpus",
                f"{subject}: {total_gpus} concurrent GPUs would exceed the cap of "
                f"{limits.max_gpus} ({now.gpus} in use + {gpu_count} requested)",
                {"limit": "concurrent_gpus", "scope": scope, "value": total_gpus, "cap": limits.max_gpus}
                | _alone(gpu_count > limits.max_gpus),
            )
        if limits.max_rate_ucredits_per_second is not None:
            cap_per_hour = limits.max_rate_ucredits_per_second * 3600
            if now.rate_ucredits_per_hour + rate > cap_per_hour:
                value = format_rate(now.rate_ucredits_per_hour + rate)
                cap = format_rate(cap_per_hour)
                return LimitExceeded(
                    "spend_rate",
                    f"{subject}: spend rate {value}/s would exceed the cap of {cap}/s",
                    {"limit": "spend_rate", "scope": scope, "value": value, "cap": cap}
                    | _alone(rate > cap_per_hour),
                )
        if limits.daily_cap_ucredits is not None:
            spent, held = now.spent_today_ucredits, now.held_ucredits
            value_u = spent + held + amount
            if value_u > limits.daily_cap_ucredits:
                value = format_credits(value_u)
                cap = format_credits(limits.daily_cap_ucredits)
                return LimitExceeded(
                    "daily_cap",
                    f"{subject}: {value} credits today would exceed the daily cap "
                    f"of {cap} ({format_credits(spent)} spent + "
                    f"{format_credits(held)} held + {format_credits(amount)} "
                    "for this job)",
                    {
                        "limit": "daily_cap",
                        "scope": scope,
                        "value": value,
                        "cap": cap,
                        "spent": format_credits(spent),
                        "held": format_credits(held),
                        "requested": format_credits(amount),
                    }
                    | _alone(amount > limits.daily_cap_ucredits),
                )
    return None


def _alone(alone: bool) -> dict[str, bool]:
    """The detail that marks a job over a cap on its own (see the module docstring)."""
    return {"alone": True} if alone else {}


def static_limit_breach(
    caps: Mapping[str | None, Limits],
    user: str,
    gpu_count: int,
    rate_ucredits_per_hour: int,
    cost_ucredits: int,
    *,
    above: str | None = None,
) -> LimitExceeded | None:
    """A cap that one job breaks on its own, whatever else runs: what job_submit can tell
    before the job exists (the hold checks the rest, with what is running, under the lock).

    `caps` are the account's (key None) and the user's (key `user`); `cost_ucredits` is
    one run's (an array task's) cost. With `above`, the caps are those set on that account
    above the job's, which cap its whole subtree (`subtree_breach`).
    """
    where = f"{above} (with the accounts below it)"
    subjects = (
        (f"user {user} in account {where}", f"account {where}") if above else (f"user {user}", "the account")
    )
    for who, scope, subject in ((user, "user", subjects[0]), (None, "account", subjects[1])):
        limits = caps.get(who) or Limits()
        if limits.max_gpus is not None and gpu_count > limits.max_gpus:
            return LimitExceeded(
                "concurrent_gpus",
                f"{gpu_count} GPUs exceed the cap of {limits.max_gpus} for {subject}",
                {"limit": "concurrent_gpus", "scope": scope, "value": gpu_count, "cap": limits.max_gpus},
            )
        if limits.max_rate_ucredits_per_second is not None:
            cap_per_hour = limits.max_rate_ucredits_per_second * 3600
            if rate_ucredits_per_hour > cap_per_hour:
                value, cap = format_rate(rate_ucredits_per_hour), format_rate(cap_per_hour)
                return LimitExceeded(
                    "spend_rate",
                    f"{value}/s exceeds the cap of {cap}/s for {subject}",
                    {"limit": "spend_rate", "scope": scope, "value": value, "cap": cap},
                )
        if limits.daily_cap_ucredits is not None and cost_ucredits > limits.daily_cap_ucredits:
            value, cap = format_credits(cost_ucredits), format_credits(limits.daily_cap_ucredits)
            return LimitExceeded(
                "daily_cap",
                f"{value} credits exceed the daily cap of {cap} for {subject}",
                {"limit": "daily_cap", "scope": scope, "value": value, "cap": cap},
            )
    return None
