"""A department manager's page for the accounts below theirs: move credit into one, and
share the department's credit (its pool) with a cap; and the same forms attacked by a
member, a manager of another account and a manager reaching outside their subtree."""

from __future__ import annotations

from decimal import Decimal

import pytest

from ledger import api
from tests.portal.test_portal_admin import available, form, ledger, page, post
from tests.support.portal import LoginAs, Site, csrf_token

MANAGE = "/accounts/physics/manage"


@pytest.fixture
def tree(portal_db: str, site: Site) -> None:
    """physics (alice manages) gets a group below it; chemistry (carol's) stays apart."""
    with ledger(portal_db) as s:
        api.create_account(s, "quantum", parent="physics")


def test_a_manager_moves_credit_into_a_group_below_once(
    login_as: LoginAs, portal_db: str, tree: None
) -> None:
    client = login_as("alice")
    before = available(portal_db, "physics")[0]
    fields = form(client, MANAGE, to="quantum", amount="12.50")
    for _ in range(2):  # a double submit sends the same key: moved once
        response = client.post(MANAGE + "/transfer", data=fields)
        assert response.status_code == 302
    assert "Moved 12.50 credits from physics to quantum." in page(client, MANAGE)
    assert available(portal_db, "quantum") == ("12.50", "0.00")
    assert Decimal(before) - Decimal(available(portal_db, "physics")[0]) == Decimal("12.50")


def test_a_manager_shares_the_departments_credit_with_a_cap(
    login_as: LoginAs, portal_db: str, tree: None
) -> None:
    client = login_as("alice")
    assert "Not shared" in page(client, MANAGE)
    response = post(client, MANAGE, MANAGE + "/pool", pool="on", child_cap="5")
    assert response.status_code == 302
    shown = page(client, MANAGE)
    assert "physics&#39;s credit is shared with the accounts below it, each up to 5.00 credits." in shown
    assert "each account up to 5.00 credits" in shown
    with ledger(portal_db) as s:
        assert api.room_for(s, "quantum", api.pool_settings(s)["physics"].since) == api.Room(
            5_000_000, "physics"
        )
    refused = post(client, MANAGE, MANAGE + "/pool", pool="on", child_cap="-1")
    assert refused.status_code == 422
    assert 'data-code="invalid_amount"' in refused.get_data(as_text=True)
    garbled = post(client, MANAGE, MANAGE + "/pool", pool="sideways")
    assert (garbled.status_code, 'data-code="invalid_request"' in garbled.get_data(as_text=True)) == (
        422,
        True,
    )
    with ledger(portal_db) as s:
        assert "physics" in api.pool_settings(s)  # a garbled form changes nothing
    assert post(client, MANAGE, MANAGE + "/pool", pool="off").status_code == 302
    with ledger(portal_db) as s:
        assert api.pool_settings(s) == {}


def test_a_transfer_larger_than_the_credit_is_refused_with_the_figures(
    login_as: LoginAs, portal_db: str, tree: None
) -> None:
    client = login_as("alice")
    response = post(client, MANAGE, MANAGE + "/transfer", to="quantum", amount="100000")
    assert response.status_code == 402
    assert 'data-code="insufficient_credits"' in response.get_data(as_text=True)
    assert available(portal_db, "quantum") == ("0.00", "0.00")


@pytest.mark.parametrize(
    ("user", "path", "to", "status"),
    [
        ("bob", MANAGE, "quantum", 403),  # a member of physics sees it but is no manager
        ("carol", MANAGE, "quantum", 404),  # a manager of another account
        ("alice", MANAGE, "chemistry", 404),  # outside physics's subtree: not hers to see
        ("alice", "/accounts/quantum/manage", "physics", 404),  # not a manager of quantum
    ],
)
def test_nobody_moves_or_shares_credit_that_is_not_theirs(
    login_as: LoginAs, portal_db: str, tree: None, user: str, path: str, to: str, status: int
) -> None:
    client = login_as(user)
    with ledger(portal_db) as s:
        before = {a: api.balance(s, a)["available"] for a in ("physics", "chemistry", "quantum")}
    # the attacker's own session's token, and a key of their own: a well-formed request
    fields = {
        "csrf_token": csrf_token(client, "/"),
        "idempotency_key": "k1",
        "to": to,
        "amount": "1",
        "pool": "on",
    }
    assert client.post(path + "/transfer", data=fields).status_code == status
    if path != MANAGE or user != "alice":  # physics's pool is alice's to share
        assert client.post(path + "/pool", data=fields).status_code == status
    with ledger(portal_db) as s:
        assert {a: api.balance(s, a)["available"] for a in before} == before
        assert "quantum" not in api.pool_settings(s) and "chemistry" not in api.pool_settings(s)
