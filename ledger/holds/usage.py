"""Provisional charges: a running job charged for the seconds it has run so far, one
hold at a time (`hold_usage`) or the meter's many under one lock (`hold_usage_many`).
A charge never moves backwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.books.accounts import lock_account
from ledger.books.grants import load_grants, save_grants
from ledger.books.journal import EntryDraft, Leg, LockedAccount, post_many
from ledger.errors import Conflict, InvalidInput, NotFound
from ledger.holds.charges import Allocation, Charge, apply_charge, draw, save_allocations_many
from ledger.holds.state import HoldState, hold_query, lock_hold, to_state
from ledger.money import charge_for
from ledger.store.bulk import update_rows
from ledger.store.models import HoldStatus
from ledger.store.tables import allocations_t, holds_t
from ledger.timeutil import parse_seconds

# One account's charges per hold_usage_many call: bounds the transaction and its memory.
MAX_USAGES_PER_CALL = 100_000


def hold_usage(s: Session, hold_id: int, elapsed_seconds: int | str, at: datetime | None = None) -> HoldState:
    """Provisional charge for the seconds run so far; never moves backwards."""
    elapsed = parse_seconds(elapsed_seconds, field="elapsed")
    account, hold = lock_hold(s, hold_id)
    if hold.state != HoldStatus.ACTIVE:
        raise Conflict(
            f"hold {hold_id} is {hold.state}; usage can only be charged on an active hold",
            code="hold_resolved",
            details={"hold_id": hold_id, "state": hold.state},
        )
    if elapsed <= hold.charged_seconds:
        return hold
    at = at or hold.started_at + timedelta(seconds=elapsed)
    return apply_charge(
        s,
        account,
        hold,
        Charge(
            kind="usage",
            at=at,
            target_ucredits=charge_for(hold.rate_ucredits_per_hour, elapsed),
            seconds=elapsed,
        ),
    )


def hold_usage_many(
    s: Session, account_name: str, usages: Sequence[tuple[int, int, datetime | None]]
) -> list[HoldState]:
    """Provisional charges for many holds of one account under one lock: the meter's tick.

    `usages` is (hold id, cumulative elapsed seconds, effective time or None). Each hold
    ends exactly where `hold_usage` would leave it (its charge is the cost of its
    cumulative seconds, rounded once), but the account is locked once and the rows are
    written in a handful of batched statements. A hold that is no longer active (the
    epilog settled it since the caller looked) or is already charged that far is skipped,
    not refused: the meter races the hooks by design. Returns the holds charged.
    """
    wanted = _wanted(usages)
    account = lock_account(s, account_name)
    due = _due(s, account, wanted)
    if not due:
        return []
    allocations = _allocations(s, account, due)
    grants = load_grants(s, account.id)
    drafts: list[EntryDraft] = []
    charged: list[HoldState] = []
    lowered: list[tuple[HoldState, Charge]] = []
    for hold in due:
        elapsed, at = wanted[hold.id]
        usage = Charge(
            kind="usage",
            at=at or hold.started_at + timedelta(seconds=elapsed),
            target_ucredits=charge_for(hold.rate_ucredits_per_hour, elapsed),
            seconds=elapsed,
        )
        delta = usage.target_ucredits - hold.charged_ucredits
        if delta < 0:  # an adjustment charged more than the seconds cost: refund as hold_usage does
            lowered.append((hold, usage))
            continue
        legs: list[Leg] = []
        if delta > 0:
            draw(account, hold, grants, allocations[hold.id], delta, usage.at, legs)
        drafts.append(
            EntryDraft(
                "usage",
                usage.at,
                legs,
                user=hold.user,
                hold_id=hold.id,
                memo={
                    "job": f"{hold.cluster}/{hold.job_id}/{hold.run}",
                    "charge": delta,
                    "seconds": elapsed,
                    "delta_seconds": elapsed - hold.charged_seconds,
                },
            )
        )
        hold.charged_ucredits, hold.charged_seconds = (
            usage.target_ucredits,
            elapsed,
        )  # a copy read under the lock
        charged.append(hold)
    post_many(s, account, drafts)
    save_grants(s, grants)
    save_allocations_many(s, allocations)
    if charged:
        _save_charges(s, charged)
    charged.extend(apply_charge(s, account, hold, usage) for hold, usage in lowered)
    return charged


def _wanted(usages: Sequence[tuple[int, int, datetime | None]]) -> dict[int, tuple[int, datetime | None]]:
    """The charges asked for, by hold id: (cumulative elapsed seconds, effective time or None)."""
    if len(usages) > MAX_USAGES_PER_CALL:
        raise InvalidInput(
            f"{len(usages)} charges in one call; at most {MAX_USAGES_PER_CALL}",
            code="too_many",
            details={"count": len(usages), "cap": MAX_USAGES_PER_CALL},
        )
    wanted: dict[int, tuple[int, datetime | None]] = {}
    for hold_id, elapsed_seconds, at in usages:
        if hold_id in wanted:
            raise InvalidInput(
                f"hold {hold_id} is listed twice", code="invalid_hold", details={"hold_id": hold_id}
            )
        wanted[hold_id] = (parse_seconds(elapsed_seconds, field="elapsed"), at)
    return wanted


def _due(
    s: Session, account: LockedAccount, wanted: dict[int, tuple[int, datetime | None]]
) -> list[HoldState]:
    """The wanted holds still active and not yet charged that far, by id (read under the
    account's lock); a hold of another account is refused."""
    active = {
        hold.id: hold
        for hold in (
            to_state(row)
            for row in s.execute(
                hold_query().where(holds_t.c.account_id == account.id, holds_t.c.state == HoldStatus.ACTIVE)
            )
        )
        if hold.id in wanted
    }
    missing = set(wanted) - set(active)
    if missing:
        owners = dict(
            s.execute(select(holds_t.c.id, holds_t.c.account_id).where(holds_t.c.id.in_(missing))).all()
        )
        foreign = sorted(h for h in missing if owners.get(h) != account.id)
        if foreign:
            raise NotFound(
                f"hold {foreign[0]} is not a hold of account {account.name}",
                details={"hold_ids": foreign[:20], "account": account.name},
            )
    return sorted((h for h in active.values() if wanted[h.id][0] > h.charged_seconds), key=lambda h: h.id)


def _allocations(
    s: Session, account: LockedAccount, due: list[HoldState]
) -> dict[int, dict[int, Allocation]]:
    """The due holds' allocations, by hold and grant (one read of the account's active holds')."""
    allocations: dict[int, dict[int, Allocation]] = {hold.id: {} for hold in due}
    for row in s.execute(
        select(allocations_t)
        .join(holds_t, holds_t.c.id == allocations_t.c.hold_id)
        .where(holds_t.c.account_id == account.id, holds_t.c.state == HoldStatus.ACTIVE)
    ):
        if row.hold_id in allocations:
            allocations[row.hold_id][row.grant_id] = Allocation(
                row.grant_id, row.earmarked_ucredits, row.drawn_ucredits
            )
    return allocations


def _save_charges(s: Session, holds: list[HoldState]) -> None:
    update_rows(
        s,
        holds_t,
        ("id",),
        [
            {
                "id": h.id,
                "charged_ucredits": h.charged_ucredits,
                "charged_seconds": h.charged_seconds,
                "debt_ucredits": h.debt_ucredits,
            }
            for h in holds
        ],
    )
