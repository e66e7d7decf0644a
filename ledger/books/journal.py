"""The append-only journal: entries with postings that sum to zero, hash-chained per account.

Each customer account carries its own chain (head hash and count on its row), so
writing an entry needs only the row the transaction already locked; no global
sequence serialises the ledger. System accounts appear in postings only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.money import format_credits
from ledger.store.bulk import deferring, insert_rows, insert_rows_referencing, update_rows
from ledger.store.tables import accounts_t, entries_t, postings_t
from ledger.timeutil import format_time, utcnow

# System accounts have fixed negative ids so customer ids from the sequence never clash.
SYSTEM_IDS = {
    "system:payments": -1,
    "system:promotions": -2,
    "system:revenue": -3,
    "system:expired": -4,
    "system:transfers": -5,  # migration 0010: the clearing account of transfers (zero after each)
}
PAYMENTS, PROMOTIONS, REVENUE, EXPIRED, TRANSFERS = (SYSTEM_IDS[n] for n in SYSTEM_IDS)


@dataclass
class LockedAccount:
    """A customer account row locked for this transaction, with its projections."""

    id: int
    name: str
    debt_ucredits: int
    entry_count: int
    head_hash: str


@dataclass
class Leg:
    account_id: int
    amount_ucredits: int
    bucket: str = "system"
    grant_id: int | None = None


@dataclass
class PostedEntry:
    id: int
    seq: int
    effective_at: datetime
    legs: list[Leg] = field(default_factory=list)


def entry_hash(
    prev_hash: str,
    account_id: int,
    seq: int,
    kind: str,
    effective_at: datetime,
    recorded_at: datetime,
    user: str | None,
    hold_id: int | None,
    links_entry_id: int | None,
    memo: str,
    legs: list[tuple[int, int | None, str, int]],
) -> str:
    head = "\x1f".join(
        [
            prev_hash,
            str(account_id),
            str(seq),
            kind,
            format_time(effective_at) or "",
            format_time(recorded_at) or "",
            user or "",
            str(hold_id or ""),
            str(links_entry_id or ""),
            memo,
        ]
    )
    body = "\x1e".join(f"{a},{g if g is not None else ''},{b},{m}" for a, g, b, m in legs)
    return hashlib.sha256(f"{head}\x1d{body}".encode()).hexdigest()


@dataclass
class EntryDraft:
    """One entry to append: what `post` takes, as a value, so many can be posted at once."""

    kind: str
    effective_at: datetime
    legs: list[Leg]
    user: str | None = None
    hold_id: int | None = None
    links_entry_id: int | None = None
    memo: dict[str, Any] | None = None


def post(
    s: Session,
    account: LockedAccount,
    kind: str,
    effective_at: datetime,
    legs: list[Leg],
    *,
    user: str | None = None,
    hold_id: int | None = None,
    links_entry_id: int | None = None,
    memo: dict[str, Any] | None = None,
) -> PostedEntry:
    """Append one entry for `account` (locked by the caller); legs must sum to zero."""
    draft = EntryDraft(kind, effective_at, legs, user, hold_id, links_entry_id, memo)
    return post_many(s, account, [draft])[0]


def post_many(s: Session, account: LockedAccount, drafts: list[EntryDraft]) -> list[PostedEntry]:
    """Append entries for `account` (locked by the caller), chained in order.

    Three statements whatever the count (entries, postings, the account's head), so the
    meter's tick costs a few round trips per account rather than three per charge.
    """
    if not drafts:
        return []
    return post_batch(s, [(account, drafts)])[0]


def post_batch(
    s: Session, batch: Sequence[tuple[LockedAccount, list[EntryDraft]]], *, ids: bool = True
) -> list[list[PostedEntry]]:
    """`post_many` for several accounts (each locked by the caller) in the same three
    statements: the daemon's group commit posts a whole batch of holds or settles at once.
    Each account's entries are chained in the order given; returns them per batch item.

    `ids=False`: the caller needs no entry back (returns empty lists), so inside
    `deferred_writes` on PostgreSQL the entries go into its pipeline too and their
    postings find them by (account, seq): no round trip of their own."""
    recorded_at = utcnow()
    entry_rows: list[dict[str, Any]] = []
    kept_legs: list[list[Leg]] = []
    chains: dict[int, tuple[LockedAccount, int, str, int]] = {}  # id: (account, seq, head, debt change)
    for account, drafts in batch:
        _, seq, head, debt_change = chains.get(
            account.id, (account, account.entry_count, account.head_hash, 0)
        )
        for draft in drafts:
            legs = [leg for leg in draft.legs if leg.amount_ucredits != 0]
            total = sum(leg.amount_ucredits for leg in legs)
            if total != 0:
                raise RuntimeError(
                    f"unbalanced {draft.kind} entry for {account.name}: postings sum to {total}"
                )
            memo_text = json.dumps(draft.memo, sort_keys=True, separators=(",", ":")) if draft.memo else ""
            seq += 1
            digest = entry_hash(
                head,
                account.id,
                seq,
                draft.kind,
                draft.effective_at,
                recorded_at,
                draft.user,
                draft.hold_id,
                draft.links_entry_id,
                memo_text,
                [(g.account_id, g.grant_id, g.bucket, g.amount_ucredits) for g in legs],
            )
            entry_rows.append(
                {
                    "account_id": account.id,
                    "seq": seq,
                    "kind": draft.kind,
                    "effective_at": draft.effective_at,
                    "recorded_at": recorded_at,
                    "user": draft.user,
                    "hold_id": draft.hold_id,
                    "links_entry_id": draft.links_entry_id,
                    "memo": memo_text,
                    "prev_hash": head,
                    "hash": digest,
                }
            )
            kept_legs.append(legs)
            debt_change -= sum(g.amount_ucredits for g in legs if g.bucket == "debt")
            head = digest
        chains[account.id] = (account, seq, head, debt_change)
    if not entry_rows:
        return [[] for _ in batch]
    if not ids and deferring(s):
        insert_rows(s, entries_t, entry_rows)
        insert_rows_referencing(
            s,
            postings_t,
            [
                {
                    "ref_account_id": row["account_id"],
                    "ref_seq": row["seq"],
                    "account_id": g.account_id,
                    "grant_id": g.grant_id,
                    "bucket": g.bucket,
                    "amount_ucredits": g.amount_ucredits,
                }
                for row, legs in zip(entry_rows, kept_legs, strict=True)
                for g in legs
            ],
            "entry_id",
            entries_t,
            ("account_id", "seq"),
        )
        _save_heads(s, chains)
        return [[] for _ in batch]
    returned = insert_rows(s, entries_t, entry_rows, returning=("id", "account_id", "seq"))
    id_by_key = {(row.account_id, row.seq): row.id for row in returned}
    entry_ids = [id_by_key[(row["account_id"], row["seq"])] for row in entry_rows]
    posting_rows = [
        {
            "entry_id": entry_id,
            "account_id": g.account_id,
            "grant_id": g.grant_id,
            "bucket": g.bucket,
            "amount_ucredits": g.amount_ucredits,
        }
        for entry_id, legs in zip(entry_ids, kept_legs, strict=True)
        for g in legs
    ]
    insert_rows(s, postings_t, posting_rows)
    _save_heads(s, chains)
    posted = [
        PostedEntry(entry_id, row["seq"], row["effective_at"], legs)
        for entry_id, row, legs in zip(entry_ids, entry_rows, kept_legs, strict=True)
    ]
    result: list[list[PostedEntry]] = []
    for _account, drafts in batch:
        result.append(posted[: len(drafts)])
        posted = posted[len(drafts) :]
    return result


def _save_heads(s: Session, chains: dict[int, tuple[LockedAccount, int, str, int]]) -> None:
    """Each account's new chain head, entry count and debt, on its row and its object."""
    heads = []
    for account, seq, head, debt_change in chains.values():
        account.entry_count = seq
        account.head_hash = head
        account.debt_ucredits += debt_change
        heads.append(
            {"id": account.id, "entry_count": seq, "head_hash": head, "debt_ucredits": account.debt_ucredits}
        )
    update_rows(s, accounts_t, ("id",), heads)


def entries_page(
    s: Session, account_id: int, *, before_id: int | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """One page of an account's journal, newest first, each entry with its postings.

    `before_id` is the previous page's last id: appending entries never moves it.
    """
    query = select(entries_t).where(entries_t.c.account_id == account_id)
    if before_id is not None:
        query = query.where(entries_t.c.id < before_id)
    entries = s.execute(query.order_by(entries_t.c.id.desc()).limit(limit)).all()
    postings: dict[int, list[dict[str, Any]]] = {row.id: [] for row in entries}
    if postings:
        for leg in s.execute(
            select(postings_t, accounts_t.c.name.label("account"))
            .join(accounts_t, accounts_t.c.id == postings_t.c.account_id)
            .where(postings_t.c.entry_id.in_(list(postings)))
            .order_by(postings_t.c.id)
        ):
            postings[leg.entry_id].append(
                {
                    "account": leg.account,
                    "grant_id": leg.grant_id,
                    "bucket": leg.bucket,
                    "amount": format_credits(leg.amount_ucredits),
                }
            )
    return [
        {
            "id": row.id,
            "seq": row.seq,
            "kind": row.kind,
            "effective_at": format_time(row.effective_at),
            "recorded_at": format_time(row.recorded_at),
            "user": row.user,
            "hold_id": row.hold_id,
            "links_entry_id": row.links_entry_id,
            "memo": json.loads(row.memo) if row.memo else {},
            "postings": postings[row.id],
            "hash": row.hash,
        }
        for row in entries
    ]
