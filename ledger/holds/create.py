"""Holds: a reservation for one job run, resolved exactly once.

`create_hold` checks limits and credit, then earmarks grant portions in burn order.
A charge (`hold_usage`, `settle_hold`, `adjust_hold`) brings the hold's cumulative
charge to the cost of its cumulative seconds, rounded once, drawing first from the
hold's own earmarks and the free part of grants active at the charge's effective
time (so expiring credit goes first), never from another hold's earmarks; what
cannot be drawn is recorded as debt. Settling releases what is left of the hold.
A run is one attempt of one job incarnation, `(cluster, job_id, run, submitted_at)`:
Slurm reuses job ids and resets SubmitTime on every requeue, so the attempt's submit
time keeps a new job with an old id from matching the old job's holds. Callers
without a submit time (CLI, HTTP API) get UNKNOWN_SUBMIT and are told apart by run.
A repeat of the same request returns the hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from ledger.books.accounts import check_name, lock_account, lock_account_by_id, lock_accounts
from ledger.books.grants import (
    GrantState,
    available_now,
    create_grant,
    load_grants,
    save_grants,
    take_free,
)
from ledger.books.idempotency import request_hash
from ledger.books.journal import (
    REVENUE,
    EntryDraft,
    Leg,
    LockedAccount,
    accounts_t,
    entries_t,
    post,
    post_many,
)
from ledger.errors import Conflict, InsufficientCredits, InvalidInput, LedgerError, NotFound
from ledger.limits.rules import check_limits
from ledger.money import charge_for, format_credits, format_rate
from ledger.pricing.prices import format_gpus, parse_gpus, rate_for
from ledger.store.bulk import insert_rows, update_rows
from ledger.store.models import UNKNOWN_SUBMIT, Hold, HoldAllocation, table_of
from ledger.timeutil import aware_utc, format_time, parse_seconds, utcnow

holds_t = table_of(Hold)
allocations_t = table_of(HoldAllocation)
DEFAULT_GRACE_SECONDS = 600
MAX_JOB_ID = 2**53
# One account's charges per hold_usage_many call: bounds the transaction and its memory.
MAX_USAGES_PER_CALL = 100_000


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


@dataclass
class Allocation:
    grant_id: int
    earmarked_ucredits: int
    drawn_ucredits: int
    is_new: bool = False
    dirty: bool = False


_HOLD_COLUMNS = [c for c in holds_t.c if c.name != "request_hash"]


def _hold_query() -> Any:
    return select(*_HOLD_COLUMNS, accounts_t.c.name.label("account")).join(
        accounts_t, accounts_t.c.id == holds_t.c.account_id
    )


def _to_state(row: Any) -> HoldState:
    return HoldState(**row._mapping)  # the hold's columns and its account's name, by name


def get_hold(s: Session, hold_id: int) -> HoldState:
    row = s.execute(_hold_query().where(holds_t.c.id == hold_id)).first()
    if row is None:
        raise NotFound(f"hold {hold_id} does not exist", details={"hold_id": hold_id})
    return _to_state(row)


def find_hold(
    s: Session, cluster: str, job_id: int, run: int, submitted_at: datetime | None = None
) -> HoldState | None:
    """The hold of one attempt; `submitted_at` None means UNKNOWN_SUBMIT (CLI, API)."""
    row = s.execute(
        _hold_query().where(
            holds_t.c.cluster == cluster,
            holds_t.c.job_id == job_id,
            holds_t.c.run == run,
            holds_t.c.submitted_at == (submitted_at or UNKNOWN_SUBMIT),
        )
    ).first()
    return None if row is None else _to_state(row)


def find_job_holds(s: Session, cluster: str, job_id: int) -> list[HoldState]:
    """Every hold ever taken under this job id, newest first: several job incarnations
    and several attempts each may share it."""
    query = _hold_query().where(holds_t.c.cluster == cluster, holds_t.c.job_id == job_id)
    return [_to_state(r) for r in s.execute(query.order_by(holds_t.c.id.desc()).limit(1000))]


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
    query = _hold_query().where(
        holds_t.c.cluster == cluster, holds_t.c.job_id == job_id, holds_t.c.state == "active"
    )
    if submitted_at is not None:
        query = query.where(holds_t.c.submitted_at.in_([_submit_time(submitted_at), UNKNOWN_SUBMIT]))
    row = s.execute(query.order_by(holds_t.c.id.desc()).limit(1)).first()
    return None if row is None else _to_state(row)


def list_holds(
    s: Session, account: str | None = None, state: str | None = None, limit: int = 1000
) -> list[HoldState]:
    query = _hold_query()
    if account is not None:
        query = query.where(accounts_t.c.name == account)
    if state is not None:
        query = query.where(holds_t.c.state == state)
    return [_to_state(r) for r in s.execute(query.order_by(holds_t.c.id).limit(limit))]


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
    query = _hold_query()
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
    return [_to_state(r) for r in s.execute(query.order_by(holds_t.c.id.desc()).limit(limit))]


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
        .where(holds_t.c.state == "active")
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


def _lock_hold(s: Session, hold_id: int) -> tuple[LockedAccount, HoldState]:
    """Lock the hold's account, then read the hold under that lock."""
    owner = select(holds_t.c.account_id).where(holds_t.c.id == hold_id).scalar_subquery()
    account = lock_account_by_id(s, owner)
    if account is None:
        raise NotFound(f"hold {hold_id} does not exist", details={"hold_id": hold_id})
    return account, get_hold(s, hold_id)


