"""Reconcile Slurm's record of finished runs (sacct) with what the ledger charged.

Slurm's accounting is the final word on what a run used; the hooks' charges are
provisional. For each finished run, identified by ``(cluster, job_id, run)``:

=============================================  =========================================  ================
sacct and the ledger                           what happens                               job_runs.flags
=============================================  =========================================  ================
hold still active 5 min after the run ended    settle with Slurm's elapsed; adjust if     (none)
(the epilog was lost)                          the GPU types change the price
hold resolved, charge == expected              nothing                                    (none)
hold resolved, charge != expected              one adjustment, linked to the settle       (none)
no hold, GPUs x elapsed > 0 (hook outage)      charged once, debt allowed                 unreserved
REQUEUED, ElapsedRaw <= 1 or Start == End,     a PrologSlurmctld refusal: nothing         refused
no hold
Start None (cancelled while pending)           nothing; an active hold is released        never_ran
NODE_FAIL and policy.refund_node_fail          expected charge 0: refunded                node_fail_refund
not final, half-written, or hold active for    skipped; a later round picks it up         (no row)
less than policy.epilog_grace_seconds
=============================================  =========================================  ================

The expected charge is ``charge_for(rate, ElapsedRaw)``, the rate summed over the
GPU types of AllocTRES at the hold's own unit prices (the price the run was sold
at), or at the price in force at the run's start for a type the hold did not have.

Money moves only through :mod:`ledger.api`; ``job_runs`` is a projection written
in the same transaction as the entry it reflects. Everything is idempotent:
re-running a round finds every charge equal to its target and posts nothing.

Throughput comes from batching (:func:`reconcile_runs`): one read per batch loads
the stored ``job_runs`` rows of the batch's jobs; a run whose Slurm record (state,
elapsed, GPUs) equals its stored row is unchanged and costs nothing more; a second
read loads the holds of the other runs; those that move no money are written in
one statement (COPY on PostgreSQL) without any lock; only a run that moves money
gets its own transaction, which locks one account.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, NamedTuple

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from accounting_bridge.sacct import TERMINAL_STATES, SacctRun
from ledger import api
from ledger.errors import InvalidInput, LedgerError
from ledger.holds import holds_t
from ledger.models import JobRun, table_of
from ledger.money import charge_for, format_credits
from ledger.prices import format_gpus, parse_pairs, price_at
from ledger.timeutil import utcnow

__all__ = [
    "COUNTERS",
    "DEFAULT_POLICY",
    "HoldView",
    "Plan",
    "Policy",
    "RunOutcome",
    "Summary",
    "not_final_reason",
    "plan_run",
    "reconcile_run",
    "reconcile_runs",
    "reconcile_stored",
    "upsert_job_runs",
]

job_runs_t = table_of(JobRun)

# What a round reports, in this order. `charged`: active holds the bridge settled
# (their epilog was lost); `adjusted`: resolved holds corrected to Slurm's record.
COUNTERS = (
    "seen",
    "unchanged",
    "matched",
    "charged",
    "adjusted",
    "unreserved",
    "refunded",
    "released",
    "not_charged",
    "skipped",
    "suspect",
    "failed",
)
# Counters whose runs move money; their totals are reported in credits.
MONEY_COUNTERS = ("charged", "adjusted", "unreserved", "refunded", "released")
_MONEY_ACTIONS = frozenset({"settle", "adjust", "release", "unreserved"})

# A prolog refusal shows as a REQUEUED attempt with Start == End; ElapsedRaw is 0 or 1.
REFUSED_ELAPSED_MAX_SECONDS = 1
# Runs per batch: bounds each read, each bulk write and the memory they hold.
DEFAULT_BATCH_RUNS = 5_000
# Job ids per range read (see _id_ranges).
_RANGE_SPAN_IDS = 10_000
# From this many rows, PostgreSQL upserts go through COPY and a temporary table.
_COPY_MIN_ROWS = 200
# job_runs.flags is String(128).
_FLAGS_MAX_CHARS = 128


@dataclass(frozen=True)
class Policy:
    """What reconciliation may decide on its own (config `[policy]`)."""

    refund_node_fail: bool = True
    # A hold whose run index differs from sacct's still matches a run starting this close.
    start_tolerance_seconds: int = 5
    # sacct has the run's end as soon as the epilog starts: an active hold is only taken
    # for a lost epilog (and settled here) once the run ended this long ago.
    epilog_grace_seconds: int = 300

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Policy:
        value = config.get("policy", {}).get("refund_node_fail", True)
        if not isinstance(value, bool):
            raise InvalidInput(
                f"policy.refund_node_fail must be true or false, got {value!r}", code="invalid_config"
            )
        grace = config.get("policy", {}).get("epilog_grace_seconds", cls.epilog_grace_seconds)
        if not isinstance(grace, int) or isinstance(grace, bool) or grace < 0:
            raise InvalidInput(
                f"policy.epilog_grace_seconds must be a whole number >= 0, got {grace!r}",
                code="invalid_config",
            )
        return cls(refund_node_fail=value, epilog_grace_seconds=grace)


DEFAULT_POLICY = Policy()


class HoldView(NamedTuple):
    """What reconciliation needs of a hold, read in bulk (a tuple: cheap to build by the 100,000)."""

    id: int
    account_id: int
    run: int
    state: str
    unit_prices: Mapping[str, int]
    rate_ucredits_per_hour: int
    charged_ucredits: int


class Plan(NamedTuple):
    """What a run needs: `action` is matched, not_charged, settle, adjust, release, unreserved,
    or wait (its hold is still active and its epilog may still come)."""

    action: str
    flags: tuple[str, ...]
    hold: HoldView | None
    expected_ucredits: int  # the run's charge per Slurm (unreserved: computed by the ledger)

    @property
    def moves_money(self) -> bool:
        return self.action in _MONEY_ACTIONS

    @property
    def refund(self) -> bool:
        return "node_fail_refund" in self.flags


@dataclass(frozen=True)
class RunOutcome:
    """What reconciliation did with one run; `counter` is one of COUNTERS."""

    cluster: str
    job_id: int
    run: int
    display_id: str
    counter: str
    flags: tuple[str, ...] = ()
    hold_id: int | None = None
    change_ucredits: int = 0  # how much this reconciliation changed the run's charge
    charged_ucredits: int = 0  # the run's charge afterwards
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": f"{self.cluster}/{self.job_id}/{self.run}",
            "display_id": self.display_id,
            "result": self.counter,
            "flags": ",".join(self.flags),
            "hold_id": self.hold_id,
            "change": format_credits(self.change_ucredits),
            "charged": format_credits(self.charged_ucredits),
            "detail": self.detail,
        }


@dataclass
class Summary:
    """Counts and credit totals of one reconciliation, plus every run that moved money or failed."""

    counts: Counter[str] = field(default_factory=Counter)
    totals_ucredits: Counter[str] = field(default_factory=Counter)
    notable: list[RunOutcome] = field(default_factory=list)

    def add(self, outcome: RunOutcome) -> None:
        self.counts[outcome.counter] += 1
        if outcome.counter in MONEY_COUNTERS:
            self.totals_ucredits[outcome.counter] += outcome.change_ucredits
        if outcome.counter in MONEY_COUNTERS or outcome.counter in ("failed", "suspect"):
            self.notable.append(outcome)

    @property
    def failures(self) -> list[RunOutcome]:
        return [o for o in self.notable if o.counter == "failed"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": {name: self.counts[name] for name in COUNTERS},
            "totals": {name: format_credits(self.totals_ucredits[name]) for name in MONEY_COUNTERS},
            "runs": [o.as_dict() for o in self.notable],
        }


class _PriceNotLoaded(Exception):
    """Internal: the bulk pass has no price for a type; the run goes the per-run way."""


# --------------------------------------------------------------------------- decisions (pure)


def not_final_reason(run: SacctRun) -> str | None:
    """Why a run cannot be reconciled yet, or None when its record is final."""
    if run.end is None:
        return f"{run.state}: no end time yet"
    if not run.finished:
        return f"{run.state} is not a final state"
    # For ~2.5 s after a short job ends, sacct can show a half-written allocation
    # record (JobName "allocation", Partition and ReqTRES empty; docs/slurm-facts.md §10).
    if not run.partition:
        return "half-written accounting record (no partition yet)"
    return None


def _is_refused_attempt(run: SacctRun) -> bool:
    return run.state == "REQUEUED" and (
        run.elapsed_seconds <= REFUSED_ELAPSED_MAX_SECONDS or run.start == run.end
    )


def _rate(
    run: SacctRun, hold: HoldView, price_of: Callable[[str], int | None]
) -> tuple[int, tuple[str, ...]]:
    """Micro-credits per hour of the GPUs Slurm allocated, at the prices the hold sold them."""
    if not run.gpus:
        # No GPU TRES in sacct while a hook reserved GPUs: accounting does not track
        # gres/gpu (AccountingStorageTRES). Refunding every such run would be wrong.
        return hold.rate_ucredits_per_hour, ("gpus_from_hold",)
    rate = 0
    for gpu_type, count in run.gpus.items():
        unit = hold.unit_prices.get(gpu_type)
        if unit is None:
            unit = price_of(gpu_type)
        if unit is None:
            raise InvalidInput(
                f"no price for GPU type {gpu_type!r} (run {run.cluster}/{run.job_id}/{run.run} "
                f"per sacct AllocTRES, not in its hold); set one with `gpucredit price set`",
                code="unknown_gres",
                details={"gres": gpu_type, "job_id": run.job_id, "run": run.run},
            )
        rate += unit * count
    return rate, ()


def plan_run(
    run: SacctRun,
    hold: HoldView | None,
    policy: Policy,
    price_of: Callable[[str], int | None],
    *,
    now: datetime,
    unreserved_hold: bool = False,
) -> Plan:
    """Decide what a final run needs, from Slurm's record and the run's hold (if any).

    `unreserved_hold`: the hold is the one an earlier round made for an unreserved
    run; it keeps that flag.
    """
    flags: list[str] = []
    if hold is not None and hold.run != run.run:
        flags.append("matched_by_start")
    if hold is not None and unreserved_hold:
        flags.append("unreserved")
    refund = run.state == "NODE_FAIL" and policy.refund_node_fail
    if run.start is None:
        flags.append("never_ran")
        if hold is None:
            return Plan("not_charged", tuple(flags), None, 0)
        if hold.state == "active":
            return Plan("release", tuple(flags), hold, 0)
        action = "matched" if hold.charged_ucredits == 0 else "adjust"
        return Plan(action, tuple(flags), hold, 0)
    if hold is None:
        if _is_refused_attempt(run):
            return Plan("not_charged", (*flags, "refused"), None, 0)
        if run.gpu_count == 0 or run.elapsed_seconds == 0:
            return Plan("not_charged", (*flags, "no_gpu_time"), None, 0)
        if refund:
            return Plan("not_charged", (*flags, "unreserved", "node_fail_refund"), None, 0)
        return Plan("unreserved", (*flags, "unreserved"), None, 0)
    if refund:
        flags.append("node_fail_refund")
        expected = 0
    else:
        rate, rate_flags = _rate(run, hold, price_of)
        flags.extend(rate_flags)
        expected = charge_for(rate, run.elapsed_seconds)
    if hold.state == "active":
        assert run.end is not None  # only final runs are planned
        if run.end > now - timedelta(seconds=policy.epilog_grace_seconds):
            return Plan("wait", tuple(flags), hold, expected)
        return Plan("settle", tuple(flags), hold, expected)
    if hold.charged_ucredits == expected:
        return Plan("matched", tuple(flags), hold, expected)
    return Plan("adjust", tuple(flags), hold, expected)


def _reason(run: SacctRun, plan: Plan) -> str:
    """The memo of an adjustment: why the run's charge changes."""
    if plan.refund:
        return "NODE_FAIL: refunded (policy.refund_node_fail)"
    if run.start is None:
        return "never started"
    return f"sacct: {run.state}, {run.elapsed_seconds} s of {format_gpus(run.gpus) or 'GPUs'}"


