"""Operations under /api/v1 that other areas serve with routes of their own, described
here so the OpenAPI document lists them too (only while the app serves them)."""

from __future__ import annotations

from portal.api.registry import document
from portal.api.schemas import obj, ref

document(
    "POST",
    "/payments/stripe/webhook",
    operation_id="stripe_webhook",
    tag="payments",
    summary="Receive a Stripe event",
    description="Stripe calls this when a checkout is paid, fails or expires "
    "(portal.payments.webhook). No token: the Stripe-Signature header authenticates the "
    "body; a bad or stale signature is a 400. A replayed event credits nothing. 404 while "
    "payments.stripe.webhook_secret is not set.",
    headers={"Stripe-Signature": {"type": "string", "minLength": 1}},
    body={"type": "object", "description": "a Stripe event"},
    errors=(400, 404, 409),
    responses={
        200: obj(
            ["received"],
            {
                "received": {"type": "boolean"},
                "ignored": {"type": "string"},
                "payment": ref("Payment"),
                "duplicate": {"type": "boolean"},
            },
        )
    },
)
