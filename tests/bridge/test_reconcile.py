"""Reconciliation of sacct's finished runs with the ledger, incremental ingestion and
`gpucredit bridge`, on both stores.

Runs come from the recorded and hand-written fixtures in tests/fixtures/sacct/
(their README says which is which) or are built here; sacct is a FakeRunner that
answers only the exact argv it was told about.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import click
import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from accounting_bridge.sacct.ingest import CURSOR_NAME, ingest_round, read_cursor, write_cursor
from accounting_bridge.sacct.reconcile import (
    DEFAULT_POLICY,
    Policy,
    RunOutcome,
    Summary,
    not_final_reason,
    reconcile_run,
    reconcile_runs,
    reconcile_stored,
)
from accounting_bridge.slurm.backends import CommandsSource
from accounting_bridge.slurm.records import SacctRun, parse_parsable2
from accounting_bridge.slurm.slurmcmd import FakeResponse, FakeRunner
from gpucredit.cli import _build
from ledger import api, cli_support
from ledger.books.journal import REVENUE
from ledger.errors import Conflict, InvalidInput
from ledger.store.db import make_sessionmaker
from ledger.store.models import JobRun
from ledger.store.tables import entries_t, postings_t
from tests import support
from tests.support.sacct import T, synthetic

FIXTURES = support.FIXTURES / "sacct"
job_runs_t = JobRun.__table__
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def fixture_runs(name: str, *job_ids: int) -> list[SacctRun]:
    result = parse_parsable2(fixture(name), tz=UTC)
    assert result.ok, result.errors
    return [run for run in result.runs if not job_ids or run.job_id in job_ids]


def one_run(name: str, job_id: int, run: int = 0) -> SacctRun:
    (found,) = [r for r in fixture_runs(name, job_id) if r.run == run]
    return found


# Reconciliation time: well after every run here, so an active hold counts as a lost epilog.
LATER = datetime(2027, 1, 1, tzinfo=UTC)


def reconcile(
    factory: sessionmaker[Session], runs: list[SacctRun], policy: Policy = DEFAULT_POLICY, **options: Any
) -> Summary:
    return reconcile_runs(factory, runs, policy, **{"now": LATER, **options})


@pytest.fixture
def factory(engine: Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)


@pytest.fixture
def ledger(tx: Callable[[], Any]) -> Callable[[], Any]:
    """Prices of docs/design.md §6, account physics (alice) with 100 credits."""
    with tx() as s:
        api.set_price(s, "a100", "2.00", effective_at=EPOCH)
        api.set_price(s, "h100", "3.60", effective_at=EPOCH)
        api.create_account(s, "physics")
        api.add_member(s, "alice", "physics")
        api.topup(s, "physics", "100", effective_at=EPOCH)
    return tx


def hold_for(
    tx: Callable[[], Any],
    run: SacctRun,
    gpus: str,
    *,
    seconds: int = 7200,
    settle_seconds: int | None = None,
    hold_run: int | None = None,
    at: datetime | None = None,
    submitted_at: datetime | None = None,
) -> api.HoldState:
    """The hooks' part: a hold at the run's start, settled with `settle_seconds` unless None.

    Without `submitted_at` the hold has no submit time (older hooks, the CLI)."""
    with tx() as s:
        hold = api.create_hold(
            s,
            api.HoldRequest(
                run.account,
                user=run.user,
                job_id=run.job_id,
                gpus=gpus,
                seconds=seconds,
                cluster=run.cluster,
                run=run.run if hold_run is None else hold_run,
                partition=run.partition,
                at=at or run.start,
                submitted_at=submitted_at,
            ),
        )
        if settle_seconds is not None:
            assert run.start is not None
            hold = api.settle_hold(s, hold.id, settle_seconds, run.start + timedelta(seconds=settle_seconds))
    return hold


def counts(tx: Callable[[], Any]) -> tuple[int, ...]:
    with tx() as s:
        return tuple(
            s.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one()
            for table in ("entries", "postings", "holds", "grants", "job_runs")
        )


def stored(tx: Callable[[], Any], job_id: int, run: int = 0) -> Any:
    with tx() as s:
        return s.execute(
            select(job_runs_t).where(job_runs_t.c.job_id == job_id, job_runs_t.c.run == run)
        ).one()


def hold_entries(tx: Callable[[], Any], hold_id: int) -> list[Any]:
    with tx() as s:
        return list(
            s.execute(select(entries_t).where(entries_t.c.hold_id == hold_id).order_by(entries_t.c.id))
        )


def revenue_of(tx: Callable[[], Any], entry_id: int) -> int:
    with tx() as s:
        return int(
            s.execute(
                select(func.coalesce(func.sum(postings_t.c.amount_ucredits), 0)).where(
                    postings_t.c.entry_id == entry_id, postings_t.c.account_id == REVENUE
                )
            ).scalar_one()
        )


def verify_ok(tx: Callable[[], Any]) -> None:
    with tx() as s:
        report = api.verify(s)
    assert report.ok, report.problems


def only(summary: Summary, counter: str) -> list[RunOutcome]:
    return [o for o in summary.notable if o.counter == counter]


# --------------------------------------------------------------------------- holds


def test_worked_example_step_9_adjusts_by_0_004_linked_to_the_settle(ledger, factory) -> None:
    run = one_run("handwritten_failures.txt", 1001)
    assert (run.elapsed_seconds, run.gpus) == (1802, {"h100": 2})
    hold = hold_for(ledger, run, "h100:2", settle_seconds=1800)
    assert hold.charged_ucredits == 3_600_000

    summary = reconcile(factory, [run])

    assert summary.counts["adjusted"] == 1
    assert summary.totals_ucredits["adjusted"] == 4_000
    settle, adjust = hold_entries(ledger, hold.id)[-2:]
    assert (settle.kind, adjust.kind) == ("settle", "adjust")
    assert adjust.links_entry_id == settle.id
    assert revenue_of(ledger, adjust.id) == 4_000
    with ledger() as s:
        assert api.get_hold(s, hold.id).charged_ucredits == 3_604_000
        assert api.balance(s, "physics")["available"] == "96.396"
    row = stored(ledger, 1001)
    assert (row.hold_id, row.charged_ucredits, row.flags, row.elapsed_seconds) == (
        hold.id,
        3_604_000,
        "",
        1802,
    )
    verify_ok(ledger)


def test_equal_charge_posts_nothing_and_a_rerun_changes_nothing(ledger, factory) -> None:
    run = one_run("handwritten_failures.txt", 1001)
    hold_for(ledger, run, "h100:2", settle_seconds=1802)
    before = counts(ledger)

    first = reconcile(factory, [run])
    assert first.counts["matched"] == 1
    assert counts(ledger)[:4] == before[:4]  # no entry, posting, hold or grant
    assert counts(ledger)[4] == before[4] + 1  # the job_runs row

    again = reconcile(factory, [run])
    assert again.counts["unchanged"] == 1
    forced = reconcile(factory, [run], force=True)
    assert forced.counts["matched"] == 1
    assert counts(ledger) == (*before[:4], before[4] + 1)


def test_gpu_types_from_alloc_tres_priced_at_the_hold_and_at_the_start(ledger, factory) -> None:
    # Job 5 asked for --gpus=2 and got a100 + h100 (AllocTRES); say its hold had priced 2×h100.
    run = one_run("recorded_finished.txt", 5)
    assert run.gpus == {"a100": 1, "h100": 1} and run.start is not None
    with ledger() as s:  # a price change after the run started does not apply to it
        api.set_price(s, "a100", "9.00", effective_at=run.start + timedelta(seconds=1))
    hold = hold_for(ledger, run, "h100:2", seconds=300, settle_seconds=3)
    assert hold.charged_ucredits == 6_000  # 7.2/h × 3 s

    summary = reconcile(factory, [run])

    # (3.60 from the hold + 2.00 at the start) per hour × 3 s = 0.004667 (half-up)
    assert only(summary, "adjusted")[0].charged_ucredits == 4_667
    assert summary.totals_ucredits["adjusted"] == 4_667 - 6_000
    with ledger() as s:
        assert api.get_hold(s, hold.id).charged_ucredits == 4_667
    verify_ok(ledger)


def test_active_hold_whose_epilog_was_lost_is_settled_with_slurms_elapsed(ledger, factory) -> None:
    run = one_run("recorded_finished.txt", 4)
    hold = hold_for(ledger, run, "a100:1", seconds=300)
    summary = reconcile(factory, [run])
    assert summary.counts["charged"] == 1
    with ledger() as s:
        settled = api.get_hold(s, hold.id)
    assert (settled.state, settled.charged_seconds, settled.charged_ucredits) == ("settled", 3, 1_667)
    assert [e.kind for e in hold_entries(ledger, hold.id)] == ["hold", "settle"]
    assert reconcile(factory, [run]).counts["unchanged"] == 1
    verify_ok(ledger)


def test_an_active_hold_waits_for_its_epilog_first(ledger, factory) -> None:
    run = one_run("recorded_finished.txt", 4)
    assert run.end is not None
    hold = hold_for(ledger, run, "a100:1", seconds=300)
    soon = reconcile(factory, [run], now=run.end + timedelta(seconds=60))
    assert soon.counts["skipped"] == 1 and counts(ledger)[4] == 0
    with ledger() as s:
        assert reconcile_run(s, run, now=run.end + timedelta(seconds=60)).detail == "waiting for the epilog"
        assert api.get_hold(s, hold.id).state == "active"
    late = reconcile(factory, [run], now=run.end + timedelta(seconds=301))
    assert late.counts["charged"] == 1


def test_hold_numbered_differently_is_found_by_its_start(ledger, factory) -> None:
    # sacct lost the refused first attempt: its only row is run 0, the hooks said run 1.
    run = synthetic(3001, start=T + timedelta(seconds=2), elapsed_seconds=600)
    hold = hold_for(ledger, run, "a100:1", hold_run=1, at=T, settle_seconds=None)
    summary = reconcile(factory, [run])
    assert summary.counts["charged"] == 1 and summary.counts["unreserved"] == 0
    row = stored(ledger, 3001)
    assert (row.hold_id, row.flags) == (hold.id, "matched_by_start")
    # Too far from the start: a different run, so this one was not reserved.
    late = synthetic(3002, start=T + timedelta(seconds=60))
    hold_for(ledger, late, "a100:1", hold_run=1, at=T)
    assert reconcile(factory, [late]).counts["unreserved"] == 1


# --------------------------------------------------------------------------- job ids reused


OLD_SUBMIT = T - timedelta(seconds=10)
NEW_SUBMIT = T + timedelta(days=1)


def rows_of_job(tx: Callable[[], Any], job_id: int) -> list[tuple[Any, ...]]:
    """(run, submitted_at, hold_id, charged, elapsed) of every stored attempt under the id."""
    with tx() as s:
        rows = s.execute(
            select(job_runs_t).where(job_runs_t.c.job_id == job_id).order_by(job_runs_t.c.submitted_at)
        )
        return [(r.run, r.submitted_at, r.hold_id, r.charged_ucredits, r.elapsed_seconds) for r in rows]


def old_job_1_then_new_job_1(ledger, factory) -> tuple[SacctRun, api.HoldState, SacctRun, api.HoldState]:
    """Old job 1 ran 1802 s (held, settled 1800 s by the hooks, sacct ingested: +0.004);
    then the cluster was rebuilt and a new job 1 ran 600 s, held and settled by the hooks."""
    old = synthetic(1, submit=OLD_SUBMIT, start=T, elapsed_seconds=1802, gpus={"h100": 2})
    old_hold = hold_for(ledger, old, "h100:2", settle_seconds=1800, submitted_at=OLD_SUBMIT)
    assert reconcile(factory, [old]).counts["adjusted"] == 1
    new_start = NEW_SUBMIT + timedelta(seconds=5)
    new = synthetic(1, submit=NEW_SUBMIT, start=new_start, elapsed_seconds=600, gpus={"a100": 1})
    new_hold = hold_for(ledger, new, "a100:1", seconds=3600, settle_seconds=600, submitted_at=NEW_SUBMIT)
    return old, old_hold, new, new_hold


def assert_both_books_right(ledger, old_hold: api.HoldState, new_hold: api.HoldState) -> None:
    with ledger() as s:
        assert api.get_hold(s, old_hold.id).charged_ucredits == 3_604_000  # 7.2/h × 1802 s
        assert api.get_hold(s, new_hold.id).charged_ucredits == 333_333  # 2.0/h × 600 s
        assert api.balance(s, "physics")["available"] == "96.062667"
    verify_ok(ledger)


def test_a_new_job_with_an_old_id_is_reconciled_as_itself(ledger, factory) -> None:
    """sacct keeps the old job 1 beside the new one; alone in the by-id read (the old one
    past the look-back), the new job's attempt is run 0, as the old one's was."""
    old, old_hold, new, new_hold = old_job_1_then_new_job_1(ledger, factory)
    before = counts(ledger)

    summary = reconcile(factory, [new])

    assert (summary.counts["matched"], summary.counts["adjusted"], summary.counts["unreserved"]) == (1, 0, 0)
    assert counts(ledger)[:4] == before[:4]  # no entry, posting, hold or grant
    assert rows_of_job(ledger, 1) == [
        (0, OLD_SUBMIT, old_hold.id, 3_604_000, 1802),
        (0, NEW_SUBMIT, new_hold.id, 333_333, 600),
    ]
    assert_both_books_right(ledger, old_hold, new_hold)
    # The old job's record read again (an overlapping window) changes neither job.
    again = reconcile(factory, [old, new])
    assert again.counts["unchanged"] == 2
    assert counts(ledger) == (*before[:4], before[4] + 1)
    assert_both_books_right(ledger, old_hold, new_hold)


def test_both_incarnations_in_one_sacct_read_each_match_their_own_hold(ledger, factory) -> None:
    """Read together, sacct numbers the attempts of id 1 as one job: the new one is run 1.
    Each still matches its own hold, by submit time; nothing moves; a second round neither."""
    old, old_hold, new, new_hold = old_job_1_then_new_job_1(ledger, factory)
    before = counts(ledger)
    new_as_sacct_numbers_it = replace(new, run=1)

    summary = reconcile(factory, [old, new_as_sacct_numbers_it])

    assert (summary.counts["unchanged"], summary.counts["matched"]) == (1, 1)
    assert counts(ledger)[:4] == before[:4]
    assert rows_of_job(ledger, 1) == [
        (0, OLD_SUBMIT, old_hold.id, 3_604_000, 1802),
        (1, NEW_SUBMIT, new_hold.id, 333_333, 600),
    ]
    assert stored_flags(ledger, 1, NEW_SUBMIT) == ""  # matched by submit time, not by start
    assert reconcile(factory, [old, new_as_sacct_numbers_it]).counts["unchanged"] == 2
    assert counts(ledger) == (*before[:4], before[4] + 1)
    assert_both_books_right(ledger, old_hold, new_hold)


def stored_flags(tx: Callable[[], Any], job_id: int, submitted_at: datetime) -> str:
    with tx() as s:
        return str(
            s.execute(
                select(job_runs_t.c.flags).where(
                    job_runs_t.c.job_id == job_id, job_runs_t.c.submitted_at == submitted_at
                )
            ).scalar_one()
        )


def test_a_new_job_that_no_hook_saw_is_charged_as_itself(ledger, factory) -> None:
    """A hook outage for the new job 1: the old job's settled hold is not its hold."""
    _old, old_hold, _new, _new_hold = old_job_1_then_new_job_1(ledger, factory)
    outage = synthetic(1, submit=NEW_SUBMIT + timedelta(days=1), start=T + timedelta(days=2))
    summary = reconcile(factory, [outage])
    (charged,) = only(summary, "unreserved")
    assert charged.change_ucredits == 333_333  # a100 × 600 s
    with ledger() as s:
        assert api.get_hold(s, old_hold.id).charged_ucredits == 3_604_000
        unreserved = api.get_hold(s, cast(int, charged.hold_id))
    assert unreserved.as_dict()["submitted_at"] == "2026-12-04T10:00:00Z"
    verify_ok(ledger)


