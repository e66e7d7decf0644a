"""Many holds, or many settles, in a handful of statements: the daemon's group commit.

`create_holds` and `settle_holds` follow exactly the rules of `create_hold` and
`settle_hold` (they call the same helpers of ledger.holds: the request's checks and
digest, the burn order, the earmark, the charge and the release), but read every
account, hold, grant and price a batch needs in one query each and write the batch's
holds, entries, postings, allocations, grants and account heads in one statement each.

Each request gets its own outcome: its HoldState, its own refusal (a LedgerError, nothing
written for it), or None for the rare cases left to the one-at-a-time functions, which
the caller runs after this batch is written: accounts with limits (their checks read the
active holds, this batch's included), a hold the account's own credit cannot cover (its
parent's pool may lend the rest), a second request for the same run, a settle of a
hold that is not active (a repeat, or a conflict), a charge lowered below what was
already charged (a refund).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, or_, select, text, union
from sqlalchemy.orm import Session

from ledger.books.accounts import lock_accounts, lock_query, no_account
from ledger.books.grants import GrantState, grants_by_account
from ledger.books.journal import EntryDraft, Leg, LockedAccount, post_batch
from ledger.books.pools import return_unused
from ledger.errors import InsufficientCredits, LedgerError
from ledger.holds.charges import Allocation, Charge, plan_charge, save_allocations_many
from ledger.holds.create import (
    earmark,
    earmark_rows,
    hold_amount,
    hold_fields,
    hold_memo,
    run_conflict,
)
from ledger.holds.request import CheckedHoldRequest, HoldRequest, submit_time
from ledger.holds.resolve import settlement_of
from ledger.holds.state import HoldState, hold_query, to_state
from ledger.pricing.prices import price_rows_query, price_table
from ledger.store.bulk import among as bulk_among
from ledger.store.bulk import among_pairs, deferred_writes, insert_rows, pair_params, select_many, update_rows
from ledger.store.models import UNKNOWN_SUBMIT, HoldStatus
from ledger.store.tables import accounts_t, allocations_t, grants_t, holds_t, limits_t
from ledger.timeutil import parse_seconds

Outcome = HoldState | LedgerError | None

__all__ = [
    "LockedBatch",
    "Outcome",
    "active_holds_among",
    "apply_holds_and_settles",
    "create_holds",
    "find_active_holds",
    "lock_batch",
    "settle_holds",
]


def create_holds(
    s: Session,
    requests: Sequence[HoldRequest],
    *,
    locked: dict[int, LockedAccount] | None = None,
) -> list[Outcome]:
    """`create_hold(s, request)` for each request, at once (`locked`: see
    `apply_holds_and_settles`)."""
    return apply_holds_and_settles(s, requests, [], locked=locked)[0]


def settle_holds(
    s: Session,
    settles: Sequence[tuple[int, int | str, datetime | None]],
    *,
    locked: dict[int, LockedAccount] | None = None,
) -> list[Outcome]:
    """`settle_hold(s, hold_id, elapsed, at)` for each (hold id, elapsed, at), at once
    (`locked`: see `apply_holds_and_settles`)."""
    return apply_holds_and_settles(s, [], settles, locked=locked)[1]


def apply_holds_and_settles(
    s: Session,
    holds: Sequence[HoldRequest],
    settles: Sequence[tuple[int, int | str, datetime | None]],
    *,
    locked: dict[int, LockedAccount] | None = None,
    read: Sequence[HoldState] | None = None,
    prefetched: dict[str, list[Any]] | None = None,
) -> tuple[list[Outcome], list[Outcome]]:
    """The settles, then the holds, as `settle_hold` and `create_hold` on each in turn
    would leave them, read and written together: one statement per table.

    `holds` are `create_hold`'s requests; `settles` are (hold id,
    elapsed seconds, effective time or None). Returns each one's outcome, in order.
    `locked`: accounts this transaction has already locked (`lock_batch`), by id; when it
    holds every account concerned they are not locked again. Entries posted here advance
    those objects, and accounts locked here are added to it. `read`: the settled holds as
    this transaction read them under `locked` (`lock_batch`), so they are not read again;
    `prefetched`: the rest of the batch's reads, made by `lock_batch` with the lock.
    """
    created: list[Outcome] = [None] * len(holds)
    settled: list[Outcome] = [None] * len(settles)
    wanted = _settle_requests(settles, settled)
    checked = _hold_requests(holds, created)
    if not wanted and not checked:
        return created, settled
    accounts, read, relocked = _lock(s, wanted, {req.account for req in checked.values()}, locked, read)
    if relocked:
        prefetched = None  # read before these accounts were locked: read again
    by_name = {a.name: a for a in accounts.values()}
    for i, req in list(checked.items()):
        if req.account not in by_name:
            created[i] = no_account(req.account)
            del checked[i]
    charges = _settlements(read, wanted, accounts)
    fetched = _reads(s, checked, charges, by_name, prefetched)
    plan = _Plan(_allocations(charges, fetched), grants_by_account(fetched.get("grants", [])))
    _plan_settles(plan, charges, accounts, settled)
    _plan_holds(plan, checked, by_name, fetched, created)
    with deferred_writes(s):  # PostgreSQL: the writes that return nothing, in one round trip
        ids = [row.id for row in fetched["hold_ids"]] if "hold_ids" in fetched else None
        _write(s, plan, ids, created)
    _return_pool_credit(s, plan, charges, accounts)
    return created, settled


def _return_pool_credit(
    s: Session,
    plan: _Plan,
    charges: list[tuple[int, HoldState, Charge]],
    accounts: dict[int, LockedAccount],
) -> None:
    """What the settled holds' accounts borrowed from pools and no longer hold goes back,
    as `apply_charge` does for one hold; no read at all for accounts with no pool credit."""
    for account_id in sorted({hold.account_id for _, hold, _ in charges}):
        grants = plan.grants.get(account_id, [])
        if any(g.source == "pool" and g.free_ucredits > 0 for g in grants):
            at = max(charge.at for _, hold, charge in charges if hold.account_id == account_id)
            return_unused(s, accounts[account_id], grants, at)


@dataclasses.dataclass
class _Plan:
    """What one `apply_holds_and_settles` will write, planned in memory under the locks:
    each account's entries, the settled holds' new columns, the new holds, and the
    allocations and grants both change."""

    allocations: dict[int, dict[int, Allocation]]
    grants: dict[int, list[GrantState]]
    drafts: dict[int, tuple[LockedAccount, list[EntryDraft]]] = dataclasses.field(default_factory=dict)
    resolved: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # (index, request, account, the new hold's columns, its 'hold' entry's legs)
    new: list[tuple[int, CheckedHoldRequest, LockedAccount, dict[str, Any], list[Leg]]] = dataclasses.field(
        default_factory=list
    )

    def post(self, account: LockedAccount, draft: EntryDraft) -> None:
        """Add an entry to `account`'s, in the order planned."""
        self.drafts.setdefault(account.id, (account, []))[1].append(draft)


