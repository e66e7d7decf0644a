"""Runs no hook reserved (hook outages), charged once: one (`record_unreserved_run`), or
many in one transaction (`record_unreserved_runs`, the sacct bridge's batches).

`record_unreserved_run` locks the account, looks the attempt up, reads prices, inserts
the hold, reads grants, posts the settle entry and writes grants, allocations and the
hold: about a dozen statements per run. `record_unreserved_runs` leaves exactly what
calling it on each run in turn leaves -- the same holds, entries, postings, grant
remainders, allocations and debt, each account's entries in the order given -- in a
handful of statements for the whole batch. The accounts are locked in one statement
in id order, as the daemon's group commit locks its batches.

The money rules are ledger.holds.charges' own (`plan_charge`: burn order, debt); only the
batching is here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy.orm import Session

from ledger.books.accounts import check_name, lock_account, lock_accounts, no_account
from ledger.books.grants import save_grants
from ledger.books.idempotency import request_hash
from ledger.books.journal import EntryDraft, LockedAccount, post_batch
from ledger.errors import Conflict, InvalidInput
from ledger.holds.adjustments import grants_of_accounts
from ledger.holds.charges import Allocation, Charge, apply_charge, plan_charge
from ledger.holds.create import new_hold, run_conflict, same_run
from ledger.holds.request import check_job, submit_time
from ledger.holds.state import HoldState, hold_query
from ledger.money import charge_for
from ledger.pricing.prices import format_gpus, load_price_table, parse_gpus, rate_for
from ledger.store.bulk import insert_rows, update_rows
from ledger.store.models import HoldStatus
from ledger.store.tables import allocations_t, holds_t
from ledger.timeutil import format_time, parse_seconds

__all__ = ["MAX_UNRESERVED_PER_CALL", "UnreservedRun", "record_unreserved_run", "record_unreserved_runs"]

# Runs per call: bounds the transaction and the statements' sizes.
MAX_UNRESERVED_PER_CALL = 10_000


class UnreservedRun(NamedTuple):
    """One run no hook reserved: `record_unreserved_run`'s arguments."""

    account: str
    user: str
    cluster: str
    job_id: int
    run: int
    gpus: str | dict[str, int]
    started_at: datetime
    elapsed_seconds: int | str
    partition: str | None = None
    submitted_at: datetime | None = None


class _Checked(NamedTuple):
    run: UnreservedRun
    gpus: dict[str, int]
    elapsed: int
    submitted_at: datetime
    digest: str

    @property
    def key(self) -> tuple[str, int, int, datetime]:
        return (self.run.cluster, self.run.job_id, self.run.run, self.submitted_at)


def _check(run: UnreservedRun) -> _Checked:
    """record_unreserved_run's checks, in its order, and the request's digest."""
    check_name(run.user, "user")
    gpus = parse_gpus(run.gpus)
    elapsed = parse_seconds(run.elapsed_seconds, field="elapsed")
    check_job(run.job_id, run.run)
    submitted_at = submit_time(run.submitted_at)
    if run.started_at.tzinfo is None:
        raise InvalidInput("the run's start must carry a time zone", code="invalid_time")
    body = {
        "account": run.account,
        "user": run.user,
        "gpus": format_gpus(gpus),
        "started_at": format_time(run.started_at),
        "elapsed": elapsed,
        "partition": run.partition,
    }
    return _Checked(run, gpus, elapsed, submitted_at, request_hash("unreserved", body))


def record_unreserved_runs(s: Session, runs: Sequence[UnreservedRun]) -> list[HoldState]:
    """Charge runs no hook reserved, as `record_unreserved_run` on each in turn.

    Returns each run's hold, in the order given: a repeat of an attempt already charged
    (or earlier in the list) returns its hold. Refuses the whole call (nothing written)
    where `record_unreserved_run` would refuse any one run: bad input, an unknown account
    or GPU type, an attempt already held for another request (`idempotency_conflict`).
    """
    if len(runs) > MAX_UNRESERVED_PER_CALL:
        raise InvalidInput(
            f"{len(runs)} unreserved runs in one call; at most {MAX_UNRESERVED_PER_CALL}",
            code="too_many",
            details={"count": len(runs), "cap": MAX_UNRESERVED_PER_CALL},
        )
    if not runs:
        return []
    checked = [_check(run) for run in runs]
    locked = {a.name: a for a in lock_accounts(s, {c.run.account for c in checked}).values()}
    for c in checked:
        if c.run.account not in locked:
            raise no_account(c.run.account)
    found = _existing(s, checked)
    table = load_price_table(s)
    results: list[HoldState | int] = []  # a hold already there, or the position of a new one
    new: list[tuple[_Checked, dict[str, Any]]] = []
    created: dict[tuple[str, int, int, datetime], tuple[int, str]] = {}
    for c in checked:
        existing = found.get(c.key)
        if existing is not None:
            hold, digest = existing
            if digest != c.digest:
                raise run_conflict(hold)
            results.append(hold)
            continue
        if c.key in created:  # a repeat of a run earlier in this call
            position, digest = created[c.key]
            if digest != c.digest:
                raise Conflict(
                    f"job {c.run.cluster}/{c.run.job_id} run {c.run.run} "
                    "is listed twice with different fields",
                    code="idempotency_conflict",
                )
            results.append(position)
            continue
        run = c.run
        rate, unit_prices = table.rate_for(c.gpus, run.partition, run.started_at)
        amount = charge_for(rate, c.elapsed)
        values = {
            "account_id": locked[run.account].id,
            "charged_ucredits": 0,
            "charged_seconds": 0,
            "debt_ucredits": 0,
            "state": HoldStatus.ACTIVE,
            "resolved_at": None,
            "user": run.user,
            "cluster": run.cluster,
            "job_id": run.job_id,
            "run": run.run,
            "submitted_at": c.submitted_at,
            "partition": run.partition,
            "gpus": format_gpus(c.gpus),
            "gpu_count": sum(c.gpus.values()),
            "unit_prices": format_gpus(unit_prices),
            "rate_ucredits_per_hour": rate,
            "limit_seconds": c.elapsed,
            "amount_ucredits": amount,
            "started_at": run.started_at,
            "expires_at": run.started_at + timedelta(seconds=c.elapsed),
            "output_path": None,
            "lease_seconds": None,
        }
        created[c.key] = (len(new), c.digest)
        results.append(len(new))
        new.append((c, values))
    settled = _insert_and_settle(s, locked, new) if new else []
    return [settled[r] if isinstance(r, int) else r for r in results]


