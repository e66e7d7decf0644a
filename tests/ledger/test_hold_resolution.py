"""A hold resolves exactly once (docs/design.md §4.4): after it is settled, released or expired, a
different settle, a release of a settled hold, or a further usage charge is refused with
`hold_resolved` and posts nothing; the identical settle (and release) is a replay.

Each case checks what a caller sees (the code, the message, the hold returned) and
that the books did not move: journal entries, postings, grant remainders, the hold row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text

from ledger import api
from ledger.errors import Conflict
from tests.support.cli import cli_for, dispose_engine

T0 = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)
HOLD_FIELDS = ("id", "account", "state", "amount", "charged", "charged_seconds", "resolved_at")


def books(tx: Callable[[], Any]) -> tuple:
    with tx() as s:
        return (
            s.execute(text("SELECT COUNT(*) FROM entries")).scalar_one(),
            s.execute(text("SELECT COUNT(*) FROM postings")).scalar_one(),
            tuple(
                map(tuple, s.execute(text("SELECT id, remaining_ucredits, earmarked_ucredits FROM grants")))
            ),
            tuple(
                map(
                    tuple,
                    s.execute(
                        text("SELECT id, state, charged_ucredits, charged_seconds, debt_ucredits FROM holds")
                    ),
                )
            ),
        )


def shown(hold: Any) -> dict[str, Any]:
    as_dict = hold.as_dict()
    return {k: as_dict[k] for k in HOLD_FIELDS}


@pytest.fixture
def hold_id(tx) -> int:
    """physics: 100 credits; hold 1 for 2×h100 × 2 h from T0 (14.40 held)."""
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=LONG_AGO)
        api.create_account(s, "physics")
        api.topup(s, "physics", "100", effective_at=LONG_AGO)
    with tx() as s:
        hold = api.create_hold(
            s,
            api.HoldRequest(
                "physics", user="alice", job_id=1001, gpus="h100:2", seconds=7200, cluster="lab", at=T0
            ),
        )
    assert hold.amount_ucredits == 14_400_000
    return hold.id


def resolve(tx, hold_id: int, how: str) -> None:
    with tx() as s:
        if how == "settled":
            api.settle_hold(s, hold_id, 1800)  # 3.60 charged, 10.80 returns
        elif how == "released":
            api.hold_usage(s, hold_id, 600)  # 1.20 charged so far
            api.release_hold(s, hold_id, datetime(2026, 12, 2, 10, 20, tzinfo=UTC))
        else:
            assert how == "expired"
            api.sweep(s, "physics", datetime(2026, 12, 2, 12, 10, tzinfo=UTC))  # limit + 600 s grace


# (how it was resolved, what is tried again)
REFUSED = [
    ("settled", "settle 2400"),
    ("settled", "settle 1200"),
    ("settled", "release"),
    ("settled", "usage 2400"),
    ("settled", "usage 1200"),
    ("released", "settle 600"),
    ("released", "settle 1800"),
    ("released", "usage 1800"),
    ("expired", "settle 1800"),
    ("expired", "usage 1800"),
    ("expired", "release"),
]


def attempt(s: Any, hold_id: int, action: str) -> Any:
    verb, _, seconds = action.partition(" ")
    if verb == "settle":
        return api.settle_hold(s, hold_id, int(seconds))
    if verb == "usage":
        return api.hold_usage(s, hold_id, int(seconds))
    return api.release_hold(s, hold_id, datetime(2026, 12, 2, 13, 0, tzinfo=UTC))


@pytest.mark.parametrize(("how", "action"), REFUSED, ids=[f"{h}-then-{a}" for h, a in REFUSED])
def test_a_resolved_hold_refuses_another_resolution_and_posts_nothing(tx, hold_id, how, action) -> None:
    resolve(tx, hold_id, how)
    before = books(tx)
    with tx() as s:
        state = api.get_hold(s, hold_id).state
    assert state == how
    with pytest.raises(Conflict) as refused, tx() as s:
        attempt(s, hold_id, action)
    assert refused.value.code == "hold_resolved"
    assert refused.value.details == {"hold_id": hold_id, "state": how}
    if action.startswith("usage"):
        assert refused.value.message == (
            f"hold {hold_id} is {how}; usage can only be charged on an active hold"
        )
    else:
        assert refused.value.message == f"hold {hold_id} is already {how}; it resolves exactly once"
    assert books(tx) == before


def test_the_identical_settle_is_a_replay(tx, hold_id) -> None:
    with tx() as s:
        first = shown(api.settle_hold(s, hold_id, 1800))
    assert (first["state"], first["charged"], first["charged_seconds"]) == ("settled", "3.60", 1800)
    before = books(tx)
    with tx() as s:  # the epilog ran twice, or its reply was lost and it asked again
        again = shown(api.settle_hold(s, hold_id, 1800, datetime(2026, 12, 2, 11, 0, tzinfo=UTC)))
    assert again == first
    assert books(tx) == before
    with tx() as s:
        balance = api.balance(s, "physics", datetime(2026, 12, 2, 12, 0, tzinfo=UTC))
    assert (balance["available"], balance["held"]) == ("96.40", "0.00")


def test_releasing_a_released_hold_again_is_a_replay(tx, hold_id) -> None:
    resolve(tx, hold_id, "released")
    before = books(tx)
    with tx() as s:
        again = api.release_hold(s, hold_id, datetime(2026, 12, 2, 10, 25, tzinfo=UTC))
    assert (again.state, again.charged_ucredits) == ("released", 1_200_000)
    assert books(tx) == before


def test_the_cli_refuses_a_second_settle_with_hold_resolved(tx, hold_id, db_url) -> None:
    gc = cli_for(db_url)
    try:
        gc("hold", "settle", str(hold_id), "--elapsed", "1800")
        before = books(tx)
        again = json.loads(gc("hold", "settle", str(hold_id), "--elapsed", "1800", "--format", "json").output)
        assert (again["state"], again["amount"], again["charged"]) == ("settled", "14.40", "3.60")
        refused = gc("hold", "settle", str(hold_id), "--elapsed", "2400", code=1)
        assert refused.stderr == (
            f"error: hold_resolved: hold {hold_id} is already settled; it resolves exactly once\n"
        )
        refused = gc("hold", "usage", str(hold_id), "--elapsed", "2400", code=1)
        assert refused.stderr == (
            f"error: hold_resolved: hold {hold_id} is settled; usage can only be charged on an active hold\n"
        )
        refused = gc("hold", "release", str(hold_id), code=1)
        assert refused.stderr.startswith("error: hold_resolved: ")
        assert books(tx) == before
    finally:
        dispose_engine(db_url)