def _lock(
    s: Session,
    wanted: dict[int, tuple[int, int, datetime | None]],
    names: set[str],
    locked: dict[int, LockedAccount] | None,
    read: Sequence[HoldState] | None,
) -> tuple[dict[int, LockedAccount], list[HoldState], bool]:
    """The batch's accounts, locked, and its settled holds as read under the locks: those of
    `locked` and `read` when they cover the batch; else what is missing is locked now (by
    id: see `lock_batch`; added to `locked`) and the holds are read again, and the last
    value is True."""
    accounts = dict(locked or {})
    holds = [hold for hold in read if hold.id in wanted] if read is not None else _read_holds(s, wanted)
    if all(hold.account_id in accounts for hold in holds) and names <= {a.name for a in accounts.values()}:
        return accounts, holds, False
    fresh = lock_accounts(s, names, sorted({hold.account_id for hold in holds}) or None)
    accounts.update(fresh)
    if locked is not None:
        locked.update(fresh)
    return accounts, _read_holds(s, wanted), True


def _settlements(
    read: Sequence[HoldState],
    wanted: dict[int, tuple[int, int, datetime | None]],
    accounts: dict[int, LockedAccount],
) -> list[tuple[int, HoldState, Charge]]:
    """The settles this batch does, in the order given: (index, hold, its settlement)."""
    charges = []
    for hold in sorted(read, key=lambda h: wanted[h.id][0]):
        i, seconds, at = wanted[hold.id]
        if hold.state != HoldStatus.ACTIVE or hold.account_id not in accounts:
            continue  # a repeat replays, a resolved hold conflicts: settle_hold says which
        settlement = settlement_of(hold, seconds, at)
        if settlement.target_ucredits < hold.charged_ucredits:
            continue  # a refund may become a refund grant: settle_hold does it
        charges.append((i, hold, settlement))
    return charges


