"""Buying credit: a pending payment, then the provider's way to pay it.

`start_topup` is the one entry point for pages and the API alike; the webhook
(`portal.payments.webhook`) and the admin page (`portal.payments.views`) resolve
payments through `ledger.api.mark_paid` / `cancel_payment`.
"""

from __future__ import annotations

from typing import Any

from flask import current_app, request, url_for

from ledger import api
from ledger.errors import InvalidInput
from ledger.money import parse_credits
from portal.payments.providers import PaymentProviderError, payment_settings
from portal.payments.registry import provider_for
from portal.store import transaction

__all__ = ["start_topup"]


def start_topup(
    *,
    account: str,
    amount: str,
    requested_by: str,
    idempotency_key: str | None,
    return_url: str | None,
) -> dict[str, Any]:
    """Open a pending payment of `amount` credits for `account` and start paying it.

    Returns {"payment": ..., "checkout_url": address to pay at, or None for an
    invoice}. The caller has checked that `requested_by` may top up `account`. Three
    steps, so no ledger lock is held while the provider answers over the network:
    open the payment (committed), start the checkout, name it on the payment. A
    replay (same idempotency key and body) returns the same payment and address.
    `return_url`: where the payer lands after the checkout (default: the payment's
    page in the portal).
    """
    settings = payment_settings(current_app)
    settings.cents_for(parse_credits(amount))  # a fraction of a cent opens nothing
    if return_url is not None and not return_url.startswith(("https://", "http://")):
        raise InvalidInput(
            "return_url must be an http(s) address",
            code="invalid_return_url",
            details={"return_url": return_url},
        )
    with transaction() as s:
        opened = api.open_payment(
            s,
            account,
            amount,
            provider=settings.provider,
            requested_by=requested_by,
            idempotency_key=idempotency_key,
        )
        payment = api.get_payment(s, opened["id"])  # a replay returns the payment as first opened
    if payment["state"] != "pending":
        return {"payment": payment, "checkout_url": None}
    back = return_url or payment_page_url(payment)
    try:
        checkout = provider_for(payment["provider"], settings).start(
            payment,
            success_url=return_url or f"{back}?checkout=success",
            cancel_url=return_url or f"{back}?checkout=cancelled",
        )
    except PaymentProviderError:
        with transaction() as s:  # nobody was given a way to pay it: it will never be paid
            api.cancel_payment(s, payment["id"])
        raise
    if checkout.external_id is not None and payment["external_id"] is None:
        with transaction() as s:
            payment = api.set_external_id(s, payment["id"], checkout.external_id)
    return {"payment": payment, "checkout_url": checkout.url}


def payment_page_url(payment: dict[str, Any]) -> str:
    """The payment's page as the payer's browser reaches it: under `portal.url` when
    set (a proxy in front), else at the address this request came to."""
    path = url_for("payments.payment", account=payment["account"], payment_id=payment["id"])
    base = current_app.config["GPUCREDIT"]["portal"].get("url")
    if base:
        return base.rstrip("/") + path.removeprefix(request.script_root)
    return request.host_url.rstrip("/") + path
