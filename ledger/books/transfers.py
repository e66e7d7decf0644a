"""Transfers: available credit from one customer account to another, in one transaction.

`transfer(FROM, TO, amount)` takes `amount` from FROM's free, active credit in FROM's
burn order (ledger.books.grants: lower priority, then earliest expiry, then oldest) and
grants it to TO as one new grant (source `transfer`), effective at once and expiring
at the earliest expiry of what it took (or at `expires_at` when that is earlier): credit
does not outlive itself by changing hands. All of it or nothing: FROM with too little is
InsufficientCredits with the figures (needed, available).

No journal entry touches two customer accounts (each chain and each checkpoint is one
account's), so a transfer is two entries, each summing to zero, through the clearing
account `system:transfers`: FROM's `transfer_out` (its grants' legs, linked to TO's
grant by a memo) and TO's `transfer` grant entry linked to it. Both accounts are locked
in id order (lock_accounts), so two transfers in opposite directions never deadlock;
the key is scoped to FROM, whose credit moves. A transfer is no new funding: fairshare
counts top-ups and grants as funded, and sees the credit in TO's `left` instead.

Refused, changing nothing: to oneself (`transfer_to_self`), an amount <= 0
(`invalid_amount`), an expiry not after now (`invalid_time`), an unknown account
(`not_found`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from ledger.books import idempotency
from ledger.books.accounts import lock_accounts, no_account
from ledger.books.grants import available_now, create_grant, load_grants, save_grants, take_free
from ledger.books.journal import TRANSFERS, Leg, post
from ledger.errors import InsufficientCredits, InvalidInput
from ledger.money import format_credits, parse_credits
from ledger.timeutil import format_time, utcnow

__all__ = ["transfer"]


def transfer(
    s: Session,
    from_account: str,
    to_account: str,
    amount: str,
    *,
    expires_at: datetime | None = None,
    at: datetime | None = None,
    user: str | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Move `amount` credits of FROM's available credit to TO (see the module)."""
    amount_ucredits = parse_credits(amount)
    if from_account == to_account:
        raise InvalidInput(
            f"account {from_account} cannot transfer to itself",
            code="transfer_to_self",
            details={"from": from_account, "to": to_account},
        )
    if amount_ucredits <= 0:
        raise InvalidInput("amount must be greater than zero", code="invalid_amount")
    locked = {row.name: row for row in lock_accounts(s, names=[from_account, to_account]).values()}
    for name in (from_account, to_account):
        if name not in locked:
            raise no_account(name)
    source, target = locked[from_account], locked[to_account]
    body = {
        "to": to_account,
        "amount": amount_ucredits,
        "expires_at": format_time(expires_at),
        "at": format_time(at),
        "user": user,
    }
    first = idempotency.replay(s, source.id, idempotency_key, "transfer", body)
    if first is not None:
        return first
    at = at or utcnow()
    if expires_at is not None and expires_at <= at:
        raise InvalidInput(
            f"expiry {format_time(expires_at)} is not after the transfer's time {format_time(at)}",
            code="invalid_time",
            details={"at": format_time(at), "expires_at": format_time(expires_at)},
        )
    grants = load_grants(s, source.id)
    available = available_now(grants, source, at)
    if amount_ucredits > available:
        raise InsufficientCredits(
            f"account {from_account}: transferring {format_credits(amount_ucredits)} credits to "
            f"{to_account} needs more than the {format_credits(available)} available at {format_time(at)}",
            details={
                "account": from_account,
                "to": to_account,
                "needed": format_credits(amount_ucredits),
                "available": format_credits(available),
            },
        )
    legs: list[Leg] = []
    if take_free(grants, source, amount_ucredits, at, None, legs):
        raise RuntimeError("available credit was computed but could not be drawn")
    taken = {leg.grant_id for leg in legs}
    expiries = [g.expires_at for g in grants if g.id in taken and g.expires_at is not None]
    if expires_at is not None:
        expiries.append(expires_at)
    expires = min(expiries) if expiries else None
    legs.append(Leg(TRANSFERS, amount_ucredits))
    out = post(s, source, "transfer_out", at, legs, user=user, memo={"to": to_account})
    save_grants(s, grants)
    received = create_grant(
        s,
        target,
        amount_ucredits,
        source="transfer",
        effective_at=at,
        expires_at=expires,
        reference=f"transfer from {from_account}",
        user=user,
        at=at,
        links_entry_id=out.id,
    )
    result = {
        "from": from_account,
        "to": to_account,
        "amount": format_credits(amount_ucredits),
        "at": format_time(at),
        "expires_at": format_time(expires),
        "taken": [
            {"grant_id": leg.grant_id, "amount": format_credits(-leg.amount_ucredits)}
            for leg in legs
            if leg.account_id == source.id
        ],
        "grant": received["grant"],
        "debt_paid": received["debt_paid"],
        "entries": [out.id, received["entry_id"]],
    }
    idempotency.remember(s, source.id, idempotency_key, "transfer", body, result)
    return result
