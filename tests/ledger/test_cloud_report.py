"""ledger.api.cloud_report: the month's instance cost beside the credits charged to the
jobs that ran on them, on a hand-built ledger, so every figure is exact.

The instance price is 36 credits an hour (0.01 a second) and an h100 costs 3.60 credits
an hour, so a reader can check each figure by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ledger import api
from ledger import errors as api_errors
from ledger.errors import InvalidInput
from tests.support.cloud_report import NOV_10_NOON, run_job, seed_accounts, seed_november, span

Tx = Callable[[], Any]
MIN = timedelta(minutes=1)


def cells(report: api.CloudReport) -> list[tuple[Any, ...]]:
    return [tuple(row[c] for c in api.CLOUD_REPORT_COLUMNS) for row in report.table()]


def test_an_instance_of_ten_minutes_with_a_job_of_six_on_two_gpus(tx: Tx) -> None:
    """Boot 2 min, the job 6 min on 2 GPUs, idle 2 min: the job's row has its 6 minutes'
    cost and its exact charge (2 x 3.60 x 0.1 h = 0.72); 4 minutes (40%) are overhead."""
    with tx() as s:
        seed_november(s)
    with tx() as s:
        report = api.cloud_report(
            s,
            month="2026-11",
            instances=[span("i-1", "cloud1", NOV_10_NOON, NOV_10_NOON + 10 * MIN)],
            cloud_nodes={"cloud1", "cloud2"},
            now=datetime(2027, 1, 1, tzinfo=UTC),
        )
    assert cells(report) == [
        ("cloud", "physics", 360, "0.10", "3.60", 720, "0.72", 0, "-"),
        ("cloud", "(overhead)", 240, "0.07", "2.40", 0, "0.00", 240, "40.0%"),
        ("*", "*", 600, "0.17", "6.00", 720, "0.72", 240, "40.0%"),
    ]
    assert report.unpriced_instances == ()
    assert report.total.charged_ucredits == 720_000
    assert report.total.provider_cost_ucredits == 6_000_000


def test_two_jobs_at_once_share_the_node_seconds_by_gpus(tx: Tx) -> None:
    """One GPU of chemistry and three of physics for the same 4 minutes: 60 s and 180 s;
    an on-premise job (node n1) and a job on another cloud node count nothing here."""
    with tx() as s:
        seed_accounts(s, "physics", "chemistry")
    with tx() as s:
        for job_id, account, gpus, nodes in (
            (1, "chemistry", "h100:1", "cloud1"),
            (2, "physics", "h100:3", "cloud1"),
            (3, "physics", "h100:1", "n1"),
        ):
            run_job(
                s,
                account=account,
                job_id=job_id,
                gpus=gpus,
                partition="cloud" if nodes != "n1" else "onprem",
                nodes=nodes,
                started_at=NOV_10_NOON,
                seconds=240,
            )
    with tx() as s:
        report = api.cloud_report(
            s,
            month="2026-11",
            instances=[span("i-1", "cloud1", NOV_10_NOON, NOV_10_NOON + 4 * MIN)],
            cloud_nodes={"cloud1"},
            now=datetime(2027, 1, 1, tzinfo=UTC),
        )
    assert cells(report) == [
        ("cloud", "chemistry", 60, "0.02", "0.60", 240, "0.24", 0, "-"),
        ("cloud", "physics", 180, "0.05", "1.80", 720, "0.72", 0, "-"),
        ("*", "*", 240, "0.07", "2.40", 960, "0.96", 0, "0.0%"),
    ]


def test_an_instance_across_the_month_boundary_is_cut_there(tx: Tx) -> None:
    """Launched 23:50 on 30 November, ended 00:20 on 1 December, a 1-GPU job from 23:55
    to 00:05: November has 10 minutes (5 of them the job's), December 20 (5 the job's).
    The job's one charge takes effect when it was posted (its settle at 00:05), so it is
    December's, as `usage_report` counts it."""
    launched = datetime(2026, 11, 30, 23, 50, tzinfo=UTC)
    with tx() as s:
        seed_accounts(s, "physics")
    with tx() as s:
        run_job(
            s,
            account="physics",
            job_id=7,
            gpus="h100:1",
            partition="cloud",
            nodes="cloud1",
            started_at=launched + 5 * MIN,
            seconds=600,
        )
    instances = [span("i-9", "cloud1", launched, launched + 30 * MIN)]
    with tx() as s:
        november, december = (
            api.cloud_report(
                s,
                month=month,
                instances=instances,
                cloud_nodes={"cloud1"},
                now=datetime(2027, 1, 1, tzinfo=UTC),
            )
            for month in ("2026-11", "2026-12")
        )
    assert cells(november) == [
        ("cloud", "physics", 300, "0.08", "3.00", 0, "0.00", 0, "-"),
        ("cloud", "(overhead)", 300, "0.08", "3.00", 0, "0.00", 300, "50.0%"),
        ("*", "*", 600, "0.17", "6.00", 0, "0.00", 300, "50.0%"),
    ]
    assert cells(december) == [
        ("cloud", "physics", 300, "0.08", "3.00", 600, "0.60", 0, "-"),
        ("cloud", "(overhead)", 900, "0.25", "9.00", 0, "0.00", 900, "75.0%"),
        ("*", "*", 1200, "0.33", "12.00", 600, "0.60", 900, "75.0%"),
    ]
    assert (november.start, november.end) == (datetime(2026, 11, 1, tzinfo=UTC), december.start)


