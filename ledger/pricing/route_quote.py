"""Where a job would run and what it would be quoted, read from the database: what
sbatch will print, shown before anything is submitted (the portal's New job page).

The rules are routing's (`ledger.pricing.routing.route`), the same job_submit applies
from the daemon's snapshot. What differs is what is known: without Slurm there are no
partitions' GPU types or default times, so every partition the config tags is priced
for the job's own time limit, and one that cannot price the job's GPUs is left out.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from ledger.errors import LedgerError
from ledger.money import format_credits
from ledger.pricing.cloud_budget import cloud_spend
from ledger.pricing.prices import parse_gpus
from ledger.pricing.quotes import estimates_in
from ledger.pricing.routing import PartitionOption, RoutingConfig, candidate_partitions, route
from ledger.timeutil import parse_seconds, utcnow

__all__ = ["route_quote"]


def route_quote(
    s: Session,
    routing: RoutingConfig,
    account: str,
    gpus: str,
    seconds: int,
    *,
    max_cost: str | None = None,
    cloud: bool | None = None,
    region: str | None = None,
    at: datetime | None = None,
) -> dict[str, Any] | None:
    """The job's placement as job_submit would decide it now: each partition's cost and
    verdict, the quote (the dearest allowed run, None when none is), the partitions it
    gets at once and those held back, and the refusal's verdict (None when some is
    allowed). None when the job is not routed (no limit, no cloud): the plain quote is
    then the whole answer."""
    at = at or utcnow()
    limit = routing.limit_for(account, max_cost, cloud, region=region)
    if limit is None:
        return None
    names = candidate_partitions([], routing, ())
    found = estimates_in(s, account, parse_gpus(gpus), parse_seconds(seconds, field="seconds"), names, at=at)
    options = [
        PartitionOption(name, routing.site(name), cost, routing.region(name))
        for name, cost in found.items()
        if not isinstance(cost, LedgerError)  # no price for these GPUs there
    ]
    spend = None
    if limit.cloud_budget_ucredits is not None:
        tagged = routing.cloud_partitions()
        spend = cloud_spend(s, cloud_partitions=tagged, accounts=[account], at=at)[account]
    decision = route(options, limit=limit, cloud_permitted=limit.allow_cloud, cloud_spend=spend)
    now, later = decision.burst_plan(routing.burst_after_seconds, eligible=True)
    quote = decision.quote
    refused_at = decision.refused_at
    return {
        "cost": None if quote is None else format_credits(quote.cost_ucredits),
        "limit": None if limit.max_cost_ucredits is None else format_credits(limit.max_cost_ucredits),
        "cloud_allowed": limit.allow_cloud,
        "region": limit.region,
        "partitions": [
            {
                "partition": option.partition,
                "site": option.site,
                "region": option.region,
                "cost": format_credits(option.estimate.cost_ucredits),
                "verdict": decision.verdict(option),
            }
            for option in decision.options
        ],
        "now": list(now),
        "after_wait": list(later),
        "burst_after_seconds": routing.burst_after_seconds if later else None,
        "refusal": decision.refusal,
        "refused_at": None if refused_at is None else refused_at.partition,  # the figure a refusal names
    }