def test_a_hold_without_a_submit_time_is_not_taken_by_a_later_job_with_its_id(ledger, factory) -> None:
    """A hold from before migration 0004 (or the CLI) knows no submit time. A later job
    that reuses its id, run 0 too, and that no hook saw is charged as itself: the old
    hold started a day earlier, so it is not this run's, though the run index agrees."""
    old = synthetic(1, submit=OLD_SUBMIT, start=T, elapsed_seconds=1800, gpus={"h100": 2})
    old_hold = hold_for(ledger, old, "h100:2", settle_seconds=1800)  # no submit time
    outage = synthetic(1, submit=NEW_SUBMIT, start=NEW_SUBMIT + timedelta(seconds=5))
    summary = reconcile(factory, [outage])
    (charged,) = only(summary, "unreserved")
    assert (charged.change_ucredits, summary.counts["adjusted"]) == (333_333, 0)
    with ledger() as s:
        assert api.get_hold(s, old_hold.id).charged_ucredits == 3_600_000
    verify_ok(ledger)


def test_a_row_stored_before_attempts_had_submit_times_is_adopted_not_doubled(ledger, factory) -> None:
    """Rows from before migration 0004 have no submit time: the same attempt read again
    (same run index and start) updates that row instead of adding a twin, and moves no money."""
    run = synthetic(2001, submit=T - timedelta(seconds=30))
    hold = hold_for(ledger, run, "a100:1", settle_seconds=600)  # an old hook: no submit time
    assert reconcile(factory, [replace(run, submit=None)]).counts["matched"] == 1
    before = counts(ledger)
    summary = reconcile(factory, [run])
    assert summary.counts["matched"] == 1
    assert counts(ledger) == before
    assert rows_of_job(ledger, 2001) == [(0, T - timedelta(seconds=30), hold.id, 333_333, 600)]
    assert reconcile(factory, [run]).counts["unchanged"] == 1


