"""One account, administered: members and roles, caps, grants, top-ups and adjustments.

Every form posts to its own address and, when the ledger refuses it, the account
page comes back with the message beside that form (`failed` names it) and the
ledger's status, nothing changed.
"""

from __future__ import annotations

from typing import Any

from flask import flash, redirect, render_template, url_for

from ledger import api
from ledger.errors import LedgerError
from portal.admin import forms
from portal.admin.blueprints import admin_bp
from portal.store import transaction

RECENT_CHARGES = 20


@admin_bp.get("/accounts/<account>", endpoint="account")
def account_page(account: str, failed: str | None = None, error: LedgerError | None = None) -> Any:
    with transaction() as s:
        balance = api.balance(s, account)
        members = api.member_roles(s, account)
        limits = api.show_limits(s, account)
        charges = api.charge_entries(s, account, limit=RECENT_CHARGES)
    return render_template(
        "admin/account.html",
        account=account,
        balance=balance,
        members=members,
        limits=limits,
        charges=charges,
        failed=failed,
        error=error,
    ), (error.http_status if error else 200)


def _done(account_name: str, message: str) -> Any:
    flash(message)
    return redirect(url_for("admin.account", account=account_name))


@admin_bp.post("/accounts/<account>/members")
def set_member(account: str) -> Any:
    """Add a member, or change a member's role (member or manager)."""
    try:
        with transaction() as s:
            member = forms.set_member(s, account)
    except LedgerError as error:
        return account_page(account, failed="member", error=error)
    return _done(account, f"{member['user']} is now a {member['role']} of {account}.")


@admin_bp.post("/accounts/<account>/limits")
def set_limits(account: str) -> Any:
    """The account's own caps (no user given) or one user's caps in it."""
    user = forms.optional_text("user")
    try:
        with transaction() as s:
            forms.set_limits(s, account, user)
    except LedgerError as error:
        return account_page(account, failed="limits", error=error)
    return _done(account, f"Caps of {user or account} in {account} saved.")


@admin_bp.post("/accounts/<account>/grants")
def grant(account: str) -> Any:
    """Allocated or promotional credit, optionally time-windowed and prioritised."""
    return _record_credit(account, "grant")


@admin_bp.post("/accounts/<account>/topups")
def topup(account: str) -> Any:
    """Credit paid outside the portal (an invoice): recorded as paid, spendable at once."""
    return _record_credit(account, "topup")


def _record_credit(account: str, kind: str) -> Any:
    """A grant or a paid top-up from the account page's form; only a grant has a priority."""
    try:
        with transaction() as s:
            extra: dict[str, Any] = {}
            if kind == "grant":
                priority = forms.optional_whole_number("priority", "priority", code="invalid_priority")
                if priority is not None:  # else the ledger's default
                    extra["priority"] = priority
            result = (api.grant if kind == "grant" else api.topup)(
                s,
                account,
                forms.text("amount"),
                effective_at=forms.optional_time("effective", "effective time"),
                expires_at=forms.optional_time("expires", "expiry"),
                reference=forms.optional_text("reference"),
                idempotency_key=forms.idempotency_key(),
                **extra,
            )
    except LedgerError as error:
        return account_page(account, failed=kind, error=error)
    what = "Grant" if kind == "grant" else "Top-up"
    return _done(account, f"{what} of {result['grant']['amount']} credits to {account} recorded.")


@admin_bp.post("/accounts/<account>/adjustments")
def adjust(account: str) -> Any:
    """A signed correction linked to a charge: negative refunds, positive charges more."""
    try:
        with transaction() as s:
            result = api.adjust(
                s,
                account,
                forms.text("amount"),
                links_entry_id=forms.whole_number("entry_id", "journal entry", code="invalid_entry"),
                reason=forms.text("reason"),
                idempotency_key=forms.idempotency_key(),
            )
    except LedgerError as error:
        return account_page(account, failed="adjust", error=error)
    return _done(
        account, f"Adjustment of {result['adjustment']} credits linked to entry {result['links_entry_id']}."
    )
