"""An account's monthly cloud spend, to the micro-credit, and the budget's boundary
(ledger.pricing.cloud_budget, docs/routing.md "Cloud budgets").

Spend = charges on cloud-partition runs effective in the month, net of refunds, plus
what open cloud holds still reserve. Every figure here is worked out by hand from the
prices (h100: 3.60 on-premise, 5.40 in the cloud) and checked exactly, on each store.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ledger import api
from ledger.errors import InvalidInput
from ledger.pricing.cloud_budget import month_of
from ledger.pricing.routing import RoutingConfig

SEP = datetime(2026, 9, 1, tzinfo=UTC)
NOV = datetime(2026, 11, 1, tzinfo=UTC)
IN_NOV = datetime(2026, 11, 20, 12, tzinfo=UTC)
CLOUD = {"cloud"}
HOUR = 3600


def run(
    s: Any,
    account: str,
    job_id: int,
    *,
    partition: str,
    at: datetime,
    gpus: str = "h100:1",
    limit_seconds: int = 2 * HOUR,
    settle_seconds: int | None = None,
) -> int:
    """A run's hold at `at`, settled after `settle_seconds` (None: left open); its id."""
    hold = api.create_hold(
        s,
        api.HoldRequest(
            account, user="alice", job_id=job_id, gpus=gpus, seconds=limit_seconds, partition=partition, at=at
        ),
    )
    if settle_seconds is not None:
        api.settle_hold(s, hold.id, settle_seconds, at + timedelta(seconds=settle_seconds))
    return hold.id


@pytest.fixture
def books(tx: Callable[[], Any]) -> Callable[[], Any]:
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=SEP)
        api.set_price(s, "h100", "5.40", partition="cloud", effective_at=SEP)
        for account in ("physics", "chemistry"):
            api.create_account(s, account)
            api.add_member(s, "alice", account)
            api.topup(s, account, "1000", effective_at=SEP)
    return tx


def spend(tx: Callable[[], Any], at: datetime = IN_NOV, accounts: tuple[str, ...] = ("physics",)) -> dict:
    with tx() as s:
        return api.cloud_spend(s, cloud_partitions=CLOUD, accounts=accounts, at=at)


def test_month_spend_is_settled_charges_net_of_refunds_plus_open_holds(books: Callable[[], Any]) -> None:
    with books() as s:
        # October's cloud run: charged in October, not November's spend.
        run(
            s, "physics", 1, partition="cloud", at=datetime(2026, 10, 31, 20, tzinfo=UTC), settle_seconds=HOUR
        )
        # Started in October, settled in November: its charge is posted (effective) in November.
        run(
            s,
            "physics",
            2,
            partition="cloud",
            at=datetime(2026, 10, 31, 23, 30, tzinfo=UTC),
            settle_seconds=HOUR,
        )
        # Two GPUs for half an hour: 2 × 5.40 × 0.5 = 5.40.
        run(
            s,
            "physics",
            3,
            partition="cloud",
            at=NOV + timedelta(days=2),
            gpus="h100:2",
            settle_seconds=HOUR // 2,
        )
        # 5.40 charged, then corrected down to 2.00: 3.40 refunded on the run.
        refunded = run(s, "physics", 4, partition="cloud", at=NOV + timedelta(days=3), settle_seconds=HOUR)
        api.adjust_hold(s, refunded, 2_000_000, at=NOV + timedelta(days=9))
        # Open for 4 h (21.60 reserved), charged 1 h so far (5.40): 16.20 still reserved.
        running = run(
            s, "physics", 5, partition="cloud", at=IN_NOV - timedelta(hours=2), limit_seconds=4 * HOUR
        )
        api.hold_usage(s, running, HOUR, IN_NOV - timedelta(hours=1))
        # Not cloud, or not physics: not physics's cloud spend.
        run(s, "physics", 6, partition="onprem", at=NOV + timedelta(days=4), settle_seconds=HOUR)
        run(s, "physics", 7, partition="onprem", at=NOV + timedelta(days=4), limit_seconds=HOUR)
        run(s, "chemistry", 8, partition="cloud", at=NOV + timedelta(days=4), settle_seconds=HOUR)
    found = spend(books)
    # charged: 5.40 (job 2) + 5.40 (job 3) + 2.00 (job 4) + 5.40 (job 5 so far); held 16.20
    assert found == {"physics": api.CloudSpend("physics", "2026-11", 18_200_000, 16_200_000)}
    assert found["physics"].spent_ucredits == 34_400_000
    october = spend(books, at=datetime(2026, 10, 15, tzinfo=UTC))["physics"]
    assert october.charged_ucredits == 5_400_000  # job 1 only; the open hold counts in any month
    both = spend(books, accounts=("physics", "chemistry", "nosuch"))
    assert both["chemistry"] == api.CloudSpend("chemistry", "2026-11", 5_400_000, 0)
    assert both["nosuch"] == api.CloudSpend("nosuch", "2026-11")  # no runs, no account: nothing spent


