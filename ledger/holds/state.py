"""A hold as the ledger reads it (`HoldState`), and the reads: one hold, a job's, an
attempt's active one, pages and lists, and the meter's lean list of active runs.

A run is one attempt of one job incarnation, `(cluster, job_id, run, submitted_at)`:
Slurm reuses job ids and resets SubmitTime on every requeue, so the attempt's submit
time keeps a new job with an old id from matching the old job's holds. Callers
without a submit time (CLI, HTTP API) get UNKNOWN_SUBMIT and are told apart by run.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from ledger.books.accounts import lock_account_by_id, lock_accounts
from ledger.books.journal import LockedAccount
from ledger.books.pools import lenders, pool_settings
from ledger.errors import NotFound
from ledger.holds.request import submit_time
from ledger.money import format_credits, format_rate
from ledger.store.models import UNKNOWN_SUBMIT, HoldStatus
from ledger.store.tables import accounts_t, holds_t
from ledger.timeutil import aware_utc, format_time


@dataclass
class HoldState:
    id: int
    account_id: int
    account: str
    user: str
    cluster: str
    job_id: int
    run: int
    submitted_at: datetime
    partition: str | None
    gpus: str
    unit_prices: str
    gpu_count: int
    rate_ucredits_per_hour: int
    limit_seconds: int
    amount_ucredits: int
    charged_ucredits: int
    charged_seconds: int
    debt_ucredits: int
    state: str
    started_at: datetime
    expires_at: datetime
    resolved_at: datetime | None
    output_path: str | None = None
    lease_seconds: int | None = None  # lease mode's window; None: a full hold
    accrues_to_seconds: int | None = None  # how far cost so far is read (ledger.holds.accrual)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "account": self.account,
            "user": self.user,
            "cluster": self.cluster,
            "job_id": self.job_id,
            "run": self.run,
            "submitted_at": None if self.submitted_at == UNKNOWN_SUBMIT else format_time(self.submitted_at),
            "state": self.state,
            "amount": format_credits(self.amount_ucredits),
            "charged": format_credits(self.charged_ucredits),
            "expires_at": format_time(self.expires_at),
            "gpus": self.gpus,
            "partition": self.partition,
            "rate": format_rate(self.rate_ucredits_per_hour),
            "started_at": format_time(self.started_at),
            "charged_seconds": self.charged_seconds,
            "resolved_at": format_time(self.resolved_at),
        }


_HOLD_COLUMNS = [c for c in holds_t.c if c.name != "request_hash"]


def hold_query() -> Any:
    return select(*_HOLD_COLUMNS, accounts_t.c.name.label("account")).join(
        accounts_t, accounts_t.c.id == holds_t.c.account_id
    )


def to_state(row: Any) -> HoldState:
    return HoldState(**row._mapping)  # the hold's columns and its account's name, by name


def get_hold(s: Session, hold_id: int) -> HoldState:
    row = s.execute(hold_query().where(holds_t.c.id == hold_id)).first()
    if row is None:
        raise NotFound(f"hold {hold_id} does not exist", details={"hold_id": hold_id})
    return to_state(row)


def find_hold(
    s: Session, cluster: str, job_id: int, run: int, submitted_at: datetime | None = None
) -> HoldState | None:
    """The hold of one attempt; `submitted_at` None means UNKNOWN_SUBMIT (CLI, API)."""
    row = s.execute(
        hold_query().where(
            holds_t.c.cluster == cluster,
            holds_t.c.job_id == job_id,
            holds_t.c.run == run,
            holds_t.c.submitted_at == (submitted_at or UNKNOWN_SUBMIT),
        )
    ).first()
    return None if row is None else to_state(row)


def find_job_holds(s: Session, cluster: str, job_id: int) -> list[HoldState]:
    """Every hold ever taken under this job id, newest first: several job incarnations
    and several attempts each may share it."""
    query = hold_query().where(holds_t.c.cluster == cluster, holds_t.c.job_id == job_id)
    return [to_state(r) for r in s.execute(query.order_by(holds_t.c.id.desc()).limit(1000))]


def find_active_hold(
    s: Session, cluster: str, job_id: int, submitted_at: datetime | None = None
) -> HoldState | None:
    """The job's active hold, whatever its run (a job runs once at a time).

    With `submitted_at` (the epilog's SubmitTime, which is still the ending run's own,
    requeue included: docs/slurm-facts.md §11), only the hold of that attempt, or a hold
    taken without a submit time, qualifies: an old job with this id that lost its epilog
    may still hold credit, and a new job without a hold of its own (refused, or run under
    policy accept) must not settle it. Without one, the newest active hold.
    """
    query = hold_query().where(
        holds_t.c.cluster == cluster, holds_t.c.job_id == job_id, holds_t.c.state == HoldStatus.ACTIVE
    )
    if submitted_at is not None:
        query = query.where(holds_t.c.submitted_at.in_([submit_time(submitted_at), UNKNOWN_SUBMIT]))
    row = s.execute(query.order_by(holds_t.c.id.desc()).limit(1)).first()
    return None if row is None else to_state(row)


def list_holds(
    s: Session, account: str | None = None, state: str | None = None, limit: int = 1000
) -> list[HoldState]:
    query = hold_query()
    if account is not None:
        query = query.where(accounts_t.c.name == account)
    if state is not None:
        query = query.where(holds_t.c.state == state)
    return [to_state(r) for r in s.execute(query.order_by(holds_t.c.id).limit(limit))]


def holds_page(
    s: Session,
    *,
    accounts: Collection[str] | None = None,
    own: tuple[str, Collection[str]] | None = None,
    state: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> list[HoldState]:
    """One page of holds, newest first: those of `accounts` (None: every account), and
    with `own` = (user, accounts) that user's own holds in those accounts too (a member
    sees their own jobs, a manager the account's), with ids below `before_id`, the
    previous page's last id (a cursor that no new hold moves)."""
    query = hold_query()
    if accounts is not None:
        every: ColumnElement[bool] = accounts_t.c.name.in_(list(accounts))
        if own is not None:
            user, own_accounts = own
            every = or_(every, and_(accounts_t.c.name.in_(list(own_accounts)), holds_t.c.user == user))
        query = query.where(every)
    if state is not None:
        query = query.where(holds_t.c.state == state)
    if before_id is not None:
        query = query.where(holds_t.c.id < before_id)
    return [to_state(r) for r in s.execute(query.order_by(holds_t.c.id.desc()).limit(limit))]


