"""Idempotency keys: a repeat with the same body returns the first result; a different
body is an `idempotency_conflict`. Keys are scoped to the account the request locks,
so the check runs under that account's lock and two racing repeats cannot both win.

A request that locks no customer account (`price set`, `account create`) keeps its key
in one global scope, `GLOBAL_SCOPE`: the id of a system account row. Keys need an
existing account row (a foreign key, unique per account), system accounts never hold
keys of their own, and so any of them is a free namespace that needs no migration.
Such a request cannot lock that row instead of a customer's: every posting to the
system account takes a key-share lock on it (PostgreSQL's foreign-key check), so a
row lock would stall the ledger. It takes a transaction-scoped advisory lock on the
key alone (PostgreSQL; SQLite's `BEGIN IMMEDIATE` already admits one writer), so two
racing repeats of one global request run one after the other and the second replays.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from ledger.books.journal import SYSTEM_IDS
from ledger.errors import IdempotencyConflict, InvalidInput
from ledger.store.db import is_postgres
from ledger.store.tables import idempotency_keys_t
from ledger.timeutil import utcnow

MAX_KEY_LENGTH = 256
GLOBAL_SCOPE = SYSTEM_IDS["system:revenue"]


def request_hash(operation: str, body: dict[str, Any]) -> str:
    canonical = json.dumps({"op": operation, **body}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def replay(
    s: Session, account_id: int, key: str | None, operation: str, body: dict[str, Any]
) -> dict[str, Any] | None:
    """The stored result for a repeat of this request, or None for a new request.

    Call it under the lock of `account_id` (the scope); for `GLOBAL_SCOPE` it takes
    the key's own lock.
    """
    if key is None:
        return None
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidInput(
            f"idempotency key must be 1..{MAX_KEY_LENGTH} characters", code="invalid_idempotency_key"
        )
    if account_id == GLOBAL_SCOPE and is_postgres(s):
        s.execute(select(func.pg_advisory_xact_lock(_advisory_id(key))))
    row = s.execute(
        select(
            idempotency_keys_t.c.operation, idempotency_keys_t.c.request_hash, idempotency_keys_t.c.result
        ).where(idempotency_keys_t.c.account_id == account_id, idempotency_keys_t.c.key == key)
    ).first()
    if row is None:
        return None
    if row.operation != operation or row.request_hash != request_hash(operation, body):
        raise IdempotencyConflict(
            f"idempotency key {key!r} was already used with a different request",
            details={"key": key, "operation": row.operation},
        )
    result: dict[str, Any] = json.loads(row.result)
    return result


def remember(
    s: Session, account_id: int, key: str | None, operation: str, body: dict[str, Any], result: dict[str, Any]
) -> None:
    if key is None:
        return
    s.execute(
        insert(idempotency_keys_t).values(
            account_id=account_id,
            key=key,
            operation=operation,
            request_hash=request_hash(operation, body),
            result=json.dumps(result),  # in its own key order: a replay prints as the first did
            created_at=utcnow(),
        )
    )


def once(
    s: Session,
    account_id: int,
    key: str | None,
    operation: str,
    body: dict[str, Any],
    perform: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """`perform()` for a new request and remember its result; the first result for a repeat."""
    first = replay(s, account_id, key, operation, body)
    if first is not None:
        return first
    result = perform()
    remember(s, account_id, key, operation, body, result)
    return result


def _advisory_id(key: str) -> int:
    """A signed 64-bit lock id for a global key (PostgreSQL's advisory lock space)."""
    digest = hashlib.sha256(b"gpucredit-idempotency\0" + key.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
