"""Stripe payments: a Checkout Session per payment, paid when Stripe's signed
webhook says so (portal.payments.webhook).

The session names the payment three ways (its id stored as the payment's external
id, `client_reference_id`, and `metadata`), so an event is matched to exactly one
payment, and an event for a session this portal did not create is ignored.
"""

from __future__ import annotations

from typing import Any

import stripe

from ledger.errors import LedgerError
from ledger.money import parse_credits
from portal.payments.providers import Checkout, PaymentProviderError, PaymentSettings


class InvalidSignature(LedgerError):
    """A webhook whose Stripe-Signature does not verify, or whose timestamp is too old."""

    code = "invalid_signature"
    http_status = 400


class InvalidEvent(LedgerError):
    """A signed webhook body that is not the shape Stripe sends."""

    code = "invalid_event"
    http_status = 400


class StripeProvider:
    name = "stripe"

    def __init__(self, settings: PaymentSettings) -> None:
        self.settings = settings

    def _client(self) -> stripe.StripeClient:
        config = self.settings.stripe
        if not config.secret_key:
            raise PaymentProviderError("payments.stripe.secret_key is not configured")
        return stripe.StripeClient(
            config.secret_key,
            base_addresses={"api": config.api_base} if config.api_base else None,
            http_client=stripe.RequestsClient(timeout=config.timeout_seconds),
            max_network_retries=1,  # safe: the library sends an Idempotency-Key with each POST
        )

    def start(self, payment: dict[str, Any], *, success_url: str, cancel_url: str) -> Checkout:
        """The payment's Checkout Session: created once (Stripe's own idempotency key is
        the payment id, so a retry after a crash gets the same session back) or found
        again; no address once the session is no longer open."""
        try:
            if payment["external_id"]:
                session = self._client().v1.checkout.sessions.retrieve(payment["external_id"])
            else:
                session = self._client().v1.checkout.sessions.create(
                    self._session_params(payment, success_url=success_url, cancel_url=cancel_url),
                    {"idempotency_key": f"gpucredit-payment-{payment['id']}"},
                )
        except stripe.StripeError as error:
            raise PaymentProviderError(
                f"Stripe refused or did not answer: {error.user_message or error}",
                details={"payment_id": payment["id"]},
            ) from None
        return Checkout(session.url if session.status == "open" else None, session.id)

    def _session_params(self, payment: dict[str, Any], *, success_url: str, cancel_url: str) -> Any:
        cents = self.settings.cents_for(parse_credits(payment["amount"]))
        reference = str(payment["id"])
        return {
            "mode": "payment",
            "line_items": [
                {
                    "quantity": 1,
                    "price_data": {
                        "currency": self.settings.currency,
                        "unit_amount": cents,
                        "product_data": {"name": f"{payment['amount']} GPU credits for {payment['account']}"},
                    },
                }
            ],
            "client_reference_id": reference,
            "metadata": {"payment_id": reference, "account": payment["account"]},
            "success_url": success_url,
            "cancel_url": cancel_url,
        }

    def verify(self, payload: bytes, signature: str | None) -> dict[str, Any]:
        """The event a webhook delivers, once its signature and timestamp check out."""
        config = self.settings.stripe
        if not config.webhook_secret:
            raise PaymentProviderError("payments.stripe.webhook_secret is not configured")
        try:
            event = stripe.Webhook.construct_event(
                payload, signature, config.webhook_secret, tolerance=config.tolerance_seconds
            )
        except stripe.SignatureVerificationError as error:
            raise InvalidSignature(f"the Stripe-Signature header does not verify: {error}") from None
        except ValueError:
            raise InvalidEvent("the webhook body is not a JSON event") from None
        return event.to_dict()
