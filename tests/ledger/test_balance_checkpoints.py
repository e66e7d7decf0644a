"""A balance at any time read from checkpoints equals the whole-journal scan, exactly,
on both stores: with and without checkpoints, between and around them, and after
entries recorded late (effective before a checkpoint taken earlier)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert, select, text
from sqlalchemy.exc import DBAPIError

from ledger import api
from ledger.books.checkpoints import checkpoint_balances, scan_sums, sums_at
from ledger.errors import LedgerError
from ledger.store.tables import accounts_t, checkpoints_t

START = datetime(2026, 12, 1, 9, tzinfo=UTC)
HOUR = timedelta(hours=1)


def _row(s: Any, name: str) -> Any:
    return s.execute(select(accounts_t).where(accounts_t.c.name == name)).one()


def _agrees(s: Any, name: str, times: list[datetime]) -> None:
    row = _row(s, name)
    for t in times:
        expected = {k: v for k, v in scan_sums(s, row.id, t).items() if v}
        got = {k: v for k, v in sums_at(s, row.id, row.entry_count, row.created_at, t).items() if v}
        assert got == expected, f"at {t}"


def _setup(s: Any, name: str) -> None:
    api.create_account(s, name, at=START - 24 * HOUR)
    api.set_price(s, "h100", "3.60", effective_at=START - 24 * HOUR)


def test_a_late_entry_before_a_checkpoint_counts_at_every_later_time(tx: Any) -> None:
    with tx() as s:
        _setup(s, "physics")
        api.topup(s, "physics", "100", effective_at=START, at=START)
        api.consume(s, "physics", "5", at=START + 3 * HOUR)
    with tx() as s:
        assert checkpoint_balances(s, "physics", START + 2 * HOUR)["written"] is True
        assert checkpoint_balances(s, "physics", START + 4 * HOUR)["written"] is True
    with tx() as s:  # usage learned late: effective an hour before the first checkpoint
        api.consume(s, "physics", "10", at=START + HOUR)
    with tx() as s:
        shown = [api.balance(s, "physics", START + h * HOUR)["available"] for h in (0, 1, 2, 3, 4, 5)]
        assert shown == ["100.00", "90.00", "90.00", "85.00", "85.00", "85.00"]
        # The next run appends a new version of both checkpoints the entry precedes.
        result = checkpoint_balances(s, "physics", START + 6 * HOUR)
        assert (result["written"], result["reissued"]) == (True, 2)
        # Nothing new since: taking an existing checkpoint again writes nothing.
        assert checkpoint_balances(s, "physics", START + 4 * HOUR)["written"] is False
    with tx() as s:
        shown = [api.balance(s, "physics", START + h * HOUR)["available"] for h in (1, 2, 4, 6)]
        assert shown == ["90.00", "90.00", "85.00", "85.00"]
        assert api.verify(s).ok
    with tx() as s:  # late again, between the checkpoints: only the later two change
        api.consume(s, "physics", "1", at=START + 3 * HOUR)
        api.consume(s, "physics", "2", at=START + 5 * HOUR)
    with tx() as s:
        assert checkpoint_balances(s, "physics", START + 7 * HOUR)["reissued"] == 2
    with tx() as s:
        shown = [api.balance(s, "physics", START + h * HOUR)["available"] for h in (2, 3, 4, 5, 6, 7)]
        assert shown == ["90.00", "84.00", "84.00", "82.00", "82.00", "82.00"]
        assert api.verify(s).ok


def test_held_credit_and_debt_at_past_times_from_checkpoints(tx: Any) -> None:
    with tx() as s:
        _setup(s, "physics")
        api.topup(s, "physics", "10", effective_at=START, at=START)
        hold = api.create_hold(
            s, api.HoldRequest("physics", user="alice", job_id=1, gpus="h100:1", seconds=3600, at=START)
        ).as_dict()
    with tx() as s:
        checkpoint_balances(s, "physics", START + HOUR / 2)
        api.settle_hold(s, hold["id"], 7200, at=START + 2 * HOUR)  # 7.20 on a 3.60 hold
        api.consume(s, "physics", "2.80", at=START + 2 * HOUR)
        checkpoint_balances(s, "physics", START + 3 * HOUR)
    with tx() as s:
        during = api.balance(s, "physics", START + HOUR)
        after = api.balance(s, "physics", START + 4 * HOUR)
    assert (during["available"], during["held"], during["debt"]) == ("6.40", "3.60", "0.00")
    assert (after["available"], after["held"], after["debt"]) == ("0.00", "0.00", "0.00")
    with tx() as s:
        _agrees(s, "physics", [START + k * HOUR / 4 for k in range(-4, 24)])


def test_a_checkpoint_is_not_taken_again_within_its_period(tx: Any) -> None:
    with tx() as s:
        _setup(s, "physics")
        api.topup(s, "physics", "10", effective_at=START, at=START)
        assert checkpoint_balances(s, "physics", START, every=HOUR)["written"] is True
        assert checkpoint_balances(s, "physics", START + HOUR / 2, every=HOUR)["written"] is False
        assert checkpoint_balances(s, "physics", START + HOUR, every=HOUR)["written"] is True
        versions = s.execute(select(checkpoints_t.c.as_of).where(checkpoints_t.c.grant_id.is_(None))).all()
        assert len(versions) == 2


def test_verify_reports_a_checkpoint_that_disagrees_with_the_journal(tx: Any) -> None:
    with tx() as s:
        _setup(s, "physics")
        api.topup(s, "physics", "10", effective_at=START, at=START)
        checkpoint_balances(s, "physics", START + HOUR)
        assert api.verify(s).ok
        header = s.execute(select(checkpoints_t)).mappings().first()
        grant_id = api.balance(s, "physics", START + HOUR)["grants"][0]["id"]
        s.execute(
            insert(checkpoints_t).values(
                {**{k: v for k, v in header.items() if k != "id"}, "grant_id": grant_id, "bucket": "held"}
                | {"amount_ucredits": 1_000_000}
            )
        )
        report = api.verify(s)
    assert report.problems == [
        f"account physics checkpoint as of 2026-12-01T10:00:00Z (through seq 1): "
        f"grant {grant_id} held: 1.00 != journal 0.00"
    ]


OPS = st.lists(
    st.tuples(
        st.sampled_from(["topup", "expiring", "consume", "job", "sweep", "checkpoint"]),
        st.integers(min_value=0, max_value=48),  # effective time, in quarter hours from START
        st.integers(min_value=1, max_value=40),  # amount in credits, or run quarter hours
    ),
    min_size=1,
    max_size=25,
)


def _apply(s: Any, name: str, op: str, when: datetime, size: int) -> None:
    if op == "topup":
        api.topup(s, name, str(size), effective_at=when, at=when)
    elif op == "expiring":
        api.grant(s, name, str(size), effective_at=when, expires_at=when + size * HOUR / 4, at=when)
    elif op == "consume":
        api.consume(s, name, str(size / 4), at=when)
    elif op == "job":
        hold = api.create_hold(
            s, api.HoldRequest(name, user="alice", job_id=size, gpus="h100:1", seconds=1800, at=when)
        ).as_dict()
        api.settle_hold(s, hold["id"], size * 300, at=when + size * HOUR / 12)
    elif op == "sweep":
        api.sweep(s, name, when)
    else:
        checkpoint_balances(s, name, when)


def test_any_history_reads_the_same_with_checkpoints_as_by_scan(tx: Any) -> None:
    """Operations effective at times that move back and forth (so many entries are late
    for some checkpoint), checkpoints taken in any order; the balance read at every
    quarter hour around them equals the scan."""
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=START - 24 * HOUR)

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(OPS)
    def run(ops: list[tuple[str, int, int]]) -> None:
        name = f"a{uuid.uuid4().hex[:10]}"
        with tx() as s:
            api.create_account(s, name, at=START - 24 * HOUR)
        for op, quarter, size in ops:
            try:
                with tx() as s:
                    _apply(s, name, op, START + quarter * HOUR / 4, size)
            except LedgerError:
                pass  # refused (not enough credit, job already held): it posted nothing
        with tx() as s:
            _agrees(s, name, [START + k * HOUR / 4 for k in range(-2, 70)])
            problems = [p for p in api.verify(s).problems if f"account {name} " in p]
            assert problems == []

    run()


def test_audit_checkpoint_and_the_sweep_take_checkpoints_that_verify_accepts(db_url: str) -> None:
    from tests.support.cli import cli_for, dispose_engine

    gc = cli_for(db_url)
    try:
        gc("account", "create", "physics")
        gc("topup", "physics", "100", "--effective", "2026-01-01T00:00Z")
        gc("consume", "physics", "30", "--at", "2026-02-01T00:00Z")
        shown = json.loads(gc("audit", "checkpoint", "--at", "2026-01-15T00:00Z", "--format", "json").output)
        assert [(r["account"], r["written"], r["reissued"], r["through_seq"]) for r in shown] == [
            ("physics", True, 0, 2)
        ]
        gc("consume", "physics", "5", "--at", "2026-01-10T00:00Z")  # late for that checkpoint
        gc("sweep")  # takes the hourly checkpoint, re-versioning the one the late entry precedes
        gc("sweep")  # within the hour: nothing more
        again = json.loads(gc("audit", "checkpoint", "--account", "physics", "--format", "json").output)
        assert [(r["written"], r["reissued"]) for r in again] == [(True, 0)]  # asked for: taken
        balance = json.loads(gc("balance", "physics", "--at", "2026-01-20T00:00Z", "--format", "json").output)
        assert balance["available"] == "95.00"
        assert gc("audit", "verify").output == "ok: 1 accounts, 3 entries, 0 problems\n"
    finally:
        dispose_engine(db_url)


def test_checkpoints_are_append_only_in_the_database(tx: Any) -> None:
    with tx() as s:
        _setup(s, "physics")
        api.topup(s, "physics", "10", effective_at=START, at=START)
        checkpoint_balances(s, "physics", START + HOUR)
    for statement in (
        "UPDATE balance_checkpoints SET amount_ucredits = 0",
        "DELETE FROM balance_checkpoints",
    ):
        with pytest.raises(DBAPIError, match="append-only"), tx() as s:
            s.execute(text(statement))
    with tx() as s:
        assert api.balance(s, "physics", START + HOUR)["available"] == "10.00"
