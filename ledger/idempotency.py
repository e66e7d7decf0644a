"""Idempotency keys: a repeat with the same body returns the first result; a different
body is an `idempotency_conflict`. Keys are scoped to the account the request locks,
so the check runs under that account's lock and two racing repeats cannot both win.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from ledger.errors import IdempotencyConflict, InvalidInput
from ledger.models import IdempotencyKey, table_of
from ledger.timeutil import utcnow

keys_t = table_of(IdempotencyKey)
MAX_KEY_LENGTH = 256


def request_hash(operation: str, body: dict[str, Any]) -> str:
    canonical = json.dumps({"op": operation, **body}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def replay(
    s: Session, account_id: int, key: str | None, operation: str, body: dict[str, Any]
) -> dict[str, Any] | None:
    """The stored result for a repeat of this request, or None for a new request."""
    if key is None:
        return None
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidInput(
            f"idempotency key must be 1..{MAX_KEY_LENGTH} characters", code="invalid_idempotency_key"
        )
    row = s.execute(
        select(keys_t.c.operation, keys_t.c.request_hash, keys_t.c.result).where(
            keys_t.c.account_id == account_id, keys_t.c.key == key
        )
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
        insert(keys_t).values(
            account_id=account_id,
            key=key,
            operation=operation,
            request_hash=request_hash(operation, body),
            result=json.dumps(result, sort_keys=True),
            created_at=utcnow(),
        )
    )