# --------------------------------------------------------------------------- no hold


def test_unreserved_run_is_charged_once_and_flagged(ledger, factory) -> None:
    run = synthetic(3100, elapsed_seconds=600, gpus={"a100": 1})
    summary = reconcile(factory, [run])
    (outcome,) = only(summary, "unreserved")
    assert outcome.charged_ucredits == 333_333  # 2.00/h × 600 s
    row = stored(ledger, 3100)
    assert (row.flags, row.charged_ucredits, row.hold_id) == ("unreserved", 333_333, outcome.hold_id)
    assert outcome.hold_id is not None
    with ledger() as s:
        hold = api.get_hold(s, outcome.hold_id)
    assert (hold.state, hold.charged_seconds) == ("settled", 600)
    (entry,) = hold_entries(ledger, hold.id)
    assert entry.kind == "settle" and json.loads(entry.memo)["unreserved"] is True
    assert entry.effective_at == T + timedelta(seconds=600)

    before = counts(ledger)
    assert reconcile(factory, [run]).counts["unchanged"] == 1
    assert reconcile(factory, [run], force=True).counts["matched"] == 1
    assert counts(ledger) == before
    verify_ok(ledger)


def test_unreserved_run_of_an_account_without_credit_becomes_debt(ledger, factory) -> None:
    with ledger() as s:
        api.create_account(s, "chemistry")
        api.set_limits(s, "chemistry", max_gpus=0, daily_cap="0")  # limits do not apply: it ran
    run = synthetic(3200, account="chemistry", user="bob", elapsed_seconds=3600, gpus={"h100": 2})
    assert reconcile(factory, [run]).counts["unreserved"] == 1
    with ledger() as s:
        assert api.balance(s, "chemistry")["debt"] == "7.20"
    verify_ok(ledger)


