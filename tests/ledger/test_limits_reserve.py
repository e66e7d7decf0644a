"""The spend-rate cap, checked when a hold is taken (docs/design.md §4.12).

The sum of the burn rates of the active holds plus the new one must not exceed the cap
of the user, then of the account. A refusal is `spend_rate`, its message names who,
the rate it would reach and the cap, per second; nothing is posted and no hold is made.
Prices: H100 3.60 and A100 2.00 credits per GPU-hour, so one H100 burns 0.001 credit/s.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ledger import api
from ledger.errors import LimitExceeded
from ledger.store.tables import entries_t

AT = datetime(2026, 12, 2, 10, tzinfo=UTC)


def _setup(tx: Callable[[], Any]) -> None:
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=AT - timedelta(days=1))
        api.set_price(s, "a100", "2.00", effective_at=AT - timedelta(days=1))
        api.create_account(s, "physics")
        api.topup(s, "physics", "100", effective_at=AT - timedelta(hours=1), at=AT - timedelta(hours=1))


def _reserve(s: Session, user: str, job_id: int, gpus: str) -> api.HoldState:
    return api.create_hold(
        s, api.HoldRequest("physics", user=user, job_id=job_id, gpus=gpus, seconds=3600, cluster="lab", at=AT)
    )


def _books(s: Session) -> tuple[int, dict[str, Any], list[int]]:
    """What a refusal must leave untouched: the journal, the balance, the holds."""
    entries = s.execute(select(func.count()).select_from(entries_t)).scalar_one()
    holds = [h.id for h in api.list_holds(s, "physics")]
    return int(entries), api.balance(s, "physics", AT), holds


def _refused(tx: Callable[[], Any], user: str, job_id: int, gpus: str) -> LimitExceeded:
    with tx() as s:
        before = _books(s)
    with pytest.raises(LimitExceeded) as refused, tx() as s:
        _reserve(s, user, job_id, gpus)
    with tx() as s:
        assert _books(s) == before
        assert api.find_hold(s, "lab", job_id, 0) is None
    return refused.value


def test_a_user_spend_rate_cap_refuses_the_hold_that_would_pass_it(tx: Callable[[], Any]) -> None:
    _setup(tx)
    with tx() as s:
        api.set_limits(s, "physics", user="alice", max_rate="0.002")
        first = _reserve(s, "alice", 1, "h100:2")  # 0.002/s: at the cap, not over it
        _reserve(s, "bob", 2, "h100:4")  # another user's burn is not alice's

    refusal = _refused(tx, "alice", 3, "h100:1")

    assert refusal.code == "spend_rate"
    assert refusal.message == (
        "user alice in account physics: spend rate 0.003/s would exceed the cap of 0.002/s"
    )
    assert refusal.details == {"limit": "spend_rate", "scope": "user", "value": "0.003", "cap": "0.002"}
    assert refusal.http_status == 429
    with tx() as s:  # only active holds burn: once the first is released, the same job fits
        api.release_hold(s, first.id, AT + timedelta(seconds=60))
        assert _reserve(s, "alice", 3, "h100:1").state == "active"


def test_an_account_spend_rate_cap_counts_every_member(tx: Callable[[], Any]) -> None:
    _setup(tx)
    with tx() as s:
        api.set_limits(s, "physics", max_rate="0.004")
        api.set_limits(s, "physics", user="bob", max_rate="0.01")  # bob's own cap is not the one hit
        _reserve(s, "alice", 1, "h100:2")
        _reserve(s, "bob", 2, "h100:2")  # 0.004/s together: at the cap

    refusal = _refused(tx, "bob", 3, "a100:1")

    # 7.20 + 7.20 + 2.00 credits/h = 0.0045555.../s, shown half-up to the micro-credit
    assert refusal.code == "spend_rate"
    assert refusal.message == "account physics: spend rate 0.004556/s would exceed the cap of 0.004/s"
    assert refusal.details == {
        "limit": "spend_rate",
        "scope": "account",
        "value": "0.004556",
        "cap": "0.004",
    }


def test_the_user_cap_is_named_before_the_account_cap(tx: Callable[[], Any]) -> None:
    """A hold over both caps is refused by the narrower scope first: the user's."""
    _setup(tx)
    with tx() as s:
        api.set_limits(s, "physics", max_rate="0.001")
        api.set_limits(s, "physics", user="alice", max_rate="0.001")

    refusal = _refused(tx, "alice", 1, "h100:1,a100:1")

    assert refusal.message == (
        "user alice in account physics: spend rate 0.001556/s would exceed the cap of 0.001/s"
    )
    assert (refusal.details["scope"], refusal.details["value"]) == ("user", "0.001556")