# -- create -----------------------------------------------------------------------------------


def _check_job(job_id: int, run: int) -> None:
    if not isinstance(job_id, int) or isinstance(job_id, bool) or not 0 < job_id < MAX_JOB_ID:
        raise InvalidInput(
            f"job id {job_id!r} must be a positive whole number",
            code="invalid_job",
            details={"job_id": job_id},
        )
    if not isinstance(run, int) or isinstance(run, bool) or run < 0:
        raise InvalidInput(f"run {run!r} must be a whole number >= 0", code="invalid_job")


def _submit_time(submitted_at: datetime | None) -> datetime:
    if submitted_at is None:
        return UNKNOWN_SUBMIT
    if submitted_at.tzinfo is None:
        raise InvalidInput("the attempt's submit time must carry a time zone", code="invalid_time")
    # Slurm's times are whole seconds; a fraction would make a repeat look like a new job.
    return submitted_at.replace(microsecond=0)


def _same_run(
    s: Session, cluster: str, job_id: int, run: int, submitted_at: datetime, digest: str
) -> HoldState | None:
    """The attempt's hold when this request repeats the one that made it; a different
    request for an attempt that already has a hold is an `idempotency_conflict`."""
    existing = find_hold(s, cluster, job_id, run, submitted_at)
    if existing is None:
        return None
    stored = s.execute(select(holds_t.c.request_hash).where(holds_t.c.id == existing.id)).scalar_one()
    if stored != digest:
        raise _run_conflict(existing)
    return existing


def _run_conflict(existing: HoldState) -> Conflict:
    return Conflict(
        f"job {existing.cluster}/{existing.job_id} run {existing.run} "
        "already has a hold for a different request",
        code="idempotency_conflict",
        details={"hold_id": existing.id},
    )


def _new_hold(s: Session, account: LockedAccount, request_hash: str, **fields: Any) -> HoldState:
    """Insert an active hold with nothing charged yet; the state is built, not read back."""
    values = {
        "account_id": account.id,
        "charged_ucredits": 0,
        "charged_seconds": 0,
        "debt_ucredits": 0,
        "state": "active",
        "resolved_at": None,
        **fields,
    }
    hold_id = s.execute(
        insert(holds_t).values(**values, request_hash=request_hash).returning(holds_t.c.id)
    ).scalar_one()
    return HoldState(id=hold_id, account=account.name, **values)