def _exact_hold(run: SacctRun, holds: Sequence[HoldView]) -> HoldView | None:
    for hold in holds:
        if hold.run == run.run:
            return hold
    return None


def _pick_hold(
    run: SacctRun,
    holds: Sequence[HoldView],
    claims: Callable[[], tuple[Collection[int], Collection[int]]],
    starts: Callable[[Sequence[int]], Mapping[int, datetime]],
    tolerance_seconds: int,
) -> HoldView | None:
    """The run's hold: by run index, else the job's unclaimed hold that started with it.

    The hooks number runs by SLURM_JOB_RESTART_COUNT and sacct's index comes from
    ordering attempts; they agree unless sacct lost an attempt. Then a hold taken
    within a few seconds of the run's start is the same run, unless another run of
    the job owns it. Only without an exact match are `claims()` (hold ids other runs
    own, the job's other run indexes) and `starts(hold ids)` asked.
    """
    exact = _exact_hold(run, holds)
    if exact is not None or run.start is None or not holds:
        return exact
    claimed_ids, other_runs = claims()
    candidates = [hold for hold in holds if hold.id not in claimed_ids and hold.run not in other_runs]
    if not candidates:
        return None
    started = starts([hold.id for hold in candidates])
    tolerance = timedelta(seconds=tolerance_seconds)
    near = [(abs(started[hold.id] - run.start), hold.id, hold) for hold in candidates]
    near = [candidate for candidate in near if candidate[0] <= tolerance]
    return min(near)[2] if near else None


