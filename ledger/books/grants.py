"""Grants, the burn order, and drawing credit from them.

Burn order: lower `priority` first, then earliest expiry (no expiry last), then oldest.
A grant is active at t when effective_at <= t < expires_at. Its free part is
`remaining - earmarked`; earmarks belong to holds and only their hold may draw them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from ledger.books import idempotency
from ledger.books.accounts import lock_account
from ledger.books.journal import EXPIRED, PAYMENTS, PROMOTIONS, REVENUE, TRANSFERS, Leg, LockedAccount, post
from ledger.errors import InsufficientCredits, InvalidInput
from ledger.money import MAX_ACCOUNT_UCREDITS, MAX_UCREDITS, format_credits, parse_credits
from ledger.store.sums import joined, split_sum
from ledger.store.tables import grants_t
from ledger.timeutil import format_time, utcnow

DEFAULT_PRIORITY = 10
# A child's credit borrowed from its parent's pool (ledger/books/pools.py) burns after
# every grant of its own: a site sets priorities 0..1000 only.
POOL_PRIORITY = 1001
POOL_REFERENCE = "pool of "  # + the lender's name: a pool grant's reference
SOURCES = {
    "topup": PAYMENTS,
    "grant": PROMOTIONS,
    "refund": REVENUE,
    "transfer": TRANSFERS,
    "pool": TRANSFERS,
}


@dataclass
class GrantState:
    id: int
    amount_ucredits: int
    remaining_ucredits: int
    earmarked_ucredits: int
    effective_at: datetime
    expires_at: datetime | None
    priority: int
    source: str
    dirty: bool = False
    reference: str | None = None

    @property
    def lender(self) -> str | None:
        """The account whose pool a `pool` grant's credit came from (ledger.books.pools)."""
        if self.source != "pool" or not self.reference:
            return None
        return self.reference.removeprefix(POOL_REFERENCE)

    @property
    def free_ucredits(self) -> int:
        return self.remaining_ucredits - self.earmarked_ucredits

    def active_at(self, at: datetime) -> bool:
        return self.effective_at <= at and (self.expires_at is None or at < self.expires_at)

    def burn_key(self) -> tuple[int, int, datetime | int, int]:
        return (self.priority, self.expires_at is None, self.expires_at or 0, self.id)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "source": self.source,
            "amount": format_credits(self.amount_ucredits),
            "remaining": format_credits(self.remaining_ucredits),
            "effective_at": format_time(self.effective_at),
            "expires_at": format_time(self.expires_at),
            "priority": self.priority,
        }


def load_grants(
    s: Session, account_id: int, *, with_remaining: bool = True, ids: set[int] | None = None
) -> list[GrantState]:
    """The account's grants in burn order (by default only those with credit left)."""
    query = select(grants_t).where(grants_t.c.account_id == account_id)
    if with_remaining:
        query = query.where(grants_t.c.remaining_ucredits > 0)
    if ids is not None:
        query = query.where(grants_t.c.id.in_(ids))
    return grants_by_account(s.execute(query)).get(account_id, [])


def grants_by_account(rows: Iterable[Any]) -> dict[int, list[GrantState]]:
    """`grants` rows as each account's grants, in burn order."""
    by_account: dict[int, list[GrantState]] = {}
    for r in rows:
        by_account.setdefault(r.account_id, []).append(
            GrantState(
                r.id,
                r.amount_ucredits,
                r.remaining_ucredits,
                r.earmarked_ucredits,
                r.effective_at,
                r.expires_at,
                r.priority,
                r.source,
                reference=r.reference,
            )
        )
    for grants in by_account.values():
        grants.sort(key=GrantState.burn_key)
    return by_account


def save_grants(s: Session, grants: list[GrantState]) -> None:
    for g in grants:
        if g.dirty:
            if g.remaining_ucredits < 0 or not 0 <= g.earmarked_ucredits <= g.remaining_ucredits:
                raise RuntimeError(
                    f"grant {g.id} would break its invariant: "
                    f"remaining {g.remaining_ucredits}, earmarked {g.earmarked_ucredits}"
                )
            s.execute(
                update(grants_t)
                .where(grants_t.c.id == g.id)
                .values(remaining_ucredits=g.remaining_ucredits, earmarked_ucredits=g.earmarked_ucredits)
            )
            g.dirty = False


def available_now(grants: list[GrantState], account: LockedAccount, at: datetime) -> int:
    """Spendable at `at` from the maintained remainders: free active credit less debt."""
    return sum(g.free_ucredits for g in grants if g.active_at(at)) - account.debt_ucredits


def take_free(
    grants: list[GrantState],
    account: LockedAccount,
    amount: int,
    at: datetime,
    bucket_to: str | None,
    legs: list[Leg],
) -> int:
    """Draw up to `amount` from the free part of grants active at `at`, in burn order.

    With bucket_to='held' the credit is earmarked (moved between buckets); with None it
    is consumed. Returns what could not be drawn. Appends the customer legs only.
    """
    need = amount
    for g in grants:
        if need == 0:
            break
        if not g.active_at(at) or g.free_ucredits <= 0:
            continue
        take = min(need, g.free_ucredits)
        need -= take
        g.dirty = True
        legs.append(Leg(account.id, -take, "available", g.id))
        if bucket_to == "held":
            g.earmarked_ucredits += take
            legs.append(Leg(account.id, take, "held", g.id))
        else:
            g.remaining_ucredits -= take
    return need


