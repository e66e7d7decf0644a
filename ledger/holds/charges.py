"""How a hold's charge moves credit: the one rule behind every charge, settle, release
and correction of a hold.

A charge brings the hold's cumulative charge to the cost of its cumulative seconds,
rounded once, drawing first from the hold's own earmarks and the free part of grants
active at the charge's effective time (so expiring credit goes first), never from
another hold's earmarks; what cannot be drawn is recorded as debt. A lower charge
refunds: debt first, then the hold's grants in reverse burn order, and what no grant
can take back becomes a refund grant. Resolving a hold releases what is left of its
earmarks. A `Charge` is one such change; `plan_charge` is its in-memory part (shared
with the batches), and `apply_charge` reads and writes one hold around it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from ledger.books.grants import GrantState, create_grant, load_grants, save_grants
from ledger.books.journal import REVENUE, EntryDraft, Leg, LockedAccount, post_many
from ledger.books.pools import return_unused
from ledger.holds.state import HoldState
from ledger.store.bulk import insert_rows, update_rows
from ledger.store.tables import allocations_t, holds_t


@dataclass
class Allocation:
    grant_id: int
    earmarked_ucredits: int
    drawn_ucredits: int
    is_new: bool = False
    dirty: bool = False


def load_allocations(s: Session, hold_id: int) -> dict[int, Allocation]:
    return {
        r.grant_id: Allocation(r.grant_id, r.earmarked_ucredits, r.drawn_ucredits)
        for r in s.execute(select(allocations_t).where(allocations_t.c.hold_id == hold_id))
    }


def _save_allocations(s: Session, hold_id: int, allocations: dict[int, Allocation]) -> None:
    new = [a for a in allocations.values() if a.is_new]
    if new:
        s.execute(
            insert(allocations_t),
            [
                {
                    "hold_id": hold_id,
                    "grant_id": a.grant_id,
                    "earmarked_ucredits": a.earmarked_ucredits,
                    "drawn_ucredits": a.drawn_ucredits,
                }
                for a in new
            ],
        )
    for a in allocations.values():
        if a.dirty and not a.is_new:
            s.execute(
                update(allocations_t)
                .where(allocations_t.c.hold_id == hold_id, allocations_t.c.grant_id == a.grant_id)
                .values(earmarked_ucredits=a.earmarked_ucredits, drawn_ucredits=a.drawn_ucredits)
            )


def draw(
    account: LockedAccount,
    hold: HoldState,
    grants: list[GrantState],
    allocations: dict[int, Allocation],
    amount: int,
    at: datetime,
    legs: list[Leg],
) -> None:
    need = amount
    for g in grants:
        if need == 0:
            break
        alloc = allocations.get(g.id)
        if alloc is not None and alloc.earmarked_ucredits > 0:
            take = min(need, alloc.earmarked_ucredits)
            alloc.earmarked_ucredits -= take
            alloc.drawn_ucredits += take
            alloc.dirty = True
            g.earmarked_ucredits -= take
            g.remaining_ucredits -= take
            g.dirty = True
            legs.append(Leg(account.id, -take, "held", g.id))
            need -= take
        if need and g.active_at(at) and g.free_ucredits > 0:
            take = min(need, g.free_ucredits)
            if alloc is None:
                alloc = allocations[g.id] = Allocation(g.id, 0, 0, is_new=True)
            alloc.drawn_ucredits += take
            alloc.dirty = True
            g.remaining_ucredits -= take
            g.dirty = True
            legs.append(Leg(account.id, -take, "available", g.id))
            need -= take
    if need:
        legs.append(Leg(account.id, -need, "debt"))
        hold.debt_ucredits += need
    legs.append(Leg(REVENUE, amount))


def refund(
    account: LockedAccount,
    hold: HoldState,
    grants: list[GrantState],
    allocations: dict[int, Allocation],
    amount: int,
    legs: list[Leg],
) -> int:
    """Give back `amount` of what this hold was charged: debt first, then its grants in
    reverse burn order. Returns what could not be placed (to become a refund grant)."""
    left = amount
    from_debt = min(left, hold.debt_ucredits, account.debt_ucredits)
    if from_debt:
        legs.append(Leg(account.id, from_debt, "debt"))
        hold.debt_ucredits -= from_debt
        left -= from_debt
    for g in reversed(grants):
        alloc = allocations.get(g.id)
        if left == 0 or alloc is None or alloc.drawn_ucredits == 0:
            continue
        give = min(left, alloc.drawn_ucredits)
        alloc.drawn_ucredits -= give
        alloc.dirty = True
        g.remaining_ucredits += give
        g.dirty = True
        legs.append(Leg(account.id, give, "available", g.id))
        left -= give
    legs.append(Leg(REVENUE, -(amount - left)))
    return left


def _release_earmarks(
    account: LockedAccount, grants: list[GrantState], allocations: dict[int, Allocation], legs: list[Leg]
) -> None:
    for g in grants:
        alloc = allocations.get(g.id)
        if alloc is None or alloc.earmarked_ucredits == 0:
            continue
        amount = alloc.earmarked_ucredits
        alloc.earmarked_ucredits = 0
        alloc.dirty = True
        g.earmarked_ucredits -= amount
        g.dirty = True
        legs.append(Leg(account.id, -amount, "held", g.id))
        legs.append(Leg(account.id, amount, "available", g.id))


def _grants_for(s: Session, account: LockedAccount, allocations: dict[int, Allocation]) -> list[GrantState]:
    """Grants with credit left plus every grant this hold touched (for refunds)."""
    grants = {g.id: g for g in load_grants(s, account.id)}
    missing = set(allocations) - set(grants)
    if missing:
        for g in load_grants(s, account.id, with_remaining=False, ids=missing):
            grants[g.id] = g
    return sorted(grants.values(), key=GrantState.burn_key)


@dataclass(frozen=True)
class Charge:
    """One change of a hold's charge, as one journal entry: its `kind` ('usage', 'settle',
    'release', 'expire', 'adjust'), effective `at`, bringing the hold's cumulative charge
    to `target_ucredits` (for `seconds` run, when it charges time run), resolving the
    hold as `new_state` when given, linked to `links_entry_id`, with `memo` added to the
    entry's."""

    kind: str
    at: datetime
    target_ucredits: int
    seconds: int | None = None
    new_state: str | None = None
    links_entry_id: int | None = None
    memo: dict[str, Any] | None = None


