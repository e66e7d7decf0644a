"""POST /api/v1/payments/stripe/webhook: Stripe says a checkout was paid or ended.

No token and no CSRF token: the Stripe-Signature header (an HMAC of the timestamp and
the body under `payments.stripe.webhook_secret`) is the authentication, and a
timestamp older than `payments.stripe.tolerance_seconds` is refused, so a captured
delivery cannot be replayed later. Within the window a replay is recognised by the
event's id, recorded once by `ledger.api.mark_paid`, and credits nothing.

What an event does (`decide`):

    event type                                  payment_status   action
    checkout.session.completed                  paid             pay
    checkout.session.completed                  other            ignore (an async method is
                                                                 still settling; its own event follows)
    checkout.session.async_payment_succeeded    any              pay
    checkout.session.expired                    any              cancel
    checkout.session.async_payment_failed       any              cancel
    anything else                               -                ignore

"pay" credits the payment whose Checkout Session the event names, and only when
Stripe's `amount_total` (in the currency's smallest unit) buys exactly the credit the
payment was opened for, in the configured currency. A session this portal did not
create (another application on the same Stripe account) is ignored.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Flask, current_app, jsonify, request

from ledger import api
from ledger.errors import InvalidInput, NotFound
from portal.api.registry import Call, endpoint
from portal.api.schemas import obj, ref
from portal.payments.providers import PaymentSettings, payment_settings
from portal.payments.stripe_provider import InvalidEvent, StripeProvider
from portal.security import csrf
from portal.store import transaction

log = logging.getLogger("gpucredit.portal.payments")
bp = Blueprint("payments_webhook", __name__)
PAYING = {"checkout.session.async_payment_succeeded"}
CANCELLING = {"checkout.session.expired", "checkout.session.async_payment_failed"}
WEBHOOK_REPLY = obj(
    ["received"],
    {
        "received": {"type": "boolean"},
        "duplicate": {"type": "boolean", "description": "a replayed event: nothing more was credited"},
        "ignored": {"type": "string", "description": "why the event changed nothing"},
        "payment": ref("Payment"),
    },
)


def init_app(app: Flask) -> None:
    csrf.exempt(bp)
    app.register_blueprint(bp)


def decide(event_type: str, payment_status: str | None) -> str:
    """'pay', 'cancel' or 'ignore': the table in this module's docstring."""
    if event_type == "checkout.session.completed":
        return "pay" if payment_status == "paid" else "ignore"
    if event_type in PAYING:
        return "pay"
    if event_type in CANCELLING:
        return "cancel"
    return "ignore"


@endpoint(
    "POST",
    "/payments/stripe/webhook",
    tag="payments",
    summary="Receive a Stripe event",
    roles=(),
    raw_body=True,
    responses={200: WEBHOOK_REPLY},
    errors=(400, 404, 409, 422),
    blueprint=bp,
)
def stripe_webhook(call: Call) -> Any:
    """Stripe's checkout events, authenticated by the `Stripe-Signature` header (no
    token): a missing or wrong signature, or one older than the tolerance, is a 400
    `invalid_signature`. A paid checkout credits its payment once; a replayed event
    answers `duplicate: true` and credits nothing; an amount or currency that does
    not match what was bought is a 422 and credits nothing."""
    settings = payment_settings(current_app)
    if not settings.stripe.webhook_secret:
        raise NotFound("Stripe payments are not configured on this portal")
    event = StripeProvider(settings).verify(request.get_data(), request.headers.get("Stripe-Signature"))
    event_id, event_type, session = _parts(event)
    action = decide(event_type, session.get("payment_status"))
    if action == "ignore":
        return jsonify(received=True, ignored=event_type)
    with transaction() as s:
        payment = api.find_payment(s, "stripe", str(session.get("id")))
        if payment is None:
            log.info("event %s: checkout session %s is not one of ours", event_id, session.get("id"))
            return jsonify(received=True, ignored="unknown checkout session")
        _check_names(session, payment)
        if action == "cancel":
            payment = api.cancel_payment(s, payment["id"], event_id=event_id)
            return jsonify(received=True, payment=payment)
        result = api.mark_paid(
            s, payment["id"], event_id=event_id, expected_ucredits=_paid_ucredits(session, settings)
        )
    if result["credited"]:
        log.info("event %s: payment %s paid, %s credits", event_id, payment["id"], payment["amount"])
    return jsonify(received=True, payment=result["payment"], duplicate=not result["credited"])


def _parts(event: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    event_id, event_type = event.get("id"), event.get("type")
    session = (event.get("data") or {}).get("object")
    if not isinstance(event_id, str) or not event_id or not isinstance(event_type, str):
        raise InvalidEvent("the event has no id or type")
    if not isinstance(session, dict):
        raise InvalidEvent(f"event {event_id} carries no object")
    return event_id, event_type, session


def _check_names(session: dict[str, Any], payment: dict[str, Any]) -> None:
    """The session's own references must name the payment it was created for."""
    metadata = session.get("metadata") or {}
    named = {
        "client_reference_id": session.get("client_reference_id"),
        "metadata.payment_id": metadata.get("payment_id"),
    }
    for field, value in named.items():
        if value is not None and str(value) != str(payment["id"]):
            raise InvalidInput(
                f"checkout session {session.get('id')} belongs to payment {payment['id']}, "
                f"but its {field} names {value}",
                code="payment_mismatch",
                details={"payment_id": payment["id"], field: value},
            )
    if metadata.get("account") not in (None, payment["account"]):
        raise InvalidInput(
            f"payment {payment['id']} is for {payment['account']}, the session names {metadata['account']}",
            code="payment_mismatch",
            details={"payment_id": payment["id"], "account": metadata["account"]},
        )


def _paid_ucredits(session: dict[str, Any], settings: PaymentSettings) -> int:
    """The credit Stripe's `amount_total` buys, refused unless it is exact."""
    cents = session.get("amount_total")
    if not isinstance(cents, int) or isinstance(cents, bool) or cents < 0:
        raise InvalidEvent(
            f"amount_total must be a whole number of cents, at least 0, not {cents!r}",
            details={"amount_total": cents},
        )
    currency = str(session.get("currency") or "").lower()
    if currency != settings.currency:
        raise InvalidInput(
            f"the checkout was paid in {currency or 'no currency'}, payments are in {settings.currency}",
            code="invalid_currency",
            details={"currency": currency},
        )
    ucredits = settings.ucredits_for(cents)
    if ucredits is None:
        raise InvalidInput(
            f"{cents} cents buy no whole number of micro-credits at {settings.unit_amount_cents} per credit",
            code="invalid_amount",
            details={"amount_total": cents},
        )
    return ucredits
