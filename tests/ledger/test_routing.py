"""Routing between on-premise and cloud partitions under a cost limit, and the submit
message's credit warning (docs/routing.md).

From the comment's grammar (slurmtext) through the ledger's decision table
(ledger.pricing.routing) and the credit-use read (ledger.books.credit_use) to the daemon's answer
(job_submit.route_answer), whose every message is checked word for word.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from gpucredit.daemon import Daemon
from job_submit import answer
from ledger import api
from ledger.config import load_config
from ledger.errors import InvalidInput
from ledger.limits.caps import Limits
from ledger.money import format_credits, parse_credits
from ledger.pricing.routing import CLOUD, ONPREM, CostLimit, PartitionOption, RoutingConfig, route
from ledger.store.db import make_sessionmaker
from ledger.timeutil import utcnow
from slurmtext import MAX_COMMENT_CHARS, SlurmTextError, comment_directives, routed_comment

EPOCH = datetime(2020, 1, 1, tzinfo=UTC)
HINT = "Top up at https://portal.example/ or ask your PI."
NO_VAL = 4294967294
# Cloud costs 1.5× on-premise (per-partition prices); a100 is cheap in the cloud here, so
# the "cloud would fit" hint has a case.
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
    "debug": {"default_time": 10, "max_time": 60, "default": False},
}
TYPES = {"onprem": ["a100", "h100"], "cloud": ["a100", "h100"], "debug": ["a100"]}
ROUTING = RoutingConfig.from_config(
    {
        "partitions": {"onprem": {"site": "onprem"}, "cloud": {"site": "cloud"}},
        "routing": {"accounts": {"chemistry": {"max_cost": "20", "cloud": True}}},
    }
)


def partition_types(partition: str | None) -> list[str] | None:
    return TYPES.get(partition or "onprem")


def snapshot(available: str = "112.40", credit: str = "112.40", **limits: Limits) -> api.Snapshot:
    return api.Snapshot(
        taken_at=utcnow(),
        prices=PRICES,
        available_ucredits={"physics": parse_credits(available), "chemistry": 50_000_000},
        credit_ucredits={"physics": parse_credits(credit), "chemistry": 50_000_000},
        limits={("physics", user): cap for user, cap in limits.items()},
    )


def submit(comment: str | None = None, *, snap: api.Snapshot | None = None, **fields: Any) -> dict[str, str]:
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
        snap or snapshot(),
        {k: v for k, v in {**base, **fields}.items() if v is not None},
        top_up_hint=HINT,
        partition_types=partition_types,
        routing=ROUTING,
        warn_at_used_share=Fraction(4, 5),
    )


# -- the comment's grammar (slurmtext) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("comment", "directives", "rest"),
    [
        ("gpucredit:max_cost=25", {"max_cost": "25"}, ""),
        ("run 7 gpucredit:max_cost=12.5,cloud=yes", {"max_cost": "12.5", "cloud": "yes"}, "run 7"),
        ("gpucredit:cloud=no  nightly  gpucredit:max_cost=3", {"cloud": "no", "max_cost": "3"}, "nightly"),
        ("gpucredit: account physics: held", {}, "gpucredit: account physics: held"),  # our own text
        ("  keep a=b as written ", {}, "keep a=b as written"),
        ("xgpucredit:max_cost=1", {}, "xgpucredit:max_cost=1"),  # not a word of its own
        ("", {}, ""),
        (None, {}, ""),
    ],
)
def test_comment_directives_and_the_users_own_text(
    comment: str | None, directives: dict[str, str], rest: str
) -> None:
    assert comment_directives(comment) == (directives, rest)


@pytest.mark.parametrize(
    ("comment", "error"),
    [
        ("gpucredit:max-cost=5", "unknown gpucredit directive 'max-cost=5' in the comment"),
        ("gpucredit:max_cost", "unknown gpucredit directive 'max_cost' in the comment"),
        ("gpucredit:max_cost=5,", "unknown gpucredit directive '' in the comment"),
        ("gpucredit:max_cost=-5", "bad value '-5' for gpucredit directive max_cost"),
        ("gpucredit:max_cost=1.1234567", "bad value '1.1234567' for gpucredit directive max_cost"),
        ("gpucredit:cloud=YES", "bad value 'YES' for gpucredit directive cloud"),
        ("gpucredit:cloud=yes gpucredit:cloud=no", "gpucredit directive cloud given twice"),
    ],
)
def test_a_malformed_directive_is_refused_not_guessed(comment: str, error: str) -> None:
    with pytest.raises(SlurmTextError, match=error.replace("(", r"\(")):
        comment_directives(comment)


def test_routed_comment_is_ours_then_the_users() -> None:
    assert routed_comment("routed to onprem (limit=5)", "run 7 a=b") == (
        "gpucredit: routed to onprem (limit:5) | run 7 a=b"
    )
    assert routed_comment("routed\nto onprem", "") == "gpucredit: routed to onprem"
    assert routed_comment("x" * 500, "mine").endswith("... | mine")
    assert len(routed_comment("x" * 500, "")) == MAX_COMMENT_CHARS


# -- the ledger's decision -----------------------------------------------------------------------------


def option(
    partition: str, site: str, cost: str, *, available: str = "100", tasks: int = 1
) -> PartitionOption:
    per_task = parse_credits(cost)
    estimate = api.Estimate(
        account="physics",
        gpus={"h100": 1},
        seconds=3600,
        partition=partition,
        tasks=tasks,
        at=EPOCH,
        unit_prices_ucredits_per_gpu_hour={"h100": per_task},
        rate_ucredits_per_hour=per_task,
        cost_per_task_ucredits=per_task,
        cost_ucredits=per_task * tasks,
        available_ucredits=parse_credits(available),
    )
    return PartitionOption(partition, site, estimate)


def test_each_verdict_of_the_decision_table() -> None:
    limit = CostLimit(parse_credits("10"), allow_cloud=False)
    options = [
        option("cloud", CLOUD, "3"),  # cloud_not_allowed
        option("big", ONPREM, "12"),  # over_limit
        option("fits", ONPREM, "8"),  # allowed
        option("poor", ONPREM, "9", available="5"),  # over_credit
    ]
    decision = route(options, limit=limit, cloud_permitted=False)
    assert [(o.partition, v) for o, v in zip(decision.options, decision.verdicts, strict=True)] == [
        ("fits", "allowed"),
        ("poor", "over_credit"),
        ("big", "over_limit"),
        ("cloud", "cloud_not_allowed"),
    ]
    assert decision.partitions == ("fits",)
    assert decision.refusal is None and decision.refused_at is None
    allowed = route(options, limit=limit, cloud_permitted=True)
    assert allowed.partitions == ("fits", "cloud")  # on-premise first, whatever the cost
    assert allowed.quote is not None and allowed.quote.partition == "fits"  # the dearest allowed


def test_the_quote_is_the_dearest_allowed_run() -> None:
    decision = route(
        [option("onprem", ONPREM, "14.4"), option("cloud", CLOUD, "21.6")],
        limit=CostLimit(None, allow_cloud=True),
        cloud_permitted=True,
    )
    assert decision.partitions == ("onprem", "cloud")
    assert decision.quote is not None and decision.quote.cost_ucredits == 21_600_000


def test_a_refusal_is_for_the_option_that_got_furthest() -> None:
    limit = CostLimit(parse_credits("20"), allow_cloud=True)
    # on-prem is over the limit, cloud within it but beyond the credit: a refusal for credit
    over_credit = route(
        [option("onprem", ONPREM, "25"), option("cloud", CLOUD, "18", available="10")],
        limit=limit,
        cloud_permitted=True,
    )
    assert (over_credit.refusal, over_credit.refused_at and over_credit.refused_at.partition) == (
        "over_credit",
        "cloud",
    )
    over_limit = route(
        [option("a", ONPREM, "25"), option("b", ONPREM, "21"), option("c", CLOUD, "5")],
        limit=limit,
        cloud_permitted=False,
    )
    assert over_limit.refusal == "over_limit"
    assert over_limit.refused_at is not None and over_limit.refused_at.partition == "b"  # the cheapest
    only_cloud = route([option("c", CLOUD, "5")], limit=limit, cloud_permitted=False)
    assert only_cloud.refusal == "cloud_not_allowed"
    with pytest.raises(ValueError):
        route([], limit=limit, cloud_permitted=True)


def test_an_array_is_limited_per_run_and_quoted_for_every_task() -> None:
    decision = route(
        [option("onprem", ONPREM, "4", tasks=10)], limit=CostLimit(parse_credits("5")), cloud_permitted=False
    )
    assert decision.partitions == ("onprem",)
    assert decision.quote is not None and decision.quote.cost_ucredits == 40_000_000


def test_routing_config_and_whose_limit_applies() -> None:
    assert ROUTING.sites == {"onprem": ONPREM, "cloud": CLOUD}
    assert ROUTING.site("cloud") == CLOUD and ROUTING.site("debug") == ONPREM and ROUTING.site(None) == ONPREM
    assert ROUTING.limit_for("physics", None, None) is None  # nothing stated: no routing
    assert ROUTING.limit_for("physics", None, False) is None
    assert ROUTING.limit_for("physics", "25", None) == CostLimit(25_000_000, False, "job")
    assert ROUTING.limit_for("physics", None, True) == CostLimit(None, True, "account")
    assert ROUTING.limit_for("chemistry", None, None) == CostLimit(20_000_000, True, "account")
    assert ROUTING.limit_for("chemistry", "5", False) == CostLimit(5_000_000, False, "job")
    with pytest.raises(InvalidInput, match="max_cost must be greater than zero"):
        ROUTING.limit_for("physics", "0", None)


@pytest.mark.parametrize(
    ("config", "error"),
    [
        ({"partitions": {"x": {"site": "moon"}}}, "partitions.x.site must be one of onprem, cloud"),
        ({"routing": {"accounts": {"p": {"max_cost": 25}}}}, "routing.accounts.p.max_cost must be a decimal"),
        ({"routing": {"accounts": {"p": {"max_cost": "1e400"}}}}, "exceeds the maximum"),
        (
            {"routing": {"accounts": {"p": {"cloud": "yes"}}}},
            "routing.accounts.p.cloud must be true or false",
        ),
    ],
)
def test_bad_routing_config_is_refused_naming_the_key(config: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidInput, match=error):
        RoutingConfig.from_config(config)


def test_candidates_are_the_named_partitions_else_the_tagged_ones_offered() -> None:
    assert api.candidate_partitions(["cloud", "onprem", "cloud"], ROUTING, ()) == ["cloud", "onprem"]
    assert api.candidate_partitions([], ROUTING, ()) == ["onprem", "cloud"]
    assert api.candidate_partitions([], ROUTING, ("onprem", "debug")) == ["onprem"]
    assert api.candidate_partitions([], RoutingConfig({}, {}), ()) == [None]


# -- the daemon's answer -----------------------------------------------------------------------------


def test_allowed_both_sites_slurm_picks_where_it_starts_first() -> None:
    assert submit("gpucredit:max_cost=25,cloud=yes nightly run") == {
        "decision": "accept",
        "message": "gpucredit: ~21.60 credits at most (2×h100 × 2 h) in onprem (~14.40) or cloud (~21.60), "
        "where Slurm can start it first; limit 25.00 a run (your comment); 112.40 available in physics",
        "partition": "onprem,cloud",
        "comment": "gpucredit: routed to onprem,cloud (limit 25.00 a run, cloud allowed): "
        "onprem ~14.40 allowed, cloud ~21.60 allowed | nightly run",
    }


def test_cloud_over_the_limit_or_not_allowed_stays_on_premise() -> None:
    over = submit("gpucredit:max_cost=20,cloud=yes")
    assert over == {
        "decision": "accept",
        "message": "gpucredit: ~14.40 credits (2×h100 × 2 h) in onprem; not cloud (~21.60, over the limit); "
        "limit 20.00 a run (your comment); 112.40 available in physics",
        "partition": "onprem",
        "comment": "gpucredit: routed to onprem (limit 20.00 a run, cloud allowed): "
        "onprem ~14.40 allowed, cloud ~21.60 over the limit",
    }
    not_allowed = submit("gpucredit:max_cost=25")
    assert not_allowed["message"] == (
        "gpucredit: ~14.40 credits (2×h100 × 2 h) in onprem; not cloud (~21.60, cloud not allowed); "
        "limit 25.00 a run (your comment); 112.40 available in physics"
    )
    assert (not_allowed["partition"], not_allowed["comment"]) == (
        "onprem",
        "gpucredit: routed to onprem (limit 25.00 a run): onprem ~14.40 allowed, "
        "cloud ~21.60 cloud not allowed",
    )


def test_a_limit_below_any_run_is_refused_with_the_figures() -> None:
    assert submit("gpucredit:max_cost=10,cloud=yes") == {
        "decision": "reject",
        "message": "gpucredit: this job would cost at least ~14.40 credits a run (2×h100 × 2 h in onprem) "
        "but its limit is 10.00 (your comment). Raise gpucredit:max_cost in --comment, or ask for fewer "
        "GPUs or less time",
    }
    # Cheaper in the cloud (a100 there costs 1.00/h): the refusal says cloud would fit.
    assert submit("gpucredit:max_cost=5", tres_per_node="gres:gpu:a100:2")["message"] == (
        "gpucredit: this job would cost at least ~8.00 credits a run (2×a100 × 2 h in onprem) but its "
        "limit is 5.00 (your comment). Raise gpucredit:max_cost in --comment, or ask for fewer GPUs or "
        "less time; cloud (~4.00) is within it: add gpucredit:cloud=yes to --comment"
    )


def test_the_accounts_default_applies_when_the_job_says_nothing() -> None:
    decided = submit(account="chemistry")
    assert decided["message"] == (
        "gpucredit: ~14.40 credits (2×h100 × 2 h) in onprem; not cloud (~21.60, over the limit); "
        "limit 20.00 a run (chemistry's default); 50.00 available in chemistry"
    )
    assert decided["partition"] == "onprem"
    # The job's own word wins, key by key.
    assert submit("gpucredit:max_cost=30", account="chemistry")["partition"] == "onprem,cloud"
    assert submit("gpucredit:cloud=no", account="chemistry")["message"].endswith(
        "not cloud (~21.60, cloud not allowed); limit 20.00 a run (chemistry's default); "
        "50.00 available in chemistry"
    )


def test_what_credit_allows_narrows_the_route_then_refuses() -> None:
    narrowed = submit("gpucredit:cloud=yes", snap=snapshot(available="18", credit="18"))
    assert narrowed["message"] == (
        "gpucredit: ~14.40 credits (2×h100 × 2 h) in onprem; not cloud (~21.60, more than is available); "
        "18.00 available in physics"
    )
    assert submit("gpucredit:cloud=yes", snap=snapshot(available="10", credit="10")) == {
        "decision": "reject",
        "message": "gpucredit: this job would cost ~14.40 credits (2×h100 × 2 h in onprem) but only 10.00 "
        f"are available in physics. {HINT}",
    }


def test_a_cap_the_job_breaks_in_one_partition_only() -> None:
    capped = snapshot(alice=Limits(max_rate_ucredits_per_second=2_500))  # 9.00/h: on-prem's 7.20/h fits
    decided = submit("gpucredit:cloud=yes", snap=capped)
    assert decided["message"].startswith(
        "gpucredit: ~14.40 credits (2×h100 × 2 h) in onprem; not cloud (~21.60, spend_rate)"
    )
    refused = submit("gpucredit:cloud=yes", snap=snapshot(alice=Limits(max_gpus=1)))
    assert refused["message"] == (
        "gpucredit: concurrent_gpus: 2 GPUs exceed the cap of 1 for user alice (job: 2×h100 × 2 h in onprem)"
    )


def test_partitions_the_user_names_are_permitted_and_priced_each_with_its_own_time() -> None:
    named = submit("gpucredit:max_cost=25", partition="cloud")
    assert (named["partition"], named["message"]) == (
        "cloud",
        "gpucredit: ~21.60 credits (2×h100 × 2 h) in cloud; limit 25.00 a run (your comment); "
        "112.40 available in physics",
    )
    # No -t: each partition's DefaultTime (onprem 1 h, cloud 30 min).
    untimed = submit("gpucredit:cloud=yes", time_limit=NO_VAL)
    assert untimed["message"].startswith(
        "gpucredit: ~7.20 credits at most (2×h100 × 1 h) in onprem (~7.20) or cloud (~5.40)"
    )


def test_untyped_gpus_are_priced_per_partition_and_missing_types_skip_a_partition() -> None:
    TYPES["cloud"] = ["a100"]
    try:
        untyped = submit("gpucredit:cloud=yes", tres_per_node=None, tres_per_job="gres:gpu:1")
        assert untyped["message"] == (
            "gpucredit: ~7.20 credits at most (1×h100 × 2 h) in onprem (~7.20) or cloud (~2.00), where "
            "Slurm can start it first; untyped GPUs estimated as h100, the dearest type here; "
            "112.40 available in physics"
        )
        typed = submit("gpucredit:cloud=yes")  # h100: not in the cloud now
        assert (typed["partition"], typed["message"].split(";")[0]) == (
            "onprem",
            "gpucredit: ~14.40 credits (2×h100 × 2 h) in onprem",
        )
        assert submit("gpucredit:cloud=yes", partition="debug")["message"] == (
            "gpucredit: no partition this job may use offers h100"
        )
    finally:
        TYPES["cloud"] = ["a100", "h100"]


def test_without_tagged_partitions_a_limit_still_caps_the_default_partition() -> None:
    decided = answer.submit(
        snapshot(),
        {"user_name": "alice", "account": "physics", "time_limit": 120, "tres_per_node": "gres:gpu:h100:2",
         "comment": "gpucredit:max_cost=15"},
        top_up_hint=HINT,
        partition_types=partition_types,
    )  # fmt: skip
    assert decided == {
        "decision": "accept",
        "message": "gpucredit: ~14.40 credits (2×h100 × 2 h) in the default partition; limit 15.00 a run "
        "(your comment); 112.40 available in physics",
        "comment": "gpucredit: routed to the default partition (limit 15.00 a run): "
        "the default partition ~14.40 allowed",
    }


def test_jobs_that_state_nothing_are_answered_as_before() -> None:
    assert submit("just my notes") == {
        "decision": "accept",
        "message": "gpucredit: ~14.40 credits (2×h100 × 2 h), 112.40 available in physics",
    }


@pytest.mark.parametrize(
    ("comment", "message"),
    [
        ("gpucredit:max-cost=5", "gpucredit: invalid_comment: unknown gpucredit directive 'max-cost=5' in "
         "the comment (known: max_cost=..., cloud=..., region=...)"),
        ("gpucredit:max_cost=0", "gpucredit: max_cost must be greater than zero"),
    ],
)  # fmt: skip
def test_a_bad_directive_refuses_the_job_saying_why(comment: str, message: str) -> None:
    assert submit(comment) == {"decision": "reject", "message": message}


# -- the credit warning ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("available", "warning"),
    [
        ("20.000001", ""),  # 79.999999 % used
        ("20", ". physics has used 80% of its credit. " + HINT),
        ("15", ". physics has used 85% of its credit. " + HINT),
    ],
)
def test_an_accepted_job_warns_from_the_configured_share_of_credit_used(available: str, warning: str) -> None:
    snap = snapshot(available=available, credit="100")
    plain = submit(snap=snap, tres_per_node="gres:gpu:a100:1", time_limit=60)
    shown = format_credits(parse_credits(available))
    assert (
        plain["message"] == f"gpucredit: ~2.00 credits (1×a100 × 1 h), {shown} available in physics{warning}"
    )
    routed = submit("gpucredit:cloud=yes", snap=snap, tres_per_node="gres:gpu:a100:1", time_limit=60)
    assert routed["message"].endswith(f"available in physics{warning}")


def test_a_refusal_carries_no_warning() -> None:
    refused = submit(snap=snapshot(available="1", credit="100"))
    assert refused["decision"] == "reject" and "used" not in refused["message"]


def test_credit_use_share_is_exact() -> None:
    use = api.CreditUse("physics", credit_ucredits=3, available_ucredits=1)
    assert (use.used_ucredits, use.used_percent) == (2, 66)
    assert use.used_at_least(Fraction(2, 3)) and not use.used_at_least(Fraction(667, 1000))
    nothing = api.CreditUse("physics", credit_ucredits=0, available_ucredits=-5)
    assert (nothing.used_at_least(Fraction(1, 100)), nothing.used_percent) == (False, 0)


@pytest.mark.parametrize(
    ("value", "share"), [(0.8, Fraction(4, 5)), ("0.85", Fraction(17, 20)), (1, Fraction(1))]
)
def test_parse_share(value: object, share: Fraction) -> None:
    assert api.parse_share(value) == share


@pytest.mark.parametrize("value", [0, 1.5, -0.1, "x", True, None, "nan"])
def test_parse_share_refuses_what_is_no_share(value: object) -> None:
    with pytest.raises(InvalidInput, match=r"policy\.warn_at_used_share"):
        api.parse_share(value)


def test_credit_use_counts_current_grants_and_held_credit_as_used(
    tx: Callable[[], Any], engine: Engine
) -> None:
    now = utcnow()
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=EPOCH)
        api.create_account(s, "physics")
        api.add_member(s, "alice", "physics")
        api.topup(s, "physics", "100", effective_at=now - timedelta(days=1))
        api.grant(
            s, "physics", "50", effective_at=now - timedelta(days=9), expires_at=now - timedelta(days=2)
        )
        api.grant(s, "physics", "70", effective_at=now + timedelta(days=2))  # not yet
        api.consume(s, "physics", "60")
        api.create_hold(
            s, api.HoldRequest("physics", user="alice", job_id=1, gpus="h100:1", seconds=7200)
        )  # holds 7.20
    with tx() as s:
        use = api.credit_use(s, "physics")
        later = api.credit_use(s, "physics", at=now + timedelta(days=3))
    # 100 granted now; 60 consumed and 7.20 held: 32.80 available, 67 % used
    assert (use.credit_ucredits, use.available_ucredits, use.used_percent) == (100_000_000, 32_800_000, 67)
    assert later.credit_ucredits == 170_000_000
    keeper = api.SnapshotKeeper(make_sessionmaker(engine))
    assert keeper.current().credit_use("physics") == use  # job_submit reads the same figure


def test_the_daemon_reads_routing_and_the_warning_from_its_config(tmp_path: Path) -> None:
    config = load_config(Path("/dev/null"))
    config["database"]["url"] = f"sqlite:///{tmp_path / 'ledger.db'}"
    config["partitions"] = {"cloud": {"site": "cloud"}}
    config["routing"]["accounts"] = {"physics": {"max_cost": "9.5"}}
    daemon = Daemon(config)
    assert daemon.routing.sites == {"cloud": "cloud"}
    assert daemon.routing.account_defaults["physics"].max_cost_ucredits == 9_500_000
    assert daemon.warn_at_used_share == Fraction(4, 5)  # the default
    daemon.engine.dispose()
    config["policy"]["warn_at_used_share"] = False
    daemon = Daemon(config)
    assert daemon.warn_at_used_share is None
    daemon.engine.dispose()
    config["partitions"] = {"cloud": {"site": "space"}}
    with pytest.raises(InvalidInput, match=r"partitions\.cloud\.site"):
        Daemon(config)
