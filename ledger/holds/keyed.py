"""The hold acts for callers that carry an idempotency key: the CLI and the HTTP API.

`create_hold`, `hold_usage`, `settle_hold` and `release_hold` here are the acts of the
same names in ledger.holds, with the same rules; each returns the act's record, the
hold as the CLI and the HTTP API show it (`HoldState.as_dict()`). With an
`idempotency_key`, the first request's record is kept under the key, in the scope of
the hold's account (locked first), and a repeat returns that record as it was, whatever
the hold has become since (a repeated create still says `active` after the run was
settled); another request under the same key is `idempotency_conflict`.

Why two forms of one act: a replay returns the *first record*, which no `HoldState` read
now can give back. In-process callers (the daemon, the bridge, the meter) call the acts
themselves and get a `HoldState`; a repeat of theirs is known by its run, not by a key.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.books import idempotency
from ledger.books.accounts import check_name, lock_account, lock_account_by_id
from ledger.errors import NotFound
from ledger.holds import create, resolve, usage
from ledger.holds.request import HoldRequest
from ledger.pricing.prices import format_gpus, parse_gpus
from ledger.store.tables import holds_t
from ledger.timeutil import format_time, parse_seconds

__all__ = ["create_hold", "hold_usage", "release_hold", "settle_hold"]


def create_hold(s: Session, request: HoldRequest, *, idempotency_key: str | None = None) -> dict[str, Any]:
    """`create_hold`'s record; with a key, a repeat returns the hold as first created."""
    check_name(request.user, "user")
    body = {
        "user": request.user,
        "job_id": request.job_id,
        "cluster": request.cluster,
        "run": request.run,
        "gpus": format_gpus(parse_gpus(request.gpus)),
        "seconds": parse_seconds(request.seconds, field="seconds"),
        "partition": request.partition,
        "at": format_time(request.at),
        "grace_seconds": request.grace_seconds,
        "submitted_at": format_time(request.submitted_at),
    }
    scope = lock_account(s, request.account).id
    return idempotency.once(
        s,
        scope,
        idempotency_key,
        "hold_create",
        body,
        lambda: create.create_hold(s, request).as_dict(),
    )


def hold_usage(
    s: Session,
    hold_id: int,
    elapsed_seconds: int | str,
    *,
    at: datetime | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """`hold_usage`'s record; with a key, a repeat returns the hold as first charged."""
    elapsed = parse_seconds(elapsed_seconds, field="elapsed")
    request = {"hold_id": hold_id, "elapsed": elapsed, "at": format_time(at)}
    return idempotency.once(
        s,
        _hold_scope(s, hold_id),
        idempotency_key,
        "hold_usage",
        request,
        lambda: usage.hold_usage(s, hold_id, elapsed, at).as_dict(),
    )


def settle_hold(
    s: Session,
    hold_id: int,
    elapsed_seconds: int | str,
    *,
    at: datetime | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """`settle_hold`'s record; with a key, a repeat returns the hold as first settled."""
    elapsed = parse_seconds(elapsed_seconds, field="elapsed")
    request = {"hold_id": hold_id, "elapsed": elapsed, "at": format_time(at)}
    return idempotency.once(
        s,
        _hold_scope(s, hold_id),
        idempotency_key,
        "hold_settle",
        request,
        lambda: resolve.settle_hold(s, hold_id, elapsed, at).as_dict(),
    )


def release_hold(
    s: Session, hold_id: int, *, at: datetime | None = None, idempotency_key: str | None = None
) -> dict[str, Any]:
    """`release_hold`'s record; with a key, a repeat returns the hold as first released."""
    request = {"hold_id": hold_id, "at": format_time(at)}
    return idempotency.once(
        s,
        _hold_scope(s, hold_id),
        idempotency_key,
        "hold_release",
        request,
        lambda: resolve.release_hold(s, hold_id, at).as_dict(),
    )


def _hold_scope(s: Session, hold_id: int) -> int:
    """Lock the account that owns the hold (the key's scope) and return its id."""
    owner = select(holds_t.c.account_id).where(holds_t.c.id == hold_id).scalar_subquery()
    account = lock_account_by_id(s, owner)
    if account is None:
        raise NotFound(f"hold {hold_id} does not exist", details={"hold_id": hold_id})
    return account.id
