"""Quotes: what a job spec costs at today's prices, and whether the account can afford it now."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from ledger.accounts import read_account
from ledger.grants import available_now, load_grants
from ledger.money import charge_for, format_credits, format_rate
from ledger.prices import format_gpus, parse_gpus, rate_for
from ledger.timeutil import format_time, parse_seconds, utcnow


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
    gpu_map = parse_gpus(gpus)
    seconds = parse_seconds(seconds, field="seconds")
    rate, unit_prices = rate_for(s, gpu_map, partition, at)
    per_task = charge_for(rate, seconds)
    cost = per_task * tasks
    # A quote reserves nothing, so it reads without the account lock: an answer a few
    # milliseconds stale is fine, and job_submit must never queue behind a hold.
    acct = read_account(s, account)
    available = available_now(load_grants(s, acct.id), acct, at)
    return {
        "account": account,
        "gpus": format_gpus(gpu_map),
        "seconds": seconds,
        "partition": partition,
        "tasks": tasks,
        "cost": format_credits(cost),
        "cost_per_task": format_credits(per_task),
        "rate": format_rate(rate),
        "prices": {g: format_credits(p) for g, p in unit_prices.items()},
        "available": format_credits(available),
        "affordable": cost <= available,
        "at": format_time(at),
    }
