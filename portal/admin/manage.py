"""An account manager's (PI's) page for their own account: its members and their roles,
each member's caps, credit moved into the accounts below it and whether they may draw on
it (its pool), and, read-only, the account's own caps and grants (an admin sets those).
Who may enter is checked once for the whole blueprint (`blueprints`).
"""

from __future__ import annotations

from typing import Any

from flask import flash, redirect, render_template, url_for

from ledger import api
from ledger.errors import InvalidInput, LedgerError
from ledger.money import format_credits
from portal.admin import forms
from portal.admin.blueprints import manage_bp
from portal.api.transfers import may_transfer
from portal.auth import Forbidden, principal
from portal.store import transaction


@manage_bp.get("", endpoint="index")
def manage_page(account: str, failed: str | None = None, error: LedgerError | None = None) -> Any:
    with transaction() as s:
        balance = api.balance(s, account)
        members = api.member_roles(s, account)
        limits = api.show_limits(s, account)
        below = api.subtree(api.account_parents(s), account)[1:]
        pool = api.pool_settings(s).get(account)
    return render_template(
        "admin/manage.html",
        account=account,
        balance=balance,
        members=members,
        limits=limits,
        below=below,
        pool=pool,
        pool_cap=None
        if pool is None or pool.child_cap_ucredits is None
        else format_credits(pool.child_cap_ucredits),
        failed=failed,
        error=error,
    ), (error.http_status if error else 200)


def _done(account: str, message: str) -> Any:
    flash(message)
    return redirect(url_for("manage.index", account=account))


@manage_bp.post("/members")
def set_member(account: str) -> Any:
    """Add a member or change a member's role; a manager's own role is left to another
    manager or an admin, so nobody locks themselves out by a slip."""
    who = principal()
    try:
        if forms.text("user") == who.user and not who.is_admin:
            raise Forbidden(
                "you cannot change your own role; ask another manager or an admin",
                details={"account": account, "user": who.user},
            )
        with transaction() as s:
            member = forms.set_member(s, account)
    except LedgerError as error:
        return manage_page(account, failed="member", error=error)
    return _done(account, f"{member['user']} is now a {member['role']} of {account}.")


@manage_bp.post("/limits")
def set_limits(account: str) -> Any:
    """One member's caps in this account (the account's own caps are an admin's)."""
    user = forms.text("user")
    try:
        with transaction() as s:
            if user not in {member["user"] for member in api.member_roles(s, account)}:
                raise InvalidInput(
                    f"{user or 'no user'} is not a member of {account}",
                    code="not_a_member",
                    details={"account": account, "user": user},
                )
            forms.set_limits(s, account, user)
    except LedgerError as error:
        return manage_page(account, failed="limits", error=error)
    return _done(account, f"Caps of {user} in {account} saved.")


@manage_bp.post("/transfer")
def transfer(account: str) -> Any:
    """Move this account's available credit into an account below it (or another one its
    manager also manages): the rule of POST /api/v1/transfers, `may_transfer`."""
    target = forms.text("to")
    try:
        with transaction() as s:
            may_transfer(s, principal(), account, target)
            result = api.transfer(
                s,
                account,
                target,
                forms.text("amount"),
                expires_at=forms.optional_time("expires", "expiry"),
                user=principal().user,
                idempotency_key=forms.idempotency_key(),
            )
    except LedgerError as error:
        return manage_page(account, failed="transfer", error=error)
    return _done(account, f"Moved {result['amount']} credits from {account} to {target}.")


@manage_bp.post("/pool")
def set_pool(account: str) -> Any:
    """Share this account's credit with the accounts below it, each up to a cap, or stop:
    its managers' decision, as the credit is theirs."""
    try:
        state = forms.text("pool")
        if state not in ("on", "off"):
            raise InvalidInput(f"pool must be on or off, not {state!r}", code="invalid_request")
        on = state == "on"
        with transaction() as s:
            result = api.set_pool(
                s,
                account,
                on,
                (forms.optional_text("child_cap") if on else None),
                idempotency_key=forms.idempotency_key(),
            )
    except LedgerError as error:
        return manage_page(account, failed="pool", error=error)
    cap = f", each up to {result['child_cap']} credits" if result["child_cap"] else ""
    shared = f"shared with the accounts below it{cap}" if on else "no longer shared"
    return _done(account, f"{account}'s credit is {shared}.")
