"""An account's monthly cloud budget: what it has spent on cloud partitions this month,
and whether one more job fits (`[routing.accounts.NAME] cloud_budget`, docs/routing.md).

    spent  = credits charged to runs in cloud partitions, effective in the month (UTC),
             net of the refunds posted on those runs (a run's negative charges)
           + what the account's open holds on cloud partitions still reserve
             (amount less what they have already been charged)
    a job fits when  spent + the job's quote (every task)  <=  budget

The charged part is the usage report's own figure (ledger.views.reports: revenue
postings of entries that name a hold, cut at the month by effective time), restricted
to holds in the cloud partitions the caller names: the ledger knows no sites, the
config does. A part of a refund that could not go back to the grants it came from
becomes a refund grant naming no run; it is not netted here, as the usage report does
not net it either, so the figure errs towards spent, never towards free.

One statement for every budgeted account, read with the daemon's snapshot
(ledger.pricing.snapshot): the month's entries through the (account_id, effective_at)
index, the open holds through (account_id, state). job_submit compares in memory.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, case, func, literal, select, union_all
from sqlalchemy.orm import Session

from ledger.books.journal import REVENUE
from ledger.errors import LimitExceeded
from ledger.money import format_credits
from ledger.store.models import HoldStatus
from ledger.store.tables import accounts_t, entries_t, holds_t, postings_t
from ledger.timeutil import as_utc

__all__ = [
    "CLOUD_BUDGET",
    "CloudBudgetScope",
    "CloudSpend",
    "cloud_budget_breach",
    "cloud_spend",
    "month_of",
]

CLOUD_BUDGET = "cloud_budget"  # the refusal's code (a LimitExceeded, like daily_cap)


@dataclass(frozen=True)
class CloudBudgetScope:
    """What the snapshot reads spend for: the cloud partitions and the budgeted accounts."""

    partitions: frozenset[str]
    accounts: frozenset[str]


@dataclass(frozen=True)
class CloudSpend:
    """One account's cloud spend in `month` (YYYY-MM, UTC), in micro-credits."""

    account: str
    month: str
    charged_ucredits: int = 0
    held_ucredits: int = 0

    @property
    def spent_ucredits(self) -> int:
        return self.charged_ucredits + self.held_ucredits


def month_of(at: datetime) -> tuple[str, datetime, datetime]:
    """`at`'s month as YYYY-MM, and its [first instant, first instant of the next), UTC."""
    at = as_utc(at)
    start = datetime(at.year, at.month, 1, tzinfo=UTC)
    end = datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)
    return f"{at.year:04d}-{at.month:02d}", start, end


def cloud_spend(
    s: Session, *, cloud_partitions: Collection[str], accounts: Collection[str], at: datetime
) -> dict[str, CloudSpend]:
    """Each of `accounts`' cloud spend in `at`'s month (see the module's formula); an
    account with none, or unknown, reads as zero. One statement."""
    month, start, end = month_of(at)
    found = {name: CloudSpend(name, month) for name in accounts}
    if not accounts or not cloud_partitions:
        return found
    query = spend_query(cloud_partitions, accounts, start, end)
    for name, charged_ucredits, held_ucredits in s.execute(query):
        found[name] = CloudSpend(name, month, int(charged_ucredits), int(held_ucredits))
    return found


def spend_query(
    cloud_partitions: Collection[str], accounts: Collection[str], start: datetime, end: datetime
) -> Select[Any]:
    """(account, charged, held) of `accounts` in [start, end): `cloud_spend`'s statement,
    apart so a test can read its plan."""
    partitions = sorted(cloud_partitions)
    ids = select(accounts_t.c.id).where(accounts_t.c.name.in_(sorted(accounts)))
    charged = (
        select(
            entries_t.c.account_id.label("account_id"),
            postings_t.c.amount_ucredits.label("charged"),
            literal(0).label("held"),
        )
        .join(postings_t, postings_t.c.entry_id == entries_t.c.id)
        .join(holds_t, holds_t.c.id == entries_t.c.hold_id)
        .where(
            entries_t.c.account_id.in_(ids),
            entries_t.c.effective_at >= start,
            entries_t.c.effective_at < end,
            # "+ 0": the revenue account's postings are every charge ever; reach them
            # through this month's entries (entry_id), never through their own index.
            postings_t.c.account_id + 0 == REVENUE,
            holds_t.c.partition.in_(partitions),
        )
    )
    held = select(
        holds_t.c.account_id.label("account_id"),
        literal(0).label("charged"),
        # a hold charged past its amount (an overrun) reserves nothing more, never less
        case(
            (
                holds_t.c.amount_ucredits > holds_t.c.charged_ucredits,
                holds_t.c.amount_ucredits - holds_t.c.charged_ucredits,
            ),
            else_=0,
        ).label("held"),
    ).where(
        holds_t.c.account_id.in_(ids),
        holds_t.c.state == HoldStatus.ACTIVE,
        holds_t.c.partition.in_(partitions),
    )
    parts = union_all(charged, held).subquery()
    rows = select(
        accounts_t.c.name,
        func.coalesce(func.sum(parts.c.charged), 0),
        func.coalesce(func.sum(parts.c.held), 0),
    ).join(parts, parts.c.account_id == accounts_t.c.id)
    return rows.group_by(accounts_t.c.name)


def cloud_budget_breach(
    spend: CloudSpend, budget_ucredits: int, cost_ucredits: int, *, sent_ucredits: int = 0
) -> LimitExceeded | None:
    """The refusal when a job costing `cost_ucredits` would take the account past its
    cloud budget (spent + sent + cost > budget; exactly the budget fits), else None.
    `sent_ucredits`: what the account's jobs already sent to the cloud, not yet started
    (so neither charged nor held), may still spend there; the burst pass counts them."""
    if spend.spent_ucredits + sent_ucredits + cost_ucredits <= budget_ucredits:
        return None
    sent = f", sent and not started {format_credits(sent_ucredits)}" if sent_ucredits else ""
    return LimitExceeded(
        CLOUD_BUDGET,
        f"account {spend.account}: cloud budget {format_credits(budget_ucredits)} credits for "
        f"{spend.month}, spent {format_credits(spend.spent_ucredits)}{sent}, "
        f"this job {format_credits(cost_ucredits)}",
        {
            "account": spend.account,
            "month": spend.month,
            "budget": format_credits(budget_ucredits),
            "spent": format_credits(spend.spent_ucredits),
            "charged": format_credits(spend.charged_ucredits),
            "held": format_credits(spend.held_ucredits),
            "sent": format_credits(sent_ucredits),
            "cost": format_credits(cost_ucredits),
        },
    )
