"""Usage reports: charges grouped by day, GPU type, user, partition or account.

Posted charges come from the journal; running jobs add what they have cost since
their last posted charge, on read (`ledger.holds.accrual`), split at the report's day and
range boundaries by the same rule, so a report reads the same whether the meter
posted a running job's time or not.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.books.journal import REVENUE
from ledger.books.tree import account_parents
from ledger.books.tree import subtree as subtree_of
from ledger.errors import InvalidInput, NotFound
from ledger.holds.accrual import accruals
from ledger.money import format_credits
from ledger.pricing.prices import parse_pairs
from ledger.store.tables import accounts_t, entries_t, holds_t, postings_t
from ledger.timeutil import utcnow

GROUPS = ("day", "gres", "user", "partition", "account")
PARTITION_ACCOUNT = "partition_account"  # charge_groups only: keys of (partition, account)


def split_by_weights(amount: int, weights: dict[str, int]) -> dict[str, int]:
    """Split an integer amount by weights with largest remainders, so parts sum exactly."""
    total = sum(weights.values())
    if total == 0:
        return {"-": amount}
    sign = -1 if amount < 0 else 1
    parts = {k: abs(amount) * w // total for k, w in weights.items()}
    rest = abs(amount) - sum(parts.values())
    order = sorted(weights, key=lambda k: (-(abs(amount) * weights[k] % total), k))
    for k in order[:rest]:
        parts[k] += 1
    return {k: sign * v for k, v in parts.items()}


def usage_report(
    s: Session,
    *,
    account: str | None = None,
    user: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    by: str = "day",
    at: datetime | None = None,
    subtree: bool = False,
) -> list[dict[str, Any]]:
    """Charges effective in [start, end), grouped; running jobs count up to `at` (now).
    With `subtree`, `account`'s and every account's below it (ledger.books.tree): a
    department's usage, by child account with `by="account"`."""
    if by not in GROUPS:
        raise InvalidInput(f"cannot group by {by!r}; choose one of {', '.join(GROUPS)}", code="invalid_group")
    accounts: set[str] | None = None
    if account is not None:
        accounts = {account}
        if subtree:
            parents = account_parents(s)
            if account not in parents:
                raise NotFound(f"account {account!r} does not exist", details={"account": account})
            accounts = set(subtree_of(parents, account))
    groups = charge_groups(s, by=by, accounts=accounts, user=user, start=start, end=end, at=at or utcnow())
    return [
        {
            by: key,
            "charged": format_credits(g["charged"]),
            "gpu_seconds": g["gpu_seconds"],
            "jobs": len(g["holds"]),
        }
        for key, g in sorted(groups.items())
    ]


