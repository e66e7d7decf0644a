"""Job history for the people who ran the jobs: each run's hold beside Slurm's record
of it, and the journal entries that moved its money. Read-only (no lock, no write).

A run's *status* is what its user would call it: ``running`` while its hold is
active; else Slurm's final state in lower case (``completed``, ``failed``,
``cancelled``, ``timeout``, ``node_fail``, ...) once the bridge has ingested the
run; else how its hold resolved (``settled``, ``released``, ``expired``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from ledger.books.accounts import read_account
from ledger.books.journal import REVENUE
from ledger.errors import NotFound
from ledger.holds.state import HoldState, get_hold
from ledger.money import format_credits
from ledger.store.models import HoldStatus
from ledger.store.sums import joined, split_sum
from ledger.store.tables import accounts_t, entries_t, holds_t, job_runs_t, postings_t
from ledger.timeutil import format_time

__all__ = [
    "MAX_JOBS_PER_PAGE",
    "JobRecord",
    "RunningTotals",
    "charge_entries",
    "hold_entries",
    "job_history",
    "job_record",
    "running_totals",
]

MAX_JOBS_PER_PAGE = 500
# Entries of one hold read at once: the hold, the meter's ticks, its resolution and
# adjustments (a job metered every minute for a week has about 10,000).
MAX_ENTRIES_PER_HOLD = 20_000


@dataclass(frozen=True)
class JobRecord:
    """One job run: its hold, its status, and Slurm's record of it when ingested."""

    hold: HoldState
    status: str
    slurm_state: str | None
    slurm_elapsed_seconds: int | None
    flags: str


class RunningTotals(NamedTuple):
    """What an account's running jobs (active holds) hold together now."""

    jobs: int
    gpus: int
    rate_ucredits_per_hour: int


_run_status = case(
    (holds_t.c.state == HoldStatus.ACTIVE, "running"),
    (job_runs_t.c.state.is_not(None), func.lower(job_runs_t.c.state)),
    else_=holds_t.c.state,
).label("status")


def _query() -> Any:
    hold_columns = [c for c in holds_t.c if c.name != "request_hash"]
    return (
        select(
            *hold_columns,
            accounts_t.c.name.label("account"),
            _run_status,
            job_runs_t.c.state.label("slurm_state"),
            job_runs_t.c.elapsed_seconds.label("slurm_elapsed_seconds"),
            job_runs_t.c.flags.label("flags"),
        )
        .join(accounts_t, accounts_t.c.id == holds_t.c.account_id)
        .outerjoin(
            job_runs_t,
            # The attempt's key prefix first, so the join uses job_runs' unique index.
            and_(
                job_runs_t.c.cluster == holds_t.c.cluster,
                job_runs_t.c.job_id == holds_t.c.job_id,
                job_runs_t.c.run == holds_t.c.run,
                job_runs_t.c.hold_id == holds_t.c.id,
            ),
        )
    )


def _record(row: Any) -> JobRecord:
    fields = dict(row._mapping)
    extra = {k: fields.pop(k) for k in ("status", "slurm_state", "slurm_elapsed_seconds", "flags")}
    return JobRecord(
        hold=HoldState(**fields),
        status=extra["status"],
        slurm_state=extra["slurm_state"],
        slurm_elapsed_seconds=extra["slurm_elapsed_seconds"],
        flags=extra["flags"] or "",
    )


