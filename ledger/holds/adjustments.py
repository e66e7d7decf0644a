"""Corrections: of a run's charge, one run (`adjust_hold`) or many runs of one account
under one lock (`adjust_holds`, the sacct bridge's batches); and an admin's signed
correction linked to an earlier entry (`adjust`), which goes through the run's hold when
the entry is a run's charge.

The bridge corrects a run's charge to Slurm's record with `adjust_hold`: a lock, six
reads and six writes per run. `adjust_holds` does what calling `adjust_hold` on each
hold in turn would do -- the same entries, postings, grant remainders, allocations,
debt and refund grants, in the same order -- but locks the account once and reads and
writes the holds, their allocations and grants, and the journal in a handful of
batched statements. One transaction still touches one customer account (docs/design.md §4.11).

The money rules are ledger.holds.charges' own (`draw`, `refund`): burn order, debt, what a
refund gives back first. Only the batching is here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from ledger.books import idempotency
from ledger.books.accounts import lock_account, lock_accounts, no_account
from ledger.books.grants import (
    GrantState,
    create_grant,
    grants_by_account,
    load_grants,
    save_grants,
    take_free,
)
from ledger.books.journal import REVENUE, EntryDraft, Leg, LockedAccount, post, post_batch
from ledger.errors import InvalidInput, NotFound
from ledger.holds.charges import Allocation, Charge, apply_charge, draw, refund, save_allocations_many
from ledger.holds.state import HoldState, get_hold, hold_query, lock_hold, to_state
from ledger.money import format_credits, parse_credits
from ledger.store.bulk import update_rows
from ledger.store.tables import allocations_t, entries_t, grants_t, holds_t
from ledger.timeutil import format_time, utcnow

__all__ = [
    "MAX_ADJUSTMENTS_PER_CALL",
    "Adjustment",
    "adjust",
    "adjust_hold",
    "adjust_holds",
    "adjust_holds_many",
    "grants_of_accounts",
]

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
    return adjust_holds_many(s, {account_name: adjustments})[account_name]


def adjust_holds_many(
    s: Session, adjustments: Mapping[str, Sequence[Adjustment]]
) -> dict[str, list[HoldState]]:
    """`adjust_holds` for several accounts in one transaction, in the same statements.

    Each account's holds end as `adjust_holds` on that account alone leaves them (the
    accounts share no grant, hold or debt). The accounts are locked in one statement in
    id order, as the daemon's group commit locks its batches, so two such calls never
    wait on each other in opposite orders. Refuses the whole call as `adjust_holds` does.
    """
    for wanted in adjustments.values():
        _check(wanted)
    named = sorted(name for name, wanted in adjustments.items() if wanted)
    if not named:
        return {name: [] for name in adjustments}
    if len(named) == 1:  # one account: the plain lock (and its refusal), as adjust_hold takes it
        locked = {named[0]: lock_account(s, named[0])}
    else:
        locked = {a.name: a for a in lock_accounts(s, named).values()}
        missing = [name for name in named if name not in locked]
        if missing:
            raise no_account(missing[0])
    ids = [a.hold_id for name in named for a in adjustments[name]]
    holds = {hold.id: hold for hold in map(to_state, s.execute(hold_query().where(holds_t.c.id.in_(ids))))}
    for name in named:
        account = locked[name]
        foreign = sorted(
            a.hold_id
            for a in adjustments[name]
            if a.hold_id not in holds or holds[a.hold_id].account_id != account.id
        )
        if foreign:
            raise NotFound(
                f"hold {foreign[0]} is not a hold of account {account.name}",
                details={"hold_ids": foreign[:20], "account": account.name},
            )
    due = {
        name: rest
        for name in named
        if (rest := [a for a in adjustments[name] if a.target_ucredits != holds[a.hold_id].charged_ucredits])
    }
    if due:
        due_ids = [a.hold_id for rest in due.values() for a in rest]
        links = _resolving_entries(s, due_ids)
        allocations = _load_allocations(s, due_ids)
        while due:
            due = _apply_segments(s, locked, holds, due, links, allocations)
    return {name: [holds[a.hold_id] for a in adjustments[name]] for name in adjustments}


def _check(adjustments: Sequence[Adjustment]) -> None:
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


def grants_of_accounts(
    s: Session, account_ids: Collection[int], touched: Collection[int] = ()
) -> dict[int, list[GrantState]]:
    """Each account's grants with credit left plus the `touched` ones (for refunds), in burn
    order: what `load_grants` and a hold's own read of its grants give, for many accounts
    in one query.

    A touched grant without credit left cannot be drawn from, so listing another hold's
    changes nothing for a hold: each sees what adjust_hold's own read would give it.
    """
    found: dict[int, list[GrantState]] = {account_id: [] for account_id in account_ids}
    if not found:
        return found
    where = grants_t.c.remaining_ucredits > 0
    if touched:
        where = or_(where, grants_t.c.id.in_(sorted(touched)))
    query = select(grants_t).where(grants_t.c.account_id.in_(sorted(found)), where)
    return found | grants_by_account(s.execute(query))


def _apply_segments(
    s: Session,
    locked: Mapping[str, LockedAccount],
    holds: dict[int, HoldState],
    due: Mapping[str, list[Adjustment]],
    links: dict[int, int],
    allocations: dict[int, dict[int, Allocation]],
) -> dict[str, list[Adjustment]]:
    """Each account's holds in order until one leaves a refund its grants cannot take
    back; write what was done (every account in the same statements); return each
    account's holds still to do.

    That refund becomes a new grant (as in adjust_hold), which the account's next holds
    must see: so the rest start afresh from the grants as they are then.
    """
    touched = {grant_id for by_grant in allocations.values() for grant_id in by_grant}
    grants_by_account = grants_of_accounts(s, [locked[name].id for name in due], touched)
    batch: list[tuple[LockedAccount, list[EntryDraft]]] = []
    every_grant: list[GrantState] = []
    done: list[HoldState] = []
    refunds: list[tuple[LockedAccount, int, Adjustment, HoldState]] = []
    rest: dict[str, list[Adjustment]] = {}
    for name, wanted in due.items():
        account = locked[name]
        grants = grants_by_account[account.id]
        every_grant.extend(grants)
        drafts, account_done, unplaced, left = _segment(account, holds, wanted, links, allocations, grants)
        batch.append((account, drafts))
        done.extend(account_done)
        if unplaced:
            refunds.append((account, unplaced, wanted[len(account_done) - 1], account_done[-1]))
        if left:
            rest[name] = left
    post_batch(s, batch)
    save_grants(s, every_grant)
    save_allocations_many(s, {hold.id: allocations[hold.id] for hold in done})
    update_rows(
        s,
        holds_t,
        ("id",),
        [
            {"id": h.id, "charged_ucredits": h.charged_ucredits, "debt_ucredits": h.debt_ucredits}
            for h in done
        ],
    )
    for account, unplaced, adjustment, hold in refunds:  # after the entries that left them
        create_grant(s, account, unplaced, source="refund", at=adjustment.at, user=hold.user)
    return rest


def _segment(
    account: LockedAccount,
    holds: dict[int, HoldState],
    due: list[Adjustment],
    links: dict[int, int],
    allocations: dict[int, dict[int, Allocation]],
    grants: list[GrantState],
) -> tuple[list[EntryDraft], list[HoldState], int, list[Adjustment]]:
    """One account's adjustments in memory, up to the first that leaves an unplaced
    refund: its entries, the holds done, that refund, and the adjustments left."""
    # refund repays debt first, up to the account's debt as the entries so far leave it.
    running = dataclasses.replace(account)
    drafts: list[EntryDraft] = []
    done: list[HoldState] = []
    for position, adjustment in enumerate(due):
        hold = holds[adjustment.hold_id]
        delta = adjustment.target_ucredits - hold.charged_ucredits
        legs: list[Leg] = []
        unplaced = 0
        if delta > 0:
            draw(running, hold, grants, allocations[hold.id], delta, adjustment.at, legs)
        else:
            unplaced = refund(running, hold, grants, allocations[hold.id], -delta, legs)
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
            return drafts, done, unplaced, due[position + 1 :]
    return drafts, done, 0, []


def adjust_hold(
    s: Session,
    hold_id: int,
    target_ucredits: int,
    *,
    at: datetime | None = None,
    reason: str = "",
    links_entry_id: int | None = None,
) -> HoldState:
    """Correct a run's total charge (the bridge's reconciliation); links to the hold's charge."""
    if target_ucredits < 0:
        raise InvalidInput("a run's charge cannot be negative", code="invalid_amount")
    account, hold = lock_hold(s, hold_id)
    if target_ucredits == hold.charged_ucredits:
        return hold
    if links_entry_id is None:
        links_entry_id = s.execute(
            select(entries_t.c.id)
            .where(entries_t.c.hold_id == hold_id, entries_t.c.kind.in_(("settle", "release", "expire")))
            .order_by(entries_t.c.id.desc())
            .limit(1)
        ).scalar()
    return apply_charge(
        s,
        account,
        hold,
        Charge(
            kind="adjust",
            at=at or utcnow(),
            target_ucredits=target_ucredits,
            links_entry_id=links_entry_id,
            memo={"reason": reason} if reason else None,
        ),
    )