def test_an_instance_still_running_costs_what_it_has_run_to_now(tx: Tx) -> None:
    """No end in the journal: its cost so far to `now` (an injected clock), 90 minutes
    at 36 credits an hour; no job ran, so all of it is overhead of no partition ("-")."""
    launched = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
    with tx() as s:
        report = api.cloud_report(
            s,
            month="2026-11",
            instances=[span("i-2", "cloud2", launched, None)],
            cloud_nodes={"cloud2"},
            now=launched + 90 * MIN,
        )
    assert cells(report) == [
        ("-", "(overhead)", 5400, "1.50", "54.00", 0, "0.00", 5400, "100.0%"),
        ("*", "*", 5400, "1.50", "54.00", 0, "0.00", 5400, "100.0%"),
    ]
    assert report.at == launched + 90 * MIN
    # Asked for November from January, it ran to the month's end.
    with tx() as s:
        later = api.cloud_report(
            s,
            month="2026-11",
            instances=[span("i-2", "cloud2", launched, None)],
            cloud_nodes={"cloud2"},
            now=datetime(2027, 1, 5, tzinfo=UTC),
        )
    assert later.total.instance_seconds == 10 * 86400 + 14 * 3600
    assert later.at == datetime(2026, 12, 1, tzinfo=UTC)  # what runs is counted to the month's end


def test_an_instance_type_without_a_price_is_named_not_priced(tx: Tx) -> None:
    launched = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
    unpriced = api.InstanceSpan("i-3", "cloud1", "g9.huge", launched, launched + 10 * MIN, None)
    with tx() as s:
        report = api.cloud_report(
            s, month="2026-11", instances=[unpriced], cloud_nodes={"cloud1"}, now=launched + 20 * MIN
        )
    assert report.unpriced_instances == ("i-3",)
    assert (report.total.instance_seconds, report.total.provider_cost_ucredits) == (600, 0)


@pytest.mark.parametrize("month", ["2026-13", "2026-00", "2026-1", "26-11", "November", "", "2026-11-01"])
def test_a_bad_month_is_refused_with_its_code(month: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        api.month_bounds(month)
    assert refused.value.code == "invalid_month"
    assert refused.value.message == f"month must be YYYY-MM (e.g. 2026-11), got {month!r}"


def test_december_ends_at_the_next_new_year() -> None:
    assert api.month_bounds("2026-12") == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )


def test_the_instance_cost_rule_is_one_for_the_bill_and_the_report() -> None:
    """`cloud instances` (accounting_bridge.cloud.plan) figures cost through InstanceSpan:
    whole seconds from launch to end (or now), charge_for rounded once."""
    launched = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
    one = api.InstanceSpan("i", "cloud1", "p5.48xlarge", launched, None, 98_320_000)
    assert one.cost_ucredits(launched + 10 * MIN) == 16_386_667  # 98.32 x 600 / 3600, half up
    assert one.cost_ucredits(launched - MIN) == 0


def test_a_node_is_matched_by_name_not_by_prefix_and_across_query_chunks(tx: Tx) -> None:
    """cloud10's job is not cloud1's; a node past the first NODES_PER_QUERY names is
    found; an instance's node is a cloud node even when no longer configured as one."""
    with tx() as s:
        seed_accounts(s, "physics")
    with tx() as s:
        for job_id, nodes in ((1, "cloud10"), (2, "cloud240"), (3, "gone7")):
            run_job(
                s,
                account="physics",
                job_id=job_id,
                gpus="h100:1",
                partition="cloud",
                nodes=nodes,
                started_at=NOV_10_NOON,
                seconds=60,
            )
    instances = [
        span(f"i-{node}", node, NOV_10_NOON, NOV_10_NOON + 2 * MIN)
        for node in ("cloud1", "cloud240", "gone7")
    ]
    with tx() as s:
        report = api.cloud_report(
            s,
            month="2026-11",
            instances=instances,
            cloud_nodes={f"cloud{n}" for n in range(1, 301)},
            now=datetime(2027, 1, 1, tzinfo=UTC),
        )
    # cloud1 ran nothing: 120 s of no partition's overhead. cloud240 and gone7 ran 60 s
    # each, then idled 60 s. The three jobs ran on cloud nodes, so all three are charged
    # here (cloud10's had no instance in the journal: a leak `cloud reconcile` ends).
    assert cells(report) == [
        ("-", "(overhead)", 120, "0.03", "1.20", 0, "0.00", 120, "100.0%"),
        ("cloud", "physics", 120, "0.03", "1.20", 180, "0.18", 0, "-"),
        ("cloud", "(overhead)", 120, "0.03", "1.20", 0, "0.00", 120, "50.0%"),
        ("*", "*", 360, "0.10", "3.60", 180, "0.18", 240, "66.7%"),
    ]


def test_more_runs_than_the_limit_is_refused_not_cut(tx: Tx, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ledger.views.cloud_report.MAX_RUNS", 1)
    with tx() as s:
        seed_accounts(s, "physics")
    with tx() as s:
        for job_id in (1, 2):
            run_job(
                s,
                account="physics",
                job_id=job_id,
                gpus="h100:1",
                partition="cloud",
                nodes="cloud1",
                started_at=NOV_10_NOON,
                seconds=60,
            )
    with tx() as s, pytest.raises(api_errors.LedgerError) as refused:
        api.cloud_report(s, month="2026-11", instances=[], cloud_nodes={"cloud1"}, now=NOV_10_NOON + 10 * MIN)
    assert refused.value.code == "too_many_runs"
