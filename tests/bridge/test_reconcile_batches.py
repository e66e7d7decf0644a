"""The bridge's batches are invisible to users: exact charges per run, one account's
refusal never loses another run, and a re-read window costs nothing unless a record
changed -- then exactly that run is corrected. On both stores.

Money-moving runs are applied in one transaction for many accounts (adjust_holds_many,
record_unreserved_runs), redone an account at a time when the ledger refuses one;
unchanged runs are told apart by one compact read per batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import click
import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from accounting_bridge.sacct.ingest import ingest_round
from accounting_bridge.sacct.reconcile import Summary, reconcile_runs, reconcile_stored
from accounting_bridge.slurm.records import ParseResult, SacctRun, SqueueResult
from gpucredit.cli import _build
from ledger import api
from ledger.store.db import make_sessionmaker
from ledger.store.models import JobRun

job_runs_t = JobRun.__table__
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
T = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
LATER = datetime(2027, 1, 1, tzinfo=UTC)
HOUR_A100 = 2_000_000  # 2.00 credits per a100-hour


def run_of(job_id: int, account: str = "physics", user: str = "alice", **fields: Any) -> SacctRun:
    elapsed = fields.pop("elapsed_seconds", 3600)
    start = T + timedelta(minutes=job_id)
    values: dict[str, Any] = {
        "cluster": "lab",
        "job_id": job_id,
        "display_id": str(job_id),
        "run": 0,
        "user": user,
        "account": account,
        "partition": "onprem",
        "state": "COMPLETED",
        "submit": start - timedelta(seconds=30),
        "start": start,
        "end": start + timedelta(seconds=elapsed),
        "elapsed_seconds": elapsed,
        "time_limit_seconds": 7200,
        "gpus": {"a100": 1},
        "requested_gpus": {"a100": 1},
        "nodes": ("node1",),
        "node_count": 1,
        "name": "job",
    }
    values.update(fields)
    return SacctRun(**values)


@pytest.fixture
def factory(engine: Engine, tx: Callable[[], Any]) -> sessionmaker[Session]:
    """Two accounts with 100 credits each; a100 at 2.00 credits an hour."""
    with tx() as s:
        api.set_price(s, "a100", "2.00", effective_at=EPOCH)
        for account, user in (("physics", "alice"), ("chemistry", "bob")):
            api.create_account(s, account)
            api.add_member(s, user, account)
            api.topup(s, account, "100", effective_at=EPOCH)
    return make_sessionmaker(engine)


def settled(factory: sessionmaker[Session], run: SacctRun, seconds: int) -> int:
    """The hooks' part: a hold for the attempt, settled for `seconds`; its id."""
    assert run.start is not None
    with factory() as s, s.begin():
        hold = api.create_hold(
            s,
            api.HoldRequest(
                run.account,
                user=run.user,
                job_id=run.job_id,
                gpus=dict(run.gpus),
                seconds=7200,
                cluster=run.cluster,
                run=run.run,
                partition=run.partition,
                at=run.start,
                submitted_at=run.submit,
            ),
        )
        api.settle_hold(s, hold.id, seconds, run.start + timedelta(seconds=seconds))
        return hold.id


def reconcile(factory: sessionmaker[Session], runs: list[SacctRun], **options: Any) -> Summary:
    return reconcile_runs(factory, runs, now=LATER, **options)


def charged(factory: sessionmaker[Session], job_id: int) -> tuple[int, str]:
    with factory() as s:
        row = s.execute(
            select(job_runs_t.c.charged_ucredits, job_runs_t.c.flags).where(job_runs_t.c.job_id == job_id)
        ).one()
        return row.charged_ucredits, row.flags


def entries(factory: sessionmaker[Session]) -> int:
    with factory() as s:
        return int(s.execute(text("SELECT COUNT(*) FROM entries")).scalar_one())


def available(factory: sessionmaker[Session], account: str) -> str:
    with factory() as s:
        return str(api.balance(s, account)["available"])