def _existing(s: Session, checked: Sequence[_Checked]) -> dict[tuple[str, int, int, datetime], Any]:
    """The attempts' holds already there, with their request digests (one query)."""
    wanted = {c.key for c in checked}
    query = (
        hold_query()
        .add_columns(holds_t.c.request_hash)
        .where(holds_t.c.job_id.in_(sorted({c.run.job_id for c in checked})))
    )
    found: dict[tuple[str, int, int, datetime], Any] = {}
    for row in s.execute(query):
        fields = dict(row._mapping)
        digest = fields.pop("request_hash")
        hold = HoldState(**fields)
        key = (hold.cluster, hold.job_id, hold.run, hold.submitted_at)
        if key in wanted:
            found[key] = (hold, digest)
    return found


def _insert_and_settle(
    s: Session, locked: dict[str, LockedAccount], new: list[tuple[_Checked, dict[str, Any]]]
) -> list[HoldState]:
    """Insert the new holds (one statement), then settle each at its run's end, each
    account's in the order given, and write it all in one statement per table."""
    rows = [{**values, "request_hash": c.digest} for c, values in new]
    returned = insert_rows(s, holds_t, rows, returning=("id", "cluster", "job_id", "run"))
    # Ids come from one sequence in the rows' order; match them per (cluster, job, run).
    ids: dict[tuple[str, int, int], list[int]] = {}
    for row in sorted(returned, key=lambda r: r.id):
        ids.setdefault((row.cluster, row.job_id, row.run), []).append(row.id)
    grants = grants_of_accounts(s, sorted({locked[c.run.account].id for c, _ in new}))
    drafts: dict[str, list[EntryDraft]] = {}
    holds: list[HoldState] = []
    allocation_rows: list[dict[str, int]] = []
    for c, values in new:
        run = c.run
        account = locked[run.account]
        hold = HoldState(id=ids[(run.cluster, run.job_id, run.run)].pop(0), account=run.account, **values)
        ended_at = run.started_at + timedelta(seconds=c.elapsed)
        allocations: dict[int, Allocation] = {}  # a new hold has none; draw adds them
        draft, changed, unplaced = plan_charge(
            account,
            hold,
            grants[account.id],
            allocations,
            Charge(
                kind="settle",
                at=ended_at,
                target_ucredits=values["amount_ucredits"],
                seconds=c.elapsed,
                new_state=HoldStatus.SETTLED,
                memo={"unreserved": True},
            ),
        )
        assert not unplaced  # a charge draws; only a refund can leave credit unplaced
        drafts.setdefault(run.account, []).append(draft)
        for name, value in changed.items():
            setattr(hold, name, value)
        holds.append(hold)
        allocation_rows.extend(
            {
                "hold_id": hold.id,
                "grant_id": a.grant_id,
                "earmarked_ucredits": a.earmarked_ucredits,
                "drawn_ucredits": a.drawn_ucredits,
            }
            for a in allocations.values()
        )
    post_batch(s, [(locked[name], account_drafts) for name, account_drafts in drafts.items()])
    save_grants(s, [g for account_grants in grants.values() for g in account_grants])
    insert_rows(s, allocations_t, allocation_rows)
    update_rows(
        s,
        holds_t,
        ("id",),
        [
            {
                "id": h.id,
                "charged_ucredits": h.charged_ucredits,
                "debt_ucredits": h.debt_ucredits,
                "charged_seconds": h.charged_seconds,
                "state": h.state,
                "resolved_at": h.resolved_at,
            }
            for h in holds
        ],
    )
    return holds


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
    check_job(job_id, run)
    submitted_at = submit_time(submitted_at)
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
    existing = same_run(s, cluster, job_id, run, submitted_at, digest)
    if existing is not None:
        return existing
    rate, unit_prices = rate_for(s, gpu_map, partition, started_at)
    amount = charge_for(rate, elapsed)
    ended_at = started_at + timedelta(seconds=elapsed)
    hold = new_hold(
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
        expires_at=ended_at,  # active only until `apply_charge` below settles it
    )
    return apply_charge(
        s,
        account,
        hold,
        Charge(
            kind="settle",
            at=ended_at,
            target_ucredits=amount,
            seconds=elapsed,
            new_state=HoldStatus.SETTLED,
            memo={"unreserved": True},
        ),
    )
