"""An account manager's (PI's) page for their own account: its members and their roles,
each member's caps, and, read-only, the account's own caps and grants (an admin sets
those). Who may enter is checked once for the whole blueprint (`blueprints`).
"""

from __future__ import annotations

from typing import Any

from flask import flash, redirect, render_template, url_for

from ledger import api
from ledger.errors import InvalidInput, LedgerError
from portal.admin import forms
from portal.admin.blueprints import manage_bp
from portal.auth import Forbidden, principal
from portal.store import transaction


@manage_bp.get("", endpoint="index")
def manage_page(account: str, failed: str | None = None, error: LedgerError | None = None) -> Any:
    with transaction() as s:
        balance = api.balance(s, account)
        members = api.member_roles(s, account)
        limits = api.show_limits(s, account)
    return render_template(
        "admin/manage.html",
        account=account,
        balance=balance,
        members=members,
        limits=limits,
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
