"""An account's money: balance, top-ups, grants, direct consumption, usage, journal, jobs.

A user token sees the accounts its user is a member of (and manages those where they
are manager); an account it may not see answers exactly like one that does not exist.
In an account, a member's token sees the member's own jobs and usage, a manager's the
account's (portal.auth.own_user: the pages' rule).
"""

from __future__ import annotations

from typing import Any

from flask import request

from ledger import api
from ledger.errors import InvalidInput
from portal.api.access import time_of, visible
from portal.api.paging import by_id, by_position
from portal.api.registry import Call, body_schema, endpoint
from portal.api.schemas import CREDITS_IN, HOLD_STATE, NAME, TEXT, TIME, nullable, ref
from portal.auth import Forbidden, accounts_of, own_user
from portal.csv_out import csv_response
from portal.payments import start_topup  # the payments area owns providers
from portal.store import transaction

USERS = ("user", "admin")
ADMIN = ("admin",)
ADMIN_ONLY_TOPUP_FIELDS = ("effective_at", "expires_at", "reference")

TOPUP = body_schema(
    ["amount"],
    {
        "amount": CREDITS_IN,
        "effective_at": TIME,
        "expires_at": nullable(TIME),
        "reference": TEXT,
        "return_url": {"type": "string", "maxLength": 2048, "description": "purchases only"},
    },
)
GRANT = body_schema(
    ["amount"],
    {
        "amount": CREDITS_IN,
        "effective_at": TIME,
        "expires_at": nullable(TIME),
        "priority": {"type": "integer", "minimum": 0, "maximum": 1000, "description": "lower burns first"},
        "reference": TEXT,
    },
)
CONSUME = body_schema(["amount"], {"amount": CREDITS_IN, "at": TIME, "user": NAME})
GROUPS = ["day", "gres", "user", "partition", "account"]


@endpoint(
    "GET",
    "/accounts",
    tag="accounts",
    summary="List the accounts this token may see",
    roles=USERS,
    paginated=True,
    responses={200: ref("AccountPage")},
)
def list_accounts(call: Call) -> Any:
    """Each account with the caller's role there: member, manager, or admin (all accounts)."""
    with transaction() as s:
        roles = accounts_of(s, call.principal)
    return by_position([{"account": name, "role": role} for name, role in sorted(roles.items())], call.page)


@endpoint(
    "GET",
    "/accounts/{account}/balance",
    tag="accounts",
    summary="Read an account's balance",
    roles=USERS,
    query={"at": TIME},
    responses={200: ref("Balance")},
)
def balance(call: Call, account: str) -> Any:
    """What is spendable at `at` (default now; past or future), what is held by running
    jobs, and each grant active then."""
    at = time_of(call.query, "at")
    with transaction() as s:
        visible(s, call.principal, account)
        return api.balance(s, account, at)


@endpoint(
    "POST",
    "/accounts/{account}/topups",
    tag="accounts",
    summary="Top up an account",
    roles=USERS,
    body=TOPUP,
    idempotency="required",
    responses={201: {"anyOf": [ref("GrantCreated"), ref("PurchaseStarted")]}},
)
def topup(call: Call, account: str) -> Any:
    """An admin records a paid top-up, spendable at once (it pays recorded debt first).
    A member or manager starts a purchase: a pending payment, and where to pay it
    (`checkout_url`; null for an invoice); the credit arrives when it is paid."""
    who = call.principal
    body = call.body
    effective_at, expires_at = time_of(body, "effective_at"), time_of(body, "expires_at")
    with transaction() as s:
        visible(s, who, account)
        if who.is_admin:
            result = api.topup(
                s,
                account,
                body["amount"],
                effective_at=effective_at,
                expires_at=expires_at,
                reference=body.get("reference"),
                idempotency_key=call.idempotency_key,
            )
            return result, 201
        named = [name for name in ADMIN_ONLY_TOPUP_FIELDS if name in body]
        if named:
            raise Forbidden(f"only an admin may set {', '.join(named)}", details={"fields": named})
    return (
        start_topup(
            account=account,
            amount=body["amount"],
            requested_by=who.user,
            idempotency_key=call.idempotency_key,
            return_url=body.get("return_url"),
        ),
        201,
    )


@endpoint(
    "POST",
    "/accounts/{account}/grants",
    tag="accounts",
    summary="Grant credit to an account",
    roles=ADMIN,
    body=GRANT,
    idempotency="optional",
    responses={201: ref("GrantCreated")},
)
def grant(call: Call, account: str) -> Any:
    """Promotional or allocated credit, optionally time-windowed."""
    body = call.body
    effective_at, expires_at = time_of(body, "effective_at"), time_of(body, "expires_at")
    priority = {"priority": body["priority"]} if "priority" in body else {}
    with transaction() as s:
        visible(s, call.principal, account)
        result = api.grant(
            s,
            account,
            body["amount"],
            effective_at=effective_at,
            expires_at=expires_at,
            reference=body.get("reference"),
            idempotency_key=call.idempotency_key,
            **priority,
        )
    return result, 201