def test_unreserved_run_of_an_unknown_account_fails_is_stored_and_retried(ledger, factory) -> None:
    run = synthetic(3300, account="nobody")
    summary = reconcile(factory, [run])
    (failed,) = summary.failures
    assert failed.detail.startswith("not_found:")
    assert stored(ledger, 3300).flags == "error"
    # A failed run is never "unchanged": the next round (or bridge reconcile) tries again.
    assert reconcile(factory, [run]).counts["failed"] == 1
    with ledger() as s:
        api.create_account(s, "nobody")
    retried = reconcile_stored(factory, now=LATER)
    assert (retried.counts["unreserved"], retried.counts["failed"]) == (1, 0)
    assert stored(ledger, 3300).flags == "unreserved"
    assert reconcile_stored(factory, now=LATER).counts["seen"] == 0


def test_refused_requeued_attempt_is_not_charged(ledger, factory) -> None:
    # 1012: the prolog refused run 0 (REQUEUED, Start == End); run 1 held and settled.
    refused, second = (one_run("handwritten_failures.txt", 1012, n) for n in (0, 1))
    assert (refused.state, refused.elapsed_seconds, refused.start == refused.end) == ("REQUEUED", 0, True)
    hold_for(ledger, second, "a100:1", settle_seconds=1800)
    before = counts(ledger)
    summary = reconcile(factory, [refused, second])
    assert (summary.counts["not_charged"], summary.counts["matched"]) == (1, 1)
    assert counts(ledger)[:4] == before[:4]
    assert stored(ledger, 1012, 0).flags == "refused"
    # ElapsedRaw 1 is still a refusal; 2 s of GPU time without a hold is a charge.
    one_second = synthetic(3400, state="REQUEUED", elapsed_seconds=1)
    two_seconds = synthetic(3401, state="REQUEUED", elapsed_seconds=2)
    summary = reconcile(factory, [one_second, two_seconds])
    assert (summary.counts["not_charged"], summary.counts["unreserved"]) == (1, 1)