@dataclass
class _HoldRequest:
    """A hold request, checked and normalised, with the digest that identifies its body."""

    account: str
    user: str
    gpus: dict[str, int]
    seconds: int
    cluster: str
    job_id: int
    run: int
    partition: str | None
    at: datetime
    grace_seconds: int
    started_at: datetime | None
    submitted_at: datetime
    output_path: str | None
    digest: str
    lease_seconds: int | None = None  # lease mode's window (see lease_window); None: a full hold

    @property
    def held_seconds(self) -> int:
        """The seconds the hold pays for: its lease window, or the whole time limit."""
        return self.seconds if self.lease_seconds is None else self.lease_seconds


def _hold_request(
    account_name: str,
    *,
    user: str,
    job_id: int,
    gpus: str | dict[str, int],
    seconds: int | str,
    cluster: str = "default",
    run: int = 0,
    partition: str | None = None,
    at: datetime | None = None,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
    started_at: datetime | None = None,
    submitted_at: datetime | None = None,
    output_path: str | None = None,
    lease_seconds: int | None = None,
) -> _HoldRequest:
    check_name(user, "user")
    gpu_map = parse_gpus(gpus)
    seconds = parse_seconds(seconds, field="seconds")
    if seconds < 1:  # a hold for no time holds nothing, and its rate would be unbounded by its amount
        raise InvalidInput(
            "seconds: a hold needs a time limit of at least 1 second",
            code="invalid_duration",
            details={"field": "seconds", "value": seconds, "minimum": 1},
        )
    _check_job(job_id, run)
    body = {
        "account": account_name,
        "user": user,
        "gpus": format_gpus(gpu_map),
        "seconds": seconds,
        "partition": partition,
    }
    return _HoldRequest(
        account_name,
        user,
        gpu_map,
        seconds,
        cluster,
        job_id,
        run,
        partition,
        at or utcnow(),
        grace_seconds,
        started_at,
        _submit_time(submitted_at),
        output_path,
        request_hash("hold", body),
        lease_window(seconds, lease_seconds),
    )


def lease_window(limit_seconds: int, lease_seconds: int | None) -> int | None:
    """The lease window a new hold records (ledger.holds.leases): None, a full hold, when no
    lease is asked for or the window would cover the whole time limit anyway."""
    if lease_seconds is None:
        return None
    if not isinstance(lease_seconds, int) or isinstance(lease_seconds, bool) or lease_seconds < 1:
        raise InvalidInput(
            f"lease_seconds must be a whole number >= 1, got {lease_seconds!r}", code="invalid_lease"
        )
    return lease_seconds if lease_seconds < limit_seconds else None


def _reserve(grants: list[GrantState], account: LockedAccount, req: _HoldRequest, amount: int) -> list[Leg]:
    """Earmark `amount` in burn order from credit free at `req.at`, or refuse naming both."""
    available = available_now(grants, account, req.at)
    if amount > available:
        raise InsufficientCredits(
            f"account {account.name}: this job needs {format_credits(amount)} credits "
            f"({format_gpus(req.gpus)} for {req.seconds} s) but {format_credits(available)} are available",
            details={
                "account": account.name,
                "needed": format_credits(amount),
                "available": format_credits(available),
            },
        )
    legs: list[Leg] = []
    if take_free(grants, account, amount, req.at, "held", legs):
        raise RuntimeError("available credit was computed but could not be earmarked")
    return legs


def _hold_amount(req: _HoldRequest, rate: int) -> int:
    """What a new hold reserves at `rate` per hour."""
    return charge_for(rate, req.held_seconds)


def _hold_fields(req: _HoldRequest, rate: int, unit_prices: dict[str, int], amount: int) -> dict[str, Any]:
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


def _hold_memo(req: _HoldRequest) -> dict[str, Any]:
    return {
        "job": f"{req.cluster}/{req.job_id}/{req.run}",
        "gpus": format_gpus(req.gpus),
        "seconds": req.seconds,
    }


