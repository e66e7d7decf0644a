"""Many holds, or many settles, in a handful of statements: the daemon's group commit.

`create_holds` and `settle_holds` follow exactly the rules of `create_hold` and
`settle_hold` (they call the same helpers of ledger.holds: the request's checks and
digest, the burn order, the earmark, the charge and the release), but read every
account, hold, grant and price a batch needs in one query each and write the batch's
holds, entries, postings, allocations, grants and account heads in one statement each.

Each request gets its own outcome: its HoldState, its own refusal (a LedgerError, nothing
written for it), or None for the rare cases left to the one-at-a-time functions, which
the caller runs after this batch is written: accounts with limits (their checks read the
active holds, this batch's included), a second request for the same run, a settle of a
hold that is not active (a repeat, or a conflict), a charge lowered below what was
already charged (a refund).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from ledger.accounts import limits_t, lock_accounts, no_account
from ledger.bulk import insert_rows, update_rows
from ledger.errors import LedgerError
from ledger.grants import GrantState, grants_t
from ledger.holds import (
    Allocation,
    HoldState,
    _charge,
    _earmarks,
    _hold_amount,
    _hold_fields,
    _hold_memo,
    _hold_query,
    _hold_request,
    _HoldRequest,
    _reserve,
    _run_conflict,
    _save_allocations_many,
    _settlement,
    _submit_time,
    _to_state,
    allocations_t,
    holds_t,
)
from ledger.journal import EntryDraft, LockedAccount, post_batch
from ledger.models import UNKNOWN_SUBMIT
from ledger.prices import load_price_table
from ledger.timeutil import parse_seconds

Outcome = HoldState | LedgerError | None

__all__ = ["Outcome", "create_holds", "find_active_holds", "settle_holds"]


def create_holds(
    s: Session,
    requests: Sequence[tuple[str, dict[str, Any]]],
    *,
    locked: dict[int, LockedAccount] | None = None,
) -> list[Outcome]:
    """`create_hold(s, account, **arguments)` for each (account, arguments), at once.

    `locked`: accounts this transaction has already locked (`lock_batch`), by id; when it
    holds every account named, they are not read and locked again. Entries posted here
    advance those objects, and accounts locked here are added, so one dict serves a
    transaction's `settle_holds` and `create_holds` alike."""
    outcomes: list[Outcome] = [None] * len(requests)
    checked: dict[int, _HoldRequest] = {}
    runs: set[tuple[str, int, int]] = set()
    for i, (account_name, arguments) in enumerate(requests):
        try:
            req = _hold_request(account_name, **arguments)
        except LedgerError as error:
            outcomes[i] = error
            continue
        except (TypeError, ValueError):
            continue  # left to create_hold, which says what is wrong
        run = (req.cluster, req.job_id, req.run)
        if run not in runs:  # a second request for a run replays or conflicts after this one
            runs.add(run)
            checked[i] = req
    if not checked:
        return outcomes
    names = {r.account for r in checked.values()}
    accounts = {a.name: a for a in (locked or {}).values() if a.name in names}
    if len(accounts) < len(names):
        fresh = lock_accounts(s, names)
        if locked is not None:
            locked.update(fresh)
        accounts = {a.name: a for a in fresh.values()}
    for i, req in list(checked.items()):
        if req.account not in accounts:
            outcomes[i] = no_account(req.account)
            del checked[i]
    capped = _accounts_with_limits(s, {accounts[r.account].id for r in checked.values()})
    existing = _holds_of_runs(s, {(r.cluster, r.job_id) for r in checked.values()})
    prices = load_price_table(s) if checked else None
    planned: list[tuple[int, _HoldRequest, LockedAccount, dict[str, Any], list[Any]]] = []
    grants = _grants_of(s, {accounts[r.account].id for r in checked.values()}, touched=set())
    for i, req in checked.items():
        account = accounts[req.account]
        if account.id in capped:
            continue  # limits read this batch's holds too: create_hold checks them after it
        try:
            found = existing.get((req.cluster, req.job_id, req.run, req.submitted_at))
            if found is not None:
                held, digest = found
                if digest != req.digest:
                    raise _run_conflict(held)
                outcomes[i] = held
                continue
            assert prices is not None
            rate, unit_prices = prices.rate_for(req.gpus, req.partition, req.at)
            amount = _hold_amount(req, rate)
            legs = _reserve(grants.setdefault(account.id, []), account, req, amount)
        except LedgerError as error:
            outcomes[i] = error
            continue
        planned.append((i, req, account, _hold_fields(req, rate, unit_prices, amount), legs))
    if not planned:
        return outcomes
    rows = [
        {
            "account_id": account.id,
            "charged_ucredits": 0,
            "charged_seconds": 0,
            "debt_ucredits": 0,
            "state": "active",
            "resolved_at": None,
            **fields,
            "request_hash": req.digest,
        }
        for _, req, account, fields, _ in planned
    ]
    returned = insert_rows(s, holds_t, rows, returning=("id", "cluster", "job_id", "run"))
    hold_ids = {(row.cluster, row.job_id, row.run): row.id for row in returned}
    drafts: dict[int, tuple[LockedAccount, list[EntryDraft]]] = {}
    earmarks: list[dict[str, int]] = []
    for i, req, account, fields, legs in planned:
        hold_id = hold_ids[(req.cluster, req.job_id, req.run)]
        drafts.setdefault(account.id, (account, []))[1].append(
            EntryDraft("hold", req.at, legs, user=req.user, hold_id=hold_id, memo=_hold_memo(req))
        )
        earmarks.extend(_earmarks(hold_id, legs))
        outcomes[i] = HoldState(
            id=hold_id,
            account=account.name,
            account_id=account.id,
            charged_ucredits=0,
            charged_seconds=0,
            debt_ucredits=0,
            state="active",
            resolved_at=None,
            **fields,
        )
    post_batch(s, list(drafts.values()))
    insert_rows(s, allocations_t, earmarks)
    _save_grants(s, [g for account_grants in grants.values() for g in account_grants])
    return outcomes