def test_cancelled_while_pending_charges_nothing_and_releases_a_hold(ledger, factory) -> None:
    pending_cancel = one_run("recorded_finished.txt", 13)
    assert pending_cancel.start is None
    before = counts(ledger)
    assert reconcile(factory, [pending_cancel]).counts["not_charged"] == 1
    assert counts(ledger)[:4] == before[:4]
    assert stored(ledger, 13).flags == "never_ran"
    # A hold somebody took for a job that never started is given back.
    never = synthetic(3500, start=None, elapsed_seconds=0, gpus={})
    hold = hold_for(ledger, replace(never, start=T), "a100:1")
    assert reconcile(factory, [never]).counts["released"] == 1
    with ledger() as s:
        assert api.get_hold(s, hold.id).state == "released"
        assert api.balance(s, "physics")["held"] == "0.00"


def test_runs_without_gpu_time_charge_nothing(ledger, factory) -> None:
    failed_at_once = one_run("recorded_finished.txt", 9)  # FAILED, ElapsedRaw 0
    cpu_only = synthetic(3600, gpus={})
    summary = reconcile(factory, [failed_at_once, cpu_only])
    assert summary.counts["not_charged"] == 2
    assert stored(ledger, 3600).flags == "no_gpu_time"


# --------------------------------------------------------------------------- NODE_FAIL


@pytest.mark.parametrize("refund", [True, False])
def test_node_fail_is_refunded_by_policy(ledger, factory, refund: bool) -> None:
    # 1010: run 0 NODE_FAIL after 626 s, requeued; run 1 COMPLETED. 1011: NODE_FAIL, no requeue.
    failed, rerun = (one_run("handwritten_failures.txt", 1010, n) for n in (0, 1))
    no_requeue = one_run("handwritten_failures.txt", 1011)
    h_failed = hold_for(ledger, failed, "a100:1", settle_seconds=626)
    hold_for(ledger, rerun, "a100:1", settle_seconds=1800)
    h_active = hold_for(ledger, no_requeue, "h100:1")  # its epilog was lost as well
    summary = reconcile(factory, [failed, rerun, no_requeue], Policy(refund_node_fail=refund))
    with ledger() as s:
        charged = {h: api.get_hold(s, h).charged_ucredits for h in (h_failed.id, h_active.id)}
    if refund:
        assert (summary.counts["refunded"], summary.counts["matched"]) == (2, 1)
        assert charged == {h_failed.id: 0, h_active.id: 0}
        assert summary.totals_ucredits["refunded"] == -347_778  # 2.00/h × 626 s back
        assert stored(ledger, 1010, 0).flags == "node_fail_refund"
        refund_entry = hold_entries(ledger, h_failed.id)[-1]
        assert refund_entry.kind == "adjust" and revenue_of(ledger, refund_entry.id) == -347_778
    else:
        assert (summary.counts["charged"], summary.counts["matched"]) == (1, 2)
        assert charged == {h_failed.id: 347_778, h_active.id: 625_000}
        assert stored(ledger, 1010, 0).flags == ""
    before = counts(ledger)
    assert (
        reconcile(factory, [failed, rerun, no_requeue], Policy(refund_node_fail=refund)).counts["unchanged"]
        == 3
    )
    assert counts(ledger) == before
    verify_ok(ledger)


def test_unreserved_node_fail_with_refunds_on_is_not_charged(ledger, factory) -> None:
    summary = reconcile(factory, [synthetic(3700, state="NODE_FAIL")])
    assert summary.counts["not_charged"] == 1
    assert stored(ledger, 3700).flags == "unreserved,node_fail_refund"


# --------------------------------------------------------------------------- not final


def test_rows_that_are_not_final_are_skipped(ledger, factory) -> None:
    running = fixture_runs("recorded_running.txt")
    pending_again = [r for r in fixture_runs("recorded_requeue_pending.txt") if r.state == "PENDING"]
    # The half-written record sacct shows for ~2.5 s after a short job ends.
    half_written = synthetic(3800, partition="", requested_gpus={}, name="allocation")
    runs = [*running, *pending_again, half_written]
    assert all(not_final_reason(r) for r in runs)
    summary = reconcile(factory, runs)
    assert summary.counts["skipped"] == len(runs) == 5
    assert counts(ledger)[4] == 0
    with ledger() as s:
        assert reconcile_run(s, half_written).counter == "skipped"


