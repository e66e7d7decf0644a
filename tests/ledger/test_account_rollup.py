"""A subtree rolled up (issue 30 E): usage of a department by child account (CLI, API and
CSV), the tree with each account's balance for its manager, and a parent's GPU cap
written on its own association (limits sync) so Slurm caps the subtree."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import Result

from accounting_bridge.sync.limits_sync import SlurmView, plan_limits
from accounting_bridge.sync.scarcity import ScarcityPolicy
from ledger import api
from ledger.config import DEFAULTS
from tests.support.cli import cli_for, dispose_engine
from tests.support.portal import bearer, make_app

START = datetime(2026, 12, 1, tzinfo=UTC)
AT = START + timedelta(days=1)


def seed(s: Any) -> dict[str, str]:
    """dept (dana manages it) -> grpa (alice), grpb (bob); solo beside it. One settled
    job in each group and a direct charge on dept; returns API tokens."""
    api.set_price(s, "h100", "3.60", effective_at=START - timedelta(days=30))
    api.create_account(s, "dept", at=START)
    api.create_account(s, "grpa", parent="dept", at=START)
    api.create_account(s, "grpb", parent="dept", at=START)
    api.create_account(s, "solo", at=START)
    api.add_member(s, "dana", "dept", role="manager")
    api.add_member(s, "erin", "dept")
    api.add_member(s, "alice", "grpa")
    api.add_member(s, "bob", "grpb")
    for account, credit in (("dept", "10"), ("grpa", "100"), ("grpb", "20"), ("solo", "50")):
        api.topup(s, account, credit, effective_at=START)
    for account, user, job, gpus, ran in (
        ("grpa", "alice", 1, "h100:2", 1800),
        ("grpb", "bob", 2, "h100:1", 3600),
    ):
        hold = api.create_hold(
            s, api.HoldRequest(account, user=user, job_id=job, gpus=gpus, seconds=7200, at=AT)
        )
        api.settle_hold(s, hold.id, ran, at=AT + timedelta(seconds=ran))
    api.consume(s, "dept", "1", at=AT, user="dana")
    api.set_portal_user(s, "admin", is_admin=True)
    return {
        user: api.create_token(s, user, "admin" if user == "admin" else "user")[1]
        for user in ("dana", "erin", "alice", "admin")
    }


@pytest.fixture
def gc(db_url: str, tx: Callable[[], Any]) -> Iterator[Callable[..., Result]]:
    with tx() as s:
        seed(s)
    yield cli_for(db_url)
    dispose_engine(db_url)


def test_the_cli_reports_a_subtree_by_child_account(gc: Callable[..., Result]) -> None:
    window = ("--from", "2026-12-01", "--to", "2026-12-03")
    rows = gc(
        "report", "--account", "dept", "--subtree", "--by", "account", *window, "--format", "csv"
    ).output
    assert list(csv.reader(io.StringIO(rows))) == [
        ["account", "charged", "gpu_seconds", "jobs"],
        ["dept", "1.00", "0", "0"],
        ["grpa", "3.60", "3600", "1"],
        ["grpb", "3.60", "3600", "1"],
    ]
    alone = gc("report", "--account", "dept", "--by", "account", *window, "--format", "csv").output
    assert alone.splitlines()[1:] == ["dept,1.00,0,0"]  # without --subtree: the account's own
    assert gc("account", "tree", "dept").output.splitlines() == [
        "ACCOUNT  PARENT  AVAILABLE  HELD  POOL",
        "dept     -       9.00       0.00  -",
        "  grpa   dept    96.40      0.00  -",
        "  grpb   dept    16.40      0.00  -",
    ]


@pytest.fixture
def http(db_url: str, tx: Callable[[], Any]) -> Iterator[tuple[Any, dict[str, str]]]:
    with tx() as s:
        tokens = seed(s)
    app = make_app(db_url)
    yield app.test_client(), tokens
    app.extensions["gpucredit.engine"].dispose()


def test_a_department_manager_sees_the_tree_and_its_usage_by_child(http: tuple[Any, dict[str, str]]) -> None:
    client, tokens = http
    tree = client.get("/api/v1/accounts/dept/tree", headers=bearer(tokens["dana"]))
    assert tree.status_code == 200
    assert tree.get_json()["items"] == [
        {"account": "dept", "parent": None, "depth": 0, "available": "9.00", "held": "0.00"},
        {"account": "grpa", "parent": "dept", "depth": 1, "available": "96.40", "held": "0.00"},
        {"account": "grpb", "parent": "dept", "depth": 1, "available": "16.40", "held": "0.00"},
    ]
    sub = client.get("/api/v1/accounts/grpa/tree", headers=bearer(tokens["admin"])).get_json()["items"]
    assert sub == [{"account": "grpa", "parent": "dept", "depth": 0, "available": "96.40", "held": "0.00"}]
    assert (
        client.get("/api/v1/accounts/dept/tree", headers=bearer(tokens["erin"])).status_code == 403
    )  # member
    assert client.get("/api/v1/accounts/dept/tree", headers=bearer(tokens["alice"])).status_code == 404
    query = "from=2026-12-01T00:00:00Z&to=2026-12-03T00:00:00Z&group_by=account&subtree=true"
    usage = client.get(f"/api/v1/accounts/dept/usage?{query}", headers=bearer(tokens["dana"]))
    assert usage.get_json()["items"] == [
        {"account": "dept", "charged": "1.00", "gpu_seconds": 0, "jobs": 0},
        {"account": "grpa", "charged": "3.60", "gpu_seconds": 3600, "jobs": 1},
        {"account": "grpb", "charged": "3.60", "gpu_seconds": 3600, "jobs": 1},
    ]
    as_csv = client.get(f"/api/v1/accounts/dept/usage?{query}&format=csv", headers=bearer(tokens["dana"]))
    assert as_csv.get_data(as_text=True).splitlines() == [
        "account,charged,gpu_seconds,jobs",
        "dept,1.00,0,0",
        "grpa,3.60,3600,1",
        "grpb,3.60,3600,1",
    ]
    # a member of dept sees only their own usage, subtree or not
    own = client.get(f"/api/v1/accounts/dept/usage?{query}", headers=bearer(tokens["erin"])).get_json()
    assert own["items"] == []


def test_a_parents_gpu_cap_goes_on_its_own_association_and_its_block_on_its_users() -> None:
    broke = api.Block("no_credit", "no credit left (0.00 available, 0.00 held)")
    ledger = [
        api.AccountEnforcement("dept", 8, (broke,), (api.MemberEnforcement("dana", None, ()),)),
        api.AccountEnforcement("grpa", None, (), ()),
    ]
    view = SlurmView(
        associations={
            ("dept", ""): ((),),
            ("dept", "dana"): ((),),
            ("grpa", ""): ((),),
        },
        parents={"dept": "root", "grpa": "dept"},
        gpu_tres=("gres/gpu",),
        qos_limits={},
        partition_qos={},
        gpu_use={},
    )
    plan = plan_limits(ledger, view, ScarcityPolicy.from_config(DEFAULTS), "lab", scarcity=False)
    assert {(c.scope, c.name): (c.new, c.reason) for c in plan.changes} == {
        ("account", "dept"): ("gres/gpu=8", "subtree cap of 8 GPUs (with its sub-accounts)"),
        ("user", "dana@dept"): (
            "gres/gpu=0",
            f"blocked: {broke.message} (on each user: the account has sub-accounts)",
        ),
    }


def test_the_dashboard_shows_a_manager_the_accounts_below(db_url: str, tx: Callable[[], Any]) -> None:
    from portal.auth import hash_password
    from tests.support.portal import PASSWORD, login

    with tx() as s:
        seed(s)
        api.create_account(s, "proj", parent="grpa")
        for user in ("dana", "erin"):
            api.set_portal_user(s, user, password_hash=hash_password(PASSWORD))
    app = make_app(db_url)
    try:
        manager = app.test_client()
        assert login(manager, "dana").status_code == 302
        page = manager.get("/accounts/dept").get_data(as_text=True)
        assert 'data-testid="subaccounts"' in page
        rows = re.findall(
            r'data-testid="subaccount-(\w+)">\s*<td>((?:&nbsp;)*)\w+</td>\s*<td>(\w+)</td>\s*'
            r'<td class="num" data-testid="subaccount-available">([0-9.]+)</td>',
            page,
        )
        assert rows == [
            ("grpa", "", "dept", "96.40"),
            ("proj", "&nbsp;&nbsp;", "grpa", "0.00"),
            ("grpb", "", "dept", "16.40"),
        ]
        member = app.test_client()
        assert login(member, "erin").status_code == 302
        assert 'data-testid="subaccounts"' not in member.get("/accounts/dept").get_data(as_text=True)
    finally:
        app.extensions["gpucredit.engine"].dispose()
