"""Pooled credit (ledger/books/pools.py): a child's hold borrows from its parent's pool
once its own credit is used, each child within its cap, nested pools walking up the
tree; what a job did not spend goes back to the grants it came from when its hold
resolves; every charge names whose credit paid. Exact figures, on both stores; the CLI;
the batch path (the daemon's) and siblings racing one pool in separate processes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import Result
from sqlalchemy import select

from ledger import api
from ledger.errors import InsufficientCredits, InvalidInput, LedgerError
from ledger.store.tables import entries_t, pool_loans_t
from tests.support.cli import cli_for, dispose_engine
from tests.support.siblings import race

AT = datetime(2026, 12, 2, 10, tzinfo=UTC)
HOUR = 3600


def seed(s: Any, *, cap: str | None = "20", dept_credit: str = "100") -> None:
    """dept (a pool, each child capped at 20) over grpa (5 of its own) and grpc (none);
    h100 at 3.60 a GPU-hour."""
    api.set_price(s, "h100", "3.60", effective_at=AT - timedelta(days=1))
    api.create_account(s, "dept")
    for child in ("grpa", "grpc"):
        api.create_account(s, child)
        api.set_parent(s, child, "dept")
        api.add_member(s, "alice", child)
    api.topup(s, "dept", dept_credit, effective_at=AT - timedelta(hours=1), at=AT - timedelta(hours=1))
    api.topup(s, "grpa", "5", effective_at=AT - timedelta(hours=1), at=AT - timedelta(hours=1))
    api.set_pool(s, "dept", True, cap, at=AT - timedelta(minutes=30))


def hold(s: Any, account: str, job_id: int, gpus: int = 1, seconds: int = HOUR) -> api.HoldState:
    return api.create_hold(
        s, api.HoldRequest(account, user="alice", job_id=job_id, gpus=f"h100:{gpus}", seconds=seconds, at=AT)
    )


def available(s: Any, account: str) -> str:
    return str(api.balance(s, account)["available"])


def test_a_child_with_no_credit_borrows_and_gives_back_what_it_did_not_spend(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
    with tx() as s:
        held = hold(s, "grpc", 1)  # 3.60 for an hour, all of it from dept
        assert held.amount_ucredits == 3_600_000
        assert (available(s, "dept"), available(s, "grpc")) == ("96.40", "0.00")
        assert api.balance(s, "grpc")["held"] == "3.60"
        [pool_grant] = api.balance(s, "grpc")["grants"]
        assert (pool_grant["source"], pool_grant["priority"], pool_grant["amount"]) == ("pool", 1001, "3.60")
    with tx() as s:
        api.settle_hold(s, held.id, 1800, AT + timedelta(seconds=1800))  # half: 1.80
    with tx() as s:
        assert (available(s, "dept"), available(s, "grpc")) == ("98.20", "0.00")
        assert api.pool_uses(s) == {("dept", "grpc"): 1_800_000}
        settle = s.execute(select(entries_t.c.memo).where(entries_t.c.kind == "settle")).scalar_one()
        assert json.loads(settle)["pools"] == {"dept": 1_800_000}  # the charge names whose credit paid
        kinds = [k for (k,) in s.execute(select(entries_t.c.kind).order_by(entries_t.c.id))][-6:]
        assert kinds == ["pool_out", "pool", "hold", "settle", "pool_return", "pool_back"]
        report = api.verify(s)
        assert report.ok, report.problems


def test_the_child_spends_its_own_credit_first_then_the_pool(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
    with tx() as s:
        held = hold(s, "grpa", 1, gpus=2)  # 7.20: grpa's 5, then 2.20 of dept's
        assert (available(s, "grpa"), available(s, "dept")) == ("0.00", "97.80")
    with tx() as s:
        api.settle_hold(s, held.id, 3000, AT + timedelta(seconds=3000))  # 6.00: 5 own + 1.00 pool
    with tx() as s:
        assert (available(s, "grpa"), available(s, "dept")) == ("0.00", "99.00")
        assert api.pool_uses(s) == {("dept", "grpa"): 1_000_000}
        assert api.verify(s).ok


def test_a_child_over_its_cap_is_refused_with_both_figures_and_nothing_moves(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
    with tx() as s:
        first = hold(s, "grpc", 1, gpus=5)  # 18.00 of its 20
        api.settle_hold(s, first.id, HOUR, AT + timedelta(seconds=HOUR))
    with tx() as s, pytest.raises(InsufficientCredits) as refused:
        hold(s, "grpc", 2)  # 3.60 > the 2.00 its cap leaves
    assert refused.value.message == (
        "account grpc: this job needs 3.60 credits (h100:1 for 3600 s) "
        "but 2.00 (0.00 in grpc + 2.00 from dept's pool) are available"
    )
    assert refused.value.details["from_pool"] == "2.00"
    with tx() as s:
        assert (available(s, "dept"), available(s, "grpc")) == ("82.00", "0.00")
        assert api.room_for(s, "grpc", AT) == api.Room(2_000_000, "dept")
        # the cap is per child: grpa may still draw its own 20 beyond its 5
        assert api.room_for(s, "grpa", AT) == api.Room(20_000_000, "dept")
        hold(s, "grpc", 3, seconds=2000)  # 2.00 exactly fits


def test_a_raised_cap_or_a_pool_turned_off_changes_what_a_child_may_draw(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s, cap="1")
    with tx() as s, pytest.raises(InsufficientCredits):
        hold(s, "grpc", 1)
    with tx() as s:
        api.set_pool(s, "dept", True, None)  # no cap
        hold(s, "grpc", 1)
    with tx() as s:
        api.set_pool(s, "dept", False)
        assert api.room_for(s, "grpc", AT) == api.Room()
    with tx() as s, pytest.raises(InsufficientCredits) as refused:
        hold(s, "grpc", 2)
    assert refused.value.message.endswith("but 0.00 are available")  # no pool: no pool words


def test_nested_pools_walk_up_the_tree(tx: Callable[[], Any]) -> None:
    """univ pools for dept, which has nothing and pools for grpc: grpc's job borrows
    through dept from univ; after it, everything unspent is back in univ."""
    with tx() as s:
        seed(s, cap=None, dept_credit="0.000001")
        api.create_account(s, "univ")
        api.topup(s, "univ", "50", effective_at=AT - timedelta(hours=1), at=AT - timedelta(hours=1))
        api.set_parent(s, "dept", "univ")
        api.set_pool(s, "univ", True, "10")
    with tx() as s:
        assert api.room_for(s, "grpc", AT) == api.Room(10_000_001, "dept")
        held = hold(s, "grpc", 1)
        # dept's own micro-credit first, the rest borrowed from univ
        assert (available(s, "univ"), available(s, "dept"), available(s, "grpc")) == (
            "46.400001",
            "0.00",
            "0.00",
        )
    with tx() as s:
        api.release_hold(s, held.id, AT + timedelta(seconds=60))
    with tx() as s:
        assert (available(s, "univ"), available(s, "dept"), available(s, "grpc")) == (
            "50.00",
            "0.000001",
            "0.00",
        )
        assert api.verify(s).ok


def test_the_quote_counts_the_pool_and_names_it(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
        quote = api.quote(s, "grpc", "h100:2", 3600)
    assert (quote["cost"], quote["available"], quote["pool"], quote["from_pool"], quote["affordable"]) == (
        "7.20",
        "0.00",
        "dept",
        "20.00",
        True,
    )
    with tx() as s:
        assert api.quote(s, "grpc", "h100:6", 3600)["affordable"] is False  # 21.60 > 20 cap


def test_the_batch_leaves_a_pooled_hold_to_create_hold_and_returns_credit_on_settle(
    tx: Callable[[], Any],
) -> None:
    with tx() as s:
        seed(s)
    request = api.HoldRequest("grpc", user="alice", job_id=7, gpus="h100:1", seconds=HOUR, at=AT)
    with tx() as s:
        assert api.create_holds(s, [request]) == [None]  # the daemon then asks create_hold
        held = api.create_hold(s, request)
    with tx() as s:
        [outcome] = api.settle_holds(s, [(held.id, 600, AT + timedelta(seconds=600))])
        assert isinstance(outcome, api.HoldState) and outcome.charged_ucredits == 600_000
    with tx() as s:
        assert (available(s, "dept"), available(s, "grpc")) == ("99.40", "0.00")
        assert api.verify(s).ok


def test_bad_pool_requests_are_refused_and_change_nothing(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
    with tx() as s, pytest.raises(InvalidInput):
        api.set_pool(s, "dept", True, "-1")
    with tx() as s, pytest.raises(InvalidInput):
        api.set_pool(s, "dept", False, "5")
    with tx() as s, pytest.raises(LedgerError) as missing:
        api.set_pool(s, "nope", True)
    assert missing.value.code == "not_found"
    with tx() as s:
        assert api.pool_settings(s)["dept"].child_cap_ucredits == 20_000_000


@pytest.fixture
def gc(db_url: str) -> Any:
    yield cli_for(db_url)
    dispose_engine(db_url)


def test_the_cli_turns_a_pool_on_and_shows_it_in_the_tree(gc: Callable[..., Result]) -> None:
    gc("account", "create", "dept")
    gc("account", "create", "grpc", "--parent", "dept")
    gc("topup", "dept", "10")
    out = gc("account", "pool", "dept", "on", "--child-cap", "4")
    assert out.output == "pool of dept on, each child up to 4.00 credits (children: grpc)\n"
    assert gc("account", "tree").output.splitlines() == [
        "ACCOUNT  PARENT  AVAILABLE  HELD  POOL",
        "dept     -       10.00      0.00  on, child cap 4.00",
        "  grpc   dept    0.00       0.00  -",
    ]
    assert gc("account", "pool", "dept", "off").output == "pool of dept off (children: grpc)\n"
    assert "'sideways' is not one of 'on', 'off'" in gc("account", "pool", "dept", "sideways", code=2).output


# -- siblings racing one pool, each in its own process --------------------------------------------

SIBLINGS = 4


def _take(s: Any, worker: int) -> int:
    """One sibling's job: 2×h100 for an hour."""
    return hold(s, f"kid{worker}", 100 + worker, gpus=2).id