def test_jobs_with_a_malformed_row_wait_for_a_clean_read(ledger, factory) -> None:
    run = synthetic(3900)
    summary = reconcile(factory, [run, synthetic(3901)], suspect_job_ids={3900})
    assert (summary.counts["suspect"], summary.counts["unreserved"]) == (1, 1)


def test_recorded_and_handwritten_fixtures_reconcile_idempotently(ledger, factory) -> None:
    runs = fixture_runs("recorded_finished.txt") + fixture_runs("handwritten_failures.txt")
    with ledger() as s:
        api.set_price(s, "gpu", "1.00", effective_at=EPOCH)  # 1019: a type sacct does not name
    for run in runs:
        if run.job_id in (4, 6, 1001, 1014) and run.start is not None:
            hold_for(ledger, run, ",".join(f"{t}:{n}" for t, n in run.gpus.items()), settle_seconds=1)
    first = reconcile(factory, runs)
    assert first.counts["failed"] == 0
    assert first.counts["seen"] == len(runs)
    after_first = counts(ledger)
    second = reconcile(factory, runs)
    reconciled = len(runs) - first.counts["skipped"]
    assert second.counts["unchanged"] == reconciled
    forced = reconcile(factory, runs, force=True)
    assert forced.counts["matched"] + forced.counts["not_charged"] == reconciled
    assert stored(ledger, 16, 0).flags == "unreserved"  # the REQUEUED attempt no hook saw
    assert counts(ledger) == after_first
    verify_ok(ledger)


def test_many_runs_go_through_the_bulk_path(ledger, factory) -> None:
    # More rows than _COPY_MIN_ROWS: PostgreSQL writes them with COPY, SQLite in one executemany.
    runs = [synthetic(10_000 + i, gpus={}, elapsed_seconds=60 + i) for i in range(240)]
    holds = [synthetic(20_000 + i, elapsed_seconds=600) for i in range(6)]
    for run in holds[:3]:
        hold_for(ledger, run, "a100:1", settle_seconds=600)
    for run in holds[3:]:
        hold_for(ledger, run, "a100:1", settle_seconds=599)
    summary = reconcile(factory, runs + holds)
    assert (summary.counts["not_charged"], summary.counts["matched"], summary.counts["adjusted"]) == (
        240,
        3,
        3,
    )
    assert counts(ledger)[4] == 246
    changed = [replace(r, elapsed_seconds=r.elapsed_seconds + 1) for r in runs[:10]]
    again = reconcile(factory, changed + runs[10:] + holds, batch_runs=50)
    assert (again.counts["unchanged"], again.counts["not_charged"]) == (236, 10)
    assert stored(ledger, 10_000).elapsed_seconds == 61
    verify_ok(ledger)


def test_runs_another_writer_stored_meanwhile_are_upserted(ledger, factory, monkeypatch) -> None:
    # 210 rows: PostgreSQL inserts them with COPY, which the stored rows make fail.
    runs = [synthetic(30_000 + i, gpus={}) for i in range(210)]
    reconcile(factory, runs)
    monkeypatch.setattr("ledger.jobs.jobruns.load_job_runs", lambda s, jobs: {})
    changed = [replace(run, elapsed_seconds=5) for run in runs]
    assert reconcile(factory, changed).counts["not_charged"] == 210
    assert counts(ledger)[4] == 210
    assert stored(ledger, 30_000).elapsed_seconds == 5


# --------------------------------------------------------------------------- the ledger side


def test_record_unreserved_run_is_idempotent_and_refuses_a_different_repeat(ledger) -> None:
    args: dict[str, Any] = {
        "user": "alice",
        "cluster": "lab",
        "job_id": 4000,
        "run": 0,
        "gpus": {"h100": 1},
        "started_at": T,
        "elapsed_seconds": 3600,
        "partition": "onprem",
    }
    with ledger() as s:
        first = api.record_unreserved_run(s, "physics", **args)
    assert (first.state, first.charged_ucredits, first.gpus) == ("settled", 3_600_000, "h100:1")
    before = counts(ledger)
    with ledger() as s:
        assert api.record_unreserved_run(s, "physics", **args).id == first.id
    assert counts(ledger) == before
    with ledger() as s, pytest.raises(Conflict) as conflict:
        api.record_unreserved_run(s, "physics", **{**args, "elapsed_seconds": 10})
    assert conflict.value.code == "idempotency_conflict"
    with ledger() as s, pytest.raises(InvalidInput) as unknown:
        api.record_unreserved_run(s, "physics", **{**args, "job_id": 4001, "gpus": {"v100": 1}})
    assert unknown.value.code == "unknown_gres"
    with ledger() as s, pytest.raises(InvalidInput):
        api.record_unreserved_run(
            s, "physics", **{**args, "job_id": 4002, "started_at": T.replace(tzinfo=None)}
        )
    with ledger() as s:  # a correction works as for any run
        adjusted = api.adjust_hold(s, first.id, 1_800_000, reason="test")
    assert adjusted.charged_ucredits == 1_800_000
    verify_ok(ledger)


# --------------------------------------------------------------------------- ingestion


