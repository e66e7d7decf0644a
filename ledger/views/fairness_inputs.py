"""The ledger's figures behind fairshare: per account, the credit it was given in a window,
what it spent in a (shorter) recent window, what it has left, and each member's spend.

`gpucredit fairshare sync` turns these into Slurm shares (accounting_bridge/sync/fairshare.py
holds the formula). A handful of aggregate reads without locks, whatever the number of
accounts: shares are a slow signal, so a consistent-enough picture is enough.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.books.journal import REVENUE
from ledger.books.tree import account_parents
from ledger.store.sums import joined, split_sum
from ledger.store.tables import accounts_t, entries_t, grants_t, postings_t
from ledger.views.totals import account_totals, memberships

__all__ = ["FUNDING_SOURCES", "FairnessInputs", "fairness_inputs"]

# Credit that funds an account: bought (top-ups) or granted. A refund only gives back
# what a run was charged, so it is no new claim on the cluster.
FUNDING_SOURCES = ("topup", "grant")


@dataclass(frozen=True)
class FairnessInputs:
    """One customer account's figures, in micro-credits."""

    account: str
    funded_ucredits: int  # top-ups and grants taking effect in [funded_since, at]
    spent_ucredits: int  # net charges effective in [spent_since, at] (refunds subtract)
    left_ucredits: int  # available plus held at `at`; <= 0: nothing left to run on
    member_spent_ucredits: dict[str, int]  # every member, by user; 0 when they spent nothing
    parent: str | None = None  # the account's parent in the tree (ledger.books.tree); None: top


def fairness_inputs(
    s: Session, at: datetime, *, funded_since: datetime, spent_since: datetime
) -> list[FairnessInputs]:
    """Every customer account's `FairnessInputs` at `at`, by account name."""
    if funded_since > at or spent_since > at:
        raise ValueError("the windows must start at or before `at`")
    funded = {
        account_id: joined(high, low)
        for account_id, high, low in s.execute(
            select(grants_t.c.account_id, *split_sum(grants_t.c.amount_ucredits))
            .where(
                grants_t.c.source.in_(FUNDING_SOURCES),
                grants_t.c.effective_at >= funded_since,
                grants_t.c.effective_at <= at,
            )
            .group_by(grants_t.c.account_id)
        )
    }
    # What the revenue account received from each account's entries is what it was charged.
    spent: dict[int, dict[str | None, int]] = {}
    for account_id, user, high, low in s.execute(
        select(entries_t.c.account_id, entries_t.c.user, *split_sum(postings_t.c.amount_ucredits))
        .join(postings_t, postings_t.c.entry_id == entries_t.c.id)
        .where(
            postings_t.c.account_id == REVENUE,
            entries_t.c.effective_at >= spent_since,
            entries_t.c.effective_at <= at,
        )
        .group_by(entries_t.c.account_id, entries_t.c.user)
    ):
        spent.setdefault(account_id, {})[user] = joined(high, low)
    ids = {
        name: account_id
        for name, account_id in s.execute(
            select(accounts_t.c.name, accounts_t.c.id).where(accounts_t.c.kind == "customer")
        )
    }
    parents = account_parents(s)
    members: dict[str, list[str]] = {}
    for user, account in memberships(s):
        members.setdefault(account, []).append(user)
    inputs = []
    for totals in account_totals(s, at):
        account_id = ids[totals.account]
        by_user = spent.get(account_id, {})
        inputs.append(
            FairnessInputs(
                account=totals.account,
                funded_ucredits=funded.get(account_id, 0),
                spent_ucredits=sum(by_user.values()),
                left_ucredits=totals.available_ucredits + totals.held_ucredits,
                member_spent_ucredits={
                    user: by_user.get(user, 0) for user in sorted(members.get(totals.account, []))
                },
                parent=parents.get(totals.account),
            )
        )
    return inputs
