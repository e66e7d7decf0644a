"""An in-memory picture of what job_submit quotes from: prices, caps and spendable credit.

job_submit.lua waits on the daemon inside slurmctld, so the answer must cost
microseconds, not a database transaction. The daemon refreshes this picture every
`max_age_seconds` (default 1 s), which keeps the promise that a top-up is visible
to job_submit within 2 s. It is only an estimate: the prolog's hold is the
authoritative check, under the account's lock.

A quote from the picture and a quote from the database (:func:`ledger.pricing.quotes.quote`)
run the same code (:func:`ledger.pricing.quotes.estimate` over a
:class:`~ledger.pricing.prices.PriceTable`); only where prices, credit and caps are read differs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from ledger.books.balance import available_credit
from ledger.books.credit_use import CreditUse, credit_in_force
from ledger.books.pools import Room, pool_rooms, pool_settings, pool_uses
from ledger.books.tree import account_parents, ancestors
from ledger.errors import LimitExceeded, NotFound
from ledger.limits.caps import Limits
from ledger.limits.rules import (
    Usage,
    capped_parents,
    capped_usage,
    static_limit_breach,
    subtree_breach,
    subtree_usage,
)
from ledger.pricing.cloud_budget import CloudBudgetScope, CloudSpend, cloud_spend, month_of
from ledger.pricing.prices import PriceTable, load_price_table, parse_gpus
from ledger.pricing.quotes import Estimate, estimate
from ledger.store.tables import accounts_t, entries_t, limits_t, pools_t, prices_t
from ledger.timeutil import utcnow

__all__ = ["STALE_AFTER_SECONDS", "Snapshot", "SnapshotKeeper", "change_marker", "take_snapshot"]

STALE_AFTER_SECONDS = 30.0
_IDLE = Usage()


@dataclass(frozen=True)
class Snapshot:
    """Prices, caps and each customer account's spendable micro-credits at `taken_at`."""

    taken_at: datetime
    marker: tuple[Any, ...] = ()
    prices: PriceTable = field(default_factory=lambda: PriceTable(()))
    available_ucredits: Mapping[str, int] = field(default_factory=dict)  # account -> now
    limits: Mapping[tuple[str, str | None], Limits] = field(default_factory=dict)  # (account, user)
    credit_ucredits: Mapping[str, int] = field(default_factory=dict)  # account -> granted, active now
    # (account, user or None) -> what runs there now, for accounts with a cap (ledger.limits.rules)
    usage: Mapping[tuple[str, str | None], Usage] = field(default_factory=dict)
    pools: Mapping[str, Room] = field(default_factory=dict)  # account -> what pools lend it now
    # account -> the accounts above it with caps, nearest first (a parent's cap caps its subtree)
    capped_above: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # (capped parent, user or None) -> what runs in its whole subtree now
    subtree_usage: Mapping[tuple[str, str | None], Usage] = field(default_factory=dict)
    # budgeted account -> its cloud spend in `cloud_month` (YYYY-MM; None: not read, no
    # account has a cloud budget) (ledger.pricing.cloud_budget)
    cloud_month: str | None = None
    cloud_spends: Mapping[str, CloudSpend] = field(default_factory=dict)

    def cloud_spend(self, account: str) -> CloudSpend:
        """`account`'s cloud spend this month as of the picture; LookupError when the
        picture read none (taken without a budget scope): never a free zero."""
        if self.cloud_month is None:
            raise LookupError("this snapshot read no cloud spend (no cloud budget in its scope)")
        return self.cloud_spends.get(account) or CloudSpend(account, self.cloud_month)

    def credit_use(self, account: str) -> CreditUse:
        """How much of `account`'s current credit is used (ledger.books.credit_use)."""
        return CreditUse(account, self.credit_ucredits.get(account, 0), self.available_ucredits[account])

    def estimate(
        self,
        account: str,
        gpus: Mapping[str, int],
        seconds: int,
        *,
        user: str,
        partition: str | None,
        at: datetime,
        tasks: int = 1,
    ) -> Estimate:
        """What the job costs, what `account` has, a cap the job breaks on its own, and
        one it breaks beside what runs now (as of the picture: the prolog decides), the
        account's own caps first, then those of the accounts above it, as the hold."""
        if account not in self.available_ucredits:
            raise NotFound(f"account {account!r} does not exist", details={"account": account})
        found = self._estimate(account, gpus, seconds, user=user, partition=partition, at=at, tasks=tasks)
        if found.limit_breach is not None or found.limit_wait is not None:
            return found
        gpu_count, rate, per_task = (
            sum(gpus.values()),
            found.rate_ucredits_per_hour,
            found.cost_per_task_ucredits,
        )
        for above in self.capped_above.get(account, ()):
            caps = {
                None: self.limits.get((above, None), Limits()),
                user: self.limits.get((above, user), Limits()),
            }
            alone = static_limit_breach(caps, user, gpu_count, rate, per_task, above=above)
            if alone is not None:
                alone.details["account"] = above
                return replace(found, limit_breach=alone)

            def usage(who: str | None, above: str = above) -> Usage:
                return self.subtree_usage.get((above, who), _IDLE)

            wait = subtree_breach(
                caps, usage, above=above, user=user, gpu_count=gpu_count, rate=rate, amount=per_task
            )
            if wait is not None:
                return replace(found, limit_wait=wait)
        return found

    def _estimate(
        self,
        account: str,
        gpus: Mapping[str, int],
        seconds: int,
        *,
        user: str,
        partition: str | None,
        at: datetime,
        tasks: int,
    ) -> Estimate:
        caps = {
            None: self.limits.get((account, None), Limits()),
            user: self.limits.get((account, user), Limits()),
        }
        return estimate(
            self.prices,
            account,
            gpus,
            seconds,
            partition=partition,
            at=at,
            tasks=tasks,
            available_ucredits=self.available_ucredits[account],
            user=user,
            caps=caps,
            usage=lambda who: self.usage.get((account, who), _IDLE),
            pool=self.pools.get(account, Room()),
        )

    def quotes_hold_until(self) -> datetime:
        """Until when a quote from this picture is the quote it gives at any later moment:
        the next price version taking effect, or the picture going stale
        (SnapshotKeeper.stale), whichever is first. Nothing else a quote reads moves with
        the clock, but the month a cloud budget counts from."""
        stale = self.taken_at + timedelta(seconds=STALE_AFTER_SECONDS)
        if self.cloud_month is not None:
            stale = min(stale, month_of(self.taken_at)[2])
        change = self.prices.next_change_after(self.taken_at)
        return stale if change is None else min(change, stale)


