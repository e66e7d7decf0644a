"""A cap set on a parent caps its whole subtree in the ledger's hold, as GrpTRES on the
parent association does in Slurm (`limits sync`): concurrent GPUs, spend rate, the daily
cap, and a user's caps across the subtree; on both stores, through the batch path (which
leaves such holds to create_hold) and with siblings racing one parent's cap."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ledger import api
from ledger.errors import LimitExceeded
from tests.support.siblings import race

AT = datetime(2026, 12, 2, 10, tzinfo=UTC)
HOUR = 3600


def seed(s: Any) -> None:
    """dept over grpa and grpb, each funded with 100; h100 at 3.60 a GPU-hour."""
    api.set_price(s, "h100", "3.60", effective_at=AT - timedelta(days=1))
    api.create_account(s, "dept")
    for child in ("grpa", "grpb"):
        api.create_account(s, child, parent="dept")
        api.add_member(s, "alice", child)
        api.add_member(s, "bob", child)
        api.topup(s, child, "100", effective_at=AT - timedelta(hours=1), at=AT - timedelta(hours=1))


def hold(s: Any, account: str, job_id: int, gpus: int, user: str = "alice") -> api.HoldState:
    return api.create_hold(
        s, api.HoldRequest(account, user=user, job_id=job_id, gpus=f"h100:{gpus}", seconds=HOUR, at=AT)
    )


def test_a_parents_gpu_cap_counts_every_account_below_it(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
        api.set_limits(s, "dept", max_gpus=4)
    with tx() as s:
        hold(s, "grpa", 1, 3)
    with tx() as s, pytest.raises(LimitExceeded) as refused:
        hold(s, "grpb", 2, 2)
    assert refused.value.message == (
        "account dept (with the accounts below it): 5 concurrent GPUs would exceed the cap of 4 "
        "(3 in use + 2 requested)"
    )
    assert (refused.value.details["account"], refused.value.details["limit"]) == ("dept", "concurrent_gpus")
    with tx() as s:
        hold(s, "grpb", 3, 1)  # 4: fits
        assert api.balance(s, "grpb")["held"] == "3.60"


def test_a_parents_daily_cap_counts_what_the_subtree_spent_and_holds(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
        api.set_limits(s, "dept", daily_cap="10")
    with tx() as s:
        first = hold(s, "grpa", 1, 1)  # 3.60 held
        api.settle_hold(s, first.id, HOUR, AT + timedelta(hours=1))  # 3.60 spent
        hold(s, "grpb", 2, 1)  # 3.60 held: 7.20 today
    with tx() as s, pytest.raises(LimitExceeded) as refused:
        hold(s, "grpa", 3, 1)
    assert refused.value.code == "daily_cap"
    assert "10.80 credits today would exceed the daily cap of 10.00 (3.60 spent + 3.60 held" in (
        refused.value.message
    )


def test_a_users_cap_on_the_parent_counts_them_in_every_account_below(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
        api.set_limits(s, "dept", user="alice", max_gpus=2)
    with tx() as s:
        hold(s, "grpa", 1, 2)
        hold(s, "grpb", 2, 2, user="bob")  # bob is not capped
    with tx() as s, pytest.raises(LimitExceeded) as refused:
        hold(s, "grpb", 3, 1)
    assert refused.value.message.startswith(
        "user alice in account dept (with the accounts below it): 3 concurrent"
    )


def test_the_batch_leaves_a_hold_under_a_capped_parent_to_create_hold(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
        api.create_account(s, "flat")
        api.topup(s, "flat", "10", effective_at=AT - timedelta(hours=1), at=AT - timedelta(hours=1))
        api.set_limits(s, "dept", max_gpus=1)
    requests = [
        api.HoldRequest("grpa", user="alice", job_id=1, gpus="h100:2", seconds=HOUR, at=AT),
        api.HoldRequest("flat", user="alice", job_id=2, gpus="h100:2", seconds=HOUR, at=AT),
    ]
    with tx() as s:
        outcomes = api.create_holds(s, requests)
        assert outcomes[0] is None  # under dept's cap: the daemon asks create_hold next
        assert isinstance(outcomes[1], api.HoldState)  # a flat account is batched as before
        with pytest.raises(LimitExceeded):
            api.create_hold(s, requests[0])


SIBLINGS = 4


def _take(s: Any, worker: int) -> int:
    """One sibling's job: 3×h100 for an hour."""
    return hold(s, f"kid{worker}", 100 + worker, 3).id


def test_siblings_racing_a_parents_cap_never_pass_it(db_url: str, tx: Callable[[], Any]) -> None:
    """dept caps its subtree at 7 GPUs; four children ask for 3 each at once: two hold."""
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=AT - timedelta(days=1))
        api.create_account(s, "dept")
        for w in range(SIBLINGS):
            api.create_account(s, f"kid{w}", parent="dept")
            api.topup(s, f"kid{w}", "100", effective_at=AT - timedelta(hours=1), at=AT - timedelta(hours=1))
        api.set_limits(s, "dept", max_gpus=7)
    outcomes = race(db_url, SIBLINGS, _take)
    assert sorted(kind for kind, _ in outcomes) == ["held", "held", "refused", "refused"]
    assert {code for kind, code in outcomes if kind == "refused"} == {"concurrent_gpus"}
