"""The audit: every account's journal recomputed and checked against what was kept.

`verify` walks each customer account's chain (sequence, previous hash, each entry's
hash over its postings), checks that each entry's postings sum to zero, and recomputes
the projections the hot path maintains (the account's debt, each grant's remaining and
earmarked credit) and the balance checkpoints (ledger.books.checkpoints) from the
journal alone. `journal_entries` pages one account's journal with its postings, for
an auditor to read. The audit reads the journal; it is not the journal, which only
appends (ledger.books.journal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.books.accounts import read_account
from ledger.books.checkpoints import verify_checkpoints
from ledger.books.journal import entries_page, entry_hash
from ledger.store.tables import accounts_t, entries_t, grants_t, postings_t


@dataclass
class VerifyReport:
    accounts: int = 0
    entries: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(s: Session) -> VerifyReport:
    """Recompute every chain, every projection and every balance checkpoint from the
    journal; report each mismatch."""

    report = VerifyReport()
    accounts = s.execute(
        select(accounts_t).where(accounts_t.c.kind == "customer").order_by(accounts_t.c.id)
    ).all()
    for acct in accounts:
        report.accounts += 1
        _verify_account(s, acct, report)
        report.problems.extend(verify_checkpoints(s, acct.id, acct.name))
    return report


def _verify_account(s: Session, acct: Any, report: VerifyReport) -> None:
    legs_by_entry: dict[int, list[tuple[int, int | None, str, int]]] = {}
    for row in s.execute(
        select(
            postings_t.c.entry_id,
            postings_t.c.account_id,
            postings_t.c.grant_id,
            postings_t.c.bucket,
            postings_t.c.amount_ucredits,
        )
        .join(entries_t, entries_t.c.id == postings_t.c.entry_id)
        .where(entries_t.c.account_id == acct.id)
        .order_by(postings_t.c.id)
    ):
        legs_by_entry.setdefault(row.entry_id, []).append(
            (row.account_id, row.grant_id, row.bucket, row.amount_ucredits)
        )
    prev = ""
    expected_seq = 0
    grant_totals: dict[int, list[int]] = {}
    debt = 0
    for entry in s.execute(
        select(entries_t).where(entries_t.c.account_id == acct.id).order_by(entries_t.c.seq)
    ):
        report.entries += 1
        expected_seq += 1
        where = f"account {acct.name} entry {entry.id} (seq {entry.seq})"
        if entry.seq != expected_seq:
            report.problems.append(f"{where}: expected seq {expected_seq}; an entry is missing")
            expected_seq = entry.seq
        if entry.prev_hash != prev:
            report.problems.append(f"{where}: prev_hash does not match the previous entry")
        legs = legs_by_entry.get(entry.id, [])
        digest = entry_hash(
            entry.prev_hash,
            entry.account_id,
            entry.seq,
            entry.kind,
            entry.effective_at,
            entry.recorded_at,
            entry.user,
            entry.hold_id,
            entry.links_entry_id,
            entry.memo,
            legs,
        )
        if digest != entry.hash:
            report.problems.append(f"{where}: hash mismatch; the entry or its postings were edited")
        if sum(leg[3] for leg in legs) != 0:
            report.problems.append(f"{where}: postings do not sum to zero")
        for account_id, grant_id, bucket, amount in legs:
            if account_id != acct.id:
                continue
            if bucket == "debt":
                debt -= amount
            elif grant_id is not None:
                totals = grant_totals.setdefault(grant_id, [0, 0])
                totals[0 if bucket == "available" else 1] += amount
        prev = entry.hash
    if prev != acct.head_hash or expected_seq != acct.entry_count:
        report.problems.append(
            f"account {acct.name}: chain head does not match its last entry "
            "(entries were removed or appended outside the ledger)"
        )
    if debt != acct.debt_ucredits:
        report.problems.append(f"account {acct.name}: debt {acct.debt_ucredits} != journal {debt}")
    for grant in s.execute(select(grants_t).where(grants_t.c.account_id == acct.id)):
        available, held = grant_totals.get(grant.id, [0, 0])
        if (grant.remaining_ucredits, grant.earmarked_ucredits) != (available + held, held):
            report.problems.append(
                f"account {acct.name} grant {grant.id}: remaining/earmarked "
                f"{grant.remaining_ucredits}/{grant.earmarked_ucredits} != journal {available + held}/{held}"
            )


def journal_entries(
    s: Session, account: str, *, before_id: int | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """One page of `account`'s journal, newest first, with postings (the audit view)."""
    return entries_page(s, read_account(s, account).id, before_id=before_id, limit=limit)
