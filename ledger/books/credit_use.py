"""How much of an account's current credit is used: the figure behind the submit
warning (and the portal's) at `policy.warn_at_used_share`.

An account's credit is the amount of its grants active now (top-ups and grants whose
window holds now, spent or not); what is used is that credit less what is available
(free credit less debt). So credit held by running jobs counts as used: it cannot be
spent again, and a job that ends early returns it, lowering the share.

    used share = (credit - available) / credit      (no credit: nothing to warn about)

Compared exactly (integers and a fraction), never through a float.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.books.accounts import read_account
from ledger.books.balance import available_credit
from ledger.errors import InvalidInput
from ledger.store.sums import joined, split_sum
from ledger.store.tables import grants_t
from ledger.timeutil import utcnow

__all__ = ["DEFAULT_WARN_AT_USED_SHARE", "CreditUse", "credit_in_force", "credit_use", "parse_share"]

DEFAULT_WARN_AT_USED_SHARE = Fraction(4, 5)


@dataclass(frozen=True)
class CreditUse:
    """An account's current credit and what of it is available, in micro-credits."""

    account: str
    credit_ucredits: int
    available_ucredits: int

    @property
    def used_ucredits(self) -> int:
        return self.credit_ucredits - self.available_ucredits

    def used_at_least(self, share: Fraction) -> bool:
        """True when `share` or more of the credit is used (never without credit)."""
        return (
            self.credit_ucredits > 0
            and self.used_ucredits * share.denominator >= share.numerator * self.credit_ucredits
        )

    @property
    def used_percent(self) -> int:
        """The used share in whole percent, rounded down (so 79.9 % never reads 80 %)."""
        if self.credit_ucredits <= 0:
            return 0
        return self.used_ucredits * 100 // self.credit_ucredits


def parse_share(value: object, *, field: str = "policy.warn_at_used_share") -> Fraction:
    """A share from the config (0.8 or "0.8") as an exact fraction in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInput(f"{field} must be a number between 0 and 1, not {value!r}", code="invalid_config")
    try:
        # str() of a TOML float is its shortest repr ("0.8"), so the fraction is exact.
        share = Fraction(Decimal(str(value).strip()))
    except (InvalidOperation, ValueError):
        raise InvalidInput(f"{field} {value!r} is not a number", code="invalid_config") from None
    if not 0 < share <= 1:
        raise InvalidInput(f"{field} must be above 0 and at most 1, not {value}", code="invalid_config")
    return share


def credit_in_force(s: Session, at: datetime, account_ids: Collection[int] | None = None) -> dict[int, int]:
    """Micro-credits granted per account (all, or `account_ids`) by grants active at `at`."""
    query = (
        select(grants_t.c.account_id, *split_sum(grants_t.c.amount_ucredits))
        .where(
            grants_t.c.effective_at <= at,
            (grants_t.c.expires_at.is_(None)) | (grants_t.c.expires_at > at),
        )
        .group_by(grants_t.c.account_id)
    )
    if account_ids is not None:
        query = query.where(grants_t.c.account_id.in_(list(account_ids)))
    return {account_id: joined(high, low) for account_id, high, low in s.execute(query)}


def credit_use(s: Session, account: str, at: datetime | None = None) -> CreditUse:
    """`account`'s credit use at `at` (default now); reads without a lock."""
    at = at or utcnow()
    acct = read_account(s, account)
    return CreditUse(
        account,
        credit_in_force(s, at, [acct.id]).get(acct.id, 0),
        available_credit(s, at, [acct.id])[acct.id],
    )