def find_active_holds(
    s: Session, attempts: Sequence[tuple[str, int, datetime | None]]
) -> list[HoldState | None]:
    """`find_active_hold(s, cluster, job_id, submitted_at)` for each attempt, in one query."""
    if not attempts:
        return []
    newest: dict[tuple[str, int], list[HoldState]] = {}
    query = _hold_query().where(
        holds_t.c.state == "active", holds_t.c.job_id.in_(sorted({job_id for _, job_id, _ in attempts}))
    )
    for row in s.execute(query.order_by(holds_t.c.id.desc())):
        hold = _to_state(row)
        newest.setdefault((hold.cluster, hold.job_id), []).append(hold)
    found: list[HoldState | None] = []
    for cluster, job_id, submitted_at in attempts:
        wanted = None if submitted_at is None else (_submit_time(submitted_at), UNKNOWN_SUBMIT)
        found.append(
            next(
                (h for h in newest.get((cluster, job_id), []) if wanted is None or h.submitted_at in wanted),
                None,
            )
        )
    return found


def settle_holds(
    s: Session,
    settles: Sequence[tuple[int, int | str, datetime | None]],
    *,
    locked: dict[int, LockedAccount] | None = None,
) -> list[Outcome]:
    """`settle_hold(s, hold_id, elapsed, at)` for each (hold id, elapsed, at), at once.

    `locked`: as for `create_holds`; when it holds every owner of these holds, they are
    not locked again."""
    outcomes: list[Outcome] = [None] * len(settles)
    wanted: dict[int, tuple[int, int, datetime | None]] = {}  # hold id: (index, elapsed, at)
    for i, (hold_id, elapsed, at) in enumerate(settles):
        try:
            seconds = parse_seconds(elapsed, field="elapsed")
        except LedgerError as error:
            outcomes[i] = error
            continue
        if hold_id not in wanted:
            wanted[hold_id] = (i, seconds, at)
    if not wanted:
        return outcomes
    read = [_to_state(row) for row in s.execute(_hold_query().where(holds_t.c.id.in_(sorted(wanted))))]
    accounts = locked or {}
    if any(hold.account_id not in accounts for hold in read):
        # Lock the owners (by id: see `lock_batch`), then read their holds under the lock.
        accounts = lock_accounts(s, ids=sorted({hold.account_id for hold in read}))
        if locked is not None:
            locked.update(accounts)  # the same objects for what follows in this transaction
        read = [_to_state(row) for row in s.execute(_hold_query().where(holds_t.c.id.in_(sorted(wanted))))]
    holds = [hold for hold in read if hold.state == "active" and hold.account_id in accounts]
    plans = []
    for hold in sorted(holds, key=lambda h: wanted[h.id][0]):
        i, seconds, at = wanted[hold.id]
        settlement = _settlement(hold, seconds, at)
        if settlement["target_ucredits"] < hold.charged_ucredits:
            continue  # a refund may become a refund grant: settle_hold does it
        plans.append((i, hold, settlement))
    if not plans:
        return outcomes
    allocations: dict[int, dict[int, Allocation]] = {hold.id: {} for _, hold, _ in plans}
    for row in s.execute(select(allocations_t).where(allocations_t.c.hold_id.in_(sorted(allocations)))):
        allocations[row.hold_id][row.grant_id] = Allocation(
            row.grant_id, row.earmarked_ucredits, row.drawn_ucredits
        )
    touched = {grant_id for by_grant in allocations.values() for grant_id in by_grant}
    grants = _grants_of(s, {hold.account_id for _, hold, _ in plans}, touched)
    drafts: dict[int, tuple[LockedAccount, list[EntryDraft]]] = {}
    changed: list[dict[str, Any]] = []
    for i, hold, settlement in plans:
        account = accounts[hold.account_id]
        draft, values, _unplaced = _charge(
            account, hold, grants.get(account.id, []), allocations[hold.id], **settlement
        )
        drafts.setdefault(account.id, (account, []))[1].append(draft)
        changed.append({"id": hold.id, **values})
        outcomes[i] = dataclasses.replace(hold, **values)
    post_batch(s, list(drafts.values()))
    _save_grants(s, [g for account_grants in grants.values() for g in account_grants])
    _save_allocations_many(s, allocations)
    update_rows(s, holds_t, ("id",), changed)
    return outcomes


