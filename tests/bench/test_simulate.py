"""The fleet simulator (bench/simulate.py): the small configuration's books are exact.

A week of a 20-node fleet against the real daemon handlers, meter and bridge, with
one of each fault; then the ledger's charges per account and per run must equal the
simulator's own pricing of the simulated sacct records to the micro-credit, every
adjustment must link to the charge it corrects, no account may overspend past the
bound, and the audit chain must verify. Two injected defects (no NODE_FAIL refund,
a requeued run charged twice) must each be caught by that check.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from accounting_bridge.slurm.records import SacctRun
from bench.sim.books import expected_charge, jain
from bench.sim.engine import DEFECTS
from bench.sim.workload import SMALL, T0
from bench.simulate import simulate
from ledger.money import parse_credits

SEED = 1
# A shorter run for the defects and PostgreSQL: still every fault, fewer jobs.
TINY = SMALL.with_(name="tiny", jobs=150, days=3)


def _run(**fields: object) -> SacctRun:
    values: dict[str, object] = {
        "cluster": "sim",
        "job_id": 7,
        "display_id": "7",
        "run": 0,
        "user": "u",
        "account": "a",
        "partition": "gpu",
        "state": "COMPLETED",
        "submit": T0,
        "start": T0,
        "end": T0 + timedelta(seconds=1800),
        "elapsed_seconds": 1800,
        "time_limit_seconds": 7200,
        "gpus": {"h100": 2},
        "requested_gpus": {"h100": 2},
        "nodes": ("n1",),
        "node_count": 1,
        "name": "x",
        **fields,
    }
    return SacctRun(**values)  # type: ignore[arg-type]


def test_expected_charge_is_priced_independently() -> None:
    # docs/design.md §6 step 5: 2 x H100 for 1800 s at 3.60 per GPU-hour is 3.6 credits.
    assert expected_charge(_run(), days=7) == 3_600_000
    # One A100 second at 2.00/h is 555.55... micro-credits: half up, once.
    assert expected_charge(_run(gpus={"a100": 1}, elapsed_seconds=1), days=7) == 556
    # The H100 price change halfway through the month applies from its effective time.
    late = T0 + timedelta(days=15)
    assert expected_charge(_run(start=late), days=30) == 3_200_000
    assert expected_charge(_run(state="NODE_FAIL"), days=7) == 0
    assert expected_charge(_run(start=None, elapsed_seconds=0, gpus={}), days=7) == 0
    assert expected_charge(_run(state="REQUEUED", elapsed_seconds=0), days=7) == 0


def test_jain_index() -> None:
    assert jain([1.0, 1.0, 1.0]) == 1.0
    assert jain([1.0, 0.0]) == 0.5


def _assert_books_right(report: dict[str, object]) -> None:
    assert report["problems"] == []
    assert report["ok"] is True
    exact = report["exactness"]
    assert isinstance(exact, dict)
    assert exact["accounts_exact"] == exact["accounts"]
    assert exact["ledger_total"] == exact["expected_total"]
    assert exact["runs_wrong"] == 0
    assert exact["adjustments_unlinked"] == 0
    assert exact["recheck_moves"] == 0
    over = report["overspend"]
    assert isinstance(over, dict)
    assert over["accounts_over_bound"] == 0
    audit = report["audit"]
    assert isinstance(audit, dict)
    assert audit["ok"] is True


def test_small_configuration_books_are_exact(tmp_path: Path) -> None:
    report = simulate(SMALL, f"sqlite:///{tmp_path / 'ledger.db'}", seed=SEED)
    _assert_books_right(report)
    events = report["events"]
    assert isinstance(events, dict)
    # One of each fault really happened, and each kind of refusal.
    for kind in ("node_failure", "daemon", "database", "partition", "meter", "agent"):
        assert events[f"fault_{kind}"] >= 1, kind
    for event in (
        "lost_epilog",
        "duplicate_epilog",
        "epilog_unreachable",
        "meter_tick_missed",
        "bridge_round_missed",
        "refused_unreachable",
        "refused_insufficient_credits",
        "refused_concurrent_gpus",
        "refused_daily_cap",
    ):
        assert events.get(event, 0) >= 1, event
    exact = report["exactness"]
    assert isinstance(exact, dict)
    # The bridge refunded NODE_FAIL runs and settled runs whose epilog never came.
    assert exact["bridge_changes"]["refunded"].startswith("-")
    assert exact["bridge_changes"]["charged"] != "0.00"
    assert exact["adjustments_linked"] >= 1
    throughput = report["throughput"]
    assert isinstance(throughput, dict)
    assert throughput["ops"]["hold"] >= SMALL.jobs
    assert 0 < report["fairness"]["jain_gpu_time_per_share"] <= 1


def test_policy_accept_charges_unreserved_runs_exactly(tmp_path: Path) -> None:
    report = simulate(TINY.with_(policy="accept"), f"sqlite:///{tmp_path / 'ledger.db'}", seed=SEED)
    _assert_books_right(report)
    assert report["events"]["unreserved_start"] >= 1
    assert report["exactness"]["bridge_changes"]["unreserved"] != "0.00"
    # The ledger's own bound (ledger.holds.bounds): the 200-credit outage line of each of the
    # three outages (daemon, database, partition), plus any upward correction.
    for row in report["overspend"]["worst"]:
        assert parse_credits(row["bound"]) >= 3 * parse_credits("200"), row


def test_lease_mode_books_are_exact_and_bounded(tmp_path: Path) -> None:
    report = simulate(TINY.with_(mode="lease"), f"sqlite:///{tmp_path / 'ledger.db'}", seed=SEED)
    _assert_books_right(report)
    assert report["config"]["lease_seconds"] == 4 * TINY.meter_interval_seconds
    # The meter renewed leases, and its outages count in the ledger's bound.
    assert report["throughput"]["ops"]["lease_renewal"] >= 1
    assert report["overspend"]["bound_rule"].startswith("ledger.holds.bounds")


def test_postgres_books_are_exact(pg_url: str) -> None:
    _assert_books_right(simulate(TINY, pg_url, seed=SEED))


@pytest.mark.parametrize("defect", DEFECTS)
def test_an_injected_defect_is_caught(tmp_path: Path, defect: str) -> None:
    report = simulate(TINY, f"sqlite:///{tmp_path / 'ledger.db'}", seed=SEED, defect=defect)
    assert report["ok"] is False
    problems = report["problems"]
    assert isinstance(problems, list)
    assert any("accounts' charges differ from sacct's record" in p for p in problems), problems
    wrong = report["exactness"]["accounts_wrong"]
    assert wrong and all(line["difference"] != "0.00" for line in wrong)


def test_simulated_times_are_aware() -> None:
    assert T0.tzinfo is UTC
    assert datetime(2026, 12, 1, tzinfo=UTC) == T0


def test_bridge_never_settles_a_running_attempt_from_a_refused_one(tmp_path: Path) -> None:
    """Two attempts with one SubmitTime (a refusal requeued in the second of the last
    requeue): the first refused at the prolog (REQUEUED, Start == End, no hold), the
    second running with a hold. The refused row must leave the running hold alone; the
    epilog settles it (the full month stopped on 'hold ... is already settled')."""
    from accounting_bridge.sacct.reconcile import reconcile_runs
    from ledger import api
    from ledger.store.db import make_engine, make_sessionmaker
    from ledger.store.schema import upgrade

    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    upgrade(engine)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        api.set_price(s, "a100", "2.00", effective_at=T0 - timedelta(days=1))
        api.create_account(s, "physics", at=T0 - timedelta(days=1))
        api.add_member(s, "alice", "physics")
        api.topup(s, "physics", "100", at=T0 - timedelta(days=1))
    with factory() as s, s.begin():
        hold = api.create_hold(s, api.HoldRequest(
            "physics", user="alice", job_id=7, gpus={"a100": 1}, seconds=7200, cluster="sim",
            run=1, partition="gpu", at=T0 + timedelta(seconds=60), submitted_at=T0,
        ))  # fmt: skip
    refused = _run(state="REQUEUED", run=0, account="physics", user="alice", gpus={"a100": 1},
                   submit=T0, start=T0, end=T0, elapsed_seconds=0)  # fmt: skip
    summary = reconcile_runs(factory, [refused], now=T0 + timedelta(hours=1))
    with factory() as s:
        after = api.get_hold(s, hold.id)
    engine.dispose()
    assert summary.counts["charged"] == 0
    assert after.state == "active"