def create_hold(
    s: Session,
    account_name: str,
    *,
    user: str,
    job_id: int,
    gpus: str | dict[str, int],
    seconds: int | str,
    cluster: str = "default",
    run: int = 0,
    partition: str | None = None,
    at: datetime | None = None,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
    started_at: datetime | None = None,
    submitted_at: datetime | None = None,
    output_path: str | None = None,
    lease_seconds: int | None = None,
) -> HoldState:
    """Reserve credit for one run at effective time `at` (grants active then).

    `started_at` is when the run began by the scheduler's clock (default `at`); charges
    count seconds from it. Slurm's StartTime is whole seconds, so it can precede a
    top-up made a moment before submission: the credit check uses `at`, not it.
    `submitted_at` is Slurm's SubmitTime of this attempt (see the module docstring).
    The same rules serve many requests at once in `ledger.holds.batch.create_holds`.
    With `lease_seconds` (holds.mode = "lease") the hold covers that window of the time
    limit, and the meter renews it (`ledger.holds.leases`).
    """
    req = _hold_request(
        account_name,
        user=user,
        job_id=job_id,
        gpus=gpus,
        seconds=seconds,
        cluster=cluster,
        run=run,
        partition=partition,
        at=at,
        grace_seconds=grace_seconds,
        started_at=started_at,
        submitted_at=submitted_at,
        output_path=output_path,
        lease_seconds=lease_seconds,
    )
    account = lock_account(s, account_name)
    existing = _same_run(s, req.cluster, req.job_id, req.run, req.submitted_at, req.digest)
    if existing is not None:
        return existing
    rate, unit_prices = rate_for(s, req.gpus, req.partition, req.at)
    amount = _hold_amount(req, rate)
    check_limits(s, account, req.user, sum(req.gpus.values()), rate, amount, req.at)
    grants = load_grants(s, account.id)
    legs = _reserve(grants, account, req, amount)
    hold = _new_hold(s, account, req.digest, **_hold_fields(req, rate, unit_prices, amount))
    post(s, account, "hold", req.at, legs, user=req.user, hold_id=hold.id, memo=_hold_memo(req))
    earmarks = _earmarks(hold.id, legs)
    if earmarks:
        s.execute(insert(allocations_t), earmarks)
    save_grants(s, grants)
    return hold


# Slurm's own cap on a heterogeneous job's components (MAX_HET_JOB_COMPONENTS, 128).
MAX_PARTS_TOGETHER = 128


def create_holds_together(s: Session, parts: Sequence[Mapping[str, Any]]) -> list[HoldState]:
    """Holds for the parts of one heterogeneous job: every part's, or a refusal and none.

    Each part is `create_hold`'s account and keywords (`{"account": ..., "user": ...}`),
    checked against what the parts before it took (limits, credit), so parts that fit
    alone but not together are refused. The accounts are locked first, in id order;
    each part's money stays in its own account. Nothing is written on a refusal once the
    caller rolls back (the daemon runs this in a SAVEPOINT); a repeat returns the holds
    as first taken. Slurm runs PrologSlurmctld once per part, so without this one part
    would run held while the next was refused, and the job would loop.
    """
    if not 1 <= len(parts) <= MAX_PARTS_TOGETHER:
        raise InvalidInput(
            f"a job is held in 1 to {MAX_PARTS_TOGETHER} parts, not {len(parts)}", code="invalid_request"
        )
    lock_accounts(s, {str(part["account"]) for part in parts})
    holds = []
    for part in parts:
        arguments = dict(part)
        holds.append(create_hold(s, str(arguments.pop("account")), **arguments))
    return holds


def hold_refusal(s: Session, parts: Sequence[Mapping[str, Any]]) -> LedgerError | None:
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


def _earmarks(hold_id: int, legs: list[Leg]) -> list[dict[str, int]]:
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


# -- charges ----------------------------------------------------------------------------------


def _load_allocations(s: Session, hold_id: int) -> dict[int, Allocation]:
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