def _accounts_with_limits(s: Session, account_ids: set[int]) -> set[int]:
    if not account_ids:
        return set()
    query = select(limits_t.c.account_id).where(limits_t.c.account_id.in_(sorted(account_ids)))
    return set(s.execute(query.distinct()).scalars())


def _holds_of_runs(s: Session, jobs: set[tuple[str, int]]) -> dict[tuple[Any, ...], tuple[HoldState, str]]:
    """Existing holds of these jobs' ids by (cluster, job id, run, submitted at), with their digests."""
    if not jobs:
        return {}
    query = _hold_query().add_columns(holds_t.c.request_hash.label("_digest"))
    query = query.where(holds_t.c.job_id.in_(sorted({job_id for _, job_id in jobs})))
    found: dict[tuple[Any, ...], tuple[HoldState, str]] = {}
    for row in s.execute(query):
        fields = dict(row._mapping)
        digest = fields.pop("_digest")
        hold = HoldState(**fields)
        if (hold.cluster, hold.job_id) in jobs:
            found[(hold.cluster, hold.job_id, hold.run, hold.submitted_at)] = (hold, digest)
    return found


def _grants_of(s: Session, account_ids: set[int], touched: set[int]) -> dict[int, list[GrantState]]:
    """Each account's grants with credit left, plus the `touched` ones, in burn order
    (what `load_grants` and `_grants_for` read, for many accounts in one query)."""
    if not account_ids:
        return {}
    where = grants_t.c.remaining_ucredits > 0
    if touched:
        where = or_(where, grants_t.c.id.in_(sorted(touched)))
    by_account: dict[int, list[GrantState]] = {}
    for r in s.execute(select(grants_t).where(grants_t.c.account_id.in_(sorted(account_ids)), where)):
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
            )
        )
    for account_grants in by_account.values():
        account_grants.sort(key=GrantState.burn_key)
    return by_account


def _save_grants(s: Session, grants: list[GrantState]) -> None:
    """`save_grants` in one statement: the same invariant, checked before anything is written."""
    dirty = [g for g in grants if g.dirty]
    for g in dirty:
        if g.remaining_ucredits < 0 or not 0 <= g.earmarked_ucredits <= g.remaining_ucredits:
            raise RuntimeError(
                f"grant {g.id} would break its invariant: "
                f"remaining {g.remaining_ucredits}, earmarked {g.earmarked_ucredits}"
            )
    update_rows(
        s,
        grants_t,
        ("id",),
        [
            {
                "id": g.id,
                "remaining_ucredits": g.remaining_ucredits,
                "earmarked_ucredits": g.earmarked_ucredits,
            }
            for g in dirty
        ],
    )
    for g in dirty:
        g.dirty = False
