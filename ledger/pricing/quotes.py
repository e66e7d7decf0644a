"""Quotes: what a job spec costs at today's prices, and whether the account can afford it now.

One computation (:func:`estimate`) serves both readers: :func:`quote` from the
database, and the job_submit snapshot (:mod:`ledger.pricing.snapshot`) from memory. Only
where the prices, the available credit and the caps come from differs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from ledger.books.accounts import read_account
from ledger.books.balance import available_credit
from ledger.books.pools import NO_ROOM, Room, room_for
from ledger.errors import LedgerError, LimitExceeded
from ledger.limits.caps import Limits
from ledger.limits.rules import Usage, limit_breach, static_limit_breach
from ledger.money import charge_for, format_credits, format_rate
from ledger.pricing.prices import PriceTable, format_gpus, parse_gpus, prices_for_job
from ledger.timeutil import format_time, parse_seconds, utcnow


@dataclass(frozen=True)
class Estimate:
    """What `tasks` runs of a job spec cost at `at`, and what the account has then.

    Amounts are micro-credits; `limit_breach` is a cap the job breaks on its own (only
    when the estimate was given the caps, as job_submit's is); `limit_wait` a cap it
    breaks beside what runs now (given the usage too): it would be held until that
    changes, as the prolog's hold would refuse it now.
    """

    account: str
    gpus: Mapping[str, int]
    seconds: int
    partition: str | None
    tasks: int
    at: datetime
    unit_prices_ucredits_per_gpu_hour: Mapping[str, int]
    rate_ucredits_per_hour: int
    cost_per_task_ucredits: int
    cost_ucredits: int
    available_ucredits: int
    limit_breach: LimitExceeded | None = None
    limit_wait: LimitExceeded | None = None
    pool: Room = NO_ROOM  # what the parent's pool would lend beyond the account's own

    @property
    def affordable(self) -> bool:
        return self.cost_ucredits <= self.available_ucredits + self.pool.ucredits

    def as_dict(self) -> dict[str, Any]:
        """The quote as the CLI and the HTTP API show it (decimal strings)."""
        return {
            "account": self.account,
            "gpus": format_gpus(dict(self.gpus)),
            "seconds": self.seconds,
            "partition": self.partition,
            "tasks": self.tasks,
            "cost": format_credits(self.cost_ucredits),
            "cost_per_task": format_credits(self.cost_per_task_ucredits),
            "rate": format_rate(self.rate_ucredits_per_hour),
            "prices": {g: format_credits(p) for g, p in self.unit_prices_ucredits_per_gpu_hour.items()},
            "available": format_credits(self.available_ucredits),
            "affordable": self.affordable,
            "at": format_time(self.at),
            **(
                {"pool": self.pool.lender, "from_pool": format_credits(self.pool.ucredits)}
                if self.pool.lender is not None
                else {}
            ),
        }


def estimate(
    prices: PriceTable,
    account: str,
    gpus: Mapping[str, int],
    seconds: int,
    *,
    partition: str | None,
    at: datetime,
    available_ucredits: int,
    tasks: int = 1,
    user: str | None = None,
    caps: Mapping[str | None, Limits] | None = None,
    usage: Callable[[str | None], Usage] | None = None,
    pool: Room = NO_ROOM,
) -> Estimate:
    """Price a job spec (an array is estimated per task) and set it beside the credit.

    With `user` and `caps` (the account's under key None, the user's under `user`),
    a cap the job breaks on its own is reported too; with `usage` as well, a cap it
    breaks beside what runs now (one task's full cost counts toward a daily cap, as a
    hold in full mode reserves it).
    """
    rate, unit_prices = prices.rate_for(gpus, partition, at)
    per_task = charge_for(rate, seconds)
    breach = wait = None
    if user is not None and caps is not None:
        breach = static_limit_breach(caps, user, sum(gpus.values()), rate, per_task)
        if breach is None and usage is not None:
            wait = limit_breach(
                caps,
                usage,
                account=account,
                user=user,
                gpu_count=sum(gpus.values()),
                rate=rate,
                amount=per_task,
            )
    return Estimate(
        account=account,
        gpus=dict(gpus),
        seconds=seconds,
        partition=partition,
        tasks=tasks,
        at=at,
        unit_prices_ucredits_per_gpu_hour=unit_prices,
        rate_ucredits_per_hour=rate,
        cost_per_task_ucredits=per_task,
        cost_ucredits=per_task * tasks,
        available_ucredits=available_ucredits,
        limit_breach=breach,
        limit_wait=wait,
        pool=pool,
    )


def quote(
    s: Session,
    account: str,
    gpus: str | dict[str, int],
    seconds: int | str,
    *,
    partition: str | None = None,
    at: datetime | None = None,
    tasks: int = 1,
) -> dict[str, Any]:
    """Cost of `tasks` runs of a job spec (an array is estimated per task). Reserves nothing."""
    at = at or utcnow()
    found = estimates_in(
        s, account, parse_gpus(gpus), parse_seconds(seconds, field="seconds"), [partition], at=at, tasks=tasks
    )[partition]
    if isinstance(found, LedgerError):
        raise found
    return found.as_dict()


def estimates_in(
    s: Session,
    account: str,
    gpus: Mapping[str, int],
    seconds: int,
    partitions: Sequence[str | None],
    *,
    at: datetime,
    tasks: int = 1,
) -> dict[str | None, Estimate | LedgerError]:
    """The job's estimate in each partition, from the database, the account's credit read
    once; a partition with no price for these GPUs gets that error instead (raised when
    no partition has one)."""
    priced: dict[str | None, PriceTable | LedgerError] = {}
    for partition in partitions:
        try:
            priced[partition] = prices_for_job(s, gpus, partition, at)
        except LedgerError as error:
            priced[partition] = error
    unpriced = [found for found in priced.values() if isinstance(found, LedgerError)]
    if len(unpriced) == len(priced):
        raise unpriced[0]  # the GPUs' fault, whatever the account
    # A quote reserves nothing, so it reads without the account lock: an answer a few
    # milliseconds stale is fine, and job_submit must never queue behind a hold.
    acct = read_account(s, account)
    available = available_credit(s, at, [acct.id])[acct.id]
    pool = room_for(s, account, at)
    return {
        partition: prices
        if isinstance(prices, LedgerError)
        else estimate(
            prices,
            account,
            gpus,
            seconds,
            partition=partition,
            at=at,
            tasks=tasks,
            available_ucredits=available,
            pool=pool,
        )
        for partition, prices in priced.items()
    }