@endpoint(
    "POST",
    "/accounts/{account}/consume",
    tag="accounts",
    summary="Charge credit directly",
    roles=("admin", "service"),
    body=CONSUME,
    idempotency="required",
    errors=(402,),
    responses={201: ref("Consumption")},
)
def consume(call: Call, account: str) -> Any:
    """Charge `amount` at `at` (default now) from credit free then, without a hold: all
    of it, or nothing (402)."""
    body = call.body
    at = time_of(body, "at")
    with transaction() as s:
        visible(s, call.principal, account)
        result = api.consume(
            s, account, body["amount"], at=at, user=body.get("user"), idempotency_key=call.idempotency_key
        )
    return result, 201


@endpoint(
    "GET",
    "/accounts/{account}/usage",
    tag="reports",
    summary="Report an account's usage",
    roles=USERS,
    query={
        "from": TIME,
        "to": TIME,
        "group_by": {"type": "string", "enum": GROUPS},
        "subtree": {"type": "string", "enum": ["true", "false"], "description": "the sub-accounts' too"},
        "format": {"type": "string", "enum": ["json", "csv"]},
    },
    paginated=True,
    csv=True,
    responses={200: ref("UsagePage")},
)
def usage_report(call: Call, account: str) -> Any:
    """Credits charged, GPU-seconds and jobs in [from, to), grouped by day (default), GPU
    type, user, partition or account: the account's for its managers, a member's own for a
    member. `?subtree=true` adds every account below it (a department's usage; by child
    with `group_by=account`). `?format=csv` or `Accept: text/csv` returns every row as CSV."""
    start, end = time_of(call.query, "from"), time_of(call.query, "to")
    if start is not None and end is not None and end < start:
        raise InvalidInput("to is before from", code="invalid_time", details={"field": "to"})
    group_by = call.query.get("group_by", "day")
    with transaction() as s:
        role = visible(s, call.principal, account)
        rows = api.usage_report(
            s,
            account=account,
            user=own_user(role, call.principal),
            start=start,
            end=end,
            by=group_by,
            subtree=call.query.get("subtree") == "true",
        )
    if _wants_csv(call):
        columns = [group_by, "charged", "gpu_seconds", "jobs"]
        return csv_response(
            columns, ([row[c] for c in columns] for row in rows), f"{account}-usage-by-{group_by}.csv"
        )
    return by_position(rows, call.page)


@endpoint(
    "GET",
    "/accounts/{account}/tree",
    tag="accounts",
    summary="Read an account's subtree with each account's balance",
    roles=USERS,
    responses={200: ref("Tree")},
)
def tree(call: Call, account: str) -> Any:
    """The account and every account below it (Slurm's tree), depth first, each with its
    own credit now: what a department manager watches. Managers and admins only."""
    with transaction() as s:
        visible(s, call.principal, account, manage=True)
        parents = api.account_parents(s)
        depth_of = dict(api.tree_order(parents))
        items = []
        for name in api.subtree(parents, account):
            figures = api.balance(s, name)
            items.append(
                {
                    "account": name,
                    "parent": parents[name],
                    "depth": depth_of[name] - depth_of[account],
                    "available": figures["available"],
                    "held": figures["held"],
                }
            )
    return {"items": items}


@endpoint(
    "GET",
    "/accounts/{account}/entries",
    tag="reports",
    summary="Read an account's journal",
    roles=USERS,
    paginated=True,
    responses={200: ref("EntryPage")},
)
def entries(call: Call, account: str) -> Any:
    """The append-only journal, newest first, each entry with its postings: for audit.
    Managers of the account and admins only."""
    with transaction() as s:
        visible(s, call.principal, account, manage=True)
        rows = api.journal_entries(s, account, before_id=call.page.cursor, limit=call.page.limit + 1)
    return by_id(rows, call.page, lambda row: int(row["id"]), lambda row: row)


@endpoint(
    "GET",
    "/accounts/{account}/jobs",
    tag="reports",
    summary="List an account's job runs",
    roles=USERS,
    query={"state": HOLD_STATE},
    paginated=True,
    responses={200: ref("HoldPage")},
)
def jobs(call: Call, account: str) -> Any:
    """Every run's hold (what it reserved and was charged), newest first: the account's
    for its managers, a member's own for a member."""
    with transaction() as s:
        role = visible(s, call.principal, account)
        user = own_user(role, call.principal)
        holds = api.holds_page(
            s,
            accounts=[account] if user is None else [],
            own=None if user is None else (user, [account]),
            state=call.query.get("state"),
            before_id=call.page.cursor,
            limit=call.page.limit + 1,
        )
    return by_id(holds, call.page, lambda hold: hold.id, lambda hold: hold.as_dict())


def _wants_csv(call: Call) -> bool:
    if "format" in call.query:
        return bool(call.query["format"] == "csv")
    return request.accept_mimetypes.best_match(["application/json", "text/csv"]) == "text/csv"