# --------------------------------------------------------------------------- reads


def _id_ranges(jobs: Collection[tuple[str, int]]) -> Iterator[tuple[list[str], int, int]]:
    """Job-id ranges covering `jobs`, each spanning at most _RANGE_SPAN_IDS ids.

    A range scan of the (cluster, job_id, run) index costs the same whatever the
    planner believes about the table; a long IN list did not (a freshly filled,
    not yet analyzed job_runs got a filter over the whole table per query).
    Slurm numbers jobs in sequence, so a window's jobs are mostly dense ranges.
    """
    clusters = sorted({cluster for cluster, _ in jobs})
    ranges: list[list[int]] = []
    for job_id in sorted({job_id for _, job_id in jobs}):
        if ranges and job_id - ranges[-1][0] < _RANGE_SPAN_IDS:
            ranges[-1][1] = job_id
        else:
            ranges.append([job_id, job_id])
    for low, high in ranges:
        yield clusters, low, high


@functools.lru_cache(maxsize=4096)
def _unit_prices(text: str) -> Mapping[str, int]:
    # A few distinct price lists serve every hold: parse each once, share it read-only.
    return MappingProxyType(parse_pairs(text))


def _load_holds(s: Session, jobs: Collection[tuple[str, int]]) -> dict[tuple[str, int], list[HoldView]]:
    found: dict[tuple[str, int], list[HoldView]] = {}
    query = select(
        holds_t.c.id,
        holds_t.c.account_id,
        holds_t.c.cluster,
        holds_t.c.job_id,
        holds_t.c.run,
        holds_t.c.state,
        holds_t.c.unit_prices,
        holds_t.c.rate_ucredits_per_hour,
        holds_t.c.charged_ucredits,
    )
    for clusters, low, high in _id_ranges(jobs):
        where = (holds_t.c.cluster.in_(clusters), holds_t.c.job_id.between(low, high))
        for hold_id, account_id, cluster, job_id, run, state, prices, rate, charged in _plain_rows(
            s, query.where(*where)
        ):
            key = (cluster, job_id)
            if key in jobs:
                found.setdefault(key, []).append(
                    HoldView(hold_id, account_id, run, state, _unit_prices(prices), rate, charged)
                )
    return found


