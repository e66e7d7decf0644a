"""Cost so far of running jobs, on read: provisional charges are not journal entries.

An active hold's cost at time t is ``charge_for(rate, s)`` for its cumulative seconds
``s = t - start`` (whole seconds, at most its time limit), rounded once, the same rule
as every posted charge, so a figure read now and the final settle never drift. The
journal holds what was posted (the hold's `charged_ucredits` for `charged_seconds`);
the rest, its *accrual*, is computed here from the hold's rate and start. Everything
that counts usage adds it: usage reports, daily caps, Slurm blocks.

How far a hold accrues is the meter's to say (`holds.accrues_to_seconds`, set by
:func:`set_accrual` when it changes): not at all until the meter has seen the job run
(NULL: without a meter, reports count posted charges only, as they always did), to now
while it runs (ACCRUES_NOW), and to the last second seen once the meter no longer sees it
(a finished job whose epilog is late or lost, a stale hold under a reused job id).

The meter posts a charge only when one is needed (the run is past what its hold
covers, its hold expires, a lease is renewed, a UTC day ends), so the journal grows
with actions, not with ticks.

Days: the cost up to cumulative second x takes effect at start + x, as a posted
charge does (its effective time is start + the seconds it brings the hold to), so a
period holds the cost increments whose second falls in it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from math import ceil

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ledger.holds.state import HoldState
from ledger.money import charge_for
from ledger.store.models import HoldStatus
from ledger.store.tables import accounts_t, holds_t
from ledger.timeutil import as_utc, day_bounds

__all__ = [
    "ACCRUES_NOW",
    "Accrual",
    "Piece",
    "accruals",
    "accrued_between",
    "cost_so_far",
    "seconds_run",
    "set_accrual",
]

# `holds.accrues_to_seconds` of a hold whose job the meter sees running: read to now.
ACCRUES_NOW = 2**31 - 1


@dataclass(frozen=True)
class Piece:
    """Part of an accrual: cumulative seconds (lo, hi], the cost of them, and when the
    last of them took effect (start + hi)."""

    lo: int
    hi: int
    ucredits: int
    effective_at: datetime

    @property
    def seconds(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class Accrual:
    """What an active hold has cost beyond its posted charge, up to one moment."""

    hold_id: int
    account_id: int
    account: str
    user: str
    job_id: int
    gpus: str
    unit_prices: str
    partition: str | None
    gpu_count: int
    rate_ucredits_per_hour: int
    started_at: datetime
    charged_seconds: int  # posted so far
    charged_ucredits: int
    seconds: int  # run so far (within the time limit)

    @property
    def ucredits(self) -> int:
        """The unposted cost: what a charge to `seconds` would add (never negative)."""
        return max(0, charge_for(self.rate_ucredits_per_hour, self.seconds) - self.charged_ucredits)

    def pieces(self, cuts: Collection[datetime] = ()) -> list[Piece]:
        """The accrual split at each UTC midnight and at each of `cuts` it spans.

        A cut at time c puts the seconds x with start + x < c before it. Each piece
        costs charge_for(hi) - charge_for(lo); a posted charge that differs from the
        charge for its seconds (a correction) is evened out in the last piece, so the
        pieces sum to `ucredits`.
        """
        total = self.ucredits
        if total == 0 or self.seconds <= self.charged_seconds:
            return []
        rate, start = self.rate_ucredits_per_hour, self.started_at
        bounds = {self.seconds}
        for cut in [*cuts, *_midnights(start + timedelta(seconds=self.charged_seconds), start, self.seconds)]:
            x = ceil((as_utc(cut) - start).total_seconds()) - 1
            if self.charged_seconds < x < self.seconds:
                bounds.add(x)
        pieces, lo = [], self.charged_seconds
        for hi in sorted(bounds):
            cost = charge_for(rate, hi) - charge_for(rate, lo)
            pieces.append(Piece(lo, hi, cost, start + timedelta(seconds=hi)))
            lo = hi
        last = pieces[-1]
        pieces[-1] = Piece(
            last.lo, last.hi, last.ucredits + total - sum(p.ucredits for p in pieces), last.effective_at
        )
        return pieces


def _midnights(since: datetime, start: datetime, seconds: int) -> Iterator[datetime]:
    _, midnight = day_bounds(since)
    end = start + timedelta(seconds=seconds)
    while midnight <= end:
        yield midnight
        midnight += timedelta(days=1)


def cost_so_far(hold: HoldState, at: datetime) -> int:
    """What a run has cost by `at`: its posted charge, or the charge for the seconds it has
    run (within its time limit and where the meter last saw it) when that is more."""
    seconds = seconds_run(hold.started_at, hold.limit_seconds, at)
    if hold.accrues_to_seconds is not None:  # a hold the meter never saw: the page reads it to now
        seconds = min(seconds, hold.accrues_to_seconds)
    if hold.state != HoldStatus.ACTIVE:
        return hold.charged_ucredits
    return max(hold.charged_ucredits, charge_for(hold.rate_ucredits_per_hour, seconds))


def seconds_run(started_at: datetime, limit_seconds: int, at: datetime) -> int:
    """Whole seconds a run started at `started_at` has run by `at`, within its limit."""
    return max(0, min(int((as_utc(at) - as_utc(started_at)).total_seconds()), limit_seconds))


def accruals(
    s: Session, at: datetime, *, account_ids: Collection[int] | None = None, user: str | None = None
) -> list[Accrual]:
    """Every active hold's accrual at `at` (those of `account_ids`, of `user`), by hold id.

    One query over the active holds (a partial index); no lock: a hold charged or
    settled meanwhile is read either before or after, never half.
    """
    query = (
        select(
            holds_t.c.id,
            holds_t.c.account_id,
            accounts_t.c.name,
            holds_t.c.user,
            holds_t.c.job_id,
            holds_t.c.gpus,
            holds_t.c.unit_prices,
            holds_t.c.partition,
            holds_t.c.gpu_count,
            holds_t.c.rate_ucredits_per_hour,
            holds_t.c.started_at,
            holds_t.c.charged_seconds,
            holds_t.c.charged_ucredits,
            holds_t.c.limit_seconds,
            holds_t.c.accrues_to_seconds,
        )
        .join(accounts_t, accounts_t.c.id == holds_t.c.account_id)
        .where(holds_t.c.state == HoldStatus.ACTIVE, holds_t.c.accrues_to_seconds.is_not(None))
        .order_by(holds_t.c.id)
    )
    if account_ids is not None:
        query = query.where(holds_t.c.account_id.in_(list(account_ids)))
    if user is not None:
        query = query.where(holds_t.c.user == user)
    found = []
    for row in s.execute(query):
        started = as_utc(row.started_at)
        seconds = seconds_run(started, row.limit_seconds, at)
        seconds = min(seconds, row.accrues_to_seconds)
        if seconds <= row.charged_seconds:
            continue
        found.append(Accrual(*row[:10], started, row.charged_seconds, row.charged_ucredits, seconds))
    return found


def accrued_between(
    s: Session,
    start: datetime,
    end: datetime,
    at: datetime,
    *,
    account_ids: Collection[int] | None = None,
) -> dict[tuple[int, str], int]:
    """Unposted cost of running jobs that took effect in [start, end) as of `at`, per
    (account id, user): what "spent today" adds for the jobs still running."""
    sums: dict[tuple[int, str], int] = {}
    for accrual in accruals(s, at, account_ids=account_ids):
        for piece in accrual.pieces((start, end)):
            if start <= piece.effective_at < end:
                key = (accrual.account_id, accrual.user)
                sums[key] = sums.get(key, 0) + piece.ucredits
    return sums


def set_accrual(s: Session, changes: Sequence[tuple[int, int]]) -> int:
    """Record, per active hold, how far its cost so far is read: ACCRUES_NOW while its job
    runs, else the seconds at which the meter last saw it run. Not money: the settle or the
    expiry charges. Returns the rows changed."""
    changed = 0
    for seconds in sorted({value for _, value in changes}):
        ids = sorted(hold_id for hold_id, value in changes if value == seconds)
        for first in range(0, len(ids), 1000):
            result = s.execute(
                update(holds_t)
                .where(holds_t.c.id.in_(ids[first : first + 1000]), holds_t.c.state == HoldStatus.ACTIVE)
                .values(accrues_to_seconds=seconds)
            )
            changed += int(getattr(result, "rowcount", 0) or 0)
    return changed
