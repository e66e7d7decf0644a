"""Regions as cloud partitions with their own prices, and a job's region (docs/routing.md):
`gpucredit:region=us-west-2` (or the account's default) keeps the job's cloud runs to the
partitions in that region; on-premise is never left out for it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from job_submit import answer
from ledger import api
from ledger.errors import InvalidInput
from ledger.money import parse_credits
from ledger.pricing.routing import RoutingConfig
from ledger.timeutil import utcnow

EPOCH = datetime(2020, 1, 1, tzinfo=UTC)
HINT = "Top up at https://portal.example/ or ask your PI."
# h100 an hour: 3.60 on-premise, 5.40 in us-east-1, 4.80 in us-west-2.
PRICES = api.PriceTable(
    [
        ("h100", None, EPOCH, 3_600_000),
        ("h100", "east", EPOCH, 5_400_000),
        ("h100", "west", EPOCH, 4_800_000),
    ]
)
PARTITIONS = {
    name: {"default_time": 60, "max_time": 1440, "default": name == "onprem"}
    for name in ("onprem", "east", "west")
}
SITES = {
    "partitions": {
        "onprem": {"site": "onprem"},
        "east": {"site": "cloud", "region": "us-east-1"},
        "west": {"site": "cloud", "region": "us-west-2"},
    },
    "routing": {"accounts": {"chemistry": {"cloud": True, "region": "us-west-2"}}},
}
ROUTING = RoutingConfig.from_config(SITES)


def submit(comment: str | None, *, account: str = "physics", **fields: Any) -> dict[str, str]:
    """sbatch -A ACCOUNT --gres=gpu:h100:2 -t 2:00:00 [--comment ...], as alice."""
    snapshot = api.Snapshot(
        taken_at=utcnow(),
        prices=PRICES,
        available_ucredits={"physics": parse_credits("112.40"), "chemistry": parse_credits("50")},
        credit_ucredits={"physics": parse_credits("112.40"), "chemistry": parse_credits("50")},
    )
    base: dict[str, Any] = {
        "user_name": "alice",
        "user_id": 1001,
        "account": account,
        "partitions": PARTITIONS,
        "time_limit": 120,
        "tres_per_node": "gres:gpu:h100:2",
        "comment": comment,
    }
    return answer.submit(
        snapshot,
        {k: v for k, v in {**base, **fields}.items() if v is not None},
        top_up_hint=HINT,
        partition_types=lambda partition: ["h100"],
        routing=ROUTING,
        warn_at_used_share=None,
    )


def test_a_cloud_job_goes_to_every_region_unless_it_names_one() -> None:
    anywhere = submit("gpucredit:cloud=yes")
    assert anywhere["partition"] == "onprem,west,east"  # on-premise, then the cheaper cloud first
    west = submit("gpucredit:cloud=yes,region=us-west-2")
    assert west == {
        "decision": "accept",
        "message": "gpucredit: ~19.20 credits at most (2×h100 × 2 h) in onprem (~14.40) or west (~19.20), "
        "where Slurm can start it first; not east (~21.60, in us-east-1, not us-west-2); "
        "112.40 available in physics",
        "partition": "onprem,west",
        "comment": "gpucredit: routed to onprem,west (cloud allowed, region us-west-2): "
        "onprem ~14.40 allowed, west ~19.20 allowed, east ~21.60 in us-east-1, not us-west-2",
    }


def test_the_accounts_region_applies_unless_the_job_names_its_own() -> None:
    assert submit(None, account="chemistry")["partition"] == "onprem,west"
    assert submit("gpucredit:region=us-east-1", account="chemistry")["partition"] == "onprem,east"


def test_a_named_cloud_partition_outside_the_jobs_region_is_refused_saying_so() -> None:
    assert submit("gpucredit:region=us-east-1", partition="west") == {
        "decision": "reject",
        "message": "gpucredit: this job can only run in the cloud, and west is in us-west-2, not the job's "
        "region us-east-1: name a partition in that region, or change gpucredit:region in --comment",
    }
    assert submit("gpucredit:region=us-west-2", partition="west")["partition"] == "west"


def test_a_region_no_partition_is_in_is_refused_not_ignored() -> None:
    assert submit("gpucredit:cloud=yes,region=eu-west-1") == {
        "decision": "reject",
        "message": "gpucredit: region: no cloud partition is in region eu-west-1 "
        "(regions: us-east-1, us-west-2)",
    }
    assert submit("gpucredit:region=Moon")["message"].startswith(
        "gpucredit: invalid_comment: bad value 'Moon' for gpucredit directive region"
    )


def test_the_ledgers_placement_names_each_partitions_region() -> None:
    decision = ROUTING.limit_for("physics", None, True, region="us-west-2")
    assert decision == api.CostLimit(None, True, "account", None, "us-west-2")
    assert ROUTING.region("west") == "us-west-2" and ROUTING.region("onprem") is None


@pytest.mark.parametrize(
    ("config", "error"),
    [
        (
            {"partitions": {"x": {"site": "onprem", "region": "us-east-1"}}},
            "partitions.x.region is for a cloud",
        ),
        (
            {"partitions": {"x": {"site": "cloud", "region": "US East"}}},
            "partitions.x.region must be a region",
        ),
        (
            {**SITES, "routing": {"accounts": {"p": {"region": "eu-west-1"}}}},
            "routing.accounts.p.region: no cloud partition is in region eu-west-1",
        ),
    ],
)
def test_a_bad_region_in_the_config_is_refused_naming_the_key(config: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidInput, match=error) as refused:
        RoutingConfig.from_config(config)
    assert refused.value.code == "invalid_config"
