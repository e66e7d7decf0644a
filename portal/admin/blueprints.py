"""The package's two blueprints and who may enter them.

`admin` (/admin) is the site's administration. For anyone but an admin it answers 404,
as if it did not exist; a visitor who has not logged in is sent to log in first.
`manage` (/accounts/<account>/manage) is an account manager's (a PI's) view of their
own account: its managers and admins enter; a member gets 403, anyone else 404, the
same answer as for an account that does not exist (`require_account`).
"""

from __future__ import annotations

import secrets
from typing import Any

from flask import Blueprint, abort, request

from portal.auth import current, require_account, to_login
from portal.store import transaction

admin_bp = Blueprint("admin", __name__, url_prefix="/admin")
manage_bp = Blueprint("manage", __name__, url_prefix="/accounts/<account>/manage")


def _fresh_key() -> str:
    """A new idempotency key for each form rendered: a double submit repeats the same key."""
    return secrets.token_urlsafe(18)


@admin_bp.before_request
def _admins_only() -> Any:
    who = current()
    if who is None:
        return to_login()
    if not who.is_admin:
        abort(404)
    return None


@manage_bp.before_request
def _managers_only() -> Any:
    who = current()
    if who is None:
        return to_login()
    if who.is_service:
        abort(403)
    account = (request.view_args or {}).get("account", "")
    with transaction() as s:
        require_account(s, who, account, manage=True)
    return None


for _blueprint in (admin_bp, manage_bp):
    _blueprint.context_processor(lambda: {"fresh_key": _fresh_key})