class ActiveRun(NamedTuple):
    """What the meter needs of an active hold to match it with a running job."""

    hold_id: int
    account: str
    cluster: str
    job_id: int
    run: int
    charged_seconds: int
    expires_at: datetime
    submitted_at: datetime  # UNKNOWN_SUBMIT when the hold's caller had none
    # What the meter needs to tell which holds need a posted charge (the rest accrue on read).
    user: str = ""
    rate_ucredits_per_hour: int = 0
    limit_seconds: int = 0
    amount_ucredits: int = 0
    charged_ucredits: int = 0
    started_at: datetime | None = None
    lease_seconds: int | None = None
    accrues_to_seconds: int | None = None


def list_active_runs(s: Session, limit: int = 200_000) -> list[ActiveRun]:
    """Every active hold, lean (one query, few columns): the meter reads them all each tick."""
    query = (
        select(
            holds_t.c.id,
            accounts_t.c.name,
            holds_t.c.cluster,
            holds_t.c.job_id,
            holds_t.c.run,
            holds_t.c.charged_seconds,
            holds_t.c.expires_at,
            holds_t.c.submitted_at,
            holds_t.c.user,
            holds_t.c.rate_ucredits_per_hour,
            holds_t.c.limit_seconds,
            holds_t.c.amount_ucredits,
            holds_t.c.charged_ucredits,
            holds_t.c.started_at,
            holds_t.c.lease_seconds,
            holds_t.c.accrues_to_seconds,
        )
        .join(accounts_t, accounts_t.c.id == holds_t.c.account_id)
        .where(holds_t.c.state == HoldStatus.ACTIVE)
        .order_by(holds_t.c.id)
        .limit(limit)
    )
    # The driver's own tuples: SQLAlchemy's per-row result processing was half of a
    # 20,000-hold read. Both stores keep naive UTC (SQLite as text); each distinct
    # timestamp is converted once.
    result = s.connection().execute(query)
    try:
        rows = result.cursor.fetchall()
    finally:
        result.close()
    make = ActiveRun._make
    if rows and isinstance(rows[0][6], datetime) and rows[0][6].tzinfo is None:  # PostgreSQL
        return [
            make((*r[:6], aware_utc(r[6]), aware_utc(r[7]), *r[8:13], aware_utc(r[13]), *r[14:]))
            for r in rows
        ]
    times: dict[Any, datetime] = {}

    def aware(value: Any) -> Any:
        found = times.get(value)
        if found is None:
            naive = datetime.fromisoformat(value) if isinstance(value, str) else value
            found = times[value] = (
                naive.replace(tzinfo=UTC) if naive.tzinfo is None else naive.astimezone(UTC)
            )
        return found

    return [make((*r[:6], aware(r[6]), aware(r[7]), *r[8:13], aware(r[13]), *r[14:])) for r in rows]


def lock_hold(s: Session, hold_id: int) -> tuple[LockedAccount, HoldState]:
    """Lock the hold's account, then read the hold under that lock. Where the account
    borrows from pools, its lenders are locked with it, in id order: resolving the hold
    gives back what it borrowed (ledger.books.pools.return_unused)."""
    owner = select(holds_t.c.account_id).where(holds_t.c.id == hold_id).scalar_subquery()
    if pool_settings(s):
        name = s.execute(select(accounts_t.c.name).where(accounts_t.c.id == owner)).scalar()
        chain = lenders(s, name) if name is not None else []
        if name is not None and chain:
            lock_accounts(s, [name, *chain])
    account = lock_account_by_id(s, owner)
    if account is None:
        raise NotFound(f"hold {hold_id} does not exist", details={"hold_id": hold_id})
    return account, get_hold(s, hold_id)