def _reads(
    s: Session,
    checked: dict[int, CheckedHoldRequest],
    charges: list[tuple[int, HoldState, Charge]],
    by_name: dict[str, LockedAccount],
    prefetched: dict[str, list[Any]] | None,
) -> dict[str, list[Any]]:
    """What the batch reads under its locks: the settled holds' allocations, which new holds'
    accounts have limits, the holds already taken for the new holds' jobs, the prices, the
    new holds' ids (PostgreSQL) and the accounts' grants; `prefetched` when `lock_batch`
    read it all with the lock."""
    if prefetched is not None and len(prefetched.get("hold_ids", checked)) >= len(checked):
        return prefetched
    settled_ids = sorted(hold.id for _, hold, _ in charges)
    hold_accounts = {by_name[req.account].id for req in checked.values()}
    runs = {(req.cluster, req.job_id) for req in checked.values()}
    grant_accounts = hold_accounts | {hold.account_id for _, hold, _ in charges}
    # The reads below need nothing from each other: on PostgreSQL, one round trip for all.
    q = _queries(s)
    reads: list[tuple[str, Any, dict[str, Any]]] = []
    if settled_ids:
        reads.append(("allocations", q.allocations, {"holds": settled_ids}))
    if hold_accounts:
        reads.append(("limits", q.limits, {"accounts": sorted(hold_accounts)}))
    if runs:
        reads.append(("runs", q.runs, pair_params("runs", runs, q.postgres)))
    if checked:
        reads.append(("prices", q.prices, {}))
        if q.hold_ids is not None:  # PostgreSQL: the new holds' ids, so no insert waits to return them
            reads.append(("hold_ids", q.hold_ids, {"n": len(checked)}))
    if grant_accounts:
        reads.append(("grants", q.grants, {"accounts": sorted(grant_accounts), "holds": settled_ids or [0]}))
    found = select_many(s, [(statement, params) for _, statement, params in reads])
    return dict(zip([name for name, _, _ in reads], found, strict=True))


def _allocations(
    charges: list[tuple[int, HoldState, Charge]], fetched: dict[str, list[Any]]
) -> dict[int, dict[int, Allocation]]:
    """The settled holds' allocations, by hold and grant."""
    allocations: dict[int, dict[int, Allocation]] = {hold.id: {} for _, hold, _ in charges}
    for row in fetched.get("allocations", []):
        if row.hold_id not in allocations:
            continue  # another hold of a settled job (`lock_batch` reads them all)
        allocations[row.hold_id][row.grant_id] = Allocation(
            row.grant_id, row.earmarked_ucredits, row.drawn_ucredits
        )
    return allocations