# A job_runs row as _load_stored returns it: the driver's own tuple, read by position
# (building an object per row was most of what re-reading a window cost).
StoredRow = tuple[Any, ...]
_STATE, _ELAPSED, _GPUS, _FLAGS, _HOLD_ID = 3, 4, 5, 6, 7


def _load_stored(s: Session, jobs: Collection[tuple[str, int]]) -> dict[tuple[str, int, int], StoredRow]:
    """job_runs rows of `jobs`, by (cluster, job_id, run)."""
    found: dict[tuple[str, int, int], StoredRow] = {}
    query = select(
        job_runs_t.c.cluster,
        job_runs_t.c.job_id,
        job_runs_t.c.run,
        job_runs_t.c.state,
        job_runs_t.c.elapsed_seconds,
        job_runs_t.c.gpus,
        job_runs_t.c.flags,
        job_runs_t.c.hold_id,
    )
    for clusters, low, high in _id_ranges(jobs):
        where = (job_runs_t.c.cluster.in_(clusters), job_runs_t.c.job_id.between(low, high))
        for row in _plain_rows(s, query.where(*where)):
            if (row[0], row[1]) in jobs:
                found[row[:3]] = row
    return found


def _stored_of_job(
    stored: Mapping[tuple[str, int, int], StoredRow], job: tuple[str, int]
) -> dict[int, StoredRow]:
    return {key[2]: row for key, row in stored.items() if key[:2] == job}


def _plain_rows(s: Session, query: Any) -> list[tuple[Any, ...]]:
    """The driver's own tuples: re-reading a window fetches one row per run, and building
    SQLAlchemy Rows cost more than the rest of the check. Only for integer and text columns,
    which every driver returns alike."""
    result = s.connection().execute(query)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


@functools.lru_cache(maxsize=4096)
def _gpu_counts(text: str) -> Mapping[str, int]:
    # Stored GPU lists repeat ("a100:1", "h100:4", ...): parse each once, share it read-only.
    return MappingProxyType(parse_pairs(text))


def _unchanged(run: SacctRun, stored: StoredRow | None) -> bool:
    """Reconciled before from the same Slurm record (and not left failed)."""
    return (
        stored is not None
        and stored[_STATE] == run.state
        and stored[_ELAPSED] == run.elapsed_seconds
        and _gpu_counts(stored[_GPUS]) == run.gpus
        and "error" not in stored[_FLAGS]  # no other flag contains "error"
    )


def _made_unreserved(stored: StoredRow | None, hold: HoldView | None) -> bool:
    """The stored row says this hold was made by an earlier round for an unreserved run."""
    return (
        stored is not None
        and hold is not None
        and stored[_HOLD_ID] == hold.id
        and "unreserved" in stored[_FLAGS].split(",")
    )