def test_a_settled_hold_stops_counting_as_held(books: Callable[[], Any]) -> None:
    with books() as s:
        hold = run(s, "physics", 1, partition="cloud", at=IN_NOV - timedelta(hours=3))
    assert spend(books)["physics"] == api.CloudSpend("physics", "2026-11", 0, 10_800_000)  # 2 h × 5.40
    with books() as s:
        api.settle_hold(s, hold, HOUR, IN_NOV - timedelta(hours=2))
    assert spend(books)["physics"] == api.CloudSpend("physics", "2026-11", 5_400_000, 0)


def test_no_cloud_partition_or_no_account_reads_nothing(books: Callable[[], Any]) -> None:
    with books() as s:
        run(s, "physics", 1, partition="cloud", at=IN_NOV - timedelta(hours=3))
        assert api.cloud_spend(s, cloud_partitions=(), accounts=["physics"], at=IN_NOV) == {
            "physics": api.CloudSpend("physics", "2026-11")
        }
        assert api.cloud_spend(s, cloud_partitions=CLOUD, accounts=[], at=IN_NOV) == {}


@pytest.mark.parametrize(
    ("at", "month", "start", "end"),
    [
        (datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), "2026-12", (2026, 12, 1), (2027, 1, 1)),
        (datetime(2027, 1, 1, tzinfo=UTC), "2027-01", (2027, 1, 1), (2027, 2, 1)),
        (datetime(2026, 2, 28, 12, tzinfo=UTC), "2026-02", (2026, 2, 1), (2026, 3, 1)),
    ],
)
def test_month_of_is_the_utc_calendar_month(
    at: datetime, month: str, start: tuple[int, int, int], end: tuple[int, int, int]
) -> None:
    assert month_of(at) == (month, datetime(*start, tzinfo=UTC), datetime(*end, tzinfo=UTC))


def test_the_budget_allows_exactly_its_amount_and_not_one_micro_credit_more() -> None:
    spent = api.CloudSpend("physics", "2026-12", charged_ucredits=470_000_000, held_ucredits=10_000_000)
    assert api.cloud_budget_breach(spent, 520_000_000, 40_000_000) is None  # 480 + 40 = 520: fits
    breach = api.cloud_budget_breach(spent, 519_999_999, 40_000_000)
    assert breach is not None and breach.code == "cloud_budget"
    assert breach.message == (
        "account physics: cloud budget 519.999999 credits for 2026-12, spent 480.00, this job 40.00"
    )
    assert breach.details == {
        "account": "physics",
        "month": "2026-12",
        "budget": "519.999999",
        "spent": "480.00",
        "charged": "470.00",
        "held": "10.00",
        "sent": "0.00",
        "cost": "40.00",
    }


def test_jobs_sent_to_the_cloud_and_not_started_count_against_the_budget() -> None:
    spent = api.CloudSpend("physics", "2026-12", charged_ucredits=470_000_000, held_ucredits=10_000_000)
    assert api.cloud_budget_breach(spent, 520_000_000, 30_000_000, sent_ucredits=10_000_000) is None
    breach = api.cloud_budget_breach(spent, 520_000_000, 30_000_000, sent_ucredits=10_000_001)
    assert breach is not None and breach.details["sent"] == "10.000001"
    assert breach.message == (
        "account physics: cloud budget 520.00 credits for 2026-12, spent 480.00, "
        "sent and not started 10.000001, this job 30.00"
    )