def _plan_settles(
    plan: _Plan,
    charges: list[tuple[int, HoldState, Charge]],
    accounts: dict[int, LockedAccount],
    settled: list[Outcome],
) -> None:
    """Each settle as `settle_hold` would do it, in memory: its entry, its hold's new columns."""
    for i, hold, settlement in charges:
        account = accounts[hold.account_id]
        draft, values, _unplaced = plan_charge(
            account, hold, plan.grants.setdefault(account.id, []), plan.allocations[hold.id], settlement
        )
        plan.post(account, draft)
        plan.resolved.append({"id": hold.id, **values})
        settled[i] = dataclasses.replace(hold, **values)


def _plan_holds(
    plan: _Plan,
    checked: dict[int, CheckedHoldRequest],
    by_name: dict[str, LockedAccount],
    fetched: dict[str, list[Any]],
    created: list[Outcome],
) -> None:
    """Each new hold as `create_hold` would take it, in memory, after the settles: a repeat
    replays its hold, a refusal is its outcome; accounts with limits are left to
    `create_hold` (their checks read the active holds, this batch's included)."""
    capped = {row.account_id for row in fetched.get("limits", [])}
    existing = _holds_of_runs(
        fetched.get("runs", []), {(req.cluster, req.job_id) for req in checked.values()}
    )
    prices = price_table(fetched["prices"]) if checked else None
    for i, req in checked.items():
        account = by_name[req.account]
        if account.id in capped:
            continue  # limits read this batch's holds too: create_hold checks them after it
        try:
            found = existing.get((req.cluster, req.job_id, req.run, req.submitted_at))
            if found is not None:
                held, digest = found
                if digest != req.digest:
                    raise run_conflict(held)
                created[i] = held
                continue
            assert prices is not None
            rate, unit_prices = prices.rate_for(req.gpus, req.partition, req.at)
            amount = hold_amount(req, rate)
            legs = earmark(plan.grants.setdefault(account.id, []), account, req, amount)
        except InsufficientCredits:
            continue  # its parent's pool may lend the rest: create_hold decides, and words it
        except LedgerError as error:
            created[i] = error
            continue
        plan.new.append((i, req, account, hold_fields(req, rate, unit_prices, amount), legs))


def _write(s: Session, plan: _Plan, ids: list[int] | None, created: list[Outcome]) -> None:
    """The batch's new holds (with `ids`, taken from their sequence beforehand, in order;
    else their ids come back), entries, postings, allocations, grants and resolved holds."""
    new_allocations = _insert_holds(s, plan, ids, created) if plan.new else []
    post_batch(s, list(plan.drafts.values()), ids=False)
    save_allocations_many(s, plan.allocations, new_allocations)
    _save_grants(s, [g for account_grants in plan.grants.values() for g in account_grants])
    update_rows(s, holds_t, ("id",), plan.resolved)


def _insert_holds(
    s: Session, plan: _Plan, ids: list[int] | None, created: list[Outcome]
) -> list[dict[str, int]]:
    """Insert the new holds, plan their 'hold' entries, set their outcomes; returns their
    allocation rows (their earmarks)."""
    rows = [
        {
            "account_id": account.id,
            "charged_ucredits": 0,
            "charged_seconds": 0,
            "debt_ucredits": 0,
            "state": HoldStatus.ACTIVE,
            "resolved_at": None,
            **fields,
            "request_hash": req.digest,
        }
        for _, req, account, fields, _ in plan.new
    ]
    if ids is not None:
        for row, hold_id in zip(rows, ids, strict=False):
            row["id"] = hold_id
        insert_rows(s, holds_t, rows)
        hold_ids = {(row["cluster"], row["job_id"], row["run"]): row["id"] for row in rows}
    else:
        returned = insert_rows(s, holds_t, rows, returning=("id", "cluster", "job_id", "run"))
        hold_ids = {(row.cluster, row.job_id, row.run): row.id for row in returned}
    new_allocations: list[dict[str, int]] = []
    for i, req, account, fields, legs in plan.new:
        hold_id = hold_ids[(req.cluster, req.job_id, req.run)]
        plan.post(
            account, EntryDraft("hold", req.at, legs, user=req.user, hold_id=hold_id, memo=hold_memo(req))
        )
        new_allocations.extend(earmark_rows(hold_id, legs))
        created[i] = HoldState(
            id=hold_id,
            account=account.name,
            account_id=account.id,
            charged_ucredits=0,
            charged_seconds=0,
            debt_ucredits=0,
            state=HoldStatus.ACTIVE,
            resolved_at=None,
            **fields,
        )
    return new_allocations