def _draw(
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


def _refund(
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


def _apply(
    s: Session,
    account: LockedAccount,
    hold: HoldState,
    *,
    kind: str,
    at: datetime,
    target_ucredits: int,
    seconds: int | None,
    new_state: str | None,
    links_entry_id: int | None = None,
    memo: dict[str, Any] | None = None,
) -> HoldState:
    """Bring a hold's cumulative charge to `target_ucredits` and optionally resolve it."""
    allocations = _load_allocations(s, hold.id)
    grants = _grants_for(s, account, allocations)
    draft, values, unplaced = _charge(
        account,
        hold,
        grants,
        allocations,
        kind=kind,
        at=at,
        target_ucredits=target_ucredits,
        seconds=seconds,
        new_state=new_state,
        links_entry_id=links_entry_id,
        memo=memo,
    )
    post_many(s, account, [draft])
    save_grants(s, grants)
    _save_allocations(s, hold.id, allocations)
    s.execute(update(holds_t).where(holds_t.c.id == hold.id).values(**values))
    if unplaced:
        create_grant(s, account, unplaced, source="refund", at=at, user=hold.user)
    return dataclasses.replace(hold, **values)


def _charge(
    account: LockedAccount,
    hold: HoldState,
    grants: list[GrantState],
    allocations: dict[int, Allocation],
    *,
    kind: str,
    at: datetime,
    target_ucredits: int,
    seconds: int | None,
    new_state: str | None,
    links_entry_id: int | None = None,
    memo: dict[str, Any] | None = None,
) -> tuple[EntryDraft, dict[str, Any], int]:
    """The in-memory part of `_apply`: draw or refund the difference on `grants` and
    `allocations` (marked dirty) and return the entry to post, the hold's new columns,
    and what a refund could not place (to become a refund grant)."""
    legs: list[Leg] = []
    delta = target_ucredits - hold.charged_ucredits
    unplaced = 0
    if delta > 0:
        _draw(account, hold, grants, allocations, delta, at, legs)
    elif delta < 0:
        unplaced = _refund(account, hold, grants, allocations, -delta, legs)
    if new_state is not None:
        _release_earmarks(account, grants, allocations, legs)
    draft = EntryDraft(
        kind,
        at,
        legs,
        user=hold.user,
        hold_id=hold.id,
        links_entry_id=links_entry_id,
        memo={
            "job": f"{hold.cluster}/{hold.job_id}/{hold.run}",
            "charge": delta,
            **(
                {"seconds": seconds, "delta_seconds": seconds - hold.charged_seconds}
                if seconds is not None
                else {}
            ),
            **(memo or {}),
        },
    )
    values: dict[str, Any] = {
        "charged_ucredits": target_ucredits,  # the unplaced part returns as a refund grant
        "debt_ucredits": hold.debt_ucredits,
    }
    if seconds is not None:
        values["charged_seconds"] = seconds
    if new_state is not None:
        values.update(state=new_state, resolved_at=at)
    return draft, values, unplaced


def hold_usage(s: Session, hold_id: int, elapsed_seconds: int | str, at: datetime | None = None) -> HoldState:
    """Provisional charge for the seconds run so far; never moves backwards."""
    elapsed = parse_seconds(elapsed_seconds, field="elapsed")
    account, hold = _lock_hold(s, hold_id)
    if hold.state != "active":
        raise Conflict(
            f"hold {hold_id} is {hold.state}; usage can only be charged on an active hold",
            code="hold_resolved",
            details={"hold_id": hold_id, "state": hold.state},
        )
    if elapsed <= hold.charged_seconds:
        return hold
    at = at or hold.started_at + timedelta(seconds=elapsed)
    return _apply(
        s,
        account,
        hold,
        kind="usage",
        at=at,
        target_ucredits=charge_for(hold.rate_ucredits_per_hour, elapsed),
        seconds=elapsed,
        new_state=None,
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
    account = lock_account(s, account_name)
    active = {
        hold.id: hold
        for hold in (
            _to_state(row)
            for row in s.execute(
                _hold_query().where(holds_t.c.account_id == account.id, holds_t.c.state == "active")
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
                f"hold {foreign[0]} is not a hold of account {account_name}",
                details={"hold_ids": foreign[:20], "account": account_name},
            )
    due = sorted((h for h in active.values() if wanted[h.id][0] > h.charged_seconds), key=lambda h: h.id)
    if not due:
        return []
    allocations: dict[int, dict[int, Allocation]] = {hold.id: {} for hold in due}
    for row in s.execute(
        select(allocations_t)
        .join(holds_t, holds_t.c.id == allocations_t.c.hold_id)
        .where(holds_t.c.account_id == account.id, holds_t.c.state == "active")
    ):
        if row.hold_id in allocations:
            allocations[row.hold_id][row.grant_id] = Allocation(
                row.grant_id, row.earmarked_ucredits, row.drawn_ucredits
            )
    grants = load_grants(s, account.id)
    drafts: list[EntryDraft] = []
    charged: list[HoldState] = []
    lowered: list[tuple[HoldState, int, datetime]] = []
    for hold in due:
        elapsed, at = wanted[hold.id]
        effective_at = at or hold.started_at + timedelta(seconds=elapsed)
        target = charge_for(hold.rate_ucredits_per_hour, elapsed)
        delta = target - hold.charged_ucredits
        if delta < 0:  # an adjustment charged more than the seconds cost: refund as hold_usage does
            lowered.append((hold, elapsed, effective_at))
            continue
        legs: list[Leg] = []
        if delta > 0:
            _draw(account, hold, grants, allocations[hold.id], delta, effective_at, legs)
        drafts.append(
            EntryDraft(
                "usage",
                effective_at,
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
        hold.charged_ucredits, hold.charged_seconds = target, elapsed  # a copy read under the lock
        charged.append(hold)
    post_many(s, account, drafts)
    save_grants(s, grants)
    _save_allocations_many(s, allocations)
    if charged:
        _save_charges(s, charged)
    for hold, elapsed, effective_at in lowered:
        charged.append(
            _apply(
                s,
                account,
                hold,
                kind="usage",
                at=effective_at,
                target_ucredits=charge_for(hold.rate_ucredits_per_hour, elapsed),
                seconds=elapsed,
                new_state=None,
            )
        )
    return charged


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


def _save_allocations_many(
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


def settle_hold(
    s: Session, hold_id: int, elapsed_seconds: int | str, at: datetime | None = None
) -> HoldState:
    """Final charge for the run's elapsed seconds; the rest of the hold returns. Exactly once."""
    elapsed = parse_seconds(elapsed_seconds, field="elapsed")
    account, hold = _lock_hold(s, hold_id)
    if hold.state != "active":
        if hold.state == "settled" and hold.charged_seconds == elapsed:
            return hold
        raise Conflict(
            f"hold {hold_id} is already {hold.state}; it resolves exactly once",
            code="hold_resolved",
            details={"hold_id": hold_id, "state": hold.state},
        )
    return _apply(s, account, hold, **_settlement(hold, elapsed, at))


def _settlement(hold: HoldState, elapsed: int, at: datetime | None) -> dict[str, Any]:
    """How an active hold settles for `elapsed` seconds: `_apply`'s (and `_charge`'s) arguments."""
    return {
        "kind": "settle",
        "at": at or hold.started_at + timedelta(seconds=elapsed),
        "target_ucredits": charge_for(hold.rate_ucredits_per_hour, elapsed),
        "seconds": elapsed,
        "new_state": "settled",
    }


def record_unreserved_run(
    s: Session,
    account_name: str,
    *,
    user: str,
    cluster: str,
    job_id: int,
    run: int,
    gpus: str | dict[str, int],
    started_at: datetime,
    elapsed_seconds: int | str,
    partition: str | None = None,
    submitted_at: datetime | None = None,
) -> HoldState:
    """Charge a run that no hook reserved (a hook outage), once.

    The GPU time was really used, so there are no limits and no credit check: it is
    charged at the prices in force at its start and may leave debt. It is recorded as
    a hold created already settled (one 'settle' entry, effective at the run's end),
    so a later correction goes through `adjust_hold` like any other run's.
    Idempotent on the attempt: a repeat returns the hold; a repeat with other fields,
    or an attempt the hooks already hold, is an `idempotency_conflict`.
    """
    check_name(user, "user")
    gpu_map = parse_gpus(gpus)
    elapsed = parse_seconds(elapsed_seconds, field="elapsed")
    _check_job(job_id, run)
    submitted_at = _submit_time(submitted_at)
    if started_at.tzinfo is None:
        raise InvalidInput("the run's start must carry a time zone", code="invalid_time")
    account = lock_account(s, account_name)
    body = {
        "account": account_name,
        "user": user,
        "gpus": format_gpus(gpu_map),
        "started_at": format_time(started_at),
        "elapsed": elapsed,
        "partition": partition,
    }
    digest = request_hash("unreserved", body)
    existing = _same_run(s, cluster, job_id, run, submitted_at, digest)
    if existing is not None:
        return existing
    rate, unit_prices = rate_for(s, gpu_map, partition, started_at)
    amount = charge_for(rate, elapsed)
    ended_at = started_at + timedelta(seconds=elapsed)
    hold = _new_hold(
        s,
        account,
        digest,
        user=user,
        cluster=cluster,
        job_id=job_id,
        run=run,
        submitted_at=submitted_at,
        partition=partition,
        gpus=format_gpus(gpu_map),
        gpu_count=sum(gpu_map.values()),
        unit_prices=format_gpus(unit_prices),
        rate_ucredits_per_hour=rate,
        limit_seconds=elapsed,
        amount_ucredits=amount,
        started_at=started_at,
        expires_at=ended_at,  # active only until `_apply` below settles it
    )
    return _apply(
        s,
        account,
        hold,
        kind="settle",
        at=ended_at,
        target_ucredits=amount,
        seconds=elapsed,
        new_state="settled",
        memo={"unreserved": True},
    )


def release_hold(
    s: Session, hold_id: int, at: datetime | None = None, *, state: str = "released"
) -> HoldState:
    """Void the rest of a hold (charges already posted stay). Repeats are harmless."""
    account, hold = _lock_hold(s, hold_id)
    if hold.state != "active":
        if hold.state == state:
            return hold
        raise Conflict(
            f"hold {hold_id} is already {hold.state}; it resolves exactly once",
            code="hold_resolved",
            details={"hold_id": hold_id, "state": hold.state},
        )
    return _apply(
        s,
        account,
        hold,
        kind="release" if state == "released" else "expire",
        at=at or utcnow(),
        target_ucredits=hold.charged_ucredits,
        seconds=None,
        new_state=state,
    )


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
    account, hold = _lock_hold(s, hold_id)
    if target_ucredits == hold.charged_ucredits:
        return hold
    if links_entry_id is None:
        links_entry_id = s.execute(
            select(entries_t.c.id)
            .where(entries_t.c.hold_id == hold_id, entries_t.c.kind.in_(("settle", "release", "expire")))
            .order_by(entries_t.c.id.desc())
            .limit(1)
        ).scalar()
    return _apply(
        s,
        account,
        hold,
        kind="adjust",
        at=at or utcnow(),
        target_ucredits=target_ucredits,
        seconds=None,
        new_state=None,
        links_entry_id=links_entry_id,
        memo={"reason": reason} if reason else None,
    )


def expire_holds(s: Session, account_name: str, at: datetime) -> list[int]:
    """Resolve holds past time limit + grace, so a lost epilog never strands credit."""
    lock_account(s, account_name)
    ids = list(
        s.execute(
            select(holds_t.c.id)
            .join(accounts_t, accounts_t.c.id == holds_t.c.account_id)
            .where(accounts_t.c.name == account_name, holds_t.c.state == "active", holds_t.c.expires_at <= at)
        ).scalars()
    )
    for hold_id in ids:
        release_hold(s, hold_id, at, state="expired")
    return ids