def rows_of_jobs(output: str, job_ids: set[int]) -> str:
    """What `sacct --jobs` prints: only the rows of those jobs."""
    wanted = {str(job_id) for job_id in job_ids}
    return "".join(line + "\n" for line in output.splitlines() if line.split("|", 1)[0] in wanted)


def sacct_source(text_by_window: dict[tuple[datetime, datetime], str]) -> tuple[CommandsSource, FakeRunner]:
    """A CommandsSource whose sacct answers each window, and then by id, with the given text."""
    runner = FakeRunner()
    source = CommandsSource(runner, cluster="lab", tz=UTC)
    for (since, until), output in text_by_window.items():
        runner.add(source.window_argv(since, until), output)
        parsed = parse_parsable2(output, tz=UTC)
        ids = {r.job_id for r in parsed.runs} | {e.job_id for e in parsed.errors if e.job_id is not None}
        if ids:
            runner.add(source.jobs_argv(ids, since, until), rows_of_jobs(output, ids))
    return source, runner


def test_cursor_persists_and_windows_overlap(ledger, factory) -> None:
    now1, now2 = T + timedelta(hours=1), T + timedelta(hours=2)
    output = fixture("handwritten_failures.txt")
    window1 = (now1 - timedelta(days=1), now1)  # first start: one day back
    window2 = (now1 - timedelta(minutes=10), now2)  # then: the cursor minus the overlap
    source, runner = sacct_source({window1: output, window2: output})

    first = ingest_round(factory, source, now=now1)
    assert (first.since, first.until, first.cursor_before, first.cursor_after) == (*window1, None, now1)
    assert first.summary.counts["unreserved"] > 0
    with ledger() as s:
        assert read_cursor(s, CURSOR_NAME) == now1
    before = counts(ledger)

    second = ingest_round(factory, source, now=now2)
    assert (second.since, second.cursor_after) == (window2[0], now2)
    # 1019's untyped GPU has no price: it failed, so it is tried again; everything else is unchanged.
    assert (first.summary.counts["failed"], second.summary.counts["failed"]) == (1, 1)
    assert second.summary.counts["unchanged"] == first.summary.counts["seen"] - 1
    assert counts(ledger)[:4] == before[:4]
    assert runner.calls[2] == tuple(source.window_argv(*window2))

    # The cursor never moves back; --since reads from where it is told.
    with ledger() as s:
        write_cursor(s, now1, at=now2)
        assert read_cursor(s) == now2
    backfill = (T - timedelta(days=3), now2)
    runner.add(source.window_argv(*backfill), "")
    assert ingest_round(factory, source, now=now2, since=backfill[0]).cursor_after == now2


