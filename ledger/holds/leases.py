"""Lease mode (docs/design.md §4.5): a hold covers rate × window, and the meter renews it.

A lease hold is taken for ``charge_for(rate, min(window, time limit))`` and records its
window (`holds.lease_seconds`; NULL is a full hold). Each meter tick charges the time
run so far (`hold_usage_many`) and, when less than half a window is left of what the
hold covers, :func:`renew_leases` earmarks more free credit so that it covers the time
run plus a whole window (never past the time limit). A renewal the account cannot pay
for, or that a limit refuses, is returned to the meter, which applies
`meter.on_exhausted` to the job. Holds keep the mode they were taken in, so switching
`holds.mode` never renews a full hold nor leaves a lease without renewals.

The bound (docs/lease-mode.md): while the meter ticks every I seconds (I <= window/2),
a lease always covers at least window/2 - I seconds ahead of the job, so a job whose
renewal is refused is cancelled before it runs past its credit. If the meter or the
ledger is away for D seconds, the job runs at most D + I seconds past its last
renewal, which covered at least window/2 ahead, so its charge beyond the credit held
is at most :func:`lease_overspend_bound`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from ledger.books.accounts import lock_account, lock_accounts
from ledger.books.grants import available_now, load_grants, save_grants, take_free
from ledger.books.journal import EntryDraft, Leg, post_many
from ledger.books.pools import borrow, lenders, room_for
from ledger.errors import InvalidInput, LimitExceeded
from ledger.holds.request import lease_window
from ledger.holds.state import HoldState, hold_query, to_state
from ledger.limits.rules import capped_ancestors, check_limits, check_subtree_limits
from ledger.money import charge_for, format_credits
from ledger.store.models import HoldStatus
from ledger.store.tables import allocations_t, holds_t

__all__ = [
    "Renewal",
    "held_seconds",
    "lease_needs_renewal",
    "lease_overspend_bound",
    "lease_window",
    "renew_leases",
]


def held_seconds(limit_seconds: int, lease_seconds: int | None) -> int:
    """The seconds a new hold pays for: its lease window, capped at the time limit."""
    window = lease_window(limit_seconds, lease_seconds)
    return limit_seconds if window is None else window


def lease_needs_renewal(
    rate_ucredits_per_hour: int, amount_ucredits: int, seconds: int, lease_seconds: int, limit_seconds: int
) -> bool:
    """True when a lease run `seconds` so far covers less than half a window ahead (and
    has not yet been extended to its time limit)."""
    if amount_ucredits >= charge_for(rate_ucredits_per_hour, limit_seconds):
        return False
    return charge_for(rate_ucredits_per_hour, seconds + lease_seconds // 2) > amount_ucredits


def lease_overspend_bound(
    rate_ucredits_per_hour: int, lease_seconds: int, meter_interval_seconds: int, outage_seconds: int = 0
) -> int:
    """The most one lease run can be charged beyond the credit it holds, in micro-credits.

    A renewal leaves the hold covering at least window/2 ahead; the next renewal (or the
    cancel of a refused one) comes at the meter's next tick once meter and ledger are
    up. A meter or ledger away for `outage_seconds` (0: nothing fails) lets the job run
    that long plus one interval past its last renewal:

        bound = charge_for(rate, max(0, outage_seconds + interval - window // 2)) + 1 µc
        (0 when the max is 0; the 1 µc covers rounding each charge once)

    It is 0 while nothing fails (interval <= window/2), and at most rate × window for
    any outage up to 1.5 windows - interval. A killed meter that never comes back is an
    outage until the job's time limit.
    """
    for name, value in (
        ("rate_ucredits_per_hour", rate_ucredits_per_hour),
        ("lease_seconds", lease_seconds),
        ("meter_interval_seconds", meter_interval_seconds),
        ("outage_seconds", outage_seconds),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInput(f"{name} must be a whole number >= 0, got {value!r}", code="invalid_bound")
    seconds = max(0, outage_seconds + meter_interval_seconds - lease_seconds // 2)
    # + 1: two charges rounded once each differ from the charge for their difference by at most 1 µc.
    return charge_for(rate_ucredits_per_hour, seconds) + 1 if seconds else 0


@dataclass(frozen=True)
class Renewal:
    """One lease's renewal: done (`refused` None) or refused, with the cause in words."""

    hold: HoldState
    extra_ucredits: int
    refused: str | None = None  # "credit" or the limit's name ("daily_cap", ...)
    reason: str = ""


def renew_leases(
    s: Session, account_name: str, renewals: Sequence[tuple[int, int, datetime]]
) -> list[Renewal]:
    """Extend each lease (hold id, seconds run so far, effective time) of one account to
    cover those seconds plus its window (at most its time limit), under the account's
    lock: one 'renew' entry each, earmarking free credit in burn order.

    Call it after charging the seconds run (the meter does both in one transaction).
    A hold that is no longer active, is not a lease or already covers that far is
    skipped. A renewal that the credit or a limit (`check_limits`: daily cap, ...)
    refuses changes nothing and is returned with `refused` set.
    """
    wanted = {hold_id: (seconds, at) for hold_id, seconds, at in renewals}
    if not wanted:
        return []
    # An account that borrows from pools renews from them too, and a cap on an account
    # above it counts the renewal: those accounts are locked with it, in id order.
    chain = lenders(s, account_name)
    above = capped_ancestors(s, account_name)
    others = [*chain, *above]
    locked = {a.name: a for a in lock_accounts(s, [account_name, *others]).values()} if others else {}
    account = locked[account_name] if account_name in locked else lock_account(s, account_name)
    holds = [
        to_state(row)
        for row in s.execute(
            hold_query().where(
                holds_t.c.account_id == account.id,
                holds_t.c.state == HoldStatus.ACTIVE,
                holds_t.c.id.in_(sorted(wanted)),
                holds_t.c.lease_seconds.is_not(None),
            )
        )
    ]
    grants = load_grants(s, account.id)
    earmarks: dict[tuple[int, int], int] = {}
    drafts: list[EntryDraft] = []
    done: list[Renewal] = []
    for hold in sorted(holds, key=lambda h: h.id):
        seconds, at = wanted[hold.id]
        assert hold.lease_seconds is not None
        target = charge_for(
            hold.rate_ucredits_per_hour, min(hold.limit_seconds, seconds + hold.lease_seconds)
        )
        extra = target - hold.amount_ucredits
        if extra <= 0:
            continue
        try:
            check_limits(s, account, hold.user, 0, 0, extra, at)
            if above:
                check_subtree_limits(s, account_name, hold.user, 0, 0, extra, at)
        except LimitExceeded as exc:
            done.append(Renewal(hold, extra, exc.details.get("limit", exc.code), exc.message))
            continue
        available = available_now(grants, account, at)
        if extra > available and chain:
            room = room_for(s, account_name, at)
            if extra - available <= room.ucredits:
                save_grants(s, grants)  # this round's earmarks so far, before the loan reads them
                memo = {"job": f"{hold.cluster}/{hold.job_id}/{hold.run}", "renew": True}
                borrow(s, locked, account_name, extra - available, at, user=hold.user, memo=memo)
                grants = load_grants(s, account.id)
                available = available_now(grants, account, at)
        if extra > available:
            done.append(
                Renewal(
                    hold,
                    extra,
                    "credit",
                    f"account {account.name} is out of credit: renewing the lease of this run needs "
                    f"{format_credits(extra)} credits but {format_credits(available)} are available; "
                    "top up to run GPU jobs",
                )
            )
            continue
        legs: list[Leg] = []
        if take_free(grants, account, extra, at, "held", legs):
            raise RuntimeError("available credit was computed but could not be earmarked")
        for leg in legs:
            if leg.bucket == "held" and leg.grant_id is not None:
                key = (hold.id, leg.grant_id)
                earmarks[key] = earmarks.get(key, 0) + leg.amount_ucredits
        drafts.append(
            EntryDraft(
                "renew",
                at,
                legs,
                user=hold.user,
                hold_id=hold.id,
                memo={
                    "job": f"{hold.cluster}/{hold.job_id}/{hold.run}",
                    "seconds": seconds,
                    "covers_seconds": min(hold.limit_seconds, seconds + hold.lease_seconds),
                    "extra": extra,
                },
            )
        )
        hold.amount_ucredits = target
        done.append(Renewal(hold, extra))
    if not drafts:
        return done
    post_many(s, account, drafts)
    save_grants(s, grants)
    _add_earmarks(s, earmarks)
    for renewal in done:
        if renewal.refused is None:
            s.execute(
                update(holds_t)
                .where(holds_t.c.id == renewal.hold.id)
                .values(amount_ucredits=renewal.hold.amount_ucredits)
            )
    return done


def _add_earmarks(s: Session, earmarks: dict[tuple[int, int], int]) -> None:
    """Add to the holds' allocation rows (one per hold and grant), inserting new ones."""
    hold_ids = sorted({hold_id for hold_id, _ in earmarks})
    existing = {
        (row.hold_id, row.grant_id)
        for row in s.execute(
            select(allocations_t.c.hold_id, allocations_t.c.grant_id).where(
                allocations_t.c.hold_id.in_(hold_ids)
            )
        )
    }
    new = []
    for (hold_id, grant_id), amount in sorted(earmarks.items()):
        if (hold_id, grant_id) in existing:
            s.execute(
                update(allocations_t)
                .where(allocations_t.c.hold_id == hold_id, allocations_t.c.grant_id == grant_id)
                .values(earmarked_ucredits=allocations_t.c.earmarked_ucredits + amount)
            )
        else:
            new.append(
                {"hold_id": hold_id, "grant_id": grant_id, "earmarked_ucredits": amount, "drawn_ucredits": 0}
            )
    if new:
        s.execute(insert(allocations_t), new)