def granted_ever(s: Session, account_id: int) -> int:
    """Micro-credits ever granted to the account: every grant's amount, spent or not."""
    return joined(
        *s.execute(
            select(*split_sum(grants_t.c.amount_ucredits)).where(grants_t.c.account_id == account_id)
        ).one()
    )


def _check_account_credit(s: Session, account: LockedAccount, amount_ucredits: int) -> None:
    """Refuse a grant that would take what the account was ever granted past
    MAX_ACCOUNT_UCREDITS, the bound every sum over its grants relies on (ledger.money).
    The account is locked, so no other grant can slip in between the read and the write."""
    if amount_ucredits > MAX_UCREDITS:
        raise InvalidInput(
            f"amount {format_credits(amount_ucredits)} exceeds the maximum of "
            f"{format_credits(MAX_UCREDITS)} credits",
            code="invalid_amount",
            details={"value": format_credits(amount_ucredits), "cap": format_credits(MAX_UCREDITS)},
        )
    before = granted_ever(s, account.id)
    if before + amount_ucredits > MAX_ACCOUNT_UCREDITS:
        raise InvalidInput(
            f"account {account.name}: {format_credits(before + amount_ucredits)} credits granted in all "
            f"would exceed the cap of {format_credits(MAX_ACCOUNT_UCREDITS)} an account may ever be granted "
            f"({format_credits(before)} granted + {format_credits(amount_ucredits)} now)",
            code="invalid_amount",
            details={
                "limit": "account_credit",
                "account": account.name,
                "value": format_credits(before + amount_ucredits),
                "cap": format_credits(MAX_ACCOUNT_UCREDITS),
            },
        )


def create_grant(
    s: Session,
    account: LockedAccount,
    amount_ucredits: int,
    *,
    source: str,
    effective_at: datetime | None = None,
    expires_at: datetime | None = None,
    priority: int = DEFAULT_PRIORITY,
    reference: str | None = None,
    user: str | None = None,
    idempotency_key: str | None = None,
    at: datetime | None = None,
    links_entry_id: int | None = None,
) -> dict[str, Any]:
    """A top-up (source 'topup'), a promotion grant ('grant') or a refund ('refund').

    Recorded debt is paid first from the new grant when the grant is already in effect
    at the operation's time `at` (default now). A grant that starts later cannot pay
    debt before it exists; the sweep pays debt from active credit then.
    """
    if amount_ucredits <= 0:
        raise InvalidInput("amount must be greater than zero", code="invalid_amount")
    # The request as the caller gave it: a retry that again omits the times is a repeat,
    # though "now" has moved on.
    body = {
        "amount": amount_ucredits,
        "source": source,
        "effective_at": format_time(effective_at),
        "expires_at": format_time(expires_at),
        "priority": priority,
        "reference": reference,
        "links_entry_id": links_entry_id,
    }
    first = idempotency.replay(s, account.id, idempotency_key, source, body)
    if first is not None:
        return first
    at = at or utcnow()
    effective_at = effective_at or at
    if expires_at is not None and expires_at <= effective_at:
        raise InvalidInput(
            f"expiry {format_time(expires_at)} is not after the effective time {format_time(effective_at)}",
            code="invalid_time",
            details={"effective_at": format_time(effective_at), "expires_at": format_time(expires_at)},
        )
    if (source, priority) != ("pool", POOL_PRIORITY) and (
        not isinstance(priority, int) or not 0 <= priority <= 1000
    ):
        raise InvalidInput(f"priority {priority!r} must be a whole number 0..1000", code="invalid_priority")
    _check_account_credit(s, account, amount_ucredits)
    grant_id = s.execute(
        insert(grants_t)
        .values(
            account_id=account.id,
            source=source,
            amount_ucredits=amount_ucredits,
            remaining_ucredits=0,
            earmarked_ucredits=0,
            effective_at=effective_at,
            expires_at=expires_at,
            priority=priority,
            reference=reference,
            entry_id=None,
        )
        .returning(grants_t.c.id)
    ).scalar_one()
    entry = post(
        s,
        account,
        source,
        effective_at,
        [Leg(SOURCES[source], -amount_ucredits), Leg(account.id, amount_ucredits, "available", grant_id)],
        user=user,
        links_entry_id=links_entry_id,
        memo={"reference": reference} if reference else None,
    )
    remaining = amount_ucredits
    paid_debt = 0
    if account.debt_ucredits > 0 and effective_at <= at:
        paid_debt = min(account.debt_ucredits, amount_ucredits)
        post(
            s,
            account,
            "debt_paid",
            effective_at,
            [Leg(account.id, -paid_debt, "available", grant_id), Leg(account.id, paid_debt, "debt")],
            user=user,
            links_entry_id=entry.id,
        )
        remaining -= paid_debt
    s.execute(
        update(grants_t)
        .where(grants_t.c.id == grant_id)
        .values(remaining_ucredits=remaining, entry_id=entry.id)
    )
    result = {
        "grant": {
            "id": grant_id,
            "source": source,
            "amount": format_credits(amount_ucredits),
            "remaining": format_credits(remaining),
            "effective_at": format_time(effective_at),
            "expires_at": format_time(expires_at),
            "priority": priority,
            "reference": reference,
        },
        "entry_id": entry.id,
        "debt_paid": format_credits(paid_debt),
    }
    idempotency.remember(s, account.id, idempotency_key, source, body, result)
    return result