def test_one_accounts_refusal_loses_no_other_run(factory: sessionmaker[Session]) -> None:
    short_physics, unpriced, short_chemistry = (
        run_of(1),
        run_of(2, gpus={"mi300": 1}),
        run_of(3, "chemistry", "bob"),
    )
    settled(factory, short_physics, 3000)
    settled(factory, short_chemistry, 1800)
    summary = reconcile(factory, [short_physics, unpriced, short_chemistry])
    counts = {name: n for name, n in summary.counts.items() if n}
    assert counts == {"seen": 3, "adjusted": 2, "failed": 1}
    # physics's other run and chemistry's run are corrected to Slurm's hour exactly
    assert charged(factory, 1) == (HOUR_A100, "")
    assert charged(factory, 3) == (HOUR_A100, "")
    assert (available(factory, "physics"), available(factory, "chemistry")) == ("98.00", "98.00")
    # the refused run is recorded, with the ledger's reason, for the next round to retry
    assert charged(factory, 2) == (0, "error")
    (failure,) = summary.failures
    assert (failure.job_id, failure.detail.split(":")[0]) == (2, "unknown_gres")


def test_an_accounts_runs_move_money_together_and_exactly(factory: sessionmaker[Session]) -> None:
    runs = [run_of(job_id, elapsed_seconds=600 * job_id) for job_id in (1, 2, 3)]
    for run in runs:
        settled(factory, run, 60)  # every epilog settled one minute
    unreserved = run_of(4, elapsed_seconds=1800)  # no hook saw it
    node_fail = run_of(5, state="NODE_FAIL")
    settled(factory, node_fail, 3600)
    summary = reconcile(factory, [*runs, unreserved, node_fail])
    assert {name: n for name, n in summary.counts.items() if n} == {
        "seen": 5,
        "adjusted": 3,
        "unreserved": 1,
        "refunded": 1,
    }
    assert [charged(factory, job_id)[0] for job_id in (1, 2, 3, 4, 5)] == [
        api.charge_for(HOUR_A100, 600),
        api.charge_for(HOUR_A100, 1200),
        api.charge_for(HOUR_A100, 1800),
        HOUR_A100 // 2,
        0,
    ]
    assert charged(factory, 4)[1] == "unreserved" and charged(factory, 5)[1] == "node_fail_refund"
    assert available(factory, "physics") == "97.00"  # 100 - (1/6 + 1/3 + 1/2 + 1/2) x 2
    # Forcing a re-plan of every stored run finds every charge right: nothing is posted.
    before = entries(factory)
    again = reconcile_stored(factory, include_all=True, now=LATER)
    assert again.counts["matched"] + again.counts["not_charged"] == 5 and entries(factory) == before


def test_a_reread_window_with_one_edited_record_corrects_exactly_that_run(
    factory: sessionmaker[Session],
) -> None:
    runs = [
        run_of(job_id, "physics" if job_id % 2 else "chemistry", "alice" if job_id % 2 else "bob")
        for job_id in range(1, 9)
    ]
    for run in runs:
        settled(factory, run, 3600)
    assert reconcile(factory, runs).counts["matched"] == 8
    before = entries(factory)
    assert reconcile(factory, runs).counts["unchanged"] == 8
    assert entries(factory) == before
    # Slurm's record of job 5 changes (its accounting was late): one adjustment, on it alone
    edited = [replace(run, elapsed_seconds=4200) if run.job_id == 5 else run for run in runs]
    summary = reconcile(factory, edited)
    assert (summary.counts["unchanged"], summary.counts["adjusted"]) == (7, 1)
    assert [o.job_id for o in summary.notable] == [5]
    assert summary.notable[0].change_ucredits == api.charge_for(HOUR_A100, 600)
    assert entries(factory) == before + 1
    assert charged(factory, 5)[0] == api.charge_for(HOUR_A100, 4200)
    assert reconcile(factory, edited).counts["unchanged"] == 8


def test_a_reread_record_with_other_gpus_or_another_state_is_not_unchanged(
    factory: sessionmaker[Session],
) -> None:
    runs = [run_of(job_id) for job_id in range(1, 5)]
    for run in runs:
        settled(factory, run, 3600)
    assert reconcile(factory, runs).counts["matched"] == 4
    before = entries(factory)
    # Job 2 got a second a100 (same elapsed, same state), job 3 another state: both re-planned
    edited = [
        replace(run, gpus={"a100": 2})
        if run.job_id == 2
        else replace(run, state="FAILED")
        if run.job_id == 3
        else run
        for run in runs
    ]
    summary = reconcile(factory, edited)
    assert summary.counts["unchanged"] == 2
    assert [o.job_id for o in summary.notable] == [2]
    assert summary.notable[0].change_ucredits == api.charge_for(HOUR_A100, 3600)
    assert entries(factory) == before + 1
    assert charged(factory, 2)[0] == api.charge_for(2 * HOUR_A100, 3600)
    assert reconcile(factory, edited).counts["unchanged"] == 4


