"""Many runs' charge corrections for one account under one lock (the sacct bridge's batches).

The bridge corrects a run's charge to Slurm's record with `adjust_hold`: a lock, six
reads and six writes per run. `adjust_holds` does what calling `adjust_hold` on each
hold in turn would do -- the same entries, postings, grant remainders, allocations,
debt and refund grants, in the same order -- but locks the account once and reads and
writes the holds, their allocations and grants, and the journal in a handful of
batched statements. One transaction still touches one customer account (DESIGN §4).

The money rules are holds.py's own (`_draw`, `_refund`): burn order, debt, what a
refund gives back first. Only the batching is here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ledger.accounts import lock_account
from ledger.bulk import insert_rows, update_rows
from ledger.errors import InvalidInput, NotFound
from ledger.grants import GrantState, create_grant, load_grants, save_grants
from ledger.holds import (
    Allocation,
    HoldState,
    _draw,
    _hold_query,
    _refund,
    _to_state,
    allocations_t,
    holds_t,
)
from ledger.journal import EntryDraft, Leg, LockedAccount, entries_t, post_many

__all__ = ["MAX_ADJUSTMENTS_PER_CALL", "Adjustment", "adjust_holds"]

# One account's corrections per call: bounds the transaction and the statements' sizes.
MAX_ADJUSTMENTS_PER_CALL = 10_000
# An adjustment links to the entry that resolved the hold (as adjust_hold's does).
_RESOLVING_KINDS = ("settle", "release", "expire")


class Adjustment(NamedTuple):
    """Bring hold `hold_id`'s total charge to `target_ucredits`, effective `at`."""

    hold_id: int
    target_ucredits: int
    at: datetime
    reason: str = ""


def adjust_holds(s: Session, account_name: str, adjustments: Sequence[Adjustment]) -> list[HoldState]:
    """Correct the charges of many holds of one account, as `adjust_hold` on each in turn.

    Refuses the whole call (nothing written) when a hold is not this account's, is
    listed twice, or a target is negative. A hold already charged its target is left
    alone. Returns every hold as it is afterwards, in the order given.
    """
    if len(adjustments) > MAX_ADJUSTMENTS_PER_CALL:
        raise InvalidInput(
            f"{len(adjustments)} adjustments in one call; at most {MAX_ADJUSTMENTS_PER_CALL}",
            code="too_many",
            details={"count": len(adjustments), "cap": MAX_ADJUSTMENTS_PER_CALL},
        )
    ids = [a.hold_id for a in adjustments]
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise InvalidInput(f"hold {twice} is listed twice", code="invalid_hold", details={"hold_id": twice})
    for a in adjustments:
        if a.target_ucredits < 0:
            raise InvalidInput("a run's charge cannot be negative", code="invalid_amount")
    if not adjustments:
        return []
    account = lock_account(s, account_name)
    holds = {hold.id: hold for hold in map(_to_state, s.execute(_hold_query().where(holds_t.c.id.in_(ids))))}
    foreign = sorted(i for i in ids if i not in holds or holds[i].account_id != account.id)
    if foreign:
        raise NotFound(
            f"hold {foreign[0]} is not a hold of account {account.name}",
            details={"hold_ids": foreign[:20], "account": account.name},
        )
    due = [a for a in adjustments if a.target_ucredits != holds[a.hold_id].charged_ucredits]
    if due:
        links = _resolving_entries(s, [a.hold_id for a in due])
        allocations = _load_allocations(s, [a.hold_id for a in due])
        while due:
            due = _apply_segment(s, account, holds, due, links, allocations)
    return [holds[i] for i in ids]


def _resolving_entries(s: Session, hold_ids: Sequence[int]) -> dict[int, int]:
    """Each hold's latest settle/release/expire entry: what its adjustment links to."""
    query = (
        select(entries_t.c.hold_id, func.max(entries_t.c.id))
        .where(entries_t.c.hold_id.in_(hold_ids), entries_t.c.kind.in_(_RESOLVING_KINDS))
        .group_by(entries_t.c.hold_id)
    )
    return {hold_id: entry_id for hold_id, entry_id in s.execute(query)}