def topup(
    s: Session,
    account: str,
    amount: str,
    *,
    effective_at: datetime | None = None,
    expires_at: datetime | None = None,
    reference: str | None = None,
    idempotency_key: str | None = None,
    at: datetime | None = None,
) -> dict[str, Any]:
    """Paid credit; visible at once; pays recorded debt first."""
    return create_grant(
        s,
        lock_account(s, account),
        parse_credits(amount),
        source="topup",
        effective_at=effective_at,
        expires_at=expires_at,
        reference=reference,
        idempotency_key=idempotency_key,
        at=at,
    )


def grant(
    s: Session,
    account: str,
    amount: str,
    *,
    effective_at: datetime | None = None,
    expires_at: datetime | None = None,
    priority: int = DEFAULT_PRIORITY,
    reference: str | None = None,
    idempotency_key: str | None = None,
    at: datetime | None = None,
) -> dict[str, Any]:
    """Promotional or allocated credit, optionally time-windowed."""
    return create_grant(
        s,
        lock_account(s, account),
        parse_credits(amount),
        source="grant",
        effective_at=effective_at,
        expires_at=expires_at,
        priority=priority,
        reference=reference,
        idempotency_key=idempotency_key,
        at=at,
    )


def consume(
    s: Session,
    account: str,
    amount: str,
    *,
    at: datetime | None = None,
    user: str | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Charge credit directly (no hold): all of it from free active credit, or refuse."""
    acct = lock_account(s, account)
    return _consume(s, acct, parse_credits(amount), at=at, user=user, idempotency_key=idempotency_key)


def _consume(
    s: Session,
    account: LockedAccount,
    amount_ucredits: int,
    *,
    at: datetime | None,
    user: str | None,
    idempotency_key: str | None,
) -> dict[str, Any]:
    body = {"amount": amount_ucredits, "at": format_time(at), "user": user}
    first = idempotency.replay(s, account.id, idempotency_key, "consume", body)
    if first is not None:
        return first
    at = at or utcnow()
    grants = load_grants(s, account.id)
    available = available_now(grants, account, at)
    if amount_ucredits > available:
        raise InsufficientCredits(
            f"account {account.name}: consuming {format_credits(amount_ucredits)} credits needs more "
            f"than the {format_credits(available)} available at {format_time(at)}",
            details={
                "account": account.name,
                "needed": format_credits(amount_ucredits),
                "available": format_credits(available),
            },
        )
    legs: list[Leg] = []
    short = take_free(grants, account, amount_ucredits, at, None, legs)
    if short:
        raise RuntimeError("available credit was computed but could not be drawn")
    legs.append(Leg(REVENUE, amount_ucredits))
    entry = post(s, account, "consume", at, legs, user=user)
    save_grants(s, grants)
    result = {
        "account": account.name,
        "charged": format_credits(amount_ucredits),
        "entry_id": entry.id,
        "at": format_time(at),
    }
    idempotency.remember(s, account.id, idempotency_key, "consume", body, result)
    return result


def expire_grants(s: Session, account: LockedAccount, at: datetime) -> int:
    """Post the free part of grants that expired by `at` to the `expired` system account."""
    total = 0
    grants = load_grants(s, account.id)
    for g in grants:
        if g.expires_at is not None and g.expires_at <= at and g.free_ucredits > 0:
            amount = g.free_ucredits
            post(
                s,
                account,
                "expiry",
                g.expires_at,
                [Leg(account.id, -amount, "available", g.id), Leg(EXPIRED, amount)],
            )
            g.remaining_ucredits -= amount
            g.dirty = True
            total += amount
    save_grants(s, grants)
    return total


def pay_debt(s: Session, account: LockedAccount, at: datetime) -> int:
    """Pay recorded debt from free credit active at `at`; available credit is unchanged."""
    if account.debt_ucredits <= 0:
        return 0
    grants = load_grants(s, account.id)
    legs: list[Leg] = []
    short = take_free(grants, account, account.debt_ucredits, at, None, legs)
    paid = account.debt_ucredits - short
    if paid:
        legs.append(Leg(account.id, paid, "debt"))
        post(s, account, "debt_paid", at, legs)
        save_grants(s, grants)
    return paid