def test_siblings_racing_one_pool_never_overdraw_it(db_url: str, tx: Callable[[], Any]) -> None:
    """dept holds 15.00, enough for two 7.20 jobs: of four siblings starting at once, two
    hold and two are refused, and dept keeps exactly 0.60."""
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=AT - timedelta(days=1))
        api.create_account(s, "dept")
        api.topup(s, "dept", "15", effective_at=AT - timedelta(hours=1), at=AT - timedelta(hours=1))
        for w in range(SIBLINGS):
            api.create_account(s, f"kid{w}")
            api.set_parent(s, f"kid{w}", "dept")
        api.set_pool(s, "dept", True, None, at=AT - timedelta(minutes=30))
    outcomes = race(db_url, SIBLINGS, _take)
    assert sorted(kind for kind, _ in outcomes) == ["held", "held", "refused", "refused"]
    assert {code for kind, code in outcomes if kind == "refused"} == {"insufficient_credits"}
    with tx() as s:
        assert available(s, "dept") == "0.60"
        lent = s.execute(select(pool_loans_t.c.taken_ucredits)).scalars().all()
        assert sum(lent) == 14_400_000
        assert api.verify(s).ok


def test_the_dashboard_shows_a_department_manager_each_childs_pool_draw(
    db_url: str, tx: Callable[[], Any]
) -> None:
    from portal.auth import hash_password
    from tests.support.portal import PASSWORD, login, make_app

    with tx() as s:
        seed(s)
        api.add_member(s, "dana", "dept", role="manager")
        api.set_portal_user(s, "dana", password_hash=hash_password(PASSWORD))
    with tx() as s:
        held = hold(s, "grpc", 1)
        api.settle_hold(s, held.id, 1800, AT + timedelta(seconds=1800))  # 1.80 of dept's
        hold(s, "grpa", 2, gpus=2)  # 7.20 running: 5 of its own, 2.20 borrowed
    app = make_app(db_url)
    try:
        manager = app.test_client()
        assert login(manager, "dana").status_code == 302
        page = manager.get("/accounts/dept").get_data(as_text=True)
        draws = re.findall(
            r'data-testid="subaccount-(\w+)">.*?data-testid="subaccount-pool-draw">([0-9.]+)<', page, re.S
        )
        assert draws == [("grpa", "2.20"), ("grpc", "1.80")]
    finally:
        app.extensions["gpucredit.engine"].dispose()


