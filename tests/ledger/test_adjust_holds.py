"""ledger.adjust_holds: many runs' corrections under one lock, as adjust_hold on each in turn.

Two accounts get the same history; one has its runs corrected one adjust_hold at a
time, the other in one adjust_holds call. Every figure a user or an auditor sees
must come out the same: journal entries and postings, grants (a refund grant
included), holds' charges and debt, the account's debt, and `audit verify`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ledger import api
from ledger.errors import InvalidInput, NotFound
from ledger.holds.adjustments import Adjustment, adjust_holds, adjust_holds_many
from tests.support.books import picture

T0 = datetime(2026, 12, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def history(tx: Callable[[], Any], account: str, first_job: int) -> list[int]:
    """Three runs settled at 2 credits each; the third corrected up into debt, which a top-up paid."""
    with tx() as s:
        api.create_account(s, account)
        api.topup(s, account, "10", effective_at=T0 - timedelta(days=1))
    holds = []
    for job_id in range(first_job, first_job + 3):
        with tx() as s:
            hold = api.create_hold(
                s,
                api.HoldRequest(account, user="alice", job_id=job_id, gpus={"a100": 1}, seconds=7200, at=T0),
            )
            api.settle_hold(s, hold.id, 3600, T0 + HOUR)
            holds.append(hold.id)
    with tx() as s:
        api.adjust_hold(s, holds[2], 10_000_000, at=T0 + 2 * HOUR, reason="setup")
    with tx() as s:
        api.topup(s, account, "4", effective_at=T0 + 3 * HOUR, at=T0 + 3 * HOUR)
    return holds


def corrections(holds: list[int]) -> list[Adjustment]:
    at = T0 + 4 * HOUR
    return [
        # 9 back: its grants take back 6, the top-up paid the debt: 3 become a refund grant...
        Adjustment(holds[2], 1_000_000, at, "sacct: COMPLETED"),
        # ...which this run's extra 3 credits must draw from, as one adjust_hold after another would
        Adjustment(holds[0], 5_000_000, at + timedelta(seconds=1), "sacct: COMPLETED"),
        Adjustment(holds[1], 0, at, "NODE_FAIL: refunded"),
    ]


@pytest.fixture
def priced(tx: Callable[[], Any]) -> Callable[[], Any]:
    with tx() as s:
        api.set_price(s, "a100", "2", effective_at=T0 - timedelta(days=30))
    return tx


def test_one_call_leaves_what_one_adjust_hold_after_another_leaves(priced: Callable[[], Any]) -> None:
    tx = priced
    one_by_one, batched = history(tx, "physics", 1), history(tx, "chemistry", 11)
    for adjustment in corrections(one_by_one):
        with tx() as s:
            hold_id, target, at, reason = adjustment
            api.adjust_hold(s, hold_id, target, at=at, reason=reason)
    with tx() as s:
        after = adjust_holds(s, "chemistry", corrections(batched))
    assert [h.charged_ucredits for h in after] == [1_000_000, 5_000_000, 0]
    expected, got = picture(tx, "physics", one_by_one), picture(tx, "chemistry", batched)
    assert got == expected
    assert [g[0] for g in got["grants"]] == ["topup", "topup", "refund"]
    with tx() as s:
        assert api.verify(s).ok


def test_a_repeat_changes_nothing(priced: Callable[[], Any]) -> None:
    tx = priced
    holds = history(tx, "physics", 1)
    with tx() as s:
        adjust_holds(s, "physics", corrections(holds))
    before = picture(tx, "physics", holds)
    with tx() as s:
        again = adjust_holds(s, "physics", corrections(holds))
    assert [h.charged_ucredits for h in again] == [1_000_000, 5_000_000, 0]
    assert picture(tx, "physics", holds) == before


def test_refusals_write_nothing(priced: Callable[[], Any]) -> None:
    tx = priced
    physics, chemistry = history(tx, "physics", 1), history(tx, "chemistry", 11)
    before = picture(tx, "physics", physics)
    with tx() as s, pytest.raises(NotFound) as foreign:
        adjust_holds(s, "physics", [Adjustment(physics[0], 0, T0), Adjustment(chemistry[0], 0, T0)])
    assert foreign.value.message == f"hold {chemistry[0]} is not a hold of account physics"
    with tx() as s, pytest.raises(InvalidInput) as twice:
        adjust_holds(s, "physics", [Adjustment(physics[0], 0, T0), Adjustment(physics[0], 1, T0)])
    assert twice.value.code == "invalid_hold" and twice.value.message == f"hold {physics[0]} is listed twice"
    with tx() as s, pytest.raises(InvalidInput) as negative:
        adjust_holds(s, "physics", [Adjustment(physics[0], -1, T0)])
    assert negative.value.code == "invalid_amount"
    assert picture(tx, "physics", physics) == before


def test_several_accounts_in_one_call_leave_what_one_call_each_leaves(priced: Callable[[], Any]) -> None:
    tx = priced
    alone = {"physics": history(tx, "physics", 1), "biology": history(tx, "biology", 21)}
    together = {"chemistry": history(tx, "chemistry", 11), "geology": history(tx, "geology", 31)}
    for account, holds in alone.items():
        with tx() as s:
            adjust_holds(s, account, corrections(holds))
    with tx() as s:
        # geology's holds in another order: each account's list is applied in its own order
        after = adjust_holds_many(
            s,
            {
                "geology": corrections(together["geology"])[::-1],
                "chemistry": corrections(together["chemistry"]),
                "nothing": [],
            },
        )
    assert [h.charged_ucredits for h in after["chemistry"]] == [1_000_000, 5_000_000, 0]
    assert [h.charged_ucredits for h in after["geology"]] == [0, 5_000_000, 1_000_000]
    assert after["nothing"] == []
    assert picture(tx, "chemistry", together["chemistry"]) == picture(tx, "physics", alone["physics"])
    # The reversed order draws before the refund grant exists: as one call for geology alone would.
    expected = history(tx, "zoology", 41)
    with tx() as s:
        adjust_holds(s, "zoology", corrections(expected)[::-1])
    assert picture(tx, "geology", together["geology"]) == picture(tx, "zoology", expected)
    with tx() as s:
        assert api.verify(s).ok


def test_several_accounts_refused_as_a_whole(priced: Callable[[], Any]) -> None:
    tx = priced
    physics, chemistry = history(tx, "physics", 1), history(tx, "chemistry", 11)
    before = picture(tx, "physics", physics), picture(tx, "chemistry", chemistry)
    with tx() as s, pytest.raises(NotFound) as foreign:
        adjust_holds_many(
            s,
            {
                "physics": corrections(physics),
                "chemistry": [Adjustment(chemistry[0], 0, T0), Adjustment(physics[1], 0, T0)],
            },
        )
    assert foreign.value.message == f"hold {physics[1]} is not a hold of account chemistry"
    with tx() as s, pytest.raises(NotFound) as unknown:
        adjust_holds_many(s, {"physics": corrections(physics), "nobody": [Adjustment(chemistry[0], 0, T0)]})
    assert unknown.value.message == "account 'nobody' does not exist"
    assert (picture(tx, "physics", physics), picture(tx, "chemistry", chemistry)) == before