def test_the_config_parses_the_budget_with_the_money_parser() -> None:
    config = RoutingConfig.from_config(
        {
            "partitions": {
                "onprem": {"site": "onprem"},
                "cloud": {"site": "cloud"},
                "burst": {"site": "cloud"},
            },
            "routing": {"accounts": {"physics": {"cloud_budget": "500"}, "chemistry": {"max_cost": "5"}}},
        }
    )
    assert config.account_defaults["physics"].cloud_budget_ucredits == 500_000_000
    assert config.account_defaults["chemistry"].cloud_budget_ucredits is None
    assert config.budget_scope() == api.CloudBudgetScope(
        frozenset({"cloud", "burst"}), frozenset({"physics"})
    )
    assert (
        RoutingConfig.from_config({"routing": {"accounts": {"x": {"max_cost": "5"}}}}).budget_scope() is None
    )
    no_cloud = RoutingConfig.from_config({"routing": {"accounts": {"x": {"cloud_budget": "0"}}}})
    assert no_cloud.account_defaults["x"].cloud_budget_ucredits == 0  # a budget of nothing: no cloud


@pytest.mark.parametrize("value", [500, "-5", "lots", "1.0000001", 2.5])
def test_a_bad_budget_names_its_key(value: object) -> None:
    with pytest.raises(InvalidInput, match=r"routing\.accounts\.physics\.cloud_budget"):
        RoutingConfig.from_config({"routing": {"accounts": {"physics": {"cloud_budget": value}}}})


def test_a_misspelt_routing_key_is_refused_not_ignored() -> None:
    with pytest.raises(
        InvalidInput, match=r"routing\.accounts\.physics\.cloud_budgt is not a routing setting"
    ):
        RoutingConfig.from_config({"routing": {"accounts": {"physics": {"cloud_budgt": "500"}}}})


def test_the_snapshot_reads_the_budgeted_accounts_spend(books: Callable[[], Any], engine: Any) -> None:
    from ledger.store.db import make_sessionmaker

    with books() as s:
        run(s, "physics", 1, partition="cloud", at=datetime.now(UTC) - timedelta(minutes=5))
    scope = api.CloudBudgetScope(frozenset(CLOUD), frozenset({"physics"}))
    picture = api.SnapshotKeeper(make_sessionmaker(engine), budget_scope=scope).current()
    month = month_of(picture.taken_at)[0]
    assert picture.cloud_month == month
    assert picture.cloud_spend("physics") == api.CloudSpend("physics", month, 0, 10_800_000)
    assert picture.cloud_spend("chemistry") == api.CloudSpend("chemistry", month)  # not budgeted: not read
    assert picture.quotes_hold_until() <= month_of(picture.taken_at)[2]
    unscoped = api.SnapshotKeeper(make_sessionmaker(engine)).current()
    with pytest.raises(LookupError):  # never a free zero
        unscoped.cloud_spend("physics")


def test_the_month_is_read_through_the_journals_account_and_time_index(tmp_path: Any) -> None:
    """The revenue account's postings are every charge ever: the statement must reach
    them from this month's entries, never scan them (SQLite's plan, which needs no
    statistics to be repeatable; PostgreSQL's chose the same indexes when measured)."""
    from ledger.pricing.cloud_budget import spend_query
    from ledger.store.db import make_engine
    from ledger.store.schema import upgrade

    engine = make_engine(f"sqlite:///{tmp_path / 'plan.db'}")
    upgrade(engine)
    _, start, end = month_of(IN_NOV)
    statement = spend_query(CLOUD, ["physics"], start, end).compile(
        engine, compile_kwargs={"literal_binds": True}
    )
    with engine.connect() as connection:
        plan = [row[3] for row in connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}")]
    engine.dispose()
    assert any("entries USING INDEX ix_entries_account_id_effective_at" in step for step in plan), plan
    assert any("holds USING INDEX ix_holds_account_id_state" in step for step in plan), plan
    assert not any(step.startswith("SCAN") and "anon" not in step for step in plan), plan
    assert not any("postings USING INDEX ix_postings_account_id" in step for step in plan), plan
