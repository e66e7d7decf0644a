"""Taking a hold: a reservation for one job run, checked against the limits and the
credit, then earmarked from grants in burn order (`create_hold`); every part of a
heterogeneous job or none (`create_holds_together`); and the refusal a hold would get
now, tried and rolled back (`hold_refusal`). A repeat of the same request for a run
returns its hold; another request for a run that has one is `idempotency_conflict`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from ledger.books.accounts import lock_account, lock_accounts
from ledger.books.grants import GrantState, available_now, load_grants, save_grants, take_free
from ledger.books.journal import Leg, LockedAccount, post
from ledger.books.pools import Room, borrow, lenders, room_for
from ledger.errors import Conflict, InsufficientCredits, InvalidInput, LedgerError
from ledger.holds.request import CheckedHoldRequest, HoldRequest
from ledger.holds.state import HoldState, find_hold
from ledger.limits.rules import capped_ancestors, check_limits, check_subtree_limits
from ledger.money import charge_for, format_credits
from ledger.pricing.prices import format_gpus, rate_for
from ledger.store.models import HoldStatus
from ledger.store.tables import allocations_t, holds_t


def same_run(
    s: Session, cluster: str, job_id: int, run: int, submitted_at: datetime, digest: str
) -> HoldState | None:
    """The attempt's hold when this request repeats the one that made it; a different
    request for an attempt that already has a hold is an `idempotency_conflict`."""
    existing = find_hold(s, cluster, job_id, run, submitted_at)
    if existing is None:
        return None
    stored = s.execute(select(holds_t.c.request_hash).where(holds_t.c.id == existing.id)).scalar_one()
    if stored != digest:
        raise run_conflict(existing)
    return existing


def run_conflict(existing: HoldState) -> Conflict:
    return Conflict(
        f"job {existing.cluster}/{existing.job_id} run {existing.run} "
        "already has a hold for a different request",
        code="idempotency_conflict",
        details={"hold_id": existing.id},
    )


def new_hold(s: Session, account: LockedAccount, request_hash: str, **fields: Any) -> HoldState:
    """Insert an active hold with nothing charged yet; the state is built, not read back."""
    values = {
        "account_id": account.id,
        "charged_ucredits": 0,
        "charged_seconds": 0,
        "debt_ucredits": 0,
        "state": HoldStatus.ACTIVE,
        "resolved_at": None,
        **fields,
    }
    hold_id = s.execute(
        insert(holds_t).values(**values, request_hash=request_hash).returning(holds_t.c.id)
    ).scalar_one()
    return HoldState(id=hold_id, account=account.name, **values)


def earmark(
    grants: list[GrantState], account: LockedAccount, req: CheckedHoldRequest, amount: int
) -> list[Leg]:
    """Earmark `amount` in burn order from credit free at `req.at`, or refuse naming both."""
    available = available_now(grants, account, req.at)
    if amount > available:
        raise too_little(account, req, amount, available)
    legs: list[Leg] = []
    if take_free(grants, account, amount, req.at, "held", legs):
        raise RuntimeError("available credit was computed but could not be earmarked")
    return legs


def too_little(
    account: LockedAccount, req: CheckedHoldRequest, amount: int, available: int, room: Room | None = None
) -> InsufficientCredits:
    """The refusal of a hold that needs more than the account has (and its pools lend)."""
    has = format_credits(available)
    if room is not None and room.lender is not None:
        has = (
            f"{format_credits(available + room.ucredits)} ({format_credits(available)} in {account.name} "
            f"+ {format_credits(room.ucredits)} from {room.lender}'s pool)"
        )
    details = {
        "account": account.name,
        "needed": format_credits(amount),
        "available": format_credits(available),
    }
    if room is not None and room.lender is not None:
        details |= {"pool": room.lender, "from_pool": format_credits(room.ucredits)}
    return InsufficientCredits(
        f"account {account.name}: this job needs {format_credits(amount)} credits "
        f"({format_gpus(req.gpus)} for {req.seconds} s) but {has} are available",
        details=details,
    )


def hold_amount(req: CheckedHoldRequest, rate: int) -> int:
    """What a new hold reserves at `rate` per hour."""
    return charge_for(rate, req.held_seconds)


def hold_fields(
    req: CheckedHoldRequest, rate: int, unit_prices: dict[str, int], amount: int
) -> dict[str, Any]:
    """The new hold's columns (besides its account and charges)."""
    started_at = req.started_at or req.at
    return {
        "user": req.user,
        "cluster": req.cluster,
        "job_id": req.job_id,
        "run": req.run,
        "submitted_at": req.submitted_at,
        "partition": req.partition,
        "gpus": format_gpus(req.gpus),
        "gpu_count": sum(req.gpus.values()),
        "unit_prices": format_gpus(unit_prices),
        "rate_ucredits_per_hour": rate,
        "limit_seconds": req.seconds,
        "amount_ucredits": amount,
        "started_at": started_at,
        "expires_at": started_at + timedelta(seconds=req.seconds + req.grace_seconds),
        "output_path": req.output_path,
        "lease_seconds": req.lease_seconds,
    }