def _settle_requests(
    settles: Sequence[tuple[int, int | str, datetime | None]], outcomes: list[Outcome]
) -> dict[int, tuple[int, int, datetime | None]]:
    """The settles to read, by hold id: (index, elapsed, at); a hold's second settle in
    the batch is left to settle_hold, which replays or refuses it after the first."""
    wanted: dict[int, tuple[int, int, datetime | None]] = {}
    for i, (hold_id, elapsed, at) in enumerate(settles):
        try:
            seconds = parse_seconds(elapsed, field="elapsed")
        except LedgerError as error:
            outcomes[i] = error
            continue
        if hold_id not in wanted:
            wanted[hold_id] = (i, seconds, at)
    return wanted


def _hold_requests(holds: Sequence[HoldRequest], outcomes: list[Outcome]) -> dict[int, CheckedHoldRequest]:
    """The holds checked and normalised, by index; a run's second request in the batch is
    left to create_hold, which replays or refuses it after the first."""
    checked: dict[int, CheckedHoldRequest] = {}
    runs: set[tuple[str, int, int]] = set()
    for i, request in enumerate(holds):
        try:
            req = request.checked()
        except LedgerError as error:
            outcomes[i] = error
            continue
        except (TypeError, ValueError):
            continue  # left to create_hold, which says what is wrong
        run = (req.cluster, req.job_id, req.run)
        if run not in runs:
            runs.add(run)
            checked[i] = req
    return checked


def _read_holds(s: Session, wanted: dict[int, Any]) -> list[HoldState]:
    if not wanted:
        return []
    return [to_state(row) for row in s.execute(hold_query().where(holds_t.c.id.in_(sorted(wanted))))]


@dataclasses.dataclass
class LockedBatch:
    """What `lock_batch` took and read: the accounts locked, by id, every hold of the
    batch's settle jobs and what `apply_holds_and_settles` reads, all under those locks."""

    accounts: dict[int, LockedAccount]
    holds: list[HoldState]
    # The batch's other reads (`apply_holds_and_settles`'s), made in the same round trip.
    reads: dict[str, list[Any]] | None = None


