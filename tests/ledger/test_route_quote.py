"""`ledger.api.route_quote`: a routed job's placement read from the database, by routing's
own rules (docs/routing.md), for the portal to show before anything is submitted.

physics has 50.00; an h100 hour is 3.60 on-premise and 5.40 in the cloud, and physics
may spend 30.00 a month there, of which 10.80 is held by a running cloud job.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ledger import api
from ledger.errors import LedgerError

SINCE = datetime(2026, 1, 1, tzinfo=UTC)
SITES = {"onprem": {"site": "onprem"}, "cloud": {"site": "cloud"}}


def routing(**accounts: dict[str, Any]) -> api.RoutingConfig:
    return api.RoutingConfig.from_config(
        {"partitions": SITES, "routing": {"accounts": accounts, "burst_after_seconds": 600}}
    )


@pytest.fixture
def site(tx: Callable[[], Any]) -> Callable[[], Any]:
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=SINCE)
        api.set_price(s, "h100", "5.40", partition="cloud", effective_at=SINCE)
        api.create_account(s, "physics")
        api.topup(s, "physics", "50", effective_at=SINCE)
    with tx() as s:
        at = datetime.now(UTC) - timedelta(minutes=1)
        hold = api.HoldRequest(
            "physics", user="alice", job_id=7, gpus="h100:1", seconds=7200, partition="cloud", at=at
        )
        api.create_hold(s, hold)  # 10.80 held in the cloud this month
    return tx


def placement(found: dict[str, Any] | None) -> dict[str | None, tuple[str, str]]:
    assert found is not None
    return {p["partition"]: (p["cost"], p["verdict"]) for p in found["partitions"]}


def test_every_tagged_partition_gets_its_verdict_and_the_quote_is_the_dearest_allowed(
    site: Callable[[], Any],
) -> None:
    with site() as s:
        found = api.route_quote(s, routing(), "physics", "h100:2", 7200, max_cost="25", cloud=True)
    assert found is not None
    assert placement(found) == {"onprem": ("14.40", "allowed"), "cloud": ("21.60", "allowed")}
    assert (found["cost"], found["refusal"], found["limit"]) == ("21.60", None, "25.00")
    assert (found["now"], found["after_wait"], found["burst_after_seconds"]) == (["onprem"], ["cloud"], 600)


def test_the_cloud_budget_and_the_credit_are_the_ledgers_figures(site: Callable[[], Any]) -> None:
    budget = routing(physics={"cloud_budget": "30"})
    with site() as s:
        # 10.80 held + 21.60 > 30.00: the cloud is past the budget; on-premise stays.
        over = api.route_quote(s, budget, "physics", "h100:2", 7200, cloud=True)
        assert placement(over) == {"onprem": ("14.40", "allowed"), "cloud": ("21.60", "over_cloud_budget")}
        # 39.20 available: 4×h100 for 3 h is 43.20 on-premise, more than is available.
        broke = api.route_quote(s, routing(), "physics", "h100:4", 3 * 3600, max_cost="100", cloud=False)
    assert placement(broke) == {"onprem": ("43.20", "over_credit"), "cloud": ("64.80", "cloud_not_allowed")}
    assert broke is not None and (broke["cost"], broke["refusal"]) == (None, "over_credit")


def test_a_job_with_no_limit_and_no_cloud_is_not_routed_and_unpriced_gpus_are_refused(
    site: Callable[[], Any],
) -> None:
    with site() as s:
        assert api.route_quote(s, routing(), "physics", "h100:1", 3600) is None
        with pytest.raises(LedgerError):
            api.route_quote(s, routing(), "physics", "v100:1", 3600, cloud=True)