def _claims(run: SacctRun, stored: Mapping[int, StoredRow]) -> tuple[set[int], set[int]]:
    """Holds other runs of the job own, and the job's other run indexes we know of."""
    others = [row for index, row in stored.items() if index != run.run]
    return {row[_HOLD_ID] for row in others if row[_HOLD_ID] is not None}, {row[2] for row in others}


# --------------------------------------------------------------------------- writes


_JOB_RUN_COLUMNS = (
    "cluster",
    "job_id",
    "run",
    "display_id",
    "account",
    "user",
    "partition",
    "state",
    "start_at",
    "end_at",
    "elapsed_seconds",
    "gpus",
    "nodes",
    "hold_id",
    "flags",
    "charged_ucredits",
    "ingested_at",
)
_KEY_COLUMNS = ("cluster", "job_id", "run")
_UPDATE_COLUMNS = tuple(c for c in _JOB_RUN_COLUMNS if c not in _KEY_COLUMNS)
# An error row leaves the last successful result (hold, charge) in place.
_UPDATE_COLUMNS_KEEP_CHARGE = tuple(c for c in _UPDATE_COLUMNS if c not in ("hold_id", "charged_ucredits"))


def _flags_text(flags: Iterable[str]) -> str:
    if not flags:
        return ""
    text = ",".join(dict.fromkeys(flags))
    if len(text) > _FLAGS_MAX_CHARS:
        raise ValueError(f"flags {text!r} exceed {_FLAGS_MAX_CHARS} characters")
    return text


JobRunRow = tuple[Any, ...]  # values in _JOB_RUN_COLUMNS order


def _job_run_row(
    run: SacctRun, *, flags: Iterable[str], hold_id: int | None, charged_ucredits: int, now: datetime
) -> JobRunRow:
    return (
        run.cluster,
        run.job_id,
        run.run,
        run.display_id,
        run.account,
        run.user,
        run.partition or None,
        run.state,
        run.start,
        run.end,
        run.elapsed_seconds,
        format_gpus(run.gpus),
        ",".join(run.nodes),
        hold_id,
        _flags_text(flags),
        charged_ucredits,
        now,
    )


def upsert_job_runs(s: Session, rows: Sequence[JobRunRow], *, keep_charge: bool = False) -> None:
    """Insert or update job_runs rows by (cluster, job_id, run); the last row of a key wins.

    `keep_charge` leaves an existing row's hold and charge alone (for runs that failed).
    """
    if not rows:
        return
    unique = list({row[:3]: row for row in rows}.values())
    dialect = s.get_bind().dialect.name
    update_columns = _UPDATE_COLUMNS_KEEP_CHARGE if keep_charge else _UPDATE_COLUMNS
    if dialect == "postgresql" and len(unique) >= _COPY_MIN_ROWS:
        _copy_upsert(s, unique, update_columns)
        return
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as upsert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as upsert  # type: ignore[assignment]
    else:
        raise RuntimeError(f"job_runs upserts support postgresql and sqlite, not {dialect}")
    statement = upsert(job_runs_t)
    statement = statement.on_conflict_do_update(
        index_elements=list(_KEY_COLUMNS),
        set_={column: statement.excluded[column] for column in update_columns},
    )
    s.execute(statement, [dict(zip(_JOB_RUN_COLUMNS, row, strict=True)) for row in unique])


def insert_job_runs(s: Session, rows: Sequence[JobRunRow]) -> None:
    """Insert rows for runs not stored yet; IntegrityError if one is there after all.

    Half the cost of an upsert on PostgreSQL (COPY straight into the table). The
    caller rolls back and upserts when another writer got there first.
    """
    if not rows:
        return
    if s.get_bind().dialect.name == "postgresql" and len(rows) >= _COPY_MIN_ROWS:
        dbapi = s.get_bind().dialect.loaded_dbapi
        try:
            with _driver_cursor(s) as cursor:
                _copy_rows(s, cursor, "job_runs", rows)
        except dbapi.IntegrityError as error:  # the driver's own: say it the way SQLAlchemy does
            raise IntegrityError("COPY job_runs", None, error) from error
        return
    s.execute(insert(job_runs_t), [dict(zip(_JOB_RUN_COLUMNS, row, strict=True)) for row in rows])


def _driver_cursor(s: Session) -> Any:
    driver = s.connection().connection.driver_connection
    if driver is None:
        raise RuntimeError("no PostgreSQL driver connection for COPY")
    return driver.cursor()


def _copy_rows(s: Session, cursor: Any, table: str, rows: Sequence[JobRunRow]) -> None:
    quote = s.get_bind().dialect.identifier_preparer.quote
    columns = ", ".join(quote(c) for c in _JOB_RUN_COLUMNS)
    with cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        for row in rows:  # start_at, end_at (8, 9) and ingested_at (16) are the times
            copy.write_row(
                (*row[:8], _naive_utc(row[8]), _naive_utc(row[9]), *row[10:16], _naive_utc(row[16]))
            )


