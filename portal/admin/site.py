"""Administration of the whole site: accounts, prices, holds and the journal audit.

Each view owns its transaction. A refused change re-renders its page with the
ledger's message and the ledger's status (422 for bad input), having changed nothing.
"""

from __future__ import annotations

from typing import Any

from flask import current_app, flash, redirect, render_template, request, url_for

from ledger import api
from ledger.errors import LedgerError
from portal.admin import forms
from portal.admin.blueprints import admin_bp
from portal.pages.common import row_id
from portal.settings import portal_settings
from portal.store import transaction


def _page_size() -> int:
    return int(portal_settings(current_app)["page_size"])


def _page_number() -> int:
    raw = request.args.get("page", "1")
    return max(int(raw), 1) if raw.isdigit() else 1


@admin_bp.get("/")
def index(failed: str | None = None, error: LedgerError | None = None) -> Any:
    """Every account with what it can spend and what is held, a page at a time."""
    size, page = _page_size(), _page_number()
    with transaction() as s:
        names = api.account_names(s)
        shown = names[(page - 1) * size : page * size]
        balances = [api.balance(s, name) for name in shown]
    return render_template(
        "admin/index.html",
        balances=balances,
        page=page,
        more=len(names) > page * size,
        failed=failed,
        error=error,
    ), (error.http_status if error else 200)


@admin_bp.post("/accounts")
def create_account() -> Any:
    name = forms.text("name")
    try:
        with transaction() as s:
            api.create_account(s, name, idempotency_key=forms.idempotency_key())
    except LedgerError as error:
        return index(failed="create", error=error)
    flash(f"Account {name} created.")
    return redirect(url_for("admin.account", account=name))


@admin_bp.route("/prices", methods=["GET", "POST"])
def prices() -> Any:
    """Every price version, the one in force now marked; a form sets a new version."""
    error = None
    if request.method == "POST":
        try:
            with transaction() as s:
                result = api.set_price(
                    s,
                    forms.text("gres"),
                    forms.text("price"),
                    partition=forms.optional_text("partition"),
                    effective_at=forms.optional_time("effective", "effective time"),
                    idempotency_key=forms.idempotency_key(),
                )
        except LedgerError as caught:
            error = caught
        else:
            flash(
                f"Price of {result['gres']} set to {result['credits_per_gpu_hour']} credits per GPU-hour "
                f"from {result['effective_at']}."
            )
            return redirect(url_for("admin.prices"))
    with transaction() as s:
        versions = api.price_versions(s)
    return render_template(
        "admin/prices.html", versions=versions, failed="price" if error else None, error=error
    ), (error.http_status if error else 200)


@admin_bp.get("/holds")
def holds(error: LedgerError | None = None) -> Any:
    """Active holds, newest first, a page at a time (`before`: the last id of the previous page)."""
    before = row_id(request.args.get("before"), "before")
    size = _page_size()
    with transaction() as s:
        page = api.holds_page(s, state=api.HoldStatus.ACTIVE, before_id=before, limit=size + 1)
    return render_template(
        "admin/holds.html",
        holds=[hold.as_dict() for hold in page[:size]],
        next_before=page[size - 1].id if len(page) > size else None,
        error=error,
    ), (error.http_status if error else 200)


@admin_bp.post("/holds/<int(min=1, max=2147483647):hold_id>/release")
def release(hold_id: int) -> Any:
    """Give a hold's unspent credit back to its account; what it charged stays charged."""
    try:
        with transaction() as s:
            hold = api.keyed.release_hold(s, hold_id, idempotency_key=forms.idempotency_key())
    except LedgerError as error:
        return holds(error=error)
    flash(
        f"Hold {hold['id']} of job {hold['job_id']} ({hold['account']}) released; "
        f"{hold['charged']} stays charged."
    )
    return redirect(url_for("admin.holds"))


@admin_bp.route("/audit", methods=["GET", "POST"])
def audit() -> Any:
    """Recompute every account's hash chain and balances from the journal (on request:
    it reads the whole journal)."""
    report = None
    if request.method == "POST":
        with transaction() as s:
            report = api.verify(s)
    return render_template("admin/audit.html", report=report)