def test_a_new_incarnation_of_a_reused_id_is_not_taken_for_the_old_runs_record(
    factory: sessionmaker[Session],
) -> None:
    old = run_of(7)
    settled(factory, old, 3600)
    assert reconcile(factory, [old]).counts["matched"] == 1
    # Same id, run index, state and elapsed; another submit time: another job
    new = replace(
        old,
        submit=old.submit + timedelta(days=3),
        start=old.start + timedelta(days=3),
        end=old.end + timedelta(days=3),
    )  # type: ignore[operator]
    summary = reconcile(factory, [old, new])
    assert (summary.counts["unchanged"], summary.counts["unreserved"]) == (1, 1)


def test_batches_smaller_than_the_window_give_the_same_answers(factory: sessionmaker[Session]) -> None:
    runs = [run_of(job_id, elapsed_seconds=3600 + job_id) for job_id in range(1, 12)]
    for run in runs[::2]:
        settled(factory, run, 3600)
    summary = reconcile(factory, runs, batch_runs=3)
    assert {name: n for name, n in summary.counts.items() if n} == {
        "seen": 11,
        "adjusted": 6,
        "unreserved": 5,
    }
    assert reconcile(factory, runs, batch_runs=4).counts["unchanged"] == 11
    assert [charged(factory, run.job_id)[0] for run in runs] == [
        api.charge_for(HOUR_A100, run.elapsed_seconds) for run in runs
    ]


class _Window:
    """A job source that returns the same finished runs for any window."""

    def __init__(self, runs: list[SacctRun]) -> None:
        self.runs = runs

    def finished_runs(self, since: datetime, until: datetime) -> ParseResult:
        return ParseResult(runs=list(self.runs))

    def running_jobs(self) -> SqueueResult:
        return SqueueResult()


def test_a_round_in_small_batches_charges_what_one_batch_does(factory: sessionmaker[Session]) -> None:
    runs = [
        run_of(job_id, "physics" if job_id % 3 else "chemistry", "alice" if job_id % 3 else "bob")
        for job_id in range(1, 10)
    ]
    for run in runs[:6]:
        settled(factory, run, 1800)
    first = ingest_round(factory, _Window(runs), now=LATER, batch_runs=2)
    assert {name: n for name, n in first.summary.counts.items() if n} == {
        "seen": 9,
        "adjusted": 6,
        "unreserved": 3,
    }
    assert (available(factory, "physics"), available(factory, "chemistry")) == ("88.00", "94.00")
    again = ingest_round(factory, _Window(runs), now=LATER, batch_runs=2)
    assert again.summary.counts["unchanged"] == 9


def test_the_cli_refuses_a_batch_size_outside_its_bounds() -> None:
    result = CliRunner().invoke(cast(click.Command, _build()), ["bridge", "sacct", "--batch-runs", "0"])
    assert result.exit_code == 2
    assert "Invalid value for '--batch-runs': 0 is not in the range 1<=x<=100000." in result.output


def test_a_refusal_inside_the_money_transaction_loses_no_other_account(
    factory: sessionmaker[Session],
) -> None:
    """The money-moving runs of many accounts share one transaction; when the ledger
    refuses one (here an unreserved run of an account the ledger does not know), the
    others are redone an account at a time and only that run fails."""
    short_physics = run_of(1)
    settled(factory, short_physics, 3000)
    unreserved_chemistry = run_of(2, "chemistry", "bob", elapsed_seconds=1800)
    stranger = run_of(3, "nobody", "carol")
    summary = reconcile(factory, [short_physics, unreserved_chemistry, stranger])
    assert {name: n for name, n in summary.counts.items() if n} == {
        "seen": 3,
        "adjusted": 1,
        "unreserved": 1,
        "failed": 1,
    }
    assert charged(factory, 1) == (HOUR_A100, "")
    assert charged(factory, 2) == (HOUR_A100 // 2, "unreserved")
    assert charged(factory, 3) == (0, "error")
    assert (available(factory, "physics"), available(factory, "chemistry")) == ("98.00", "99.00")
    (failure,) = summary.failures
    assert (failure.job_id, failure.detail) == (3, "not_found: account 'nobody' does not exist")
    with factory() as s:
        assert api.verify(s).ok
