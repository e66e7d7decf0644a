"""The JSON API under /api/v1, as a hook, a bridge, an admin and a researcher use it.

Every route, with the seeded site's exact figures (tests/support/portal.py): who may
see and do what, what each refusal says, and what the ledger holds afterwards. The
money paths run on both stores.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from ledger.timeutil import format_time, utcnow
from tests.support.portal import Site, bearer, make_app, seed_site

V1 = "/api/v1"


class Caller:
    """A test client that speaks for one site's tokens."""

    def __init__(self, client: FlaskClient, site: Site, db_url: str) -> None:
        self.client = client
        self.site = site
        self.db_url = db_url

    def __call__(
        self,
        method: str,
        path: str,
        who: str | None,
        body: Any = None,
        *,
        key: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> TestResponse:
        sent = dict(headers or {})
        if who is not None:
            sent.update(bearer(self.site.tokens[who]))
        if key is not None:
            sent["Idempotency-Key"] = key
        return self.client.open(V1 + path, method=method, json=body, headers=sent)

    def ledger(self) -> Any:
        """A committed transaction on the site's database, to read what a request left."""
        return _transaction(self.db_url)

    def balance(self, account: str) -> tuple[str, str]:
        with self.ledger() as s:
            figures = api.balance(s, account)
        return figures["available"], figures["held"]

    def hold_count(self, account: str) -> int:
        with self.ledger() as s:
            return len(api.list_holds(s, account))


class _transaction:
    def __init__(self, db_url: str) -> None:
        self.engine = make_engine(db_url)
        self.session = make_sessionmaker(self.engine)()

    def __enter__(self) -> Any:
        self.session.begin()
        return self.session

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.session.commit()
        self.session.close()
        self.engine.dispose()


@pytest.fixture
def call(client: FlaskClient, site: Site, portal_db: str) -> Caller:
    """The seeded site on SQLite."""
    return Caller(client, site, portal_db)


@pytest.fixture
def call_both(db_url: str) -> Iterator[Caller]:
    """The seeded site on each store (SQLite and PostgreSQL)."""
    site = seed_site(db_url)
    app = make_app(db_url)
    yield Caller(app.test_client(), site, db_url)
    app.extensions["gpucredit.engine"].dispose()


def error(response: TestResponse) -> dict[str, Any]:
    body = response.get_json()
    assert set(body) == {"error"}, body
    return dict(body["error"])


# -- balances -----------------------------------------------------------------------------


def test_a_member_reads_the_balance_of_their_account_with_each_grant(call_both: Caller) -> None:
    response = call_both("GET", "/accounts/physics/balance", "bob")
    assert response.status_code == 200
    balance = response.get_json()
    assert (balance["account"], balance["available"], balance["held"]) == ("physics", "100.00", "14.40")
    grants = {g["source"]: g for g in balance["grants"]}
    assert (grants["grant"]["amount"], grants["grant"]["remaining"]) == ("20.00", "14.40")
    assert (grants["topup"]["amount"], grants["topup"]["remaining"]) == ("100.00", "100.00")
    assert grants["topup"]["expires_at"] is None
    assert grants["grant"]["expires_at"] == format_time(call_both.site.now + timedelta(days=5))


def test_the_balance_at_a_past_time_is_what_was_spendable_then(call: Caller) -> None:
    before_any_job = format_time(call.site.start + timedelta(hours=1))
    response = call("GET", f"/accounts/physics/balance?at={before_any_job}", "alice")
    assert response.status_code == 200
    assert (response.get_json()["available"], response.get_json()["held"]) == ("120.00", "0.00")


def test_a_malformed_time_is_a_422_naming_the_field(call: Caller) -> None:
    response = call("GET", "/accounts/physics/balance?at=yesterday", "alice")
    assert response.status_code == 422
    assert error(response)["code"] == "invalid_time"
    assert error(response)["details"]["field"] == "at"


# -- who may see what ------------------------------------------------------------------------

FOREIGN_READS = [
    ("GET", "/accounts/{}/balance", None),
    ("GET", "/accounts/{}/jobs", None),
    ("GET", "/accounts/{}/usage", None),
    ("GET", "/accounts/{}/usage?format=csv", None),
    ("GET", "/accounts/{}/entries", None),
    ("GET", "/holds?account={}", None),
    ("POST", "/accounts/{}/topups", {"amount": "10"}),
]


@pytest.mark.parametrize(
    ("who", "foreign"), [("bob", "chemistry"), ("alice", "chemistry"), ("carol", "physics")]
)
def test_an_account_a_user_is_not_in_answers_exactly_like_a_missing_one(
    call: Caller, who: str, foreign: str
) -> None:
    for method, path, body in FOREIGN_READS:
        seen = call(method, path.format(foreign), who, body, key="k-1")
        missing = call(method, path.format("nosuch"), who, body, key="k-1")
        assert seen.status_code == missing.status_code == 404, path
        assert error(seen)["code"] == "not_found", path
        assert seen.get_data(as_text=True).replace(foreign, "nosuch") == missing.get_data(as_text=True), path
    with call.ledger() as s:
        assert api.list_payments(s) == []


def test_a_quote_for_an_account_a_user_is_not_in_is_not_found(call: Caller) -> None:
    spec = {"gpus": "a100:1", "time": "01:00:00"}
    seen = call("POST", "/quotes", "carol", {"account": "physics", **spec})
    missing = call("POST", "/quotes", "carol", {"account": "nosuch", **spec})
    assert seen.status_code == missing.status_code == 404
    assert seen.get_data(as_text=True).replace("physics", "nosuch") == missing.get_data(as_text=True)


def test_a_hold_of_another_account_answers_like_a_missing_hold(call: Caller) -> None:
    with call.ledger() as s:
        physics_hold = api.list_holds(s, "physics")[0].id
    seen = call("GET", f"/holds/{physics_hold}", "carol")
    missing = call("GET", "/holds/999", "carol")
    assert seen.status_code == missing.status_code == 404
    assert seen.get_data(as_text=True).replace(str(physics_hold), "999") == missing.get_data(as_text=True)
    assert call("GET", f"/holds/{physics_hold}", "alice").get_json()["job_id"] == 1001  # a manager: any


def test_a_member_reads_only_their_own_holds_a_manager_the_accounts(call: Caller) -> None:
    """Bob is a member of physics, alice its manager: the API shows bob what the pages
    show him (his own jobs), never alice's, and alice everyone's."""
    with call.ledger() as s:
        holds = {hold.job_id: hold.id for hold in api.list_holds(s, "physics")}
    alices, bobs = holds[1001], holds[1002]
    hidden = call("GET", f"/holds/{alices}", "bob")
    missing = call("GET", "/holds/999", "bob")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.get_data(as_text=True).replace(str(alices), "999") == missing.get_data(as_text=True)
    assert call("GET", f"/holds/{bobs}", "bob").get_json()["user"] == "bob"
    assert call("GET", f"/holds/{bobs}", "alice").get_json()["user"] == "bob"


def test_a_service_token_reads_no_ones_reports(call: Caller) -> None:
    for path in (
        "/accounts/physics/balance",
        "/accounts/physics/usage",
        "/accounts/physics/entries",
        "/accounts/physics/jobs",
        "/accounts",
        "/ood/balance.json",
    ):
        response = call("GET", path, "service")
        assert response.status_code == 403, path
        assert error(response)["code"] == "forbidden", path
        assert error(response)["details"] == {"role": "service", "roles": ["user", "admin"]}, path


MONEY_BY_HAND = [
    (
        "POST",
        "/holds",
        {"account": "physics", "user": "alice", "job_id": 7, "gpus": "a100:1", "seconds": 60},
    ),
    ("POST", "/holds/4/settle", {"elapsed": 60}),
    ("POST", "/holds/4/usage", {"elapsed": 60}),
    ("POST", "/holds/4/release", {}),
    ("POST", "/accounts/physics/consume", {"amount": "1"}),
    ("POST", "/accounts/physics/grants", {"amount": "1"}),
    ("PUT", "/prices/h100", {"credits_per_gpu_hour": "1"}),
]


def test_a_user_token_even_a_managers_cannot_move_money_by_hand(call: Caller) -> None:
    for method, path, body in MONEY_BY_HAND:
        response = call(method, path, "alice", body, key="k-1")
        assert response.status_code == 403, path
        assert error(response)["code"] == "forbidden", path
    assert call.balance("physics") == ("100.00", "14.40")
    assert call.hold_count("physics") == 3


def test_the_journal_is_for_managers_and_admins(call: Caller) -> None:
    response = call("GET", "/accounts/physics/entries", "bob")
    assert response.status_code == 403
    assert error(response)["details"] == {"account": "physics", "role": "member"}
    assert call("GET", "/accounts/physics/entries", "alice").status_code == 200
    assert call("GET", "/accounts/physics/entries", "admin").status_code == 200


def test_without_a_valid_token_the_api_answers_401(call: Caller) -> None:
    response = call("GET", "/accounts/physics/balance", None)
    assert response.status_code == 401
    assert error(response)["code"] == "unauthenticated"
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    forged = call("GET", "/accounts/physics/balance", None, headers=bearer("gpc_not-a-token"))
    assert forged.status_code == 401
    assert error(forged)["message"] == "invalid, expired or revoked token"


def test_a_revoked_token_is_refused(call: Caller) -> None:
    with call.ledger() as s:
        token, secret = api.create_token(s, "bob", "user")
    assert call("GET", "/prices", None, headers=bearer(secret)).status_code == 200
    with call.ledger() as s:
        api.revoke_token(s, token.id)
    response = call("GET", "/prices", None, headers=bearer(secret))
    assert response.status_code == 401
    assert error(response)["code"] == "unauthenticated"


def test_an_expired_token_is_refused(call: Caller, monkeypatch: pytest.MonkeyPatch) -> None:
    expires = utcnow() + timedelta(hours=1)
    with call.ledger() as s:
        _token, secret = api.create_token(s, "bob", "user", expires_at=expires)
    assert call("GET", "/prices", None, headers=bearer(secret)).status_code == 200
    monkeypatch.setattr("ledger.access.identity.utcnow", lambda: expires + timedelta(seconds=1))
    response = call("GET", "/prices", None, headers=bearer(secret))
    assert response.status_code == 401
    assert error(response)["code"] == "unauthenticated"


def test_a_browser_session_does_not_open_the_api(call: Caller, login_as: Any) -> None:
    login_as("alice")
    response = call("GET", "/accounts/physics/balance", None)
    assert response.status_code == 401
    assert "bearer token" in error(response)["message"]


def test_each_token_has_its_own_rate_limit(portal_db: str, site: Site) -> None:
    app = make_app(portal_db, portal={"api_rate_limit": "3 per minute"})
    caller = Caller(app.test_client(), site, portal_db)
    assert [caller("GET", "/prices", "alice").status_code for _ in range(4)] == [200, 200, 200, 429]
    refused = caller("GET", "/prices", "alice")
    assert error(refused)["code"] == "rate_limited"
    assert caller("GET", "/prices", "bob").status_code == 200


# -- holds --------------------------------------------------------------------------------


def test_a_service_reserves_and_settles_a_job(call_both: Caller) -> None:
    call = call_both
    job = {"account": "physics", "user": "alice", "job_id": 1004, "gpus": "h100:2", "seconds": 7200}
    reserved = call("POST", "/holds", "service", job)
    assert reserved.status_code == 201
    hold = reserved.get_json()
    assert {
        k: hold[k] for k in ("account", "user", "cluster", "job_id", "run", "state", "amount", "charged")
    } == {
        "account": "physics",
        "user": "alice",
        "cluster": "default",
        "job_id": 1004,
        "run": 0,
        "state": "active",
        "amount": "14.40",
        "charged": "0.00",
    }
    assert call.balance("physics") == ("85.60", "28.80")
    provisional = call("POST", f"/holds/{hold['id']}/usage", "service", {"elapsed": 600})
    assert (provisional.status_code, provisional.get_json()["charged"]) == (200, "1.20")
    settled = call("POST", f"/holds/{hold['id']}/settle", "service", {"elapsed": 1800})
    assert settled.status_code == 200
    assert (settled.get_json()["state"], settled.get_json()["charged"]) == ("settled", "3.60")
    assert call.balance("physics") == ("96.40", "14.40")


def test_a_hold_beyond_the_credit_is_refused_with_402_and_changes_nothing(call_both: Caller) -> None:
    call = call_both
    job = {"account": "physics", "user": "bob", "job_id": 1005, "gpus": "h100:4", "seconds": 360000}
    response = call("POST", "/holds", "service", job)
    assert response.status_code == 402
    assert error(response)["code"] == "insufficient_credits"
    assert error(response)["details"] == {"account": "physics", "needed": "1440.00", "available": "100.00"}
    assert call.balance("physics") == ("100.00", "14.40")
    assert call.hold_count("physics") == 3


def test_a_hold_past_a_limit_is_refused_with_429_naming_it(call: Caller) -> None:
    with call.ledger() as s:
        api.set_limits(s, "physics", user="alice", max_gpus=2)
    job = {"account": "physics", "user": "alice", "job_id": 1006, "gpus": "h100:2", "seconds": 3600}
    response = call("POST", "/holds", "admin", job)
    assert response.status_code == 429
    assert error(response)["code"] == "concurrent_gpus"
    assert error(response)["details"]["cap"] == 2
    assert call.hold_count("physics") == 3


def test_a_released_hold_returns_its_credit_and_resolves_once(call: Caller) -> None:
    with call.ledger() as s:
        running = api.list_holds(s, "physics", state="active")[0].id
    released = call("POST", f"/holds/{running}/release", "service")
    assert (released.status_code, released.get_json()["state"]) == (200, "released")
    assert call.balance("physics") == ("114.40", "0.00")
    again = call("POST", f"/holds/{running}/settle", "service", {"elapsed": 60})
    assert again.status_code == 409
    assert error(again)["code"] == "hold_resolved"
    assert call.balance("physics") == ("114.40", "0.00")


def test_an_unknown_hold_is_not_found(call: Caller) -> None:
    response = call("POST", "/holds/999/settle", "service", {"elapsed": 60})
    assert response.status_code == 404
    assert error(response) == {
        "code": "not_found",
        "message": "hold 999 does not exist",
        "details": {"hold_id": 999},
    }


def test_holds_are_listed_newest_first_for_the_accounts_a_user_sees(call: Caller) -> None:
    managed = call("GET", "/holds", "alice").get_json()
    assert [h["job_id"] for h in managed["items"]] == [1003, 1002, 1001]
    assert managed["next_cursor"] is None
    mine = call("GET", "/holds", "bob").get_json()  # a member: his own only
    assert [(h["job_id"], h["user"]) for h in mine["items"]] == [(1002, "bob")]
    assert call("GET", "/holds?account=physics", "bob").get_json()["items"] == mine["items"]
    everyone = call("GET", "/holds?state=settled", "service").get_json()
    assert [h["job_id"] for h in everyone["items"]] == [2001, 1002, 1001]
    with call.ledger() as s:
        _token, secret = api.create_token(s, "dave", "user")
    assert call("GET", "/holds", None, headers=bearer(secret)).get_json() == {
        "items": [],
        "next_cursor": None,
    }


def test_an_accounts_jobs_are_its_holds_newest_first(call: Caller) -> None:
    response = call("GET", "/accounts/physics/jobs", "alice")
    assert response.status_code == 200
    jobs = response.get_json()["items"]
    assert [(j["job_id"], j["user"], j["state"], j["charged"]) for j in jobs] == [
        (1003, "alice", "active", "0.00"),
        (1002, "bob", "settled", "2.00"),
        (1001, "alice", "settled", "3.60"),
    ]
    active = call("GET", "/accounts/physics/jobs?state=active", "alice").get_json()["items"]
    assert [j["job_id"] for j in active] == [1003]
    # A member sees his own jobs, as on the jobs page.
    bobs = call("GET", "/accounts/physics/jobs", "bob").get_json()["items"]
    assert [(j["job_id"], j["user"]) for j in bobs] == [(1002, "bob")]


# -- idempotency --------------------------------------------------------------------------


def test_a_repeated_hold_request_returns_the_first_hold_and_another_body_conflicts(call_both: Caller) -> None:
    call = call_both
    job = {"account": "physics", "user": "alice", "job_id": 1007, "gpus": "a100:1", "seconds": 3600}
    first = call("POST", "/holds", "service", job, key="prolog-1007")
    repeat = call("POST", "/holds", "service", job, key="prolog-1007")
    assert first.status_code == repeat.status_code == 201
    assert first.get_json() == repeat.get_json()
    conflict = call("POST", "/holds", "service", {**job, "seconds": 7200}, key="prolog-1007")
    assert conflict.status_code == 409
    assert error(conflict)["code"] == "idempotency_conflict"
    assert call.hold_count("physics") == 4
    assert call.balance("physics") == ("98.00", "16.40")


def test_a_repeated_admin_top_up_credits_once(call_both: Caller) -> None:
    call = call_both
    body = {"amount": "50", "reference": "invoice-7"}
    first = call("POST", "/accounts/physics/topups", "admin", body, key="invoice-7")
    repeat = call("POST", "/accounts/physics/topups", "admin", body, key="invoice-7")
    assert first.status_code == repeat.status_code == 201
    assert first.get_json() == repeat.get_json()
    assert first.get_json()["grant"]["amount"] == "50.00"
    assert first.get_json()["grant"]["reference"] == "invoice-7"
    conflict = call("POST", "/accounts/physics/topups", "admin", {"amount": "60"}, key="invoice-7")
    assert (conflict.status_code, error(conflict)["code"]) == (409, "idempotency_conflict")
    assert call.balance("physics") == ("150.00", "14.40")


@pytest.mark.parametrize("path", ["/accounts/physics/topups", "/accounts/physics/consume"])
def test_top_ups_and_consumption_need_an_idempotency_key(call: Caller, path: str) -> None:
    response = call("POST", path, "admin", {"amount": "5"})
    assert response.status_code == 422
    assert error(response)["code"] == "invalid_input"
    assert error(response)["details"]["field"] == "Idempotency-Key"
    assert call.balance("physics") == ("100.00", "14.40")


# -- top-ups, grants, consumption -------------------------------------------------------------


def test_an_admin_top_up_is_spendable_at_once(call: Caller) -> None:
    expires = format_time(call.site.now + timedelta(days=30))
    response = call(
        "POST", "/accounts/chemistry/topups", "admin", {"amount": "12.5", "expires_at": expires}, key="t-1"
    )
    assert response.status_code == 201
    grant = response.get_json()["grant"]
    assert (grant["source"], grant["amount"], grant["remaining"], grant["expires_at"]) == (
        "topup",
        "12.50",
        "12.50",
        expires,
    )
    assert call.balance("chemistry") == ("51.50", "0.00")


def test_a_member_top_up_opens_a_pending_payment_and_credits_nothing_yet(call: Caller) -> None:
    response = call("POST", "/accounts/physics/topups", "bob", {"amount": "10"}, key="buy-1")
    assert response.status_code == 201
    started = response.get_json()
    payment = started["payment"]
    assert (payment["account"], payment["amount"], payment["state"], payment["provider"]) == (
        "physics",
        "10.00",
        "pending",
        "manual",
    )
    assert (payment["requested_by"], started["checkout_url"]) == ("bob", None)
    repeat = call("POST", "/accounts/physics/topups", "bob", {"amount": "10"}, key="buy-1")
    assert repeat.get_json()["payment"]["id"] == payment["id"]
    assert call.balance("physics") == ("100.00", "14.40")
    with call.ledger() as s:
        assert [p["id"] for p in api.list_payments(s, account="physics")] == [payment["id"]]


def test_only_an_admin_dates_or_references_a_top_up(call: Caller) -> None:
    response = call(
        "POST", "/accounts/physics/topups", "alice", {"amount": "10", "reference": "mine"}, key="t-2"
    )
    assert response.status_code == 403
    assert error(response)["details"] == {"fields": ["reference"]}
    with call.ledger() as s:
        assert api.list_payments(s) == []


def test_an_admin_grants_time_windowed_credit(call: Caller) -> None:
    starts = call.site.now + timedelta(days=1)
    body = {
        "amount": "30",
        "effective_at": format_time(starts),
        "expires_at": format_time(starts + timedelta(days=7)),
        "priority": 5,
    }
    response = call("POST", "/accounts/chemistry/grants", "admin", body)
    assert response.status_code == 201
    grant = response.get_json()["grant"]
    assert (grant["source"], grant["amount"], grant["priority"]) == ("grant", "30.00", 5)
    assert call.balance("chemistry") == ("39.00", "0.00")
    later = call("GET", f"/accounts/chemistry/balance?at={format_time(starts + timedelta(hours=1))}", "carol")
    assert later.get_json()["available"] == "69.00"


def test_a_service_consumes_credit_directly_or_not_at_all(call_both: Caller) -> None:
    call = call_both
    response = call(
        "POST", "/accounts/chemistry/consume", "service", {"amount": "5", "user": "carol"}, key="c-1"
    )
    assert response.status_code == 201
    assert (response.get_json()["account"], response.get_json()["charged"]) == ("chemistry", "5.00")
    assert call.balance("chemistry") == ("34.00", "0.00")
    refused = call("POST", "/accounts/chemistry/consume", "service", {"amount": "35"}, key="c-2")
    assert refused.status_code == 402
    assert error(refused)["details"] == {"account": "chemistry", "needed": "35.00", "available": "34.00"}
    assert call.balance("chemistry") == ("34.00", "0.00")


# -- bad input ------------------------------------------------------------------------------


BAD_TOP_UPS = [
    ({"amount": 10}, "amount", "invalid_input"),
    ({"amount": "1.1234567"}, "amount", "invalid_input"),
    ({"amount": "-5"}, "amount", "invalid_input"),
    ({"amount": "0"}, "amount", "invalid_amount"),
    ({"amount": "5", "colour": "red"}, "colour", "invalid_input"),
    ({"amount": "5", "expires_at": "soon"}, "expires_at", "invalid_time"),
    ({}, "amount", "invalid_input"),
    ([], "body", "invalid_input"),
]


def test_a_bad_top_up_is_a_422_naming_the_field_and_changes_nothing(call: Caller) -> None:
    for body, field, code in BAD_TOP_UPS:
        response = call("POST", "/accounts/physics/topups", "admin", body, key="bad")
        assert response.status_code == 422, body
        assert (error(response)["code"], error(response)["details"].get("field")) == (code, field)
    assert call.balance("physics") == ("100.00", "14.40")


BAD_HOLDS: list[tuple[dict[str, Any], str]] = [
    ({"job_id": "1008"}, "job_id"),
    ({"job_id": 0}, "job_id"),
    ({"job_id": True}, "job_id"),
    ({"seconds": -1}, "seconds"),
    ({"gpus": "h100"}, "gpus"),
    ({"user": "../etc"}, "user"),
    ({"run": 1.5}, "run"),
]


def test_a_bad_hold_request_is_a_422_and_reserves_nothing(call: Caller) -> None:
    for change, field in BAD_HOLDS:
        job = {
            "account": "physics",
            "user": "alice",
            "job_id": 1008,
            "gpus": "h100:1",
            "seconds": 60,
            **change,
        }
        response = call("POST", "/holds", "service", job)
        assert response.status_code == 422, change
        assert error(response)["details"]["field"] == field
    assert call.hold_count("physics") == 3


def test_a_body_that_is_not_json_is_a_422(call: Caller) -> None:
    response = call.client.post(
        V1 + "/holds",
        data="{not json",
        headers={**bearer(call.site.tokens["service"])},
        content_type="application/json",
    )
    assert response.status_code == 422
    assert error(response)["details"]["field"] == "body"


def test_an_unpriced_gpu_type_is_a_422_unknown_gres(call: Caller) -> None:
    job = {"account": "physics", "user": "alice", "job_id": 1009, "gpus": "v100:1", "seconds": 60}
    response = call("POST", "/holds", "service", job)
    assert response.status_code == 422
    assert error(response)["code"] == "unknown_gres"


# -- quotes and prices ----------------------------------------------------------------------


def test_a_quote_prices_a_job_without_reserving(call: Caller) -> None:
    for time in ("02:00:00", "0-02:00:00", 7200, "7200"):
        response = call("POST", "/quotes", "bob", {"account": "physics", "gpus": "h100:2", "time": time})
        assert response.status_code == 200, time
        quote = response.get_json()
        assert (quote["cost"], quote["available"], quote["affordable"], quote["seconds"]) == (
            "14.40",
            "100.00",
            True,
            7200,
        )
        assert quote["prices"] == {"h100": "3.60"}
    assert call.hold_count("physics") == 3


def test_a_service_quotes_any_account_and_a_bad_time_is_refused(call: Caller) -> None:
    response = call(
        "POST", "/quotes", "service", {"account": "chemistry", "gpus": "a100:2", "time": "1-00:00:00"}
    )
    assert (response.status_code, response.get_json()["cost"], response.get_json()["affordable"]) == (
        200,
        "96.00",
        False,
    )
    bad = call("POST", "/quotes", "service", {"account": "chemistry", "gpus": "a100:2", "time": "2h"})
    assert (bad.status_code, error(bad)["details"]["field"]) == (422, "time")


def test_prices_are_listed_to_any_token_and_set_by_an_admin(call: Caller) -> None:
    listed = call("GET", "/prices", "service").get_json()["items"]
    assert [(p["gres"], p["partition"], p["credits_per_gpu_hour"]) for p in listed] == [
        ("a100", None, "2.00"),
        ("h100", None, "3.60"),
    ]
    response = call("PUT", "/prices/h100", "admin", {"credits_per_gpu_hour": "4.00"})
    assert response.status_code == 201
    assert (response.get_json()["gres"], response.get_json()["credits_per_gpu_hour"]) == ("h100", "4.00")
    quote = call("POST", "/quotes", "bob", {"account": "physics", "gpus": "h100:1", "time": 3600}).get_json()
    assert quote["cost"] == "4.00"
    bad = call("PUT", "/prices/h%20100", "admin", {"credits_per_gpu_hour": "4.00"})
    assert (bad.status_code, error(bad)["code"]) == (422, "invalid_gpus")


# -- lists and reports ----------------------------------------------------------------------


def test_accounts_are_listed_with_the_callers_role(call: Caller) -> None:
    assert call("GET", "/accounts", "alice").get_json() == {
        "items": [{"account": "physics", "role": "manager"}],
        "next_cursor": None,
    }
    assert call("GET", "/accounts", "admin").get_json()["items"] == [
        {"account": "chemistry", "role": "admin"},
        {"account": "physics", "role": "admin"},
    ]


def test_usage_is_reported_as_json_and_as_csv_with_the_same_figures(call: Caller) -> None:
    by_gres = call("GET", "/accounts/physics/usage?group_by=gres", "alice").get_json()
    assert by_gres == {
        "items": [
            {"gres": "a100", "charged": "2.00", "gpu_seconds": 3600, "jobs": 1},
            {"gres": "h100", "charged": "3.60", "gpu_seconds": 3600, "jobs": 1},
        ],
        "next_cursor": None,
    }
    as_csv = call("GET", "/accounts/physics/usage?group_by=gres&format=csv", "alice")
    assert as_csv.status_code == 200
    assert as_csv.mimetype == "text/csv"
    assert (
        as_csv.get_data(as_text=True) == "gres,charged,gpu_seconds,jobs\na100,2.00,3600,1\nh100,3.60,3600,1\n"
    )
    by_accept = call("GET", "/accounts/physics/usage?group_by=user", "alice", headers={"Accept": "text/csv"})
    assert (
        by_accept.get_data(as_text=True)
        == "user,charged,gpu_seconds,jobs\nalice,3.60,3600,1\nbob,2.00,3600,1\n"
    )
    # A member's usage is his own, in JSON and in CSV, however it is grouped.
    bobs = call("GET", "/accounts/physics/usage?group_by=user&format=csv", "bob").get_data(as_text=True)
    assert bobs == "user,charged,gpu_seconds,jobs\nbob,2.00,3600,1\n"
    assert call("GET", "/accounts/physics/usage?group_by=gres", "bob").get_json()["items"] == [
        {"gres": "a100", "charged": "2.00", "gpu_seconds": 3600, "jobs": 1}
    ]


def test_usage_in_a_window_counts_only_charges_in_it(call: Caller) -> None:
    start = call.site.start
    window = f"from={format_time(start + timedelta(hours=4))}&to={format_time(start + timedelta(hours=12))}"
    rows = call("GET", f"/accounts/physics/usage?group_by=user&{window}", "alice").get_json()["items"]
    assert rows == [{"user": "bob", "charged": "2.00", "gpu_seconds": 3600, "jobs": 1}]
    reversed_window = f"from={format_time(start)}&to={format_time(start - timedelta(days=1))}"
    backwards = call("GET", f"/accounts/physics/usage?{reversed_window}", "alice")
    assert (backwards.status_code, error(backwards)["code"]) == (422, "invalid_time")


def test_the_journal_shows_each_entry_with_postings_that_sum_to_zero(call: Caller) -> None:
    entries = call("GET", "/accounts/chemistry/entries", "carol").get_json()["items"]
    assert [e["kind"] for e in entries] == ["settle", "hold", "topup"]
    topup = entries[-1]
    assert topup["memo"] == {"reference": "invoice-2"}
    assert sorted((p["account"], p["bucket"], p["amount"]) for p in topup["postings"]) == [
        ("chemistry", "available", "40.00"),
        ("system:payments", "system", "-40.00"),
    ]
    for entry in entries:
        assert sum(Decimal(p["amount"]) for p in entry["postings"]) == 0


@pytest.mark.parametrize(
    ("who", "path"),
    [
        ("alice", "/accounts/physics/entries"),
        ("admin", "/holds"),
        ("alice", "/accounts/physics/jobs"),
        ("service", "/prices"),
        ("admin", "/accounts"),
        ("alice", "/accounts/physics/usage?group_by=user"),
    ],
)
def test_a_walk_through_the_pages_sees_every_item_exactly_once(
    call_both: Caller, who: str, path: str
) -> None:
    call = call_both
    whole = call("GET", f"{path}{'&' if '?' in path else '?'}limit=500", who).get_json()
    assert whole["next_cursor"] is None and len(whole["items"]) >= 2
    seen: list[Any] = []
    cursor = None
    for _ in range(len(whole["items"]) + 1):
        page_path = f"{path}{'&' if '?' in path else '?'}limit=1" + (f"&cursor={cursor}" if cursor else "")
        page = call("GET", page_path, who).get_json()
        assert len(page["items"]) == 1
        seen += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == whole["items"]


def test_a_bad_page_request_or_an_unknown_parameter_is_a_422(call: Caller) -> None:
    for query in ("limit=0", "limit=501", "limit=ten", "cursor=abc", "cursor=-1", "limt=5"):
        response = call("GET", f"/holds?{query}", "admin")
        assert response.status_code == 422, query
        assert error(response)["details"]["field"] == query.split("=")[0]


def test_the_page_size_defaults_to_the_portal_setting(portal_db: str, site: Site) -> None:
    app = make_app(portal_db, portal={"page_size": 2})
    page = Caller(app.test_client(), site, portal_db)("GET", "/holds", "admin").get_json()
    assert len(page["items"]) == 2 and page["next_cursor"] is not None


def test_the_open_ondemand_document_shows_a_user_their_own_rows(call: Caller) -> None:
    mine = call("GET", "/ood/balance.json", "bob").get_json()
    assert mine["version"] == 1
    assert mine["balances"] == [{"user": "bob", "project": "physics", "value": 100}]
    everyone = call("GET", "/ood/balance.json", "admin").get_json()["balances"]
    assert sorted((r["user"], r["project"], r["value"]) for r in everyone) == [
        ("alice", "physics", 100),
        ("bob", "physics", 100),
        ("carol", "chemistry", 39),
    ]


# -- the document ---------------------------------------------------------------------------


def test_the_openapi_document_lists_exactly_the_operations_served(app: Flask, call: Caller) -> None:
    response = call("GET", "/openapi.json", None)
    assert response.status_code == 200
    document = response.get_json()
    documented = {(method, path) for path, operations in document["paths"].items() for method in operations}
    served = {
        (method.lower(), rule.rule)
        for rule in app.url_map.iter_rules()
        if rule.rule.startswith(V1)
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }
    assert documented == {
        (method, re.sub(r"<(?:[^>]*:)?([^>:]+)>", r"{\1}", rule)) for method, rule in served
    }
    assert ("post", V1 + "/payments/stripe/webhook") in documented
    assert document["paths"][V1 + "/holds"]["post"]["responses"].keys() >= {"201", "402", "429", "422", "409"}


def test_the_api_takes_no_csrf_token_and_sends_no_cookie(call: Caller) -> None:
    job = {"account": "physics", "user": "alice", "job_id": 1010, "gpus": "a100:1", "seconds": 60}
    response = call("POST", "/holds", "service", job)
    assert response.status_code == 201
    assert "Set-Cookie" not in response.headers
    assert response.headers["Cache-Control"] == "no-store"


def test_an_error_body_is_json_even_for_an_unknown_route(call: Caller) -> None:
    response = call("GET", "/nothing-here", "alice")
    assert response.status_code == 404
    assert error(response)["code"] == "not_found"
    assert json.loads(response.get_data(as_text=True))["error"]["details"] == {}