def lock_batch(
    s: Session,
    accounts: Collection[str],
    jobs: Collection[tuple[str, int]],
    *,
    owners_named: bool = False,
    new_runs: Collection[tuple[str, int]] = (),
) -> LockedBatch:
    """Lock, in id order, the accounts a batch will touch (those its holds name and those
    owning its settles' `(cluster, job_id)`), then read, under the locks, those jobs' holds
    and all that `apply_holds_and_settles` reads for the batch (`new_runs`: the jobs its
    holds are for, one new hold id each; the reads are a superset of what it needs).

    Two round trips on PostgreSQL whatever the batch: the jobs' owners (with the BEGIN),
    then the lock and the reads together. Owners are read before the lock and locked by
    id (a hold's account never changes); a subquery under FOR UPDATE got a nested-loop
    plan over all holds while a young table had no statistics.

    `owners_named`: `accounts` names the settles' accounts too (the epilog sends its job's
    account), so the owners are not read first: one round trip. A hold found under another
    account is locked after the others by `apply_holds_and_settles`; should that cross
    another batch's locks, PostgreSQL fails one of the two (a deadlock), retried."""
    postgres = s.get_bind().dialect.name == "postgresql"
    q = _queries(s)
    jobs_params = pair_params("runs", jobs, postgres)
    owners: list[int] = []
    if jobs and not owners_named:
        owners = sorted({row.account_id for row in select_many(s, [(q.owners, jobs_params)])[0]})
    if not accounts and not owners:
        return LockedBatch({}, [])
    named = {"names": sorted(accounts), "ids": owners}
    reads: list[tuple[str, Any, dict[str, Any]]] = [
        ("locked", lock_query(postgres), named),
        ("holds", q.jobs, jobs_params),
        ("allocations", q.job_allocations, jobs_params),
        ("limits", q.named_limits, named),
        ("grants", q.named_grants, {**named, **jobs_params}),
        ("runs", q.runs, pair_params("runs", new_runs, postgres)),
        ("prices", q.prices, {}),
    ]
    if q.hold_ids is not None:
        reads.append(("hold_ids", q.hold_ids, {"n": len(new_runs)}))
    fetched = dict(zip([name for name, _, _ in reads], select_many(s, [r[1:] for r in reads]), strict=True))
    return LockedBatch(
        {row.id: LockedAccount(*row) for row in fetched.pop("locked")},
        [to_state(row) for row in fetched.pop("holds")],
        fetched,
    )


def find_active_holds(
    s: Session, attempts: Sequence[tuple[str, int, datetime | None]]
) -> list[HoldState | None]:
    """`find_active_hold(s, cluster, job_id, submitted_at)` for each attempt, in one query."""
    if not attempts:
        return []
    postgres = s.get_bind().dialect.name == "postgresql"
    params = pair_params("runs", [(cluster, job_id) for cluster, job_id, _ in attempts], postgres)
    return active_holds_among([to_state(row) for row in s.execute(_queries(s).jobs, params)], attempts)


def active_holds_among(
    holds: Sequence[HoldState], attempts: Sequence[tuple[str, int, datetime | None]]
) -> list[HoldState | None]:
    """For each attempt, the hold `find_active_hold` would find among `holds` (every hold
    of the attempts' jobs): the newest active one of that submit time, or of any."""
    newest: dict[tuple[str, int], list[HoldState]] = {}
    for hold in sorted(holds, key=lambda hold: -hold.id):
        if hold.state == HoldStatus.ACTIVE:
            newest.setdefault((hold.cluster, hold.job_id), []).append(hold)
    found: list[HoldState | None] = []
    for cluster, job_id, submitted_at in attempts:
        wanted = None if submitted_at is None else (submit_time(submitted_at), UNKNOWN_SUBMIT)
        found.append(
            next(
                (h for h in newest.get((cluster, job_id), []) if wanted is None or h.submitted_at in wanted),
                None,
            )
        )
    return found


