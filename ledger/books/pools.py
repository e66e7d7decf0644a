"""Pooled credit: a parent account shares its credit with its children.

With a pool on (`gpucredit account pool PARENT on [--child-cap C]`), a child's hold that
needs more than the child has borrows the rest from the parent, at the moment of the
hold: the parent's free credit in its burn order moves, as a transfer does, into one new
grant of the child's (source `pool`), which burns after every grant of the child's own
(`POOL_PRIORITY`). A parent short itself borrows first from its own parent when that one
pools too, so nested pools walk up the tree. What a child borrowed and did not spend goes
back when its hold resolves (`return_unused`), to the very grants it came from, so the
parent's credit keeps its expiry and the parent sees it again at once.

Each child may use at most the pool's `child_cap` of the parent's credit: borrowed less
returned, over loans made since the pool was (last) turned on, so spent credit counts
and returned credit does not. Every loan is a row of `pool_loans` (which grant of whose
paid, how much came back), and two journal entries through `system:transfers`, as a
transfer is: the parent's `pool_out`, naming the child and the job, and the child's
`pool` grant. A charge that draws on a pool grant is paid by the lender it names.

What a child may still draw (`room`) is one function of the tree, the pools, each
account's available credit and the caps used, shared by quotes, the job_submit
snapshot and the hold's refusal. A hold that may borrow locks the child and every
lender above it in one statement, in id order (docs/design.md §4.11), before it reads any credit.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from ledger.books import idempotency
from ledger.books.accounts import lock_account, lock_accounts, read_account
from ledger.books.balance import available_credit
from ledger.books.grants import (
    POOL_PRIORITY,
    POOL_REFERENCE,
    GrantState,
    available_now,
    create_grant,
    load_grants,
    save_grants,
    take_free,
)
from ledger.books.journal import TRANSFERS, Leg, LockedAccount, post
from ledger.books.tree import MAX_DEPTH, account_parents
from ledger.errors import InvalidInput
from ledger.money import format_credits, parse_credits
from ledger.store.tables import accounts_t, pool_loans_t, pools_t
from ledger.timeutil import format_time, utcnow

__all__ = [
    "NO_ROOM",
    "POOL_PRIORITY",
    "Pool",
    "Room",
    "borrow",
    "lenders",
    "pool_rooms",
    "pool_settings",
    "pool_uses",
    "return_unused",
    "room_for",
    "set_pool",
]


@dataclass(frozen=True)
class Pool:
    """A parent's pool, as it is on: each child's cap (None: none), counted since `since`."""

    account: str
    child_cap_ucredits: int | None
    since: datetime


@dataclass(frozen=True)
class Room:
    """What an account may draw from the pools above it now, and the nearest lender."""

    ucredits: int = 0
    lender: str | None = None


NO_ROOM = Room()  # a flat account's: no pool above it


def pool_settings(s: Session) -> dict[str, Pool]:
    """Every pool that is on, by the parent's name."""
    rows = s.execute(
        select(accounts_t.c.name, pools_t.c.child_cap_ucredits, pools_t.c.since)
        .join(accounts_t, accounts_t.c.id == pools_t.c.account_id)
        .where(pools_t.c.enabled.is_(True))
    )
    return {name: Pool(name, cap, since) for name, cap, since in rows}


def pool_uses(s: Session, borrowers: Collection[str] | None = None) -> dict[tuple[str, str], int]:
    """(lender, child): the lender's credit the child has used (borrowed less returned)
    under the pool as it is on now (loans since its `since`); every child's, or those of
    `borrowers` only (a hold reads its own chain's, by the loans' index)."""
    lender = accounts_t.alias("lender")
    borrower = accounts_t.alias("borrower")
    query = (
        select(
            lender.c.name,
            borrower.c.name,
            func.sum(pool_loans_t.c.taken_ucredits - pool_loans_t.c.returned_ucredits),
        )
        .join(lender, lender.c.id == pool_loans_t.c.lender_id)
        .join(borrower, borrower.c.id == pool_loans_t.c.borrower_id)
        .join(pools_t, pools_t.c.account_id == pool_loans_t.c.lender_id)
        .where(pool_loans_t.c.created_at >= pools_t.c.since)
        .group_by(lender.c.name, borrower.c.name)
    )
    if borrowers is not None:
        query = query.where(borrower.c.name.in_(sorted(borrowers)))
    return {(lender_name, child): int(used) for lender_name, child, used in s.execute(query)}