def adjust(
    s: Session,
    account: str,
    amount: str,
    *,
    links_entry_id: int,
    reason: str = "",
    at: datetime | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Post a signed correction linked to an earlier charge (repeat-safe with a key)."""
    delta = parse_credits(amount, field="amount", allow_negative=True)
    acct = lock_account(s, account)
    request = {
        "amount": delta,
        "links_entry_id": links_entry_id,
        "reason": reason,
        "at": format_time(at) if at else None,
    }
    first = idempotency.replay(s, acct.id, idempotency_key, "adjust", request)
    if first is not None:
        return first
    result = _adjust(s, acct, delta, links_entry_id, reason, at or utcnow())
    idempotency.remember(s, acct.id, idempotency_key, "adjust", request, result)
    return result


def _adjust(
    s: Session, acct: LockedAccount, delta: int, links_entry_id: int, reason: str, at: datetime
) -> dict[str, Any]:
    """A correction of a job run's charge goes through its hold (so refunds return to the
    grants the run drew from); any other correction charges free credit (else debt) or
    refunds as a new grant."""
    account = acct.name
    linked = s.execute(
        select(entries_t.c.id, entries_t.c.account_id, entries_t.c.hold_id).where(
            entries_t.c.id == links_entry_id
        )
    ).first()
    if linked is None or linked.account_id != acct.id:
        raise NotFound(
            f"entry {links_entry_id} of account {account} does not exist",
            details={"entry_id": links_entry_id, "account": account},
        )
    if linked.hold_id is not None:
        hold = get_hold(s, linked.hold_id)
        target = hold.charged_ucredits + delta
        if target < 0:
            raise InvalidInput(
                f"a refund of {format_credits(-delta)} exceeds the "
                f"{format_credits(hold.charged_ucredits)} this run was charged",
                code="invalid_amount",
            )
        hold = adjust_hold(s, hold.id, target, at=at, reason=reason, links_entry_id=links_entry_id)
        return {
            "account": account,
            "adjustment": format_credits(delta),
            "hold": hold.as_dict(),
            "links_entry_id": links_entry_id,
        }
    if delta > 0:
        grants = load_grants(s, acct.id)
        legs: list[Leg] = []
        short = take_free(grants, acct, delta, at, None, legs)
        if short:
            legs.append(Leg(acct.id, -short, "debt"))
        legs.append(Leg(REVENUE, delta))
        entry = post(
            s,
            acct,
            "adjust",
            at,
            legs,
            links_entry_id=links_entry_id,
            memo={"reason": reason} if reason else None,
        )
        save_grants(s, grants)
        return {
            "account": account,
            "adjustment": format_credits(delta),
            "entry_id": entry.id,
            "links_entry_id": links_entry_id,
        }
    result = create_grant(s, acct, -delta, source="refund", at=at, links_entry_id=links_entry_id)
    return {
        "account": account,
        "adjustment": format_credits(delta),
        "entry_id": result["entry_id"],
        "links_entry_id": links_entry_id,
        "grant": result["grant"],
    }
