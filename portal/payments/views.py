"""Pages for buying credit: the top-up form, a payment's page, and the admins' list
of payments where invoices are marked paid or cancelled.

Any member or manager of an account may top it up (they only ask: credit arrives
when the payment is paid); an account they may not see answers 404, and so does
the admin page to anyone but an admin.
"""

from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, Flask, abort, current_app, flash, redirect, render_template, request, url_for
from sqlalchemy.orm import Session

from ledger import api
from ledger.errors import Conflict, InvalidInput
from portal.auth import login_required, principal, require_account
from portal.payments import start_topup
from portal.payments.providers import PaymentProviderError, PaymentSettings, payment_settings
from portal.store import transaction

bp = Blueprint("payments", __name__)
RECENT_PAYMENTS = 50


def init_app(app: Flask) -> None:
    from portal.payments import webhook

    payment_settings(app)  # a bad [payments] table stops the portal at start
    app.register_blueprint(bp)
    webhook.init_app(app)


def _new_key() -> str:
    """A fresh idempotency key for a form: a double submit replays, never pays twice."""
    return uuid.uuid4().hex


def _form_key() -> str | None:
    return request.form.get("idempotency_key") or None


@bp.route("/accounts/<account>/topup", methods=["GET", "POST"])
@login_required
def topup(account: str) -> Any:
    who = principal()
    with transaction() as s:
        require_account(s, who, account)
        payments = api.list_payments(s, account=account, limit=10)
    settings = payment_settings(current_app)
    if request.method == "GET":
        return _topup_page(account, payments, settings)
    amount = request.form.get("amount", "").strip()
    try:
        started = start_topup(
            account=account,
            amount=amount,
            requested_by=who.user,
            idempotency_key=_form_key(),
            return_url=None,
        )
    except (InvalidInput, Conflict, PaymentProviderError) as error:
        flash(error.message, "error")
        return _topup_page(account, payments, settings, amount=amount), error.http_status
    if started["checkout_url"]:
        return redirect(started["checkout_url"], 303)
    payment = started["payment"]
    return redirect(url_for("payments.payment", account=account, payment_id=payment["id"]), 303)


def _topup_page(
    account: str, payments: list[dict[str, Any]], settings: PaymentSettings, amount: str = ""
) -> str:
    return render_template(
        "payments/topup.html",
        account=account,
        payments=payments,
        settings=settings,
        amount=amount,
        idempotency_key=_new_key(),
    )


@bp.route("/accounts/<account>/payments/<int(min=1, max=2147483647):payment_id>")
@login_required
def payment(account: str, payment_id: int) -> Any:
    """Where the payer lands after a checkout, and where an invoice's state shows."""
    who = principal()
    with transaction() as s:
        require_account(s, who, account)
        found = api.get_payment(s, payment_id)
        if found["account"] != account:
            abort(404)
        available = api.balance(s, account)["available"]
    return render_template(
        "payments/payment.html",
        payment=found,
        available=available,
        checkout=request.args.get("checkout"),
    )


# --- admins ---------------------------------------------------------------------


def _admin() -> str:
    who = principal()
    if not who.is_admin:
        abort(404)
    return who.user


@bp.route("/admin/payments")
@login_required
def admin() -> Any:
    _admin()
    with transaction() as s:
        pending = api.list_payments(s, state="pending", limit=RECENT_PAYMENTS)
        recent = [p for p in api.list_payments(s, limit=RECENT_PAYMENTS) if p["state"] != "pending"]
    return render_template("payments/admin.html", pending=pending, recent=recent, new_key=_new_key)


@bp.route("/admin/payments/<int(min=1, max=2147483647):payment_id>/paid", methods=["POST"])
@login_required
def mark_paid(payment_id: int) -> Any:
    """An invoice's money arrived: the top-up grant is created now."""
    user = _admin()
    key = _form_key()
    try:
        with transaction() as s:
            _require_invoice(s, payment_id)
            result = api.mark_paid(s, payment_id, event_id=_event_id(user, key))
    except (Conflict, InvalidInput) as error:
        flash(error.message, "error")
        return redirect(url_for("payments.admin"), 303)
    paid = result["payment"]
    if result["credited"]:
        flash(f"Invoice #{paid['id']} paid: {paid['amount']} credits added to {paid['account']}.", "ok")
    else:
        flash(f"Invoice #{paid['id']} was already paid; nothing more was credited.", "ok")
    return redirect(url_for("payments.admin"), 303)


@bp.route("/admin/payments/<int(min=1, max=2147483647):payment_id>/cancel", methods=["POST"])
@login_required
def cancel(payment_id: int) -> Any:
    """An invoice that will not be paid; a paid one stays paid."""
    user = _admin()
    try:
        with transaction() as s:
            _require_invoice(s, payment_id)
            cancelled = api.cancel_payment(s, payment_id, event_id=_event_id(user, _form_key()))
    except Conflict as error:
        flash(error.message, "error")
        return redirect(url_for("payments.admin"), 303)
    flash(f"Invoice #{cancelled['id']} is {cancelled['state']}.", "ok")
    return redirect(url_for("payments.admin"), 303)


def _event_id(user: str, key: str | None) -> str | None:
    """The admin's click, recorded once (with who clicked) like a provider's event."""
    return f"portal:{user}:{key}" if key else None


def _require_invoice(s: Session, payment_id: int) -> None:
    """Stripe's own events pay or cancel its checkouts: an admin resolving one would
    race a payer still on Stripe's page."""
    if api.get_payment(s, payment_id)["provider"] != "manual":
        raise Conflict(
            f"payment {payment_id} is paid through Stripe; its events resolve it",
            code="not_an_invoice",
            details={"payment_id": payment_id},
        )