def pool_rooms(
    parents: Mapping[str, str | None],
    pools: Mapping[str, Pool],
    available: Mapping[str, int],
    used: Mapping[tuple[str, str], int],
) -> dict[str, Room]:
    """Each pooled account's room: the least of its cap left and what its parent has
    (its available credit plus its own room), never below zero. The one rule."""
    rooms: dict[str, Room] = {}

    def room(name: str, depth: int) -> Room:
        if name in rooms:
            return rooms[name]
        parent = parents.get(name)
        if parent is None or parent not in pools or depth > MAX_DEPTH:
            return Room()
        has = available.get(parent, 0) + room(parent, depth + 1).ucredits
        cap = pools[parent].child_cap_ucredits
        if cap is not None:
            has = min(has, cap - used.get((parent, name), 0))
        rooms[name] = Room(max(0, has), parent)
        return rooms[name]

    for name in parents:
        room(name, 0)
    return rooms


def room_for(s: Session, account: str, at: datetime) -> Room:
    """`account`'s room now, read without locks (a quote; the hold reads it again locked)."""
    pools = pool_settings(s)
    if not pools:
        return Room()
    parents = account_parents(s)
    chain = lenders_in(parents, pools, account)
    if not chain:
        return Room()
    ids = {name: read_account(s, name).id for name in chain}
    credit = available_credit(s, at, list(ids.values()))
    available = {name: credit.get(ids[name], 0) for name in chain}
    used = pool_uses(s, [account, *chain[:-1]])
    return pool_rooms(parents, pools, available, used).get(account, NO_ROOM)


def lenders_in(parents: Mapping[str, str | None], pools: Mapping[str, Pool], account: str) -> list[str]:
    """The accounts `account` may borrow through, nearest first: its parent while that
    pools, then the parent's parent while that one pools, and so on."""
    chain: list[str] = []
    current = parents.get(account)
    while current is not None and current in pools and current not in chain and len(chain) < MAX_DEPTH:
        chain.append(current)
        current = parents.get(current)
    return chain


def lenders(s: Session, account: str) -> list[str]:
    """`lenders_in` from the database: [] (one cheap read) where no pool is on."""
    pools = pool_settings(s)
    return lenders_in(account_parents(s), pools, account) if pools else []


def borrow(
    s: Session,
    locked: Mapping[str, LockedAccount],
    borrower: str,
    need: int,
    at: datetime,
    *,
    user: str | None = None,
    hold_id: int | None = None,
    memo: Mapping[str, Any] | None = None,
) -> int:
    """Lend `borrower` up to `need` from its parent's pool (the parent borrowing its own
    shortfall first, where its parent pools); returns what was lent. The caller asked
    `room_for` first, under the locks of every account involved (`locked`, `lenders`):
    the caps are that function's, and only its."""
    parent = account_parents(s).get(borrower)
    if need <= 0 or parent is None or parent not in locked:
        return 0
    child, lender = locked[borrower], locked[parent]
    want = need
    grants = load_grants(s, lender.id)
    short = want - available_now(grants, lender, at)
    if short > 0 and borrow(s, locked, parent, short, at, user=user, memo={"for": borrower, **(memo or {})}):
        grants = load_grants(s, lender.id)
    lend = min(want, available_now(grants, lender, at))
    if lend <= 0:
        return 0
    legs: list[Leg] = []
    if take_free(grants, lender, lend, at, None, legs):
        raise RuntimeError("available credit was computed but could not be lent")
    taken = {leg.grant_id: -leg.amount_ucredits for leg in legs}
    expiries = [g.expires_at for g in grants if g.id in taken and g.expires_at is not None]
    out = post(
        s,
        lender,
        "pool_out",
        at,
        [*legs, Leg(TRANSFERS, lend)],
        user=user,
        hold_id=hold_id,
        memo={"to": borrower, **(memo or {})},
    )
    save_grants(s, grants)
    received = create_grant(
        s,
        child,
        lend,
        source="pool",
        effective_at=at,
        expires_at=min(expiries) if expiries else None,
        priority=POOL_PRIORITY,
        reference=f"{POOL_REFERENCE}{parent}",
        user=user,
        at=at,
        links_entry_id=out.id,
    )
    s.execute(
        insert(pool_loans_t),
        [
            {
                "lender_id": lender.id,
                "borrower_id": child.id,
                "grant_id": received["grant"]["id"],
                "source_grant_id": grant_id,
                "hold_id": hold_id,
                "taken_ucredits": amount,
                "returned_ucredits": 0,
                "created_at": at,
            }
            for grant_id, amount in taken.items()
            if grant_id is not None
        ],
    )
    return lend


