"""The cloud budget in routing's verdict table and in job_submit's words (docs/routing.md).

A cloud partition whose run would take the account past its monthly cloud budget is
`over_cloud_budget`: the job keeps the on-premise partitions still allowed, and with
none it is refused with the budget, the month's spend, the job's cost and the code
`cloud_budget`, the way a cap's refusal is worded. Every message is checked word for word.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from job_submit import answer
from ledger import api
from ledger.limits.caps import Limits
from ledger.money import parse_credits
from ledger.pricing.routing import (
    ALLOWED,
    CLOUD,
    CLOUD_NOT_ALLOWED,
    ONPREM,
    OVER_CAP,
    OVER_CLOUD_BUDGET,
    OVER_LIMIT,
    CostLimit,
    PartitionOption,
    RoutingConfig,
    route,
)
from ledger.timeutil import utcnow

EPOCH = datetime(2020, 1, 1, tzinfo=UTC)
HINT = "Top up at https://portal.example/ or ask your PI."
PRICES = api.PriceTable(
    [
        ("a100", None, EPOCH, 2_000_000),
        ("h100", None, EPOCH, 3_600_000),
        ("h100", "cloud", EPOCH, 5_400_000),
        ("a100", "cloud", EPOCH, 1_000_000),
    ]
)
PARTITIONS = {
    "onprem": {"default_time": 60, "max_time": 1440, "default": True},
    "cloud": {"default_time": 30, "max_time": 1440, "default": False},
}
TYPES = {"onprem": ["a100", "h100"], "cloud": ["a100", "h100"]}
ROUTING = RoutingConfig.from_config(
    {
        "partitions": {"onprem": {"site": "onprem"}, "cloud": {"site": "cloud"}},
        "routing": {"accounts": {"physics": {"cloud_budget": "500"}}},
    }
)
REFUSED_21_60 = (
    "gpucredit: cloud_budget: account physics: cloud budget 500.00 credits for 2026-12, "
    "spent 480.00, this job 21.60 (job: 2×h100 × 2 h in cloud)"
)


def partition_types(partition: str | None) -> list[str] | None:
    return TYPES.get(partition or "onprem")


def snapshot(spent: str, **limits: Limits) -> api.Snapshot:
    return api.Snapshot(
        taken_at=utcnow(),
        prices=PRICES,
        available_ucredits={"physics": 112_400_000},
        credit_ucredits={"physics": 112_400_000},
        limits={("physics", user): cap for user, cap in limits.items()},
        cloud_month="2026-12",
        cloud_spends={
            "physics": api.CloudSpend("physics", "2026-12", parse_credits(spent, allow_zero=True), 0)
        },
    )


def submit(
    comment: str | None, spent: str, snap: api.Snapshot | None = None, **fields: Any
) -> dict[str, str]:
    """sbatch -A physics --gres=gpu:h100:2 -t 2:00:00 [--comment ...], as alice."""
    base: dict[str, Any] = {
        "user_name": "alice",
        "user_id": 1001,
        "account": "physics",
        "partitions": PARTITIONS,
        "time_limit": 120,
        "tres_per_node": "gres:gpu:h100:2",
        "comment": comment,
    }
    return answer.submit(
        snap or snapshot(spent),
        {k: v for k, v in {**base, **fields}.items() if v is not None},
        top_up_hint=HINT,
        partition_types=partition_types,
        routing=ROUTING,
    )


def test_cloud_past_the_budget_is_dropped_and_the_job_stays_on_premise() -> None:
    kept = submit("gpucredit:cloud=yes nightly", "480")
    assert kept == {
        "decision": "accept",
        "message": "gpucredit: ~14.40 credits (2×h100 × 2 h) in onprem; "
        "not cloud (~21.60, over the account's cloud budget); 112.40 available in physics",
        "partition": "onprem",
        "comment": "gpucredit: routed to onprem (cloud allowed): onprem ~14.40 allowed, "
        "cloud ~21.60 over the account's cloud budget | nightly",
    }


def test_exactly_the_budget_fits_and_one_micro_credit_more_does_not() -> None:
    fits = submit("gpucredit:cloud=yes", "478.40")  # 478.40 + 21.60 = 500.00
    assert fits["decision"] == "accept" and fits["partition"] == "onprem,cloud"
    over = submit("gpucredit:cloud=yes", "478.400001")
    assert over["decision"] == "accept" and over["partition"] == "onprem"


def test_a_job_that_names_the_cloud_itself_is_refused_naming_the_budget() -> None:
    assert submit(None, "480", partition="cloud") == {"decision": "reject", "message": REFUSED_21_60}
    assert submit(None, "478.40", partition="cloud")["decision"] == "accept"


def test_on_premise_over_the_limit_and_cloud_over_the_budget_is_a_budget_refusal() -> None:
    # 2×a100 × 2 h: 8.00 on-premise (over the 5.00 limit), 4.00 in the cloud (within it).
    refused = submit("gpucredit:max_cost=5,cloud=yes", "497", tres_per_node="gres:gpu:a100:2")
    assert refused == {
        "decision": "reject",
        "message": "gpucredit: cloud_budget: account physics: cloud budget 500.00 credits for 2026-12, "
        "spent 497.00, this job 4.00 (job: 2×a100 × 2 h in cloud)",
    }


def test_an_array_is_weighed_against_the_budget_with_every_task() -> None:
    # 3 tasks × 2×a100 × 2 h in the cloud: 12.00 against 10.00 left.
    refused = submit(None, "490", partition="cloud", tres_per_node="gres:gpu:a100:2", array_inx="0-2")
    assert refused["message"] == (
        "gpucredit: cloud_budget: account physics: cloud budget 500.00 credits for 2026-12, "
        "spent 490.00, this job 12.00 (job: 2×a100 × 2 h, × 3 tasks in cloud)"
    )


def test_an_account_without_a_budget_and_a_plain_job_are_not_routed_by_it() -> None:
    plain = submit(None, "999")  # no directive, no cloud partition named: the plain estimate
    assert plain == {
        "decision": "accept",
        "message": "gpucredit: ~14.40 credits (2×h100 × 2 h), 112.40 available in physics",
    }


def _option(partition: str, site: str, snap: api.Snapshot, gpus: dict[str, int]) -> PartitionOption:
    estimate = snap.estimate("physics", gpus, 7200, user="alice", partition=partition, at=utcnow())
    return PartitionOption(partition, site, estimate)


def test_the_budget_row_comes_after_site_and_limit_and_before_caps() -> None:
    snap = snapshot("480", alice=Limits(max_gpus=1))  # every 2-GPU run breaks a cap
    options = [_option("onprem", ONPREM, snap, {"h100": 2}), _option("cloud", CLOUD, snap, {"h100": 2})]
    budget = CostLimit(allow_cloud=True, cloud_budget_ucredits=500_000_000)
    spend = snap.cloud_spend("physics")
    assert route(options, limit=budget, cloud_permitted=True, cloud_spend=spend).verdicts == (
        OVER_CAP,
        OVER_CLOUD_BUDGET,  # over the budget before the cap is asked
    )
    not_allowed = route(options, limit=budget, cloud_permitted=False, cloud_spend=spend)
    assert not_allowed.verdicts == (OVER_CAP, CLOUD_NOT_ALLOWED)
    limited = CostLimit(max_cost_ucredits=20_000_000, allow_cloud=True, cloud_budget_ucredits=500_000_000)
    assert route(options, limit=limited, cloud_permitted=True, cloud_spend=spend).verdicts == (
        OVER_CAP,
        OVER_LIMIT,  # over the limit first
    )
    free = snapshot("0")
    fits = [_option("onprem", ONPREM, free, {"h100": 2}), _option("cloud", CLOUD, free, {"h100": 2})]
    decided = route(fits, limit=budget, cloud_permitted=True, cloud_spend=free.cloud_spend("physics"))
    assert decided.verdicts == (ALLOWED, ALLOWED)


def test_routing_an_account_with_a_budget_needs_its_spend() -> None:
    snap = snapshot("0")
    options = [_option("cloud", CLOUD, snap, {"h100": 1})]
    with pytest.raises(ValueError, match="cloud spend"):
        route(options, limit=CostLimit(allow_cloud=True, cloud_budget_ucredits=1), cloud_permitted=True)