def test_a_run_that_ended_before_its_loan_was_dated_still_gives_it_back(tx: Callable[[], Any]) -> None:
    """Slurm's StartTime is whole seconds: a job cancelled at once settles 0 s at its start,
    a fraction of a second before the hold (and its loan) was taken."""
    with tx() as s:
        seed(s)
    with tx() as s:
        held = api.create_hold(
            s,
            api.HoldRequest(
                "grpc",
                user="alice",
                job_id=9,
                gpus="h100:1",
                seconds=HOUR,
                at=AT + timedelta(microseconds=400_000),
                started_at=AT,
            ),
        )
        api.settle_hold(s, held.id, 0, AT)
    with tx() as s:
        assert (available(s, "dept"), available(s, "grpc")) == ("100.00", "0.00")
        assert api.pool_uses(s) == {("dept", "grpc"): 0}
        assert api.verify(s).ok


def test_a_lease_renews_from_the_pool_within_the_cap(tx: Callable[[], Any]) -> None:
    """Lease mode: grpc's hold covers a 10-minute window (0.60), borrowed; at 9 minutes the
    meter's renewal borrows the next window too, until the cap says no."""
    with tx() as s:
        seed(s, cap="1.50")
    with tx() as s:
        held = api.create_hold(
            s,
            api.HoldRequest(
                "grpc", user="alice", job_id=5, gpus="h100:1", seconds=HOUR, at=AT, lease_seconds=600
            ),
        )
        assert held.amount_ucredits == 600_000
    with tx() as s:
        [renewed] = api.renew_leases(s, "grpc", [(held.id, 540, AT + timedelta(seconds=540))])
        assert (renewed.refused, renewed.extra_ucredits) == (None, 540_000)  # covers 1140 s: 1.14
        assert api.pool_uses(s) == {("dept", "grpc"): 1_140_000}
    with tx() as s:
        [refused] = api.renew_leases(s, "grpc", [(held.id, 1080, AT + timedelta(seconds=1080))])
        assert refused.refused == "credit"  # 1.68 in all would pass the 1.50 cap
    with tx() as s:
        assert available(s, "dept") == "98.86"
        assert api.verify(s).ok