def test_malformed_lines_are_reported_with_line_numbers(ledger, factory) -> None:
    output = fixture("handwritten_malformed.txt")
    parsed = parse_parsable2(output, tz=UTC)
    assert [e.line_no for e in parsed.errors] == [2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    expected = sorted((e.line, e.reason) for e in parsed.errors)
    window = (T, T + timedelta(hours=1))
    source, _ = sacct_source({window: output})
    # A row whose job id can be read is reported from the by-id query, the others from the window.
    by_id = rows_of_jobs(output, {r.job_id for r in parsed.runs} | parsed.suspect_job_ids)

    def check_line_numbers(malformed: list[Any]) -> None:
        assert sorted((e.line, e.reason) for e in malformed) == expected
        for error in malformed:
            printed = output if error.job_id is None else by_id
            assert printed.split("\n")[error.line_no - 1] == error.line

    strict = ingest_round(factory, source, now=window[1], since=window[0], strict=True)
    assert strict.aborted and strict.cursor_after is None
    check_line_numbers(strict.malformed)
    assert counts(ledger)[4] == 0
    with ledger() as s:
        assert read_cursor(s) is None

    lenient = ingest_round(factory, source, now=window[1], since=window[0])
    check_line_numbers(lenient.malformed)
    assert lenient.as_dict()["counts"]["malformed"] == len(expected)
    # The two good rows (2001, 2013) are charged; jobs with a bad row wait.
    assert lenient.summary.counts["unreserved"] == 2
    assert lenient.cursor_after == window[1]


# --------------------------------------------------------------------------- the CLI


@pytest.fixture
def cli(db_url: str, ledger) -> Iterator[Callable[..., Any]]:
    runner = CliRunner()
    root = cast(click.Command, _build())

    def run(*args: str, obj: dict[str, Any] | None = None, code: int = 0) -> Any:
        result = runner.invoke(root, list(args), env={"GPUCREDIT_DATABASE_URL": db_url}, obj=obj)
        assert result.exit_code == code, (args, result.output, result.stderr, result.exception)
        return result

    yield run
    engine = cli_support._engines.pop(db_url, None)
    if engine is not None:
        engine.dispose()


def test_cli_bridge_sacct_ingests_reports_and_is_idempotent(cli, ledger) -> None:
    now = T + timedelta(hours=2)
    since = T - timedelta(hours=1)
    output = fixture("handwritten_failures.txt") + fixture("handwritten_malformed.txt")
    source, runner = sacct_source({(since, now): output})
    obj = {"job_source": source, "clock": lambda: now, "sleep": lambda seconds: None}
    hold_for(ledger, one_run("handwritten_failures.txt", 1001), "h100:2", settle_seconds=1800)
    with ledger() as s:
        api.set_price(s, "gpu", "1.00", effective_at=EPOCH)  # job 1019's untyped GPU

    result = cli("bridge", "sacct", "--since", since.isoformat(), "--format", "json", obj=obj)
    data = json.loads(result.stdout)
    assert data["counts"]["adjusted"] == 1 and data["totals"]["adjusted"] == "0.004"
    assert data["counts"]["malformed"] == 11
    first_bad = min(data["malformed"], key=lambda line: line["line_no"])
    assert data["cursor_after"] == "2026-12-02T12:00:00Z"

    table = cli("bridge", "sacct", "--since", since.isoformat(), obj=obj).stdout
    assert "malformed lines" in table and "unchanged since last read" in table
    where = f"malformed line {first_bad['line_no']} ({first_bad['output']})"
    assert f"{where}: {first_bad['reason']}: {first_bad['line']}" in table
    assert len(runner.calls) == 4

    strict = cli("bridge", "sacct", "--since", since.isoformat(), "--strict", obj=obj, code=1)
    assert "--strict" in strict.stderr

    csv_out = cli("bridge", "sacct", "--since", since.isoformat(), "--format", "csv", obj=obj).stdout
    assert csv_out.splitlines()[0] == "what,runs,credits"


def test_cli_bridge_sacct_follow_uses_the_cursor_after_the_first_round(cli) -> None:
    times = iter([T, T + timedelta(minutes=1)])
    runner = FakeRunner()
    source = CommandsSource(runner, cluster="lab", tz=UTC)
    runner.add(source.window_argv(T - timedelta(hours=1), T), "")
    runner.add(source.window_argv(T - timedelta(minutes=10), T + timedelta(minutes=1)), "")
    slept: list[float] = []
    obj = {"job_source": source, "clock": lambda: next(times), "sleep": slept.append}
    since = (T - timedelta(hours=1)).isoformat()
    cli("bridge", "sacct", "--since", since, "--follow", "--interval", "5", "--rounds", "2", obj=obj)
    assert slept == [5.0] and len(runner.calls) == 2


def test_cli_bridge_sacct_failing_sacct_exits_1_and_keeps_the_cursor(cli, ledger) -> None:
    runner = FakeRunner()
    source = CommandsSource(runner, cluster="lab", tz=UTC)
    runner.add(source.window_argv(T - timedelta(days=1), T), FakeResponse(returncode=1, stderr="boom"))
    result = cli("bridge", "sacct", obj={"job_source": source, "clock": lambda: T}, code=1)
    assert "boom" in result.stderr
    with ledger() as s:
        assert read_cursor(s) is None


def test_cli_bridge_reconcile_retries_failed_runs(cli, ledger) -> None:
    # Job 1019: sacct names one GPU only as untyped "gpu"; nothing prices that yet.
    run = one_run("handwritten_failures.txt", 1019)
    window = (T, T + timedelta(hours=3))
    source, _ = sacct_source({window: _line_of("handwritten_failures.txt", 1019)})
    obj = {"job_source": source, "clock": lambda: window[1]}
    failed = cli("bridge", "sacct", "--since", window[0].isoformat(), obj=obj, code=1)
    assert "unknown_gres" in failed.stderr
    assert stored(ledger, run.job_id).flags == "error"
    cli("price", "set", "gpu", "1.00", "--effective", "2026-01-01")
    fixed = json.loads(cli("bridge", "reconcile", "--format", "json").stdout)
    assert fixed["counts"]["unreserved"] == 1 and fixed["totals"]["unreserved"] == "0.50"
    assert stored(ledger, run.job_id).flags == "unreserved"
    everything = json.loads(cli("bridge", "reconcile", "--all", "--format", "json").stdout)
    assert everything["counts"]["matched"] == 1


def test_cli_reads_the_node_fail_policy_from_the_config(cli, ledger, tmp_path, monkeypatch) -> None:
    run = one_run("handwritten_failures.txt", 1011)  # NODE_FAIL after 625 s, no requeue
    hold = hold_for(ledger, run, "h100:1", settle_seconds=625)
    window = (T, T + timedelta(hours=3))
    source, _ = sacct_source({window: _line_of("handwritten_failures.txt", 1011)})
    obj = {"job_source": source, "clock": lambda: window[1]}
    config = tmp_path / "gpucredit.toml"
    config.write_text("[policy]\nrefund_node_fail = false\n")
    monkeypatch.setenv("GPUCREDIT_CONFIG", str(config))
    kept = json.loads(
        cli("bridge", "sacct", "--since", window[0].isoformat(), "--format", "json", obj=obj).stdout
    )
    assert kept["counts"]["matched"] == 1
    config.write_text('[policy]\nrefund_node_fail = "yes"\n')
    assert "invalid_config" in cli("bridge", "reconcile", code=2).stderr
    with ledger() as s:
        assert api.get_hold(s, hold.id).charged_ucredits == 625_000


def test_cli_bridge_lists_its_commands(cli) -> None:
    output = cli("bridge", "--help").stdout
    assert "sacct" in output and "reconcile" in output


def _line_of(name: str, job_id: int) -> str:
    return "".join(line + "\n" for line in fixture(name).splitlines() if line.startswith(f"{job_id}|"))