def _naive_utc(value: datetime | None) -> datetime | None:
    # What UTCDateTime stores; COPY bypasses the column type, so convert here.
    if value is None:
        return None
    return (value if value.tzinfo is UTC else value.astimezone(UTC)).replace(tzinfo=None)


def _copy_upsert(s: Session, rows: Sequence[JobRunRow], update_columns: Sequence[str]) -> None:
    """COPY into a temporary table, then one INSERT ... ON CONFLICT: ~3x executemany's rate."""
    quote = s.get_bind().dialect.identifier_preparer.quote
    columns = ", ".join(quote(c) for c in _JOB_RUN_COLUMNS)
    assignments = ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in update_columns)
    with _driver_cursor(s) as cursor:
        cursor.execute(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS bridge_job_runs_in ON COMMIT DROP AS "
            f"SELECT {columns} FROM job_runs WITH NO DATA"
        )
        cursor.execute("TRUNCATE bridge_job_runs_in")
        _copy_rows(s, cursor, "bridge_job_runs_in", rows)
        cursor.execute(
            f"INSERT INTO job_runs ({columns}) SELECT {columns} FROM bridge_job_runs_in "
            f"ON CONFLICT ({', '.join(_KEY_COLUMNS)}) DO UPDATE SET {assignments}"
        )


# --------------------------------------------------------------------------- one run


def _outcome(run: SacctRun, counter: str, **fields: Any) -> RunOutcome:
    return RunOutcome(run.cluster, run.job_id, run.run, run.display_id, counter, **fields)


def _counter(plan: Plan) -> str:
    if plan.action in ("matched", "not_charged", "unreserved"):
        return plan.action
    if plan.action == "release":
        return "released"
    if plan.refund:
        return "refunded"
    return "charged" if plan.action == "settle" else "adjusted"


def _hold_starts(s: Session, hold_ids: Sequence[int]) -> dict[int, datetime]:
    query = select(holds_t.c.id, holds_t.c.started_at).where(holds_t.c.id.in_(hold_ids))
    return {hold_id: started_at for hold_id, started_at in s.execute(query).all()}


def _read_hold_for(s: Session, run: SacctRun, tolerance_seconds: int) -> tuple[HoldView | None, bool]:
    """The run's hold, and whether an earlier round made it for an unreserved run."""
    key = (run.cluster, run.job_id)
    holds = _load_holds(s, {key}).get(key, [])
    stored = _stored_of_job(_load_stored(s, {key}), key)
    hold = _pick_hold(
        run, holds, lambda: _claims(run, stored), lambda ids: _hold_starts(s, ids), tolerance_seconds
    )
    return hold, _made_unreserved(stored.get(run.run), hold)


def _execute(s: Session, run: SacctRun, plan: Plan) -> RunOutcome:
    """Carry out a plan through the ledger's public operations (they lock the payer)."""
    hold = plan.hold
    if plan.action == "unreserved":
        assert run.start is not None  # plan_run charges only runs that started
        done = api.record_unreserved_run(
            s,
            run.account,
            user=run.user,
            cluster=run.cluster,
            job_id=run.job_id,
            run=run.run,
            gpus=run.gpus,
            started_at=run.start,
            elapsed_seconds=run.elapsed_seconds,
            partition=run.partition or None,
        )
        return _outcome(
            run,
            "unreserved",
            flags=plan.flags,
            hold_id=done.id,
            change_ucredits=done.charged_ucredits,
            charged_ucredits=done.charged_ucredits,
        )
    if hold is None:  # matched / not_charged without a hold
        return _outcome(run, _counter(plan), flags=plan.flags)
    before = hold.charged_ucredits
    charged = before
    at = run.end
    if plan.action == "settle":
        charged = api.settle_hold(s, hold.id, run.elapsed_seconds, at).charged_ucredits
    elif plan.action == "release":
        charged = api.release_hold(s, hold.id, at).charged_ucredits
    if plan.action != "matched" and charged != plan.expected_ucredits:
        charged = api.adjust_hold(
            s, hold.id, plan.expected_ucredits, at=at, reason=_reason(run, plan)
        ).charged_ucredits
    return _outcome(
        run,
        _counter(plan),
        flags=plan.flags,
        hold_id=hold.id,
        change_ucredits=charged - before,
        charged_ucredits=charged,
    )


