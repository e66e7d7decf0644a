"""The caps: per account (user NULL) or per user in it, at most N GPUs at once, a spend
rate and a daily spend. NULL is no cap. `set_limits` changes the given ones; the rules
that hold a job to them are ledger.limits.rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, or_, select, update
from sqlalchemy.orm import Session

from ledger.books import idempotency
from ledger.books.accounts import check_name, lock_account
from ledger.errors import InvalidInput, NotFound
from ledger.money import format_credits, parse_credits
from ledger.store.tables import accounts_t, limits_t
from ledger.timeutil import utcnow


@dataclass(frozen=True)
class Limits:
    max_gpus: int | None = None
    max_rate_ucredits_per_second: int | None = None
    daily_cap_ucredits: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_gpus": self.max_gpus,
            "max_rate": None
            if self.max_rate_ucredits_per_second is None
            else format_credits(self.max_rate_ucredits_per_second),
            "daily_cap": None if self.daily_cap_ucredits is None else format_credits(self.daily_cap_ucredits),
        }


def set_limits(
    s: Session,
    account: str,
    *,
    user: str | None = None,
    max_gpus: int | None = None,
    max_rate: str | None = None,
    daily_cap: str | None = None,
    clear: bool = False,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Set the given caps (others unchanged; `clear` removes all caps first). A repeat of a
    keyed request returns the caps as the first one left them."""
    scope = lock_account(s, account).id
    request = {
        "user": user,
        "max_gpus": max_gpus,
        "max_rate": None if max_rate is None else parse_credits(max_rate, field="max_rate", allow_zero=True),
        "daily_cap": None
        if daily_cap is None
        else parse_credits(daily_cap, field="daily_cap", allow_zero=True),
        "clear": clear,
    }
    return idempotency.once(
        s,
        scope,
        idempotency_key,
        "limits_set",
        request,
        lambda: _set_limits(
            s, account, user=user, max_gpus=max_gpus, max_rate=max_rate, daily_cap=daily_cap, clear=clear
        ),
    )


def _set_limits(
    s: Session,
    account: str,
    *,
    user: str | None,
    max_gpus: int | None,
    max_rate: str | None,
    daily_cap: str | None,
    clear: bool,
) -> dict[str, Any]:
    acct = lock_account(s, account)
    if user is not None:
        check_name(user, "user")
    if max_gpus is not None and (not isinstance(max_gpus, int) or max_gpus < 0 or max_gpus > 10**6):
        raise InvalidInput(
            f"max GPUs {max_gpus!r} must be a whole number >= 0",
            code="invalid_limit",
            details={"field": "max_gpus", "value": max_gpus},
        )
    values: dict[str, Any] = {}
    if clear:
        values = {"max_gpus": None, "max_rate_ucredits_per_second": None, "daily_cap_ucredits": None}
    if max_gpus is not None:
        values["max_gpus"] = max_gpus
    if max_rate is not None:
        values["max_rate_ucredits_per_second"] = parse_credits(max_rate, field="max_rate", allow_zero=True)
    if daily_cap is not None:
        values["daily_cap_ucredits"] = parse_credits(daily_cap, field="daily_cap", allow_zero=True)
    where = (
        limits_t.c.account_id == acct.id,
        limits_t.c.user.is_(None) if user is None else limits_t.c.user == user,
    )
    values["updated_at"] = utcnow()
    if s.execute(select(limits_t.c.id).where(*where)).first():
        s.execute(update(limits_t).where(*where).values(**values))
    else:
        s.execute(insert(limits_t).values(account_id=acct.id, user=user, **values))
    return show_limits(s, account)


def limits_for(s: Session, account_id: int, user: str | None) -> Limits:
    where = limits_t.c.user.is_(None) if user is None else limits_t.c.user == user
    row = s.execute(select(limits_t).where(limits_t.c.account_id == account_id, where)).first()
    if row is None:
        return Limits()
    return Limits(row.max_gpus, row.max_rate_ucredits_per_second, row.daily_cap_ucredits)


def limits_of(s: Session, account_id: int, user: str) -> dict[str | None, Limits]:
    """The account's caps (key None) and one user's (key `user`), in one query."""
    caps: dict[str | None, Limits] = {None: Limits(), user: Limits()}
    for row in s.execute(
        select(limits_t).where(
            limits_t.c.account_id == account_id, or_(limits_t.c.user.is_(None), limits_t.c.user == user)
        )
    ):
        caps[row.user] = Limits(row.max_gpus, row.max_rate_ucredits_per_second, row.daily_cap_ucredits)
    return caps


def show_limits(s: Session, account: str) -> dict[str, Any]:
    row = s.execute(
        select(accounts_t.c.id).where(accounts_t.c.name == account, accounts_t.c.kind == "customer")
    ).first()
    if row is None:
        raise NotFound(f"account {account!r} does not exist", details={"account": account})
    result: dict[str, Any] = {
        "account": account,
        "account_limits": limits_for(s, row.id, None).as_dict(),
        "users": {},
    }
    for lim in s.execute(
        select(limits_t)
        .where(limits_t.c.account_id == row.id, limits_t.c.user.is_not(None))
        .order_by(limits_t.c.user)
    ):
        result["users"][lim.user] = Limits(
            lim.max_gpus, lim.max_rate_ucredits_per_second, lim.daily_cap_ucredits
        ).as_dict()
    return result