def job_history(
    s: Session,
    account: str,
    *,
    user: str | None = None,
    status: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> list[JobRecord]:
    """The account's job runs, newest first: all, one user's, or those with one status.

    A page ends at `limit` runs; the next starts `before_id` the last one shown.
    """
    query = _query().where(accounts_t.c.name == account)
    if user is not None:
        query = query.where(holds_t.c.user == user)
    if status is not None:
        query = query.where(_run_status == status)
    if before_id is not None:
        query = query.where(holds_t.c.id < before_id)
    query = query.order_by(holds_t.c.id.desc()).limit(max(1, min(limit, MAX_JOBS_PER_PAGE)))
    return [_record(row) for row in s.execute(query)]


def job_record(s: Session, hold_id: int) -> JobRecord:
    row = s.execute(_query().where(holds_t.c.id == hold_id)).first()
    if row is None:
        raise NotFound(f"hold {hold_id} does not exist", details={"hold_id": hold_id})
    return _record(row)


def hold_entries(s: Session, hold_id: int, *, limit: int = 1000) -> list[dict[str, Any]]:
    """The first `limit` journal entries of one hold, oldest first.

    `charge` is how much the entry changed the run's charge (a refund is negative);
    `held` how much it changed the credit held for the run; `links_entry_id` names the
    charge an adjustment corrects and `reason` says why.
    """
    held = (
        select(func.coalesce(func.sum(postings_t.c.amount_ucredits), 0))
        .where(
            postings_t.c.entry_id == entries_t.c.id,
            postings_t.c.account_id == entries_t.c.account_id,
            postings_t.c.bucket == "held",
        )
        .scalar_subquery()
    )
    revenue = (
        select(func.coalesce(func.sum(postings_t.c.amount_ucredits), 0))
        .where(postings_t.c.entry_id == entries_t.c.id, postings_t.c.account_id == REVENUE)
        .scalar_subquery()
    )
    query = (
        select(
            entries_t.c.id,
            entries_t.c.kind,
            entries_t.c.effective_at,
            entries_t.c.recorded_at,
            entries_t.c.user,
            entries_t.c.links_entry_id,
            entries_t.c.memo,
            held.label("held"),
            revenue.label("revenue"),
        )
        .where(entries_t.c.hold_id == hold_id)
        .order_by(entries_t.c.id)
        .limit(max(1, min(limit, MAX_ENTRIES_PER_HOLD)))
    )
    shown = []
    for row in s.execute(query):
        memo = json.loads(row.memo) if row.memo else {}
        # The memo's charge is the run's change, the part of a refund that returns as a
        # new grant included; an entry without one (the hold itself) moved no charge.
        charge = int(memo.get("charge", row.revenue))
        shown.append(
            {
                "id": row.id,
                "kind": row.kind,
                "effective_at": format_time(row.effective_at),
                "recorded_at": format_time(row.recorded_at),
                "user": row.user,
                "links_entry_id": row.links_entry_id,
                "charge": format_credits(charge),
                "held": format_credits(int(row.held)),
                "seconds": memo.get("seconds"),
                "reason": memo.get("reason"),
            }
        )
    return shown


def running_totals(s: Session, account: str) -> RunningTotals:
    """How many jobs of `account` run now, on how many GPUs, burning how much per hour."""
    jobs, gpus, rate_high, rate_low = s.execute(
        select(
            func.count(),
            func.coalesce(func.sum(holds_t.c.gpu_count), 0),
            *split_sum(holds_t.c.rate_ucredits_per_hour),
        )
        .select_from(holds_t)
        .join(accounts_t, accounts_t.c.id == holds_t.c.account_id)
        .where(accounts_t.c.name == account, holds_t.c.state == HoldStatus.ACTIVE)
    ).one()
    return RunningTotals(int(jobs), int(gpus), joined(rate_high, rate_low))


def charge_entries(s: Session, account: str, *, limit: int = 20) -> list[dict[str, Any]]:
    """The account's latest charges an adjustment may link to, newest first: each job run
    that ended (its settle or expire entry, with the run's whole charge so far) and each
    direct consumption (with its amount)."""
    acct = read_account(s, account)
    consumed = (
        select(func.coalesce(func.sum(postings_t.c.amount_ucredits), 0))
        .where(postings_t.c.entry_id == entries_t.c.id, postings_t.c.account_id == REVENUE)
        .scalar_subquery()
    )
    rows = s.execute(
        select(
            entries_t.c.id,
            entries_t.c.kind,
            entries_t.c.effective_at,
            entries_t.c.user,
            entries_t.c.hold_id,
            consumed.label("consumed_ucredits"),
        )
        .where(entries_t.c.account_id == acct.id, entries_t.c.kind.in_(("settle", "expire", "consume")))
        .order_by(entries_t.c.id.desc())
        .limit(limit)
    ).all()
    charges = []
    for row in rows:
        hold = None if row.hold_id is None else get_hold(s, row.hold_id)
        charges.append(
            {
                "entry_id": row.id,
                "kind": row.kind,
                "effective_at": format_time(row.effective_at),
                "user": row.user,
                "job": None if hold is None else f"{hold.cluster}/{hold.job_id}/{hold.run}",
                "gpus": None if hold is None else hold.gpus,
                "charged": format_credits(row.consumed_ucredits if hold is None else hold.charged_ucredits),
            }
        )
    return charges
