"""A hold resolves exactly once: settled (the final charge for the seconds the run used;
the rest returns) or released (the rest returns, charges already posted stay). A
repeat of the same resolution returns the hold; another is `hold_resolved`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from ledger.errors import Conflict
from ledger.holds.charges import Charge, apply_charge
from ledger.holds.state import HoldState, lock_hold
from ledger.money import charge_for
from ledger.store.models import HoldStatus
from ledger.timeutil import parse_seconds, utcnow


def settle_hold(
    s: Session, hold_id: int, elapsed_seconds: int | str, at: datetime | None = None
) -> HoldState:
    """Final charge for the run's elapsed seconds; the rest of the hold returns. Exactly once."""
    elapsed = parse_seconds(elapsed_seconds, field="elapsed")
    account, hold = lock_hold(s, hold_id)
    if hold.state != HoldStatus.ACTIVE:
        if hold.state == HoldStatus.SETTLED and hold.charged_seconds == elapsed:
            return hold
        raise Conflict(
            f"hold {hold_id} is already {hold.state}; it resolves exactly once",
            code="hold_resolved",
            details={"hold_id": hold_id, "state": hold.state},
        )
    return apply_charge(s, account, hold, settlement_of(hold, elapsed, at))


def settlement_of(hold: HoldState, elapsed: int, at: datetime | None) -> Charge:
    """How an active hold settles for `elapsed` seconds."""
    return Charge(
        kind="settle",
        at=at or hold.started_at + timedelta(seconds=elapsed),
        target_ucredits=charge_for(hold.rate_ucredits_per_hour, elapsed),
        seconds=elapsed,
        new_state=HoldStatus.SETTLED,
    )


def release_hold(
    s: Session, hold_id: int, at: datetime | None = None, *, state: str = HoldStatus.RELEASED
) -> HoldState:
    """Void the rest of a hold (charges already posted stay). Repeats are harmless."""
    account, hold = lock_hold(s, hold_id)
    if hold.state != HoldStatus.ACTIVE:
        if hold.state == state:
            return hold
        raise Conflict(
            f"hold {hold_id} is already {hold.state}; it resolves exactly once",
            code="hold_resolved",
            details={"hold_id": hold_id, "state": hold.state},
        )
    return apply_charge(
        s,
        account,
        hold,
        Charge(
            kind="release" if state == HoldStatus.RELEASED else "expire",
            at=at or utcnow(),
            target_ucredits=hold.charged_ucredits,
            new_state=state,
        ),
    )