def hold_memo(req: CheckedHoldRequest) -> dict[str, Any]:
    return {
        "job": f"{req.cluster}/{req.job_id}/{req.run}",
        "gpus": format_gpus(req.gpus),
        "seconds": req.seconds,
    }


def create_hold(s: Session, request: HoldRequest) -> HoldState:
    """Reserve credit for one run at the request's effective time `at` (grants active then).

    `started_at` is when the run began by the scheduler's clock (default `at`); charges
    count seconds from it. Slurm's StartTime is whole seconds, so it can precede a
    top-up made a moment before submission: the credit check uses `at`, not it.
    `submitted_at` is Slurm's SubmitTime of this attempt (ledger.holds.state).
    The same rules serve many requests at once in `ledger.holds.batch.create_holds`.
    With `lease_seconds` (holds.mode = "lease") the hold covers that window of the time
    limit, and the meter renews it (`ledger.holds.leases`).
    """
    req = request.checked()
    chain = lenders(s, req.account)
    above = capped_ancestors(s, req.account)
    others = [*chain, *above]  # lenders and capped parents: locked with it, in id order
    locked = {a.name: a for a in lock_accounts(s, [req.account, *others]).values()} if others else {}
    account = locked[req.account] if req.account in locked else lock_account(s, req.account)
    existing = same_run(s, req.cluster, req.job_id, req.run, req.submitted_at, req.digest)
    if existing is not None:
        return existing
    rate, unit_prices = rate_for(s, req.gpus, req.partition, req.at)
    amount = hold_amount(req, rate)
    check_limits(s, account, req.user, sum(req.gpus.values()), rate, amount, req.at)
    if above:
        check_subtree_limits(s, req.account, req.user, sum(req.gpus.values()), rate, amount, req.at)
    grants = load_grants(s, account.id)
    if chain:
        grants = _borrow_for(s, locked, req, amount, grants)
    legs = earmark(grants, account, req, amount)
    hold = new_hold(s, account, req.digest, **hold_fields(req, rate, unit_prices, amount))
    post(s, account, "hold", req.at, legs, user=req.user, hold_id=hold.id, memo=hold_memo(req))
    earmarks = earmark_rows(hold.id, legs)
    if earmarks:
        s.execute(insert(allocations_t), earmarks)
    save_grants(s, grants)
    return hold


def _borrow_for(
    s: Session,
    locked: dict[str, LockedAccount],
    req: CheckedHoldRequest,
    amount: int,
    grants: list[GrantState],
) -> list[GrantState]:
    """What the hold needs beyond the account's own credit, borrowed from its pools (the
    account and its lenders locked); refused with both figures when the pools have too
    little, before anything is lent. Returns the account's grants as they are now."""
    account = locked[req.account]
    short = amount - available_now(grants, account, req.at)
    if short <= 0:
        return grants
    room = room_for(s, req.account, req.at)
    if short > room.ucredits:
        raise too_little(account, req, amount, available_now(grants, account, req.at), room)
    lent = borrow(s, locked, req.account, short, req.at, user=req.user, memo=hold_memo(req))
    if lent != short:
        raise RuntimeError(f"the pools had {room.ucredits} to lend but lent {lent} of {short}")
    return load_grants(s, account.id)


# Slurm's own cap on a heterogeneous job's components (MAX_HET_JOB_COMPONENTS, 128).
MAX_PARTS_TOGETHER = 128


def create_holds_together(s: Session, parts: Sequence[HoldRequest]) -> list[HoldState]:
    """Holds for the parts of one heterogeneous job: every part's, or a refusal and none.

    Each part is a `create_hold` request, checked against what the parts before it took
    (limits, credit), so parts that fit alone but not together are refused. The accounts
    are locked first, in id order; each part's money stays in its own account. Nothing is
    written on a refusal once the caller rolls back (the daemon runs this in a SAVEPOINT);
    a repeat returns the holds as first taken. Slurm runs PrologSlurmctld once per part,
    so without this one part would run held while the next was refused, and the job
    would loop.
    """
    if not 1 <= len(parts) <= MAX_PARTS_TOGETHER:
        raise InvalidInput(
            f"a job is held in 1 to {MAX_PARTS_TOGETHER} parts, not {len(parts)}", code="invalid_request"
        )
    lock_accounts(s, {part.account for part in parts})
    return [create_hold(s, part) for part in parts]


def hold_refusal(s: Session, parts: Sequence[HoldRequest]) -> LedgerError | None:
    """The refusal `create_holds_together(parts)` would give now, or None if the holds
    would be taken: the same rules, tried in a SAVEPOINT that is always rolled back.
    What the daemon asks before it releases a held job (docs/design.md §3.2)."""
    savepoint = s.begin_nested()
    try:
        create_holds_together(s, parts)
    except LedgerError as error:
        return error
    finally:
        savepoint.rollback()
    return None


def earmark_rows(hold_id: int, legs: list[Leg]) -> list[dict[str, int]]:
    """The hold's allocation rows: what its 'hold' entry moved to the held bucket, per grant."""
    return [
        {
            "hold_id": hold_id,
            "grant_id": leg.grant_id,
            "earmarked_ucredits": leg.amount_ucredits,
            "drawn_ucredits": 0,
        }
        for leg in legs
        if leg.bucket == "held" and leg.grant_id is not None
    ]