def return_unused(
    s: Session, borrower: LockedAccount, grants: list[GrantState], at: datetime, *, user: str | None = None
) -> int:
    """Give back to their lenders the free part of `borrower`'s pool grants (`grants`:
    its grants as the caller holds them, saved), to the grants the credit came from, in
    reverse burn order; then the lenders' own unused pool credit, up the tree. Returns
    what went back. Called when a hold resolves: what no running job holds is no longer
    the child's to keep.

    The lenders are locked here, after the borrower: such a lock can cross a hold that
    locks the same two in id order; PostgreSQL then fails one of them (a deadlock) and
    the caller retries, as for the daemon's batches (ledger.holds.batch.lock_batch)."""
    # A run's end can precede its loan by a fraction of a second (Slurm's StartTime is whole
    # seconds; the loan is made at the hold's own time): the return is never dated before it.
    spare = [
        g
        for g in grants
        if g.source == "pool" and g.free_ucredits > 0 and g.active_at(max(at, g.effective_at))
    ]
    if not spare:
        return 0
    at = max(at, *(g.effective_at for g in spare))
    loans = s.execute(
        select(pool_loans_t).where(
            pool_loans_t.c.grant_id.in_([g.id for g in spare]),
            pool_loans_t.c.returned_ucredits < pool_loans_t.c.taken_ucredits,
        )
    ).all()
    if not loans:
        return 0
    lenders_by_id = lock_accounts(s, ids=sorted({loan.lender_id for loan in loans}))
    total = 0
    for lender in lenders_by_id.values():
        sources = load_grants(
            s, lender.id, with_remaining=False, ids={loan.source_grant_id for loan in loans}
        )
        for g in spare:
            mine = [loan for loan in loans if loan.grant_id == g.id and loan.lender_id == lender.id]
            if mine:
                total += _give_back(s, borrower, lender, g, mine, sources, at, user)
        save_grants(s, sources)
        return_unused(s, lender, load_grants(s, lender.id), at, user=user)
    save_grants(s, grants)
    return total


def _give_back(
    s: Session,
    borrower: LockedAccount,
    lender: LockedAccount,
    pool_grant: GrantState,
    loans: list[Any],
    sources: list[GrantState],
    at: datetime,
    user: str | None,
) -> int:
    """One pool grant's free part back to its loans' source grants (latest burn first)."""
    amount = pool_grant.free_ucredits
    pool_grant.remaining_ucredits -= amount
    pool_grant.dirty = True
    out = post(
        s,
        borrower,
        "pool_return",
        at,
        [Leg(borrower.id, -amount, "available", pool_grant.id), Leg(TRANSFERS, amount)],
        user=user,
        memo={"to": lender.name, "grant": pool_grant.id},
    )
    by_id = {g.id: g for g in sources}
    legs: list[Leg] = [Leg(TRANSFERS, -amount)]
    left = amount
    for loan in sorted(loans, key=lambda row: by_id[row.source_grant_id].burn_key(), reverse=True):
        give = min(left, loan.taken_ucredits - loan.returned_ucredits)
        if give <= 0:
            continue
        source = by_id[loan.source_grant_id]
        source.remaining_ucredits += give
        source.dirty = True
        legs.append(Leg(lender.id, give, "available", source.id))
        s.execute(
            update(pool_loans_t)
            .where(pool_loans_t.c.id == loan.id)
            .values(returned_ucredits=loan.returned_ucredits + give)
        )
        left -= give
    if left:
        raise RuntimeError(f"pool grant {pool_grant.id} holds {left} more than its loans left to return")
    post(s, lender, "pool_back", at, legs, user=user, links_entry_id=out.id, memo={"from": borrower.name})
    return amount


def set_pool(
    s: Session,
    parent: str,
    enabled: bool,
    child_cap: str | None = None,
    *,
    at: datetime | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Turn `parent`'s pool on (with each child's cap, None: no cap) or off. Turning it on
    starts counting the caps afresh; changing the cap of a pool that is on does not."""
    cap = None if child_cap is None else parse_credits(child_cap, field="child_cap", allow_zero=True)
    if not enabled and child_cap is not None:
        raise InvalidInput("a pool that is off has no child cap", code="invalid_request")
    request = {"account": parent, "enabled": enabled, "child_cap": cap}
    return idempotency.once(
        s,
        idempotency.GLOBAL_SCOPE,
        idempotency_key,
        "account_pool",
        request,
        lambda: _set_pool(s, parent, enabled, cap, at or utcnow()),
    )


def _set_pool(s: Session, parent: str, enabled: bool, cap: int | None, at: datetime) -> dict[str, Any]:
    account = lock_account(s, parent)  # a hold borrowing from it reads the pool under this lock
    row = s.execute(select(pools_t).where(pools_t.c.account_id == account.id)).first()
    if row is None:
        s.execute(
            insert(pools_t).values(account_id=account.id, enabled=enabled, child_cap_ucredits=cap, since=at)
        )
        since = at
    else:
        since = row.since if (row.enabled and enabled) else at
        s.execute(
            update(pools_t)
            .where(pools_t.c.account_id == account.id)
            .values(
                enabled=enabled, child_cap_ucredits=cap if enabled else row.child_cap_ucredits, since=since
            )
        )
    children = sorted(name for name, up in account_parents(s).items() if up == parent)
    return {
        "account": parent,
        "pool": "on" if enabled else "off",
        "child_cap": None if cap is None or not enabled else format_credits(cap),
        "since": format_time(since),
        "children": children,
    }
