"""An in-memory picture of what job_submit needs: prices, caps and spendable credit.

job_submit.lua waits on the daemon inside slurmctld, so the answer must cost
microseconds, not a database transaction. The daemon refreshes this picture every
`max_age_seconds` (default 1 s), which keeps the promise that a top-up is visible
to job_submit within 2 s. It is only an estimate: the prolog's hold is the
authoritative check, under the account's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from ledger.accounts import Limits, limits_t
from ledger.errors import InvalidInput, NotFound
from ledger.grants import grants_t
from ledger.journal import accounts_t, entries_t
from ledger.prices import prices_t
from ledger.timeutil import format_time, utcnow

STALE_AFTER_SECONDS = 30.0


@dataclass(frozen=True)
class Snapshot:
    taken_at: datetime
    marker: tuple[Any, ...] = ()
    available: dict[str, int] = field(default_factory=dict)  # account -> micro-credits now
    account_ids: dict[str, int] = field(default_factory=dict)
    limits: dict[tuple[str, str | None], Limits] = field(default_factory=dict)
    prices: dict[tuple[str, str | None], list[tuple[datetime, int]]] = field(default_factory=dict)

    def price_at(self, gres: str, partition: str | None, at: datetime) -> int | None:
        for key in ([(gres, partition)] if partition else []) + [(gres, None)]:
            for effective_at, price in reversed(self.prices.get(key, [])):
                if effective_at <= at:
                    return price
        return None

    def rate_for(self, gpus: dict[str, int], partition: str | None, at: datetime) -> int:
        rate = 0
        for gres, count in gpus.items():
            price = self.price_at(gres, partition, at)
            if price is None:
                raise InvalidInput(
                    f"no price for GPU type {gres!r}"
                    + (f" in partition {partition}" if partition else "")
                    + f" at {format_time(at)}; set one with `gpucredit price set`",
                    code="unknown_gres",
                    details={"gres": gres, "partition": partition},
                )
            rate += price * count
        return rate

    def available_in(self, account: str) -> int:
        if account not in self.account_ids:
            raise NotFound(f"account {account!r} does not exist", details={"account": account})
        return self.available.get(account, 0)

    def limits_for(self, account: str, user: str | None) -> Limits:
        return self.limits.get((account, user), Limits())


def change_marker(s: Any) -> tuple[Any, ...]:
    """Changes whenever a journal entry, account, price or cap is written."""
    return tuple(
        s.execute(
            select(
                select(func.max(entries_t.c.id)).scalar_subquery(),
                select(func.max(accounts_t.c.id)).scalar_subquery(),
                select(func.max(prices_t.c.id)).scalar_subquery(),
                select(func.max(limits_t.c.updated_at)).scalar_subquery(),
            )
        ).one()
    )


def take_snapshot(session_factory: Callable[[], Any]) -> Snapshot:
    """Aggregate reads, no locks: prices, caps, and free active credit less debt."""
    now = utcnow()
    with session_factory() as s:
        marker = change_marker(s)
        accounts = {
            r.name: (r.id, r.debt_ucredits)
            for r in s.execute(
                select(accounts_t.c.name, accounts_t.c.id, accounts_t.c.debt_ucredits).where(
                    accounts_t.c.kind == "customer"
                )
            )
        }
        free = dict(
            s.execute(
                select(
                    grants_t.c.account_id,
                    func.sum(grants_t.c.remaining_ucredits - grants_t.c.earmarked_ucredits),
                )
                .where(
                    grants_t.c.remaining_ucredits > 0,
                    grants_t.c.effective_at <= now,
                    (grants_t.c.expires_at.is_(None)) | (grants_t.c.expires_at > now),
                )
                .group_by(grants_t.c.account_id)
            ).all()
        )
        names = {account_id: name for name, (account_id, _debt) in accounts.items()}
        limits = {
            (names[r.account_id], r.user): Limits(
                r.max_gpus, r.max_rate_ucredits_per_second, r.daily_cap_ucredits
            )
            for r in s.execute(select(limits_t))
            if r.account_id in names
        }
        prices: dict[tuple[str, str | None], list[tuple[datetime, int]]] = {}
        for r in s.execute(select(prices_t).order_by(prices_t.c.effective_at, prices_t.c.id)):
            prices.setdefault((r.gres, r.partition), []).append((r.effective_at, r.ucredits_per_gpu_hour))
    return Snapshot(
        taken_at=now,
        marker=marker,
        available={
            name: int(free.get(account_id, 0)) - debt for name, (account_id, debt) in accounts.items()
        },
        account_ids={name: account_id for name, (account_id, _debt) in accounts.items()},
        limits=limits,
        prices=prices,
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

    def run(self, stop: threading.Event, on_error: Callable[[SQLAlchemyError], None]) -> None:
        """Refresh until `stop`; a failed refresh keeps the last picture (see `stale`)."""
        while not stop.wait(self.max_age_seconds):
            try:
                self.refresh()
            except SQLAlchemyError as error:
                on_error(error)

    def stale(self, now: datetime, max_stale_seconds: float = STALE_AFTER_SECONDS) -> bool:
        """True when the database has not answered for a while: job_submit then follows the
        unreachable-ledger policy rather than quote from old numbers."""
        snapshot = self._current
        return snapshot is not None and (now - snapshot.taken_at).total_seconds() > max_stale_seconds