def test_the_dashboard_shows_what_each_child_spent_this_month(db_url: str, tx: Callable[[], Any]) -> None:
    from ledger.timeutil import utcnow
    from portal.auth import hash_password
    from tests.support.portal import PASSWORD, login, make_app

    now = utcnow().replace(microsecond=0)
    ran = now - timedelta(minutes=2)
    with tx() as s:
        seed(s)
        api.add_member(s, "dana", "dept", role="manager")
        api.set_portal_user(s, "dana", password_hash=hash_password(PASSWORD))
    with tx() as s:
        held = api.create_hold(
            s, api.HoldRequest("grpc", user="alice", job_id=1, gpus="h100:1", seconds=HOUR, at=ran)
        )
        api.settle_hold(s, held.id, 60, ran + timedelta(seconds=60))  # 0.06, paid by dept's pool
    this_month = ran >= now.replace(day=1, hour=0, minute=0, second=0)
    app = make_app(db_url)
    try:
        manager = app.test_client()
        assert login(manager, "dana").status_code == 302
        page = manager.get("/accounts/dept").get_data(as_text=True)
        spent = re.findall(
            r'data-testid="subaccount-(\w+)">.*?data-testid="subaccount-spent">([0-9.]+)<', page, re.S
        )
        assert spent == [("grpa", "0.00"), ("grpc", "0.06" if this_month else "0.00")]
    finally:
        app.extensions["gpucredit.engine"].dispose()
