"""Credit that is bought: a payment is pending (not spendable) until it is paid, and
paying it creates the top-up grant in the same transaction.

Each provider event is recorded once under a unique (provider, event_id): the check
runs under the account's lock, and the constraint stops a racing duplicate, so a
replayed webhook credits nothing. A payment is paid at most once whatever repeats.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from ledger.books import grants as _grants
from ledger.books import idempotency
from ledger.books.accounts import lock_account, lock_account_by_id
from ledger.errors import Conflict, InvalidInput, NotFound
from ledger.money import format_credits, parse_credits
from ledger.store.tables import accounts_t, payment_events_t, payments_t
from ledger.timeutil import format_time, utcnow

PROVIDERS = ("manual", "stripe")
# The most one payment may buy: a typo of three zeros should not need a refund.
MAX_PAYMENT_UCREDITS = 10**6 * 10**6


def _as_dict(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "account": row.account,
        "amount": format_credits(row.amount_ucredits),
        "provider": row.provider,
        "external_id": row.external_id,
        "state": row.state,
        "requested_by": row.requested_by,
        "created_at": format_time(row.created_at),
        "resolved_at": format_time(row.resolved_at),
        "grant_id": row.grant_id,
    }


def _select() -> Any:
    return select(payments_t, accounts_t.c.name.label("account")).join(
        accounts_t, accounts_t.c.id == payments_t.c.account_id
    )


def get_payment(s: Session, payment_id: int) -> dict[str, Any]:
    row = s.execute(_select().where(payments_t.c.id == payment_id)).first()
    if row is None:
        raise NotFound(f"payment {payment_id} does not exist", details={"payment_id": payment_id})
    return _as_dict(row)


def find_payment(s: Session, provider: str, external_id: str) -> dict[str, Any] | None:
    row = s.execute(
        _select().where(payments_t.c.provider == provider, payments_t.c.external_id == external_id)
    ).first()
    return None if row is None else _as_dict(row)


def list_payments(
    s: Session, *, account: str | None = None, state: str | None = None, limit: int = 200
) -> list[dict[str, Any]]:
    query = _select().order_by(payments_t.c.id.desc()).limit(limit)
    if account is not None:
        query = query.where(accounts_t.c.name == account)
    if state is not None:
        query = query.where(payments_t.c.state == state)
    return [_as_dict(row) for row in s.execute(query)]


def open_payment(
    s: Session,
    account: str,
    amount: str,
    *,
    provider: str,
    requested_by: str,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Credit bought but not yet paid (not spendable), `amount` credits: what a checkout
    session or an invoice will pay for. `mark_paid` turns it into a top-up."""
    amount_ucredits = parse_credits(amount)
    if provider not in PROVIDERS:
        raise InvalidInput(f"unknown payment provider {provider!r}", code="invalid_provider")
    if amount_ucredits <= 0 or amount_ucredits > MAX_PAYMENT_UCREDITS:
        raise InvalidInput(
            f"amount must be more than 0 and at most {format_credits(MAX_PAYMENT_UCREDITS)}",
            code="invalid_amount",
            details={"value": format_credits(amount_ucredits)},
        )
    acct = lock_account(s, account)
    body = {"amount": amount_ucredits, "provider": provider, "requested_by": requested_by}

    def create() -> dict[str, Any]:
        payment_id = s.execute(
            insert(payments_t)
            .values(
                account_id=acct.id,
                amount_ucredits=amount_ucredits,
                provider=provider,
                state="pending",
                requested_by=requested_by,
                created_at=utcnow(),
            )
            .returning(payments_t.c.id)
        ).scalar_one()
        return get_payment(s, payment_id)

    return idempotency.once(s, acct.id, idempotency_key, "payment", body, create)


def set_external_id(s: Session, payment_id: int, external_id: str) -> dict[str, Any]:
    """Name the provider's object for a pending payment (a Stripe checkout session id)."""
    payment = get_payment(s, payment_id)
    if payment["external_id"] not in (None, external_id):
        raise Conflict(f"payment {payment_id} already names {payment['external_id']}", code="already_exists")
    s.execute(update(payments_t).where(payments_t.c.id == payment_id).values(external_id=external_id))
    return get_payment(s, payment_id)


def _lock_payment(s: Session, payment_id: int) -> tuple[dict[str, Any], Any]:
    account_id = select(payments_t.c.account_id).where(payments_t.c.id == payment_id).scalar_subquery()
    acct = lock_account_by_id(s, account_id)
    if acct is None:
        raise NotFound(f"payment {payment_id} does not exist", details={"payment_id": payment_id})
    return get_payment(s, payment_id), acct


def _first_time(s: Session, provider: str, event_id: str | None, kind: str, payment_id: int) -> bool:
    """Record a provider event; False when it was seen before (a replay)."""
    if event_id is None:
        return True
    seen = s.execute(
        select(payment_events_t.c.id).where(
            payment_events_t.c.provider == provider, payment_events_t.c.event_id == event_id
        )
    ).first()
    if seen is not None:
        return False
    s.execute(
        insert(payment_events_t).values(
            provider=provider, event_id=event_id, kind=kind, payment_id=payment_id, received_at=utcnow()
        )
    )
    return True


def mark_paid(
    s: Session,
    payment_id: int,
    *,
    event_id: str | None = None,
    expected_ucredits: int | None = None,
    at: datetime | None = None,
) -> dict[str, Any]:
    """Pay a pending payment: the top-up grant is created now and is spendable at once.

    Returns the payment and `credited` (False for a replayed event or a payment that
    was already paid). `expected_ucredits` is the amount the provider says was paid:
    a mismatch credits nothing and is refused.
    """
    payment, acct = _lock_payment(s, payment_id)
    if not _first_time(s, payment["provider"], event_id, "paid", payment_id):
        return {"payment": payment, "credited": False}
    if payment["state"] == "paid":
        return {"payment": payment, "credited": False}
    if payment["state"] != "pending":
        raise Conflict(f"payment {payment_id} is {payment['state']}", code="payment_resolved")
    amount = s.execute(select(payments_t.c.amount_ucredits).where(payments_t.c.id == payment_id)).scalar_one()
    if expected_ucredits is not None and expected_ucredits != amount:
        raise InvalidInput(
            f"payment {payment_id} is for {format_credits(amount)} credits, "
            f"the provider reports {format_credits(expected_ucredits)}",
            code="invalid_amount",
            details={"payment_id": payment_id},
        )
    at = at or utcnow()
    result = _grants.create_grant(
        s,
        acct,
        amount,
        source="topup",
        reference=f"{payment['provider']}:{payment['external_id'] or payment_id}",
        user=payment["requested_by"],
        at=at,
    )
    s.execute(
        update(payments_t)
        .where(payments_t.c.id == payment_id)
        .values(state="paid", resolved_at=at, grant_id=result["grant"]["id"])
    )
    return {"payment": get_payment(s, payment_id), "credited": True}


def cancel_payment(s: Session, payment_id: int, *, event_id: str | None = None) -> dict[str, Any]:
    """An unpaid payment that will not be paid (expired checkout, void invoice)."""
    payment, _acct = _lock_payment(s, payment_id)
    if not _first_time(s, payment["provider"], event_id, "cancelled", payment_id):
        return payment
    if payment["state"] == "pending":
        s.execute(
            update(payments_t)
            .where(payments_t.c.id == payment_id)
            .values(state="cancelled", resolved_at=utcnow())
        )
    return get_payment(s, payment_id)