def apply_charge(s: Session, account: LockedAccount, hold: HoldState, charge: Charge) -> HoldState:
    """Bring a hold's cumulative charge to `charge.target_ucredits` and optionally resolve it."""
    allocations = load_allocations(s, hold.id)
    grants = _grants_for(s, account, allocations)
    draft, values, unplaced = plan_charge(account, hold, grants, allocations, charge)
    post_many(s, account, [draft])
    save_grants(s, grants)
    _save_allocations(s, hold.id, allocations)
    s.execute(update(holds_t).where(holds_t.c.id == hold.id).values(**values))
    if unplaced:
        create_grant(s, account, unplaced, source="refund", at=charge.at, user=hold.user)
    if charge.new_state is not None or charge.target_ucredits < hold.charged_ucredits:
        # resolved, or a charge lowered: what is left of a loan from a pool goes back
        return_unused(s, account, grants, charge.at, user=hold.user)
    return dataclasses.replace(hold, **values)


def plan_charge(
    account: LockedAccount,
    hold: HoldState,
    grants: list[GrantState],
    allocations: dict[int, Allocation],
    charge: Charge,
) -> tuple[EntryDraft, dict[str, Any], int]:
    """The in-memory part of `apply_charge`: draw or refund the difference on `grants` and
    `allocations` (marked dirty) and return the entry to post, the hold's new columns,
    and what a refund could not place (to become a refund grant)."""
    legs: list[Leg] = []
    delta = charge.target_ucredits - hold.charged_ucredits
    unplaced = 0
    if delta > 0:
        draw(account, hold, grants, allocations, delta, charge.at, legs)
    elif delta < 0:
        unplaced = refund(account, hold, grants, allocations, -delta, legs)
    if charge.new_state is not None:
        _release_earmarks(account, grants, allocations, legs)
    draft = EntryDraft(
        charge.kind,
        charge.at,
        legs,
        user=hold.user,
        hold_id=hold.id,
        links_entry_id=charge.links_entry_id,
        memo=_memo(hold, charge, delta) | _paid_by_pools(grants, legs),
    )
    values: dict[str, Any] = {
        "charged_ucredits": charge.target_ucredits,  # the unplaced part returns as a refund grant
        "debt_ucredits": hold.debt_ucredits,
    }
    if charge.seconds is not None:
        values["charged_seconds"] = charge.seconds
    if charge.new_state is not None:
        values.update(state=charge.new_state, resolved_at=charge.at)
    return draft, values, unplaced


def _paid_by_pools(grants: list[GrantState], legs: list[Leg]) -> dict[str, Any]:
    """{"pools": {lender: micro-credits}} for what the entry drew from (or, negative,
    refunded to) pool grants: whose credit paid, named in the charge itself."""
    lenders = {g.id: g.lender for g in grants if g.lender is not None}
    paid: dict[str, int] = {}
    for leg in legs:
        lender = lenders.get(leg.grant_id) if leg.grant_id is not None else None  # held + available
        if lender is not None:
            paid[lender] = paid.get(lender, 0) - leg.amount_ucredits
    return {"pools": paid} if any(paid.values()) else {}


def _memo(hold: HoldState, charge: Charge, delta: int) -> dict[str, Any]:
    """The entry's memo: the run, the change in charge, the seconds when it charges time."""
    seconds = (
        {"seconds": charge.seconds, "delta_seconds": charge.seconds - hold.charged_seconds}
        if charge.seconds is not None
        else {}
    )
    return {
        "job": f"{hold.cluster}/{hold.job_id}/{hold.run}",
        "charge": delta,
        **seconds,
        **(charge.memo or {}),
    }


def save_allocations_many(
    s: Session, allocations: dict[int, dict[int, Allocation]], new: list[dict[str, int]] | None = None
) -> None:
    """`_save_allocations` for many holds: one INSERT (with the `new` rows given, such as
    new holds' earmarks) and one UPDATE. Written allocations are clean again."""
    new = list(new or [])
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
                a.is_new = a.dirty = False
    insert_rows(s, allocations_t, new)
    update_rows(s, allocations_t, ("hold_id", "grant_id"), changed)
