"""Idempotency keys for a request the ledger does not perform itself (a job submitted
to Slurm through the API): the first result is kept under the account's key scope, so
a repeat with the same key and body returns it and a different body is an
`idempotency_conflict`, exactly as for the ledger's own acts (ledger.books.idempotency).

The request runs between `first_result` and `keep_result`, outside the account lock
(a job submission waits on Slurm): two racing first requests with one key may both
run; the second to keep its result is refused by the key's unique constraint.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from ledger.books.accounts import read_account
from ledger.books.idempotency import remember, replay


def first_result(
    s: Session, account: str, key: str | None, operation: str, body: dict[str, Any]
) -> dict[str, Any] | None:
    """The result kept for this key in `account`, or None for a new request."""
    if key is None:
        return None
    return replay(s, read_account(s, account).id, key, operation, body)


def keep_result(
    s: Session, account: str, key: str | None, operation: str, body: dict[str, Any], result: dict[str, Any]
) -> None:
    if key is not None:
        remember(s, read_account(s, account).id, key, operation, body, result)