class _Queries:
    """The batch's reads, built once per dialect (`select_many` compiles each once)."""

    def __init__(self, postgres: bool) -> None:
        self.postgres = postgres

        def among(column: Any, name: str) -> Any:
            return bulk_among(column, name, postgres)

        self.allocations = select(allocations_t).where(among(allocations_t.c.hold_id, "holds"))
        # Accounts with caps, and, where an account with children has caps (a cap on a
        # subtree), every account in a tree: create_hold checks those (ledger.limits.rules).
        child = accounts_t.alias("child")
        parent_capped = (
            select(limits_t.c.account_id)
            .where(select(child.c.id).where(child.c.parent_id == limits_t.c.account_id).exists())
            .exists()
        )

        def capped_among(accounts: Any) -> Any:
            return union(
                select(limits_t.c.account_id).where(accounts(limits_t.c.account_id)),
                select(accounts_t.c.id.label("account_id")).where(
                    accounts(accounts_t.c.id), accounts_t.c.parent_id.is_not(None), parent_capped
                ),
            )

        self.limits = capped_among(lambda column: among(column, "accounts"))
        # Every hold of some jobs (the unique index), whatever their state; and their accounts.
        of_jobs = among_pairs(holds_t.c.cluster, holds_t.c.job_id, "runs", postgres)
        self.jobs = hold_query().where(of_jobs)
        self.owners = select(holds_t.c.account_id).where(of_jobs)
        self.runs = self.jobs.add_columns(holds_t.c.request_hash.label("_digest"))
        self.prices = price_rows_query()
        self.hold_ids = (
            text(
                "SELECT nextval(pg_get_serial_sequence('holds', 'id')) AS id FROM generate_series(1, :n)"
            ).columns(id=Integer)
            if postgres
            else None
        )
        # Each account's grants with credit left, plus those the settled holds drew on
        # (what `load_grants` and `_grants_for` read, for many accounts at once).
        touched = select(allocations_t.c.grant_id).where(among(allocations_t.c.hold_id, "holds"))
        self.grants = select(grants_t).where(
            among(grants_t.c.account_id, "accounts"),
            or_(grants_t.c.remaining_ucredits > 0, grants_t.c.id.in_(touched)),
        )
        # The same, for `lock_batch`: by the accounts it locks and the holds of the settles' jobs.
        locked_ids = select(accounts_t.c.id).where(
            accounts_t.c.kind == "customer",
            or_(among(accounts_t.c.name, "names"), among(accounts_t.c.id, "ids")),
        )
        job_holds = select(holds_t.c.id).where(of_jobs)
        self.job_allocations = select(allocations_t).where(allocations_t.c.hold_id.in_(job_holds))
        self.named_limits = capped_among(lambda column: column.in_(locked_ids))
        touched_by_jobs = select(allocations_t.c.grant_id).where(allocations_t.c.hold_id.in_(job_holds))
        self.named_grants = select(grants_t).where(
            grants_t.c.account_id.in_(locked_ids),
            or_(grants_t.c.remaining_ucredits > 0, grants_t.c.id.in_(touched_by_jobs)),
        )


_QUERIES: dict[bool, _Queries] = {}


def _queries(s: Session) -> _Queries:
    postgres = s.get_bind().dialect.name == "postgresql"
    if postgres not in _QUERIES:
        _QUERIES[postgres] = _Queries(postgres)
    return _QUERIES[postgres]


def _holds_of_runs(
    rows: Sequence[Any], jobs: set[tuple[str, int]]
) -> dict[tuple[Any, ...], tuple[HoldState, str]]:
    """Existing holds of these jobs' ids by (cluster, job id, run, submitted at), with their digests."""
    found: dict[tuple[Any, ...], tuple[HoldState, str]] = {}
    for row in rows:
        fields = dict(row._mapping)
        digest = fields.pop("_digest")
        hold = HoldState(**fields)
        if (hold.cluster, hold.job_id) in jobs:
            found[(hold.cluster, hold.job_id, hold.run, hold.submitted_at)] = (hold, digest)
    return found


def _save_grants(s: Session, grants: list[GrantState]) -> None:
    """`save_grants` in one statement: the same invariant, checked before anything is written."""
    dirty = [g for g in grants if g.dirty]
    for g in dirty:
        if g.remaining_ucredits < 0 or not 0 <= g.earmarked_ucredits <= g.remaining_ucredits:
            raise RuntimeError(
                f"grant {g.id} would break its invariant: "
                f"remaining {g.remaining_ucredits}, earmarked {g.earmarked_ucredits}"
            )
    update_rows(
        s,
        grants_t,
        ("id",),
        [
            {
                "id": g.id,
                "remaining_ucredits": g.remaining_ucredits,
                "earmarked_ucredits": g.earmarked_ucredits,
            }
            for g in dirty
        ],
    )
    for g in dirty:
        g.dirty = False
