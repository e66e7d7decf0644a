"""ledger.record_unreserved_runs: many hook-outage runs in one call, as record_unreserved_run on each.

Two pairs of accounts get the same history; one pair has its runs charged one
record_unreserved_run at a time, the other in one record_unreserved_runs call. Every
figure a user or an auditor sees must come out the same: holds, journal entries and
postings, grant remainders, allocations, the account's debt, and `audit verify`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from ledger import api
from ledger.errors import Conflict, InvalidInput, NotFound
from ledger.store.tables import allocations_t, holds_t
from tests.support.books import picture

T0 = datetime(2026, 12, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture
def priced(tx: Callable[[], Any]) -> Callable[[], Any]:
    with tx() as s:
        api.set_price(s, "a100", "2", effective_at=T0 - timedelta(days=30))
        api.set_price(s, "h100", "4", effective_at=T0 - timedelta(days=30))
        api.set_price(s, "h100", "6", effective_at=T0 + 2 * HOUR)  # the later runs pay more
    return tx


def accounts(tx: Callable[[], Any], *names: str) -> None:
    for name in names:
        with tx() as s:
            api.create_account(s, name)
            api.topup(s, name, "7", effective_at=T0 - timedelta(days=1))
            # expires first, so burns first: each run draws from the grants in burn order
            api.topup(s, name, "3", effective_at=T0 - timedelta(days=1), expires_at=T0 + timedelta(days=9))


def runs(first: str, second: str, first_job: int) -> list[api.UnreservedRun]:
    """Interleaved runs of two accounts; the first's last ones run past its credit into debt."""
    return [
        api.UnreservedRun(first, "alice", "c1", first_job, 0, {"a100": 1}, T0, 3600, "gpu", T0 - HOUR),
        api.UnreservedRun(second, "bob", "c1", first_job + 1, 0, "h100:1", T0, 1800, None, None),
        api.UnreservedRun(first, "alice", "c1", first_job + 2, 1, {"h100": 1}, T0 + 3 * HOUR, 3600),
        api.UnreservedRun(first, "carol", "c2", first_job + 2, 0, {"a100": 2}, T0 + HOUR, 7200, "gpu", T0),
        api.UnreservedRun(second, "bob", "c1", first_job + 3, 0, {"a100": 1, "h100": 1}, T0, 60),
    ]


def one_by_one(s: Any, run: api.UnreservedRun) -> api.HoldState:
    return api.record_unreserved_run(
        s,
        run.account,
        user=run.user,
        cluster=run.cluster,
        job_id=run.job_id,
        run=run.run,
        gpus=run.gpus,
        started_at=run.started_at,
        elapsed_seconds=run.elapsed_seconds,
        partition=run.partition,
        submitted_at=run.submitted_at,
    )


def allocations(tx: Callable[[], Any], holds: list[int]) -> list[tuple[int, int, int]]:
    with tx() as s:
        rows = s.execute(select(allocations_t).where(allocations_t.c.hold_id.in_(holds)))
        order = {h: n for n, h in enumerate(holds)}
        return sorted((order[r.hold_id], r.earmarked_ucredits, r.drawn_ucredits) for r in rows)


def test_one_call_leaves_what_one_record_unreserved_run_after_another_leaves(
    priced: Callable[[], Any],
) -> None:
    tx = priced
    accounts(tx, "physics", "biology", "chemistry", "geology")
    alone = []
    for run in runs("physics", "biology", 1):
        with tx() as s:
            alone.append(one_by_one(s, run))
    with tx() as s:
        together = api.record_unreserved_runs(s, runs("chemistry", "geology", 1001))
    fields = ("charged_ucredits", "charged_seconds", "debt_ucredits", "state", "rate_ucredits_per_hour")
    assert [[getattr(h, f) for f in fields] for h in together] == [
        [getattr(h, f) for f in fields] for h in alone
    ]
    assert [h.charged_ucredits for h in together] == [2_000_000, 2_000_000, 6_000_000, 8_000_000, 100_000]
    assert together[3].debt_ucredits == 6_000_000  # physics: 10 credits, 16 charged
    with tx() as s:  # what was stored is what was returned, column for column
        for hold in together:
            assert api.get_hold(s, hold.id) == hold
    mine, theirs = [h.id for h in together], [h.id for h in alone]
    for pair in (("chemistry", "physics"), ("geology", "biology")):
        assert picture(tx, pair[0], mine) == picture(tx, pair[1], theirs)
    assert allocations(tx, mine) == allocations(tx, theirs)
    with tx() as s:
        assert api.verify(s).ok


def test_a_repeat_returns_the_holds_and_changes_nothing(priced: Callable[[], Any]) -> None:
    tx = priced
    accounts(tx, "physics", "biology")
    with tx() as s:
        first = api.record_unreserved_runs(s, runs("physics", "biology", 1)[:3])
    before = picture(tx, "physics", [h.id for h in first])
    with tx() as s:  # the first three again (one twice), and two new ones
        again = api.record_unreserved_runs(
            s, [*runs("physics", "biology", 1), runs("physics", "biology", 1)[0]]
        )
    assert [h.id for h in again[:3]] == [h.id for h in first] and again[5].id == first[0].id
    assert [h.charged_ucredits for h in again] == [
        2_000_000,
        2_000_000,
        6_000_000,
        8_000_000,
        100_000,
        2_000_000,
    ]
    with tx() as s:
        assert one_by_one(s, runs("physics", "biology", 1)[3]).id == again[3].id
        assert s.execute(select(holds_t.c.id)).all().__len__() == 5
    assert picture(tx, "physics", [h.id for h in first])["holds"] == before["holds"]


def test_refusals_write_nothing(priced: Callable[[], Any]) -> None:
    tx = priced
    accounts(tx, "physics")
    good = runs("physics", "physics", 1)
    with tx() as s:
        api.record_unreserved_runs(s, good[:1])
    before = picture(tx, "physics", [1])
    changed = good[0]._replace(elapsed_seconds=60)
    cases: list[tuple[list[api.UnreservedRun], type[Exception], str]] = [
        ([*good[1:], changed], Conflict, "job c1/1 run 0 already has a hold for a different request"),
        (
            [good[1], good[1]._replace(user="zed")],
            Conflict,
            "job c1/2 run 0 is listed twice with different fields",
        ),
        ([good[1], good[2]._replace(account="nobody")], NotFound, "account 'nobody' does not exist"),
        ([good[1], good[2]._replace(gpus={"v100": 1})], InvalidInput, "v100"),
        ([good[1], good[2]._replace(started_at=T0.replace(tzinfo=None))], InvalidInput, "time zone"),
    ]
    for batch, error, message in cases:
        with tx() as s, pytest.raises(error) as refused:
            api.record_unreserved_runs(s, batch)
        assert message in refused.value.message  # type: ignore[attr-defined]
    assert picture(tx, "physics", [1]) == before
    with tx() as s:
        assert len(s.execute(select(holds_t.c.id)).all()) == 1