def change_marker(s: Any) -> tuple[Any, ...]:
    """Changes whenever a journal entry, account, price, cap, pool or parent is written."""
    return tuple(
        s.execute(
            select(
                select(func.max(entries_t.c.id)).scalar_subquery(),
                select(func.max(accounts_t.c.id)).scalar_subquery(),
                select(func.max(prices_t.c.id)).scalar_subquery(),
                select(func.max(limits_t.c.updated_at)).scalar_subquery(),
                # pools and the tree change no journal: count, caps and times of the pools on
                select(func.count()).where(pools_t.c.enabled.is_(True)).scalar_subquery(),
                select(func.sum(func.coalesce(pools_t.c.child_cap_ucredits, -1)))
                .where(pools_t.c.enabled.is_(True))
                .scalar_subquery(),
                select(func.max(pools_t.c.since)).scalar_subquery(),
                select(func.sum(accounts_t.c.parent_id)).scalar_subquery(),
            )
        ).one()
    )


def take_snapshot(
    session_factory: Callable[[], Any], budget_scope: CloudBudgetScope | None = None
) -> Snapshot:
    """Aggregate reads, no locks: prices, caps, and free active credit less debt; with a
    `budget_scope`, the budgeted accounts' cloud spend this month too."""
    now = utcnow()
    with session_factory() as s:
        marker = change_marker(s)
        names: dict[int, str] = {
            row.id: row.name
            for row in s.execute(
                select(accounts_t.c.id, accounts_t.c.name).where(accounts_t.c.kind == "customer")
            )
        }
        available = available_credit(s, now)
        granted = credit_in_force(s, now)
        usage = {
            (names[account_id], who): value
            for (account_id, who), value in capped_usage(s, now).items()
            if account_id in names
        }
        limits = {
            (names[r.account_id], r.user): Limits(
                r.max_gpus, r.max_rate_ucredits_per_second, r.daily_cap_ucredits
            )
            for r in s.execute(select(limits_t))
            if r.account_id in names
        }
        prices = load_price_table(s)
        by_name = {names[i]: credit for i, credit in available.items() if i in names}
        parents = account_parents(s)
        pools = pool_settings(s)
        rooms = pool_rooms(parents, pools, by_name, pool_uses(s)) if pools else {}
        capped = capped_parents(s)
        capped_above = {
            name: above
            for name in parents
            if capped and (above := tuple(a for a in ancestors(parents, name) if a in capped))
        }
        below_capped = subtree_usage(s, now) if capped else {}
        spends = (
            cloud_spend(s, cloud_partitions=budget_scope.partitions, accounts=budget_scope.accounts, at=now)
            if budget_scope is not None
            else {}
        )
    return Snapshot(
        taken_at=now,
        marker=marker,
        prices=prices,
        available_ucredits=by_name,
        limits=limits,
        credit_ucredits={names[i]: total for i, total in granted.items() if i in names},
        usage=usage,
        pools=rooms,
        capped_above=capped_above,
        subtree_usage=below_capped,
        cloud_month=None if budget_scope is None else month_of(now)[0],
        cloud_spends=spends,
    )