def charge_groups(
    s: Session,
    *,
    by: str,
    start: datetime | None,
    end: datetime | None,
    at: datetime,
    accounts: set[str] | None = None,
    user: str | None = None,
    keep: Callable[[int, str | None], bool] | None = None,
) -> dict[Any, dict[str, Any]]:
    """usage_report's figures before formatting: key -> charged (micro-credits),
    gpu_seconds and the set of holds. `by` is one of GROUPS or PARTITION_ACCOUNT (a key
    of (partition, account)); `keep(hold_id, partition)`, when given, keeps only the
    charges of the holds it accepts (a charge of no hold, a direct consumption, is left
    out): the cloud report's jobs on cloud nodes."""
    query = (
        select(
            entries_t.c.effective_at,
            entries_t.c.user,
            entries_t.c.memo,
            entries_t.c.hold_id,
            accounts_t.c.name.label("account"),
            postings_t.c.amount_ucredits,
            holds_t.c.gpus,
            holds_t.c.unit_prices,
            holds_t.c.partition,
            holds_t.c.job_id,
        )
        .join(postings_t, postings_t.c.entry_id == entries_t.c.id)
        .join(accounts_t, accounts_t.c.id == entries_t.c.account_id)
        .outerjoin(holds_t, holds_t.c.id == entries_t.c.hold_id)
        .where(postings_t.c.account_id == REVENUE)
    )
    if accounts is not None:
        query = query.where(accounts_t.c.name.in_(sorted(accounts)))
    if user is not None:
        query = query.where(entries_t.c.user == user)
    if start is not None:
        query = query.where(entries_t.c.effective_at >= start)
    if end is not None:
        query = query.where(entries_t.c.effective_at < end)
    if keep is not None:
        query = query.where(entries_t.c.hold_id.is_not(None))
    groups: dict[Any, dict[str, Any]] = {}
    for row in s.execute(query.order_by(entries_t.c.id)):
        if keep is not None and not keep(row.hold_id, row.partition):
            continue
        memo = json.loads(row.memo) if row.memo else {}
        delta_seconds = int(memo.get("delta_seconds", 0))
        gpus = parse_pairs(row.gpus) if row.gpus else {}
        if by == "gres":
            prices = parse_pairs(row.unit_prices) if row.unit_prices else {}
            weights = {g: n * prices.get(g, 0) for g, n in gpus.items()}
            shares = split_by_weights(row.amount_ucredits, weights) if gpus else {"-": row.amount_ucredits}
            for gres, amount in shares.items():
                _add(groups, gres, amount, gpus.get(gres, 0) * delta_seconds, row.hold_id)
            continue
        key = _group_key(row, by)
        _add(groups, key, row.amount_ucredits, sum(gpus.values()) * delta_seconds, row.hold_id)
    _add_running(s, groups, by, accounts=accounts, user=user, start=start, end=end, at=at, keep=keep)
    return groups


def _add_running(
    s: Session,
    groups: dict[Any, dict[str, Any]],
    by: str,
    *,
    accounts: set[str] | None,
    user: str | None,
    start: datetime | None,
    end: datetime | None,
    at: datetime,
    keep: Callable[[int, str | None], bool] | None,
) -> None:
    """Add running jobs' unposted cost, piece by piece, as posted charges are added."""
    cuts = [t for t in (start, end) if t is not None]
    for accrual in accruals(s, at, user=user):
        if accounts is not None and accrual.account not in accounts:
            continue
        if keep is not None and not keep(accrual.hold_id, accrual.partition):
            continue
        gpus = parse_pairs(accrual.gpus) if accrual.gpus else {}
        for piece in accrual.pieces(cuts):
            if (start is not None and piece.effective_at < start) or (
                end is not None and piece.effective_at >= end
            ):
                continue
            if by == "gres":
                prices = parse_pairs(accrual.unit_prices) if accrual.unit_prices else {}
                weights = {g: n * prices.get(g, 0) for g, n in gpus.items()}
                shares = split_by_weights(piece.ucredits, weights) if gpus else {"-": piece.ucredits}
                for gres, amount in shares.items():
                    _add(groups, gres, amount, gpus.get(gres, 0) * piece.seconds, accrual.hold_id)
                continue
            key = {
                "day": piece.effective_at.strftime("%Y-%m-%d"),
                "user": accrual.user,
                "partition": accrual.partition or "-",
                "account": accrual.account,
                PARTITION_ACCOUNT: (accrual.partition or "-", accrual.account),
            }[by]
            _add(groups, key, piece.ucredits, accrual.gpu_count * piece.seconds, accrual.hold_id)


def _group_key(row: Any, by: str) -> Any:
    if by == PARTITION_ACCOUNT:
        return (str(row.partition or "-"), str(row.account))
    if by == "day":
        return str(row.effective_at.strftime("%Y-%m-%d"))
    if by == "user":
        return str(row.user or "-")
    if by == "partition":
        return str(row.partition or "-")
    return str(row.account)


def _add(
    groups: dict[Any, dict[str, Any]], key: Any, amount: int, gpu_seconds: int, hold_id: int | None
) -> None:
    g = groups.setdefault(key, {"charged": 0, "gpu_seconds": 0, "holds": set()})
    g["charged"] += amount
    g["gpu_seconds"] += gpu_seconds
    if hold_id is not None:
        g["holds"].add(hold_id)
