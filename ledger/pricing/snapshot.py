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

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from ledger.books.balance import available_credit
from ledger.books.credit_use import CreditUse, credit_in_force
from ledger.books.pools import Room, pool_rooms, pool_settings, pool_uses
from ledger.books.tree import account_parents
from ledger.errors import NotFound
from ledger.limits.caps import Limits
from ledger.limits.rules import Usage, capped_usage
from ledger.pricing.prices import PriceTable, load_price_table
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
        one it breaks beside what runs now (as of the picture: the prolog decides)."""
        if account not in self.available_ucredits:
            raise NotFound(f"account {account!r} does not exist", details={"account": account})
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
        the clock."""
        stale = self.taken_at + timedelta(seconds=STALE_AFTER_SECONDS)
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


def take_snapshot(session_factory: Callable[[], Any]) -> Snapshot:
    """Aggregate reads, no locks: prices, caps, and free active credit less debt."""
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
        pools = pool_settings(s)
        rooms = pool_rooms(account_parents(s), pools, by_name, pool_uses(s)) if pools else {}
    return Snapshot(
        taken_at=now,
        marker=marker,
        prices=prices,
        available_ucredits=by_name,
        limits=limits,
        credit_ucredits={names[i]: total for i, total in granted.items() if i in names},
        usage=usage,
        pools=rooms,
    )


class SnapshotKeeper:
    """Holds the latest Snapshot; a background thread replaces it every max_age_seconds."""

    def __init__(self, session_factory: Callable[[], Any], max_age_seconds: float = 1.0) -> None:
        self.session_factory = session_factory
        self.max_age_seconds = max_age_seconds
        self._current: Snapshot | None = None
        self._lock = threading.Lock()

    def current(self) -> Snapshot:
        snapshot = self._current
        if snapshot is None:
            with self._lock:
                if self._current is None:
                    self._current = take_snapshot(self.session_factory)
                snapshot = self._current
        return snapshot

    def refresh(self) -> None:
        self._current = take_snapshot(self.session_factory)

    def refresh_if_changed(self) -> bool:
        """Refresh now if the ledger changed since the picture was taken; True when refreshed.

        One cheap query (a few maxima of primary keys and timestamps) decides.
        """
        current = self._current
        with self.session_factory() as s:
            marker = change_marker(s)
        if current is not None and current.marker == marker:
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