def reconcile_run(
    s: Session, run: SacctRun, policy: Policy = DEFAULT_POLICY, *, now: datetime | None = None
) -> RunOutcome:
    """Reconcile one run inside the caller's transaction; locks at most one account.

    Raises LedgerError when the ledger refuses (unknown account or GPU type, ...);
    the caller rolls back and may record the failure (see reconcile_runs).
    """
    reason = not_final_reason(run)
    if reason is not None:
        return _outcome(run, "skipped", detail=reason)
    now = now or utcnow()
    start = run.start

    def price_of(gpu_type: str) -> int | None:
        return None if start is None else price_at(s, gpu_type, run.partition or None, start)

    hold, unreserved_hold = _read_hold_for(s, run, policy.start_tolerance_seconds)
    plan = plan_run(run, hold, policy, price_of, now=now, unreserved_hold=unreserved_hold)
    if plan.action == "wait":
        return _outcome(run, "skipped", hold_id=hold.id if hold else None, detail="waiting for the epilog")
    # No lock of our own: each ledger operation locks the payer's account and reads the
    # hold again under it. A late epilog cannot make this wrong: an adjustment targets an
    # absolute charge, and settle/release refuse a hold resolved meanwhile (the run then
    # fails this round and is planned afresh the next).
    outcome = _execute(s, run, plan)
    row = _job_run_row(
        run,
        flags=plan.flags,
        hold_id=outcome.hold_id,
        charged_ucredits=outcome.charged_ucredits if outcome.hold_id is not None else 0,
        now=now,
    )
    upsert_job_runs(s, [row])
    return outcome


# --------------------------------------------------------------------------- many runs


SessionFactory = Callable[[], Session]


def reconcile_runs(
    session_factory: SessionFactory,
    runs: Iterable[SacctRun],
    policy: Policy = DEFAULT_POLICY,
    *,
    suspect_job_ids: Collection[int] = (),
    force: bool = False,
    now: datetime | None = None,
    batch_runs: int = DEFAULT_BATCH_RUNS,
) -> Summary:
    """Reconcile many runs: batched reads, bulk projection writes, one transaction per payment.

    `suspect_job_ids` are jobs with a malformed sacct row: their run numbers may be
    off, so their runs wait for a clean read. `force` re-plans runs whose Slurm
    record is unchanged (after a price or policy fix, or to re-check the ledger).
    A run the ledger refuses is reported as failed and stored with flag `error`, so
    `bridge reconcile` and later rounds retry it.
    """
    if batch_runs < 1:
        raise ValueError("batch_runs must be at least 1")
    now = now or utcnow()
    summary = Summary()
    jobs: dict[tuple[str, int], list[SacctRun]] = {}
    seen = 0
    for run in runs:
        seen += 1
        if run.end is None or run.state not in TERMINAL_STATES or not run.partition:
            summary.add(_outcome(run, "skipped", detail=not_final_reason(run) or ""))
        elif run.job_id in suspect_job_ids:
            summary.add(_outcome(run, "suspect", detail="the job has a malformed sacct row"))
        else:
            key = (run.cluster, run.job_id)
            same_job = jobs.get(key)
            if same_job is None:
                jobs[key] = [run]
            else:
                same_job.append(run)
    summary.counts["seen"] += seen
    batch: dict[tuple[str, int], list[SacctRun]] = {}
    size = 0
    for key in sorted(jobs):  # in job order: each batch reads few id ranges
        batch[key] = jobs[key]
        size += len(batch[key])
        if size >= batch_runs:
            _reconcile_batch(session_factory, batch, policy, force, now, summary)
            batch, size = {}, 0
    if batch:
        _reconcile_batch(session_factory, batch, policy, force, now, summary)
    return summary


