"""Transfers between accounts: POST /api/v1/transfers (ledger.books.transfers).

Who may move credit from FROM to TO:

    admin                              any two accounts
    a manager of FROM                  to an account they also manage, or into FROM's
                                       subtree (a department head funds a group)
    anyone else                        403 when they see both accounts, else 404 as if
                                       FROM (or TO) did not exist

A member's role is not enough: moving money out of an account is its managers' act.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from ledger import api
from ledger.errors import NotFound
from portal.api.access import time_of
from portal.api.registry import Call, body_schema, endpoint
from portal.api.schemas import CREDITS_IN, NAME, TIME, nullable, ref
from portal.auth import Forbidden, Principal, accounts_of
from portal.store import transaction

TRANSFER = body_schema(
    ["from", "to", "amount"],
    {
        "from": NAME,
        "to": NAME,
        "amount": CREDITS_IN,
        "expires_at": nullable(TIME),
    },
)


def may_transfer(s: Session, who: Principal, source: str, target: str) -> None:
    """Raise unless `who` may move credit from `source` to `target` (the table above)."""
    if who.is_admin:
        return
    roles = accounts_of(s, who)
    below = source in roles and target in api.subtree(api.account_parents(s), source)
    for account in (source, target):
        if account not in roles and not (account == target and below):
            raise NotFound(f"account {account} does not exist", details={"account": account})
    if roles[source] == "manager" and (roles.get(target) == "manager" or below):
        return
    raise Forbidden(
        f"only an admin, a manager of both {source} and {target}, or a manager of {source} "
        f"moving credit into its subtree may transfer from {source} to {target}",
        details={"from": source, "to": target},
    )


@endpoint(
    "POST",
    "/transfers",
    tag="accounts",
    summary="Move available credit from one account to another",
    roles=("user", "admin"),
    body=TRANSFER,
    idempotency="required",
    errors=(402, 404),
    responses={201: ref("Transfer")},
)
def transfer(call: Call) -> Any:
    """Take `amount` of `from`'s available credit in its burn order and grant it to `to`,
    expiring at the earliest expiry of what it took (or `expires_at`, when earlier); all
    of it or nothing (402 with what was needed and what is available)."""
    body = call.body
    with transaction() as s:
        may_transfer(s, call.principal, body["from"], body["to"])
        result = api.transfer(
            s,
            body["from"],
            body["to"],
            body["amount"],
            expires_at=time_of(body, "expires_at"),
            user=call.principal.user,
            idempotency_key=call.idempotency_key,
        )
    return result, 201