def cap_refusal(
    s: Any, account: str, user: str, gpus: str | dict[str, int], seconds: int
) -> LimitExceeded | None:
    """The cap job_submit refuses this job (in the default partition) for on its own, from
    a picture read in `s` now: what a refusal that comes back without job_submit's words
    (slurmrestd's) was for."""
    snapshot = take_snapshot(lambda: contextlib.nullcontext(s))
    found = snapshot.estimate(
        account, parse_gpus(gpus), seconds, user=user, partition=None, at=snapshot.taken_at
    )
    return found.limit_breach


class SnapshotKeeper:
    """Holds the latest Snapshot; a background thread replaces it every max_age_seconds."""

    def __init__(
        self,
        session_factory: Callable[[], Any],
        max_age_seconds: float = 1.0,
        *,
        budget_scope: CloudBudgetScope | None = None,
    ) -> None:
        self.session_factory = session_factory
        self.max_age_seconds = max_age_seconds
        self.budget_scope = budget_scope
        self._current: Snapshot | None = None
        self._lock = threading.Lock()

    def current(self) -> Snapshot:
        snapshot = self._current
        if snapshot is None:
            with self._lock:
                if self._current is None:
                    self._current = take_snapshot(self.session_factory, self.budget_scope)
                snapshot = self._current
        return snapshot

    def refresh(self) -> None:
        self._current = take_snapshot(self.session_factory, self.budget_scope)

    def refresh_if_changed(self) -> bool:
        """Refresh now if the ledger changed since the picture was taken; True when refreshed.

        One cheap query (a few maxima of primary keys and timestamps) decides.
        """
        current = self._current
        with self.session_factory() as s:
            marker = change_marker(s)
        new_month = current is not None and current.cloud_month not in (None, month_of(utcnow())[0])
        if current is not None and current.marker == marker and not new_month:
            return False
        with self._lock:
            self.refresh()
        return True

    def run(
        self,
        stop: threading.Event,
        on_error: Callable[[SQLAlchemyError], None],
        after_refresh: Callable[[Snapshot], None] | None = None,
    ) -> None:
        """Refresh until `stop`; a failed refresh keeps the last picture (see `stale`).
        `after_refresh` is given each new picture, in this thread, once it is current."""
        while not stop.wait(self.max_age_seconds):
            try:
                self.refresh()
            except SQLAlchemyError as error:
                on_error(error)
                continue
            if after_refresh is not None:
                after_refresh(self.current())

    def stale(self, now: datetime, max_stale_seconds: float = STALE_AFTER_SECONDS) -> bool:
        """True when the database has not answered for a while: job_submit then follows the
        unreachable-ledger policy rather than quote from old numbers."""
        snapshot = self._current
        return snapshot is not None and (now - snapshot.taken_at).total_seconds() > max_stale_seconds