def _reconcile_batch(
    session_factory: SessionFactory,
    jobs: Mapping[tuple[str, int], list[SacctRun]],
    policy: Policy,
    force: bool,
    now: datetime,
    summary: Summary,
) -> None:
    with session_factory() as s, s.begin():
        stored = _load_stored(s, jobs.keys())
        changed: dict[tuple[str, int], list[SacctRun]] = {}
        unchanged = 0
        for key, job_runs in jobs.items():
            for run in job_runs:
                if not force and _unchanged(run, stored.get((key[0], key[1], run.run))):
                    unchanged += 1
                else:
                    changed.setdefault(key, []).append(run)
        summary.counts["unchanged"] += unchanged
        # Only jobs with a changed run need their holds: re-reading a window costs one read.
        holds_by_job = _load_holds(s, changed.keys()) if changed else {}
    rows: list[JobRunRow] = []
    per_run: list[SacctRun] = []

    def no_price(gpu_type: str) -> int | None:
        raise _PriceNotLoaded(gpu_type)

    for key, job_runs in changed.items():
        holds = holds_by_job.get(key, [])
        for run in job_runs:
            hold = _exact_hold(run, holds)
            if hold is None and holds and run.start is not None:
                per_run.append(run)  # a hold numbered differently, maybe: match by start, per run
                continue
            try:
                unreserved_hold = _made_unreserved(stored.get((key[0], key[1], run.run)), hold)
                plan = plan_run(run, hold, policy, no_price, now=now, unreserved_hold=unreserved_hold)
            except _PriceNotLoaded:
                per_run.append(run)  # a GPU type its hold did not price: look it up, per run
                continue
            if plan.action == "wait":
                summary.add(_outcome(run, "skipped", detail="waiting for the epilog"))
                continue
            if plan.moves_money:
                per_run.append(run)
                continue
            hold_id = hold.id if hold is not None else None
            charged = hold.charged_ucredits if hold is not None else 0
            rows.append(
                _job_run_row(run, flags=plan.flags, hold_id=hold_id, charged_ucredits=charged, now=now)
            )
            summary.counts[_counter(plan)] += 1  # matched / not_charged: counted, not listed
    if rows:
        try:
            with session_factory() as s, s.begin():
                insert_job_runs(s, [row for row in rows if row[:3] not in stored])
                upsert_job_runs(s, [row for row in rows if row[:3] in stored])
        except IntegrityError:  # another writer stored one of these runs since we read: upsert all
            with session_factory() as s, s.begin():
                upsert_job_runs(s, rows)
    for run in per_run:
        summary.add(_reconcile_one(session_factory, run, policy, now))


def _reconcile_one(
    session_factory: SessionFactory, run: SacctRun, policy: Policy, now: datetime
) -> RunOutcome:
    """One run in its own transaction; a ledger refusal is recorded, not raised."""
    try:
        with session_factory() as s, s.begin():
            return reconcile_run(s, run, policy, now=now)
    except LedgerError as error:
        with session_factory() as s, s.begin():
            before = s.execute(
                select(job_runs_t.c.flags).where(
                    job_runs_t.c.cluster == run.cluster,
                    job_runs_t.c.job_id == run.job_id,
                    job_runs_t.c.run == run.run,
                )
            ).scalar()
            # Keep what the row said (e.g. unreserved) next to the error, for the retry.
            flags = [flag for flag in (before or "").split(",") if flag and flag != "error"]
            row = _job_run_row(run, flags=(*flags, "error"), hold_id=None, charged_ucredits=0, now=now)
            upsert_job_runs(s, [row], keep_charge=True)
        return _outcome(run, "failed", flags=("error",), detail=f"{error.code}: {error.message}")


# --------------------------------------------------------------------------- stored runs


def _run_from_row(row: Any) -> SacctRun:
    nodes = tuple(node for node in row.nodes.split(",") if node)
    return SacctRun(
        cluster=row.cluster,
        job_id=row.job_id,
        display_id=row.display_id,
        run=row.run,
        user=row.user,
        account=row.account,
        partition=row.partition or "",
        state=row.state,
        submit=None,
        start=row.start_at,
        end=row.end_at,
        elapsed_seconds=row.elapsed_seconds,
        time_limit_seconds=None,
        gpus=parse_pairs(row.gpus),
        requested_gpus={},
        nodes=nodes,
        node_count=len(nodes),
        name="",
    )


def reconcile_stored(
    session_factory: SessionFactory,
    policy: Policy = DEFAULT_POLICY,
    *,
    include_all: bool = False,
    since: datetime | None = None,
    now: datetime | None = None,
    batch_runs: int = DEFAULT_BATCH_RUNS,
) -> Summary:
    """Reconcile runs already ingested, from Slurm's record kept in job_runs (no Slurm call).

    By default only runs left failed (flag `error`); with `include_all`, every run
    that ended at or after `since`: after a price, account or policy fix, or to
    check that no charge drifted from Slurm's record.
    """
    now = now or utcnow()
    summary = Summary()
    last_id = 0
    while True:
        query = (
            select(job_runs_t).where(job_runs_t.c.id > last_id).order_by(job_runs_t.c.id).limit(batch_runs)
        )
        if not include_all:
            query = query.where(job_runs_t.c.flags.contains("error"))
        if since is not None:
            query = query.where(job_runs_t.c.end_at >= since)
        with session_factory() as s, s.begin():
            rows = s.execute(query).all()
        if not rows:
            return summary
        last_id = rows[-1].id
        page = reconcile_runs(
            session_factory,
            [_run_from_row(row) for row in rows],
            policy,
            force=True,
            now=now,
            batch_runs=batch_runs,
        )
        summary.counts.update(page.counts)
        summary.totals_ucredits.update(page.totals_ucredits)
        summary.notable.extend(page.notable)
