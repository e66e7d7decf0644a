"""Buying credit through the portal: invoices an admin marks paid, Stripe checkouts
paid by signed webhooks, replays that credit nothing, and who may do what.

The seeded site: physics has 100.00 available (alice manager, bob member), chemistry
39.00 (carol); dave belongs to no account. Stripe is tests/support/fake_stripe.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from ledger import api
from ledger.errors import InvalidInput
from portal.payments import start_topup
from portal.store import transaction
from tests.support.fake_stripe import FakeStripe, StripeRefusal, event, signature
from tests.support.portal import csrf_token, logged_in, make_app

WEBHOOK = "/api/v1/payments/stripe/webhook"
WEBHOOK_SECRET = "whsec_test_portal"


def available(app: Flask, account: str = "physics") -> str:
    with app.app_context(), transaction() as s:
        return str(api.balance(s, account)["available"])


def payments(app: Flask, account: str = "physics") -> list[dict[str, Any]]:
    with app.app_context(), transaction() as s:
        return api.list_payments(s, account=account)


def user_client(app: Flask, user: str) -> FlaskClient:
    return logged_in(app.test_client(), user)


def request_topup(client: FlaskClient, account: str, amount: str, **fields: str) -> Any:
    path = f"/accounts/{account}/topup"
    form = {"amount": amount, "csrf_token": csrf_token(client, path), "idempotency_key": "k-" + amount}
    return client.post(path, data={**form, **fields})


# --- manual invoices --------------------------------------------------------------


def test_an_invoice_is_not_spendable_until_an_admin_marks_it_paid(app: Flask) -> None:
    alice = user_client(app, "alice")
    response = request_topup(alice, "physics", "25")
    assert response.status_code == 303
    page = alice.get(response.headers["Location"]).get_data(as_text=True)
    (invoice,) = payments(app)
    assert f"Invoice #{invoice['id']} for 25.00 credits is pending" in page
    assert (invoice["state"], invoice["provider"], invoice["requested_by"]) == ("pending", "manual", "alice")
    assert available(app) == "100.00"

    admin = user_client(app, "admin")
    listing = admin.get("/admin/payments").get_data(as_text=True)
    assert f'data-payment="{invoice["id"]}"' in listing
    mark = admin.post(
        f"/admin/payments/{invoice['id']}/paid",
        data={"csrf_token": csrf_token(admin, "/admin/payments"), "idempotency_key": "click-1"},
    )
    assert mark.status_code == 303
    assert available(app) == "125.00"
    assert payments(app)[0]["state"] == "paid"
    assert "25.00 credits added to physics" in admin.get("/admin/payments").get_data(as_text=True)

    again = admin.post(
        f"/admin/payments/{invoice['id']}/paid",
        data={"csrf_token": csrf_token(admin, "/admin/payments"), "idempotency_key": "click-2"},
    )
    assert again.status_code == 303
    assert "already paid; nothing more was credited" in admin.get("/admin/payments").get_data(as_text=True)
    assert available(app) == "125.00"
    paid_page = alice.get(f"/accounts/physics/payments/{invoice['id']}").get_data(as_text=True)
    assert "which now has 125.00 credits available" in paid_page


def test_a_cancelled_invoice_credits_nothing_and_cannot_be_paid(app: Flask) -> None:
    alice = user_client(app, "alice")
    request_topup(alice, "physics", "30")
    (invoice,) = payments(app)
    admin = user_client(app, "admin")
    token = csrf_token(admin, "/admin/payments")
    admin.post(f"/admin/payments/{invoice['id']}/cancel", data={"csrf_token": token, "idempotency_key": "c"})
    admin.post(f"/admin/payments/{invoice['id']}/paid", data={"csrf_token": token, "idempotency_key": "p"})
    assert "is cancelled" in admin.get("/admin/payments").get_data(as_text=True)
    assert payments(app)[0]["state"] == "cancelled"
    assert available(app) == "100.00"


def test_start_topup_replays_one_key_and_refuses_a_fraction_of_a_cent(app: Flask) -> None:
    with app.test_request_context():
        first = start_topup(
            account="physics", amount="12.5", requested_by="bob", idempotency_key="api-1", return_url=None
        )
        again = start_topup(
            account="physics", amount="12.5", requested_by="bob", idempotency_key="api-1", return_url=None
        )
    assert first == again
    assert first["checkout_url"] is None
    assert (first["payment"]["amount"], first["payment"]["state"]) == ("12.50", "pending")
    with app.test_request_context(), pytest.raises(InvalidInput) as refused:
        start_topup(
            account="physics", amount="0.001", requested_by="bob", idempotency_key=None, return_url=None
        )
    assert refused.value.code == "invalid_amount"
    assert len(payments(app)) == 1


# --- who may do what ------------------------------------------------------------


def test_a_member_may_top_up_and_others_see_no_such_account(app: Flask) -> None:
    bob = user_client(app, "bob")
    assert request_topup(bob, "physics", "5").status_code == 303
    assert payments(app)[0]["requested_by"] == "bob"
    dave = user_client(app, "dave")
    assert dave.get("/accounts/physics/topup").status_code == 404
    carol = user_client(app, "carol")
    assert carol.get("/accounts/physics/topup").status_code == 404
    assert carol.get(f"/accounts/physics/payments/{payments(app)[0]['id']}").status_code == 404
    assert carol.get(f"/accounts/chemistry/payments/{payments(app)[0]['id']}").status_code == 404
    assert len(payments(app)) == 1


def test_the_payments_admin_page_is_for_admins_only(app: Flask) -> None:
    alice = user_client(app, "alice")
    request_topup(alice, "physics", "25")
    (invoice,) = payments(app)
    assert alice.get("/admin/payments").status_code == 404
    token = csrf_token(alice, "/accounts/physics/topup")
    forged = alice.post(f"/admin/payments/{invoice['id']}/paid", data={"csrf_token": token})
    assert forged.status_code == 404
    assert available(app) == "100.00"
    assert app.test_client().get("/admin/payments").status_code == 302  # to the login page


def test_the_topup_form_needs_its_csrf_token(app: Flask) -> None:
    alice = user_client(app, "alice")
    response = alice.post("/accounts/physics/topup", data={"amount": "25", "idempotency_key": "x"})
    assert response.status_code == 400
    assert payments(app) == []


def test_a_bad_amount_is_shown_on_the_form_and_opens_nothing(app: Flask) -> None:
    alice = user_client(app, "alice")
    for amount, message in (("-5", "must not be negative"), ("lots", "is not a decimal number")):
        response = request_topup(alice, "physics", amount)
        assert response.status_code == 422
        assert message in response.get_data(as_text=True)
    assert payments(app) == []


def test_a_double_submitted_form_opens_one_invoice(app: Flask) -> None:
    alice = user_client(app, "alice")
    first = request_topup(alice, "physics", "25", idempotency_key="same")
    second = request_topup(alice, "physics", "25", idempotency_key="same")
    assert first.headers["Location"] == second.headers["Location"]
    assert len(payments(app)) == 1


def test_without_a_webhook_secret_there_is_no_webhook(app: Flask) -> None:
    response = app.test_client().post(WEBHOOK, data=b"{}", headers={"Stripe-Signature": "t=1,v1=0"})
    assert response.status_code == 404


# --- Stripe -------------------------------------------------------------------------


@pytest.fixture
def fake_stripe() -> Iterator[FakeStripe]:
    with FakeStripe().running() as fake:
        yield fake


@pytest.fixture
def stripe_app(portal_db: str, site: Any, fake_stripe: FakeStripe) -> Flask:
    return make_app(
        portal_db,
        payments={
            "provider": "stripe",
            "currency": "usd",
            "unit_amount_cents": 100,
            "stripe": {
                "secret_key": fake_stripe.secret_key,
                "webhook_secret": WEBHOOK_SECRET,
                "api_base": fake_stripe.api_base,
            },
        },
    )


def checkout(app: Flask, fake: FakeStripe, user: str = "alice", amount: str = "50") -> dict[str, Any]:
    """`user` starts a top-up and is sent to Stripe; the session as Stripe then holds it."""
    response = request_topup(user_client(app, user), "physics", amount)
    assert response.status_code == 303
    session_id = re.fullmatch(
        r"https://checkout\.stripe\.com/c/pay/(cs_test_\w+)", response.headers["Location"]
    )
    assert session_id, response.headers["Location"]
    return fake.sessions[session_id.group(1)]


def deliver(app: Flask, payload: bytes, *, secret: str = WEBHOOK_SECRET, timestamp: int | None = None) -> Any:
    header = signature(payload, secret, timestamp=timestamp)
    return app.test_client().post(
        WEBHOOK, data=payload, headers={"Stripe-Signature": header, "Content-Type": "application/json"}
    )


def test_a_checkout_paid_through_stripe_credits_once(stripe_app: Flask, fake_stripe: FakeStripe) -> None:
    session = checkout(stripe_app, fake_stripe)
    (payment,) = payments(stripe_app)
    assert (payment["state"], payment["external_id"]) == ("pending", session["id"])
    (params,) = fake_stripe.created
    assert params["line_items"][0]["price_data"]["unit_amount"] == "5000"
    assert params["line_items"][0]["price_data"]["currency"] == "usd"
    assert params["client_reference_id"] == str(payment["id"])
    assert params["metadata"] == {"payment_id": str(payment["id"]), "account": "physics"}
    assert params["success_url"].endswith(f"/accounts/physics/payments/{payment['id']}?checkout=success")
    assert available(stripe_app) == "100.00"

    paid = event("checkout.session.completed", fake_stripe.finish(session["id"]), event_id="evt_paid_1")
    response = deliver(stripe_app, paid)
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["duplicate"] is False
    assert available(stripe_app) == "150.00"
    assert payments(stripe_app)[0]["state"] == "paid"

    replay = deliver(stripe_app, paid)
    assert replay.status_code == 200
    assert replay.get_json()["received"] is True
    assert replay.get_json()["duplicate"] is True
    assert available(stripe_app) == "150.00"

    alice = user_client(stripe_app, "alice")
    page = alice.get(f"/accounts/physics/payments/{payment['id']}?checkout=success").get_data(as_text=True)
    assert "Paid: 50.00 credits were added to physics" in page


def test_the_success_page_waits_for_stripe(stripe_app: Flask, fake_stripe: FakeStripe) -> None:
    checkout(stripe_app, fake_stripe)
    (payment,) = payments(stripe_app)
    page = user_client(stripe_app, "bob").get(f"/accounts/physics/payments/{payment['id']}?checkout=success")
    assert "Waiting for Stripe to confirm the payment of 50.00 credits" in page.get_data(as_text=True)


BAD_SESSION_FIELDS: dict[str, dict[str, Any]] = {
    "negative amount": {"amount_total": -5000},
    "amount not what was bought": {"amount_total": 50000},
    "another currency": {"currency": "eur"},
    "names another payment": {"client_reference_id": "999"},
}


def _old() -> int:
    return int(time.time()) - 3600


@pytest.mark.parametrize(
    ("case", "status", "code"),
    [
        ("wrong secret", 400, "invalid_signature"),
        ("old timestamp", 400, "invalid_signature"),
        ("no signature", 400, "invalid_signature"),
        ("negative amount", 400, "invalid_event"),
        ("amount not what was bought", 422, "invalid_amount"),
        ("another currency", 422, "invalid_currency"),
        ("names another payment", 422, "payment_mismatch"),
    ],
)
def test_a_webhook_that_does_not_check_out_credits_nothing(
    stripe_app: Flask, fake_stripe: FakeStripe, case: str, status: int, code: str
) -> None:
    session = fake_stripe.finish(checkout(stripe_app, fake_stripe)["id"])
    changes = BAD_SESSION_FIELDS.get(case, {})
    payload = event("checkout.session.completed", session, **changes)
    if case == "no signature":
        response = stripe_app.test_client().post(WEBHOOK, data=payload)
    else:
        response = deliver(
            stripe_app,
            payload,
            secret="whsec_someone_else" if case == "wrong secret" else WEBHOOK_SECRET,
            timestamp=_old() if case == "old timestamp" else None,
        )
    assert response.status_code == status, response.get_json()
    assert response.get_json()["error"]["code"] == code
    assert available(stripe_app) == "100.00"
    assert payments(stripe_app)[0]["state"] == "pending"


def test_a_rejected_delivery_does_not_burn_the_event_id(stripe_app: Flask, fake_stripe: FakeStripe) -> None:
    """Stripe retries a delivery that failed; the retry of a genuine event must pay."""
    session = fake_stripe.finish(checkout(stripe_app, fake_stripe)["id"])
    payload = event("checkout.session.completed", session, event_id="evt_retried")
    assert deliver(stripe_app, payload, timestamp=_old()).status_code == 400
    assert deliver(stripe_app, payload).status_code == 200
    assert available(stripe_app) == "150.00"


def test_an_expired_checkout_cancels_its_payment(stripe_app: Flask, fake_stripe: FakeStripe) -> None:
    session = checkout(stripe_app, fake_stripe)
    expired = fake_stripe.finish(session["id"], payment_status="unpaid", status="expired")
    assert deliver(stripe_app, event("checkout.session.expired", expired)).status_code == 200
    assert payments(stripe_app)[0]["state"] == "cancelled"
    late = deliver(stripe_app, event("checkout.session.completed", {**expired, "payment_status": "paid"}))
    assert late.status_code == 409
    assert available(stripe_app) == "100.00"


def test_a_delayed_payment_is_credited_when_it_succeeds(stripe_app: Flask, fake_stripe: FakeStripe) -> None:
    session = checkout(stripe_app, fake_stripe, user="bob", amount="20.25")
    completed = fake_stripe.finish(session["id"], payment_status="unpaid")
    waiting = deliver(stripe_app, event("checkout.session.completed", completed))
    assert waiting.get_json() == {"received": True, "ignored": "checkout.session.completed"}
    assert available(stripe_app) == "100.00"
    succeeded = fake_stripe.finish(session["id"], payment_status="paid")
    assert (
        deliver(stripe_app, event("checkout.session.async_payment_succeeded", succeeded)).status_code == 200
    )
    assert available(stripe_app) == "120.25"


def test_events_this_portal_did_not_ask_for_are_ignored(stripe_app: Flask, fake_stripe: FakeStripe) -> None:
    session = fake_stripe.finish(checkout(stripe_app, fake_stripe)["id"])
    other = deliver(stripe_app, event("payment_intent.succeeded", {"id": "pi_1", "amount": 5000}))
    assert other.get_json() == {"received": True, "ignored": "payment_intent.succeeded"}
    foreign = deliver(stripe_app, event("checkout.session.completed", {**session, "id": "cs_test_elsewhere"}))
    assert foreign.get_json() == {"received": True, "ignored": "unknown checkout session"}
    assert available(stripe_app) == "100.00"


def test_a_double_submitted_checkout_opens_one_session(stripe_app: Flask, fake_stripe: FakeStripe) -> None:
    alice = user_client(stripe_app, "alice")
    first = request_topup(alice, "physics", "50", idempotency_key="once")
    second = request_topup(alice, "physics", "50", idempotency_key="once")
    assert first.headers["Location"] == second.headers["Location"]
    assert len(fake_stripe.created) == 1
    assert len(payments(stripe_app)) == 1


def test_stripe_refusing_the_checkout_opens_nothing(stripe_app: Flask, fake_stripe: FakeStripe) -> None:
    fake_stripe.refuse_next = StripeRefusal(400, "Amount must convert to at least 50 cents.")
    response = request_topup(user_client(stripe_app, "alice"), "physics", "0.10")
    assert response.status_code == 502
    assert "Amount must convert to at least 50 cents." in response.get_data(as_text=True)
    assert [p["state"] for p in payments(stripe_app)] == ["cancelled"]  # nobody can pay it
    assert available(stripe_app) == "100.00"


def test_admins_leave_stripe_payments_to_stripe(stripe_app: Flask, fake_stripe: FakeStripe) -> None:
    checkout(stripe_app, fake_stripe)
    (payment,) = payments(stripe_app)
    admin = user_client(stripe_app, "admin")
    admin.post(
        f"/admin/payments/{payment['id']}/paid",
        data={"csrf_token": csrf_token(admin, "/admin/payments"), "idempotency_key": "k"},
    )
    assert "its events resolve it" in admin.get("/admin/payments").get_data(as_text=True)
    assert available(stripe_app) == "100.00"


def test_the_webhook_is_in_the_openapi_document(app: Flask) -> None:
    document = app.test_client().get("/api/v1/openapi.json").get_json()
    operation = document["paths"]["/api/v1/payments/stripe/webhook"]["post"]
    assert operation["security"] == []  # no token: the signature authenticates
    assert {"200", "400", "404", "409", "422"} <= set(operation["responses"])
    assert "Stripe-Signature" in operation["description"]


def test_a_checkout_retried_after_a_crash_is_the_same_stripe_session(
    stripe_app: Flask, fake_stripe: FakeStripe
) -> None:
    """The session is created outside the ledger's transaction; if the portal dies before
    it names the session on the payment, the retry must not open a second one."""
    from portal.payments import payment_page_url
    from portal.payments.providers import payment_settings
    from portal.payments.registry import provider_for

    with stripe_app.test_request_context():
        started = start_topup(
            account="physics", amount="20", requested_by="alice", idempotency_key="k1", return_url=None
        )
        with transaction() as s:
            unnamed = {**api.get_payment(s, started["payment"]["id"]), "external_id": None}
        stripe = provider_for("stripe", payment_settings(stripe_app))
        back = payment_page_url(unnamed)  # the same request the first attempt sent
        again = stripe.start(
            unnamed, success_url=f"{back}?checkout=success", cancel_url=f"{back}?checkout=cancelled"
        )
    assert again.external_id == started["payment"]["external_id"]
    assert len(fake_stripe.created) == 1