def _load_allocations(s: Session, hold_ids: Sequence[int]) -> dict[int, dict[int, Allocation]]:
    found: dict[int, dict[int, Allocation]] = {hold_id: {} for hold_id in hold_ids}
    for row in s.execute(select(allocations_t).where(allocations_t.c.hold_id.in_(hold_ids))):
        found[row.hold_id][row.grant_id] = Allocation(
            row.grant_id, row.earmarked_ucredits, row.drawn_ucredits
        )
    return found


def _grants(
    s: Session, account: LockedAccount, allocations: dict[int, dict[int, Allocation]]
) -> list[GrantState]:
    """Grants with credit left plus every grant these holds touched (for refunds), in burn order.

    A touched grant without credit left cannot be drawn from, so listing another hold's
    changes nothing for a hold: each sees what adjust_hold's own read would give it.
    """
    grants = {g.id: g for g in load_grants(s, account.id)}
    missing = {grant_id for by_grant in allocations.values() for grant_id in by_grant} - set(grants)
    if missing:
        for g in load_grants(s, account.id, with_remaining=False, ids=missing):
            grants[g.id] = g
    return sorted(grants.values(), key=GrantState.burn_key)


def _apply_segment(
    s: Session,
    account: LockedAccount,
    holds: dict[int, HoldState],
    due: list[Adjustment],
    links: dict[int, int],
    allocations: dict[int, dict[int, Allocation]],
) -> list[Adjustment]:
    """Adjust holds in order until one leaves a refund its grants cannot take back; write
    what was done; return the holds still to do.

    That refund becomes a new grant (as in adjust_hold), which the next holds must see:
    so the rest start afresh from the grants as they are then.
    """
    grants = _grants(s, account, allocations)
    # _refund repays debt first, up to the account's debt as the entries so far leave it.
    running = dataclasses.replace(account)
    drafts: list[EntryDraft] = []
    done: list[HoldState] = []
    unplaced = 0
    rest: list[Adjustment] = []
    for position, adjustment in enumerate(due):
        hold = holds[adjustment.hold_id]
        delta = adjustment.target_ucredits - hold.charged_ucredits
        legs: list[Leg] = []
        if delta > 0:
            _draw(running, hold, grants, allocations[hold.id], delta, adjustment.at, legs)
        else:
            unplaced = _refund(running, hold, grants, allocations[hold.id], -delta, legs)
        running.debt_ucredits -= sum(leg.amount_ucredits for leg in legs if leg.bucket == "debt")
        memo: dict[str, Any] = {"job": f"{hold.cluster}/{hold.job_id}/{hold.run}", "charge": delta}
        if adjustment.reason:
            memo["reason"] = adjustment.reason
        drafts.append(
            EntryDraft(
                "adjust",
                adjustment.at,
                legs,
                user=hold.user,
                hold_id=hold.id,
                links_entry_id=links.get(hold.id),
                memo=memo,
            )
        )
        hold.charged_ucredits = adjustment.target_ucredits
        done.append(hold)
        if unplaced:
            rest = due[position + 1 :]
            break
    post_many(s, account, drafts)
    save_grants(s, grants)
    _save_allocations(s, {hold.id: allocations[hold.id] for hold in done})
    update_rows(
        s,
        holds_t,
        ("id",),
        [
            {"id": h.id, "charged_ucredits": h.charged_ucredits, "debt_ucredits": h.debt_ucredits}
            for h in done
        ],
    )
    if unplaced:  # the loop stopped at the adjustment that left it
        create_grant(s, account, unplaced, source="refund", at=adjustment.at, user=done[-1].user)
    return rest


def _save_allocations(s: Session, allocations: dict[int, dict[int, Allocation]]) -> None:
    new: list[dict[str, int]] = []
    changed: list[dict[str, int]] = []
    for hold_id, by_grant in allocations.items():
        for a in by_grant.values():
            if a.dirty:
                (new if a.is_new else changed).append(
                    {
                        "hold_id": hold_id,
                        "grant_id": a.grant_id,
                        "earmarked_ucredits": a.earmarked_ucredits,
                        "drawn_ucredits": a.drawn_ucredits,
                    }
                )
                a.is_new = a.dirty = False  # written: a later segment updates them
    insert_rows(s, allocations_t, new)
    update_rows(s, allocations_t, ("hold_id", "grant_id"), changed)
