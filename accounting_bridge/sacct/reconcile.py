"""Reconcile Slurm's record of finished runs (sacct) with what the ledger charged.

Slurm's accounting is the final word on what a run used; the hooks' charges are
provisional. A run is one attempt of one job incarnation, ``(cluster, job_id, run,
submitted_at)``: Slurm reuses job ids (a wiped StateSaveLocation, FirstJobId, the
wrap at MaxJobId) and keeps the old jobs in sacct under the same ids, and it resets
SubmitTime on every requeue, so sacct's ``Submit`` names the attempt. A run's hold
is the one taken with the same submit time; only holds taken without one (before
migration 0004, or by the CLI) are matched the old way, by run index and then by
start, and never one that another attempt's row already owns. An old job's sacct
rows never match, and never update, a new job's hold or row. For each finished run:

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

The expected charge is the ledger's ``charge_for(rate, ElapsedRaw)``, the rate
(``rate_of``) of the GPU types of AllocTRES at the hold's own unit prices (the price
the run was sold at), or, for a type the hold did not have, at the price in force at
the run's start (the ledger's ``PriceTable``).

Money moves only through :mod:`ledger.api`; ``job_runs`` is a projection written
(through :mod:`ledger.jobs.jobruns`) in the same transaction as the entry it reflects.
Everything is idempotent: re-running a round finds every charge equal to its target
and posts nothing.

Throughput comes from batching (:func:`reconcile_runs`): one compact read per chunk
of the window (:mod:`ledger.jobs.jobrun_records`, one text per stored attempt) finds the
runs whose Slurm record (state, elapsed, GPUs) equals the one stored for the same
attempt: they are unchanged and cost one string and one set lookup each. The other
runs are grouped by job, in batches; a read per batch loads their stored rows and
holds; those that move no money are written in one statement (COPY on PostgreSQL)
without any lock. Runs that move money are queued over batches and applied in one
transaction per flush, its accounts locked first in one statement in id order (as the
daemon's group commit locks its batches, docs/design.md §3.9): every account's adjustments in one
``adjust_holds_many`` call, the unreserved runs in one ``record_unreserved_runs``
call, the job_runs rows in one statement. If the ledger refuses one run, the flush is
redone one transaction per account, and that account's one run per transaction, so
the refusal costs no other run. On PostgreSQL a batch's writes and transactions run
in background threads while the next batch is read and planned (their time is mostly
round trips).
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, NamedTuple

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from accounting_bridge.slurm.gc_pause import cycle_collection_paused
from accounting_bridge.slurm.records import TERMINAL_STATES, SacctRun
from ledger import api
from ledger.errors import InvalidInput, LedgerError
from ledger.jobs import jobrun_records, jobruns
from ledger.jobs.jobruns import UNKNOWN_SUBMIT, AttemptKey, HoldView, JobRunRow, StoredRun
from ledger.money import format_credits
from ledger.timeutil import utcnow

__all__ = [
    "COUNTERS",
    "DEFAULT_POLICY",
    "HoldView",
    "Plan",
    "Policy",
    "RunOutcome",
    "Summary",
    "attempt_key",
    "not_final_reason",
    "plan_run",
    "reconcile_run",
    "reconcile_runs",
    "reconcile_stored",
]

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
# Money-moving runs are queued over batches up to this many, then applied in one
# transaction (one per account only when the ledger refuses one of them).
MONEY_RUNS_PER_FLUSH = 2_000
# Flushes of money-moving runs whose transactions run at once (PostgreSQL; SQLite has one writer).
MONEY_WORKERS = 4
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


# --------------------------------------------------------------------------- decisions (pure)


def attempt_key(run: SacctRun) -> AttemptKey:
    """The run's identity: one attempt of one job incarnation (see the module docstring)."""
    return (run.cluster, run.job_id, run.run, run.submit or UNKNOWN_SUBMIT)


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
    unit_prices: dict[str, int] = {}
    for gpu_type in run.gpus:
        unit = hold.ucredits_per_gpu_hour.get(gpu_type)
        if unit is None:
            unit = price_of(gpu_type)
        if unit is None:
            raise InvalidInput(
                f"no price for GPU type {gpu_type!r} (run {run.cluster}/{run.job_id}/{run.run} "
                f"per sacct AllocTRES, not in its hold); set one with `gpucredit price set`",
                code="unknown_gres",
                details={"gres": gpu_type, "job_id": run.job_id, "run": run.run},
            )
        unit_prices[gpu_type] = unit
    return api.rate_of(run.gpus, unit_prices), ()


def _same_attempt(hold: HoldView, run: SacctRun) -> bool:
    """The hold was taken for this very attempt (the hooks sent its submit time).

    SubmitTime is whole seconds, and Slurm resets it at each requeue: a start the prolog
    refused, requeued within the second of the previous requeue, shares it with the next
    attempt. So an attempt that ran no time at all claims only a hold of its own run
    index; it costs nothing whichever hold it is told apart from."""
    if run.submit is None or hold.submitted_at != run.submit:
        return False
    return hold.run == run.run or run.elapsed_seconds > 0


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
    if hold is not None and hold.run != run.run and not _same_attempt(hold, run):
        flags.append("matched_by_start")
    if hold is not None and unreserved_hold:
        flags.append("unreserved")
    refund = run.state == "NODE_FAIL" and policy.refund_node_fail
    if run.start is None:
        flags.append("never_ran")
        if hold is None:
            return Plan("not_charged", tuple(flags), None, 0)
        if hold.state == api.HoldStatus.ACTIVE:
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
        expected = api.charge_for(rate, run.elapsed_seconds)
    if hold.state == api.HoldStatus.ACTIVE:
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
    return f"sacct: {run.state}, {run.elapsed_seconds} s of {jobruns.format_gpus(run.gpus) or 'GPUs'}"


# --------------------------------------------------------------------------- which hold, which row


class _StoredRuns:
    """The stored rows of every attempt under some job ids (all incarnations), by attempt."""

    def __init__(self, rows: Mapping[AttemptKey, StoredRun]) -> None:
        self.rows = rows
        self._by_job: dict[tuple[str, int], list[StoredRun]] | None = None

    def of(self, run: SacctRun) -> StoredRun | None:
        """The run's own row; a row written before migration 0004 (no submit time) with
        the same run index and start is the same attempt, recorded before attempts had one."""
        found = self.rows.get(attempt_key(run))
        if found is None and run.submit is not None:
            legacy = self.rows.get((run.cluster, run.job_id, run.run, UNKNOWN_SUBMIT))
            if legacy is not None and legacy.start_at == run.start:
                found = legacy
        return found

    def claims(self, run: SacctRun) -> tuple[set[int], set[int]]:
        """Holds that the job's other attempts' rows own, and those attempts' run indexes."""
        if self._by_job is None:  # only runs without a hold of their own get here: group once
            self._by_job = {}
            for row in self.rows.values():
                self._by_job.setdefault((row.cluster, row.job_id), []).append(row)
        own = self.of(run)
        others = [row for row in self._by_job.get((run.cluster, run.job_id), ()) if row is not own]
        return {row.hold_id for row in others if row.hold_id is not None}, {row.run for row in others}


class _PerRun(Exception):
    """Internal: matching a hold by its start needs a read the bulk pass does not make."""


def _per_run(hold_ids: Sequence[int]) -> Mapping[int, datetime]:
    raise _PerRun


def _own_hold(run: SacctRun, holds: Sequence[HoldView]) -> HoldView | None:
    """The hold the hooks took for this attempt, by its submit time."""
    for hold in holds:
        if _same_attempt(hold, run):
            return hold
    return None


def _legacy(holds: Sequence[HoldView]) -> list[HoldView]:
    """Holds taken without a submit time: matched by run index, then by start."""
    return [hold for hold in holds if hold.submitted_at == UNKNOWN_SUBMIT]


def _pick_hold(
    run: SacctRun,
    holds: Sequence[HoldView],
    claims: Callable[[], tuple[Collection[int], Collection[int]]],
    starts: Callable[[Sequence[int]], Mapping[int, datetime]],
    tolerance_seconds: int,
) -> HoldView | None:
    """The run's hold: the one taken for this attempt; else a hold without a submit time
    that no other attempt's row owns and that started with the run (its run index first).

    The hooks number runs by SLURM_JOB_RESTART_COUNT and sacct's index comes from
    ordering attempts; they agree unless sacct lost an attempt. Then a hold taken
    within a few seconds of the run's start is the same run, unless another run of
    the job owns it. `claims()` (hold ids other attempts own, their run indexes) and
    `starts(hold ids)` are only asked when there is no hold for the attempt itself.
    A hold taken for another attempt (another submit time) never matches.
    """
    own = _own_hold(run, holds)
    legacy = _legacy(holds)
    if own is not None or not legacy:
        return own
    claimed_ids, other_runs = claims()
    free = [hold for hold in legacy if hold.id not in claimed_ids]
    if run.start is None:  # cancelled while pending: at most its hold is released
        return next((hold for hold in free if hold.run == run.run), None)
    # Even with the same run index a hold must have started with the run: a later job
    # that reuses the id has its own run 0, and a legacy hold knows no submit time.
    candidates = [hold for hold in free if hold.run == run.run or hold.run not in other_runs]
    if not candidates:
        return None
    started = starts([hold.id for hold in candidates])
    tolerance = timedelta(seconds=tolerance_seconds)
    near = [
        (abs(started[hold.id] - run.start), hold.run != run.run, hold.id, hold)
        for hold in candidates
        if abs(started[hold.id] - run.start) <= tolerance
    ]
    return min(near)[3] if near else None


@functools.lru_cache(maxsize=4096)
def _gpu_counts(text: str) -> Mapping[str, int]:
    # Stored GPU lists repeat ("a100:1", "h100:4", ...): parse each once, share it read-only.
    return MappingProxyType(jobruns.parse_pairs(text))


def _record_text(run: SacctRun) -> str:
    """The run's Slurm record as the stored records read renders an attempt's.

    A row written before attempts had a submit time renders with that of 1970, so a run
    with a submit time never matches it: it is adopted, so written again.
    """
    submitted = int((run.submit or UNKNOWN_SUBMIT).timestamp())
    return jobrun_records.record_text(
        run.job_id, run.run, submitted, run.state, run.elapsed_seconds, _gpus_text(run.gpus)
    )


def _job_ids_by_cluster(runs: Sequence[SacctRun]) -> dict[str, list[int]]:
    clusters = {run.cluster for run in runs}
    if len(clusters) == 1:  # the usual window: a list, no keys
        return {clusters.pop(): [run.job_id for run in runs]}
    found: dict[str, list[int]] = {}
    for run in runs:
        found.setdefault(run.cluster, []).append(run.job_id)
    return found


def _changed_runs(
    session_factory: SessionFactory, runs: Sequence[SacctRun], chunk_runs: int, summary: Summary
) -> tuple[list[SacctRun], bool]:
    """The runs whose Slurm record differs from the one stored for their attempt (or that
    have none, or were left failed), and whether any of the runs' jobs has a stored row.

    Counts the others as unchanged: reconciled before from the same record, they cost
    one string and one set lookup each.
    """
    chunks = [runs[first : first + chunk_runs] for first in range(0, len(runs), chunk_runs)]
    keys = map(_job_ids_by_cluster, chunks)
    changed: list[SacctRun] = []
    any_stored = False
    unchanged = 0
    with contextlib.closing(jobrun_records.stored_records_in_turn(session_factory, keys)) as reads:
        for chunk, stored in zip(chunks, reads, strict=True):
            if not stored:  # a first read of these jobs: nothing stored, nothing unchanged
                changed.extend(chunk)
                continue
            any_stored = True
            cluster: str | None = None
            texts: set[str] = set()
            for run in chunk:
                if run.cluster != cluster:
                    cluster, texts = run.cluster, stored.get(run.cluster, set())
                if _record_text(run) in texts:
                    unchanged += 1
                else:
                    changed.append(run)
    summary.counts["unchanged"] += unchanged
    return changed, any_stored


def _made_unreserved(stored: StoredRun | None, hold: HoldView | None) -> bool:
    """The stored row says this hold was made by an earlier round for an unreserved run."""
    return (
        stored is not None
        and hold is not None
        and stored.hold_id == hold.id
        and "unreserved" in stored.flags.split(",")
    )


# --------------------------------------------------------------------------- writes


def _flags_text(flags: Iterable[str]) -> str:
    if not flags:
        return ""
    text = ",".join(dict.fromkeys(flags))
    if len(text) > _FLAGS_MAX_CHARS:
        raise ValueError(f"flags {text!r} exceed {_FLAGS_MAX_CHARS} characters")
    return text


@functools.lru_cache(maxsize=4096)
def _gpus_text_of(items: tuple[tuple[str, int], ...]) -> str:
    return jobruns.format_gpus(dict(items))


def _gpus_text(gpus: Mapping[str, int]) -> str:
    """jobruns.format_gpus, once per distinct GPU mix (a few serve a whole window)."""
    return _gpus_text_of(tuple(gpus.items()))


def _job_run_row(
    run: SacctRun, *, flags: Iterable[str], hold_id: int | None, charged_ucredits: int, now: datetime
) -> JobRunRow:
    return JobRunRow(
        run.cluster,
        run.job_id,
        run.run,
        run.submit or UNKNOWN_SUBMIT,
        run.display_id,
        run.account,
        run.user,
        run.partition or None,
        run.state,
        run.start,
        run.end,
        run.elapsed_seconds,
        _gpus_text(run.gpus),
        ",".join(run.nodes),
        hold_id,
        _flags_text(flags),
        charged_ucredits,
        now,
    )


def _adopting(run: SacctRun, stored: StoredRun | None) -> list[AttemptKey]:
    """The run's key when its stored row predates submit times (to be adopted)."""
    if stored is not None and run.submit is not None and stored.submitted_at == UNKNOWN_SUBMIT:
        return [attempt_key(run)]
    return []


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


def _read_hold_for(
    s: Session, run: SacctRun, tolerance_seconds: int
) -> tuple[HoldView | None, bool, StoredRun | None]:
    """The run's hold, whether an earlier round made it for an unreserved run, and the
    run's stored row."""
    key = (run.cluster, run.job_id)
    holds = jobruns.load_hold_views(s, {key}).get(key, [])
    job_rows = _StoredRuns(jobruns.load_job_runs(s, {key}))
    hold = _pick_hold(
        run,
        holds,
        lambda: job_rows.claims(run),
        lambda ids: jobruns.hold_starts(s, ids),
        tolerance_seconds,
    )
    stored = job_rows.of(run)
    return hold, _made_unreserved(stored, hold), stored


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
            submitted_at=run.submit,
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


def _price_lookup(s: Session, run: SacctRun) -> Callable[[str], int | None]:
    """The price in force at the run's start, read only when a type needs it."""
    start = run.start

    @functools.cache
    def table() -> api.PriceTable:
        return api.load_price_table(s)

    def price_of(gpu_type: str) -> int | None:
        return None if start is None else table().price_at(gpu_type, run.partition or None, start)

    return price_of


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
    hold, unreserved_hold, stored = _read_hold_for(s, run, policy.start_tolerance_seconds)
    plan = plan_run(run, hold, policy, _price_lookup(s, run), now=now, unreserved_hold=unreserved_hold)
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
    jobruns.adopt_submit_times(s, _adopting(run, stored))
    jobruns.upsert_job_runs(s, [row])
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
    with cycle_collection_paused():
        now = now or utcnow()
        return _reconcile_all(session_factory, runs, policy, suspect_job_ids, force, now, batch_runs)


def _reconcile_all(
    session_factory: SessionFactory,
    runs: Iterable[SacctRun],
    policy: Policy,
    suspect_job_ids: Collection[int],
    force: bool,
    now: datetime,
    batch_runs: int,
) -> Summary:
    summary = Summary()
    eligible: list[SacctRun] = []
    seen = 0
    for run in runs:
        seen += 1
        if run.end is None or run.state not in TERMINAL_STATES or not run.partition:
            summary.add(_outcome(run, "skipped", detail=not_final_reason(run) or ""))
        elif run.job_id in suspect_job_ids:
            summary.add(_outcome(run, "suspect", detail="the job has a malformed sacct row"))
        else:
            eligible.append(run)
    summary.counts["seen"] += seen
    if force:  # every run re-planned, every stored row read
        changed, any_stored = eligible, True
    else:
        changed, any_stored = _changed_runs(session_factory, eligible, batch_runs, summary)
    jobs: dict[tuple[str, int], list[SacctRun]] = {}
    for run in changed:
        key = (run.cluster, run.job_id)
        same_job = jobs.get(key)
        if same_job is None:
            jobs[key] = [run]
        else:
            same_job.append(run)
    with session_factory() as s:
        concurrent = s.get_bind().dialect.name == "postgresql"  # SQLite has one writer at a time
    batches: list[dict[tuple[str, int], list[SacctRun]]] = []
    size = batch_runs
    for key in sorted(jobs):  # in job order: each batch reads few id ranges
        if size >= batch_runs:
            batches.append({})
            size = 0
        batches[-1][key] = jobs[key]
        size += len(jobs[key])
    move = functools.partial(_move_money, session_factory, policy=policy, now=now)
    with _Background(concurrent, move) as background:
        for batch in batches:
            _reconcile_batch(session_factory, batch, any_stored, policy, now, summary, background)
        for outcome in background.outcomes():
            summary.add(outcome)
    return summary


_Task = Callable[[], list[RunOutcome]]
# {account: its runs} -> their outcomes: one transaction
_MoveMoney = Callable[[Mapping[str, Sequence["_MoneyRun"]]], list[RunOutcome]]


class _Background:
    """The writes of planned batches: bulk job_runs rows and money-moving runs.

    On PostgreSQL a batch's bulk job_runs write runs in a writer thread while the next
    batch is read and planned, and the money-moving transactions (one per paying
    account, each locking that account alone, so none waits on another) in a few more:
    most of their time is round trips, which then overlap. (Reads stay in the planning
    thread: a reader thread only fought it for the interpreter lock.) On SQLite (one
    writer) each runs at once, in order. `outcomes()` starts the money still queued,
    waits for everything and yields the outcomes in submission order; an error in any
    is raised there.
    """

    def __init__(self, concurrent: bool, move: _MoveMoney) -> None:
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="bridge-write") if concurrent else None
        self.money = (
            ThreadPoolExecutor(MONEY_WORKERS, thread_name_prefix="bridge-money") if concurrent else None
        )
        self.pending: list[Future[list[RunOutcome]]] = []
        self.queued: list[_MoneyRun] = []
        self.move = move

    def write(self, task: _Task) -> None:
        self._submit(self.writer, task)

    def move_money(self, money: Sequence[_MoneyRun]) -> None:
        """Queue runs that move money; once MONEY_RUNS_PER_FLUSH are queued (and at the end),
        start one transaction per paying account: the more runs per account, the fewer
        locks, statements and commits."""
        self.queued.extend(money)
        if len(self.queued) >= MONEY_RUNS_PER_FLUSH:
            self._flush_money()

    def _flush_money(self) -> None:
        by_account: dict[str, list[_MoneyRun]] = {}
        for item in self.queued:
            by_account.setdefault(item.run.account, []).append(item)
        self.queued = []
        if by_account:
            self._submit(self.money, functools.partial(self.move, by_account))

    def _submit(self, pool: ThreadPoolExecutor | None, task: _Task) -> None:
        if pool is not None:
            self.pending.append(pool.submit(task))
            return
        done: Future[list[RunOutcome]] = Future()
        done.set_result(task())
        self.pending.append(done)

    def outcomes(self) -> Iterator[RunOutcome]:
        self._flush_money()
        for future in self.pending:
            yield from future.result()

    def __enter__(self) -> _Background:
        return self

    def __exit__(self, *_: object) -> None:
        for pool in (self.writer, self.money):
            if pool is not None:
                pool.shutdown(wait=True)


def _reconcile_batch(
    session_factory: SessionFactory,
    jobs: Mapping[tuple[str, int], list[SacctRun]],
    stored: bool,
    policy: Policy,
    now: datetime,
    summary: Summary,
    background: _Background,
) -> None:
    """Plan a batch of changed runs; hand its bulk write and its money-moving runs to
    `background`. `stored`: the jobs may have stored rows (False on a first read of a
    window, which then reads none)."""
    with_rows: Collection[tuple[str, int]] = jobs.keys() if stored else ()
    with session_factory() as s, s.begin():
        job_rows = _StoredRuns(jobruns.load_job_runs(s, with_rows) if with_rows else {})
        holds_by_job = jobruns.load_hold_views(s, jobs.keys())
        prices = api.load_price_table(s)
    inserts: list[JobRunRow] = []
    updates: list[JobRunRow] = []
    adopted: list[AttemptKey] = []
    per_run: list[SacctRun] = []
    money: list[_MoneyRun] = []
    counted: Counter[str] = Counter()
    for key, job_runs in jobs.items():
        holds = holds_by_job.get(key, [])
        legacy = bool(_legacy(holds))
        for run in job_runs:
            hold = _own_hold(run, holds)
            if hold is None and legacy:  # what _pick_hold does first, without its closures
                try:
                    claims = functools.partial(job_rows.claims, run)
                    hold = _pick_hold(run, holds, claims, _per_run, policy.start_tolerance_seconds)
                except _PerRun:
                    per_run.append(run)  # a hold without a submit time, maybe matched by start: per run
                    continue
            own_row = job_rows.of(run) if job_rows.rows else None  # a first read has none
            start = run.start

            def price_of(gpu_type: str, run: SacctRun = run, start: datetime | None = start) -> int | None:
                return None if start is None else prices.price_at(gpu_type, run.partition or None, start)

            try:
                unreserved_hold = own_row is not None and _made_unreserved(own_row, hold)
                plan = plan_run(run, hold, policy, price_of, now=now, unreserved_hold=unreserved_hold)
            except LedgerError:
                per_run.append(run)  # e.g. a GPU type without a price: fails, recorded, per run
                continue
            if plan.action == "wait":
                summary.add(_outcome(run, "skipped", detail="waiting for the epilog"))
                continue
            if plan.moves_money:
                money.append(_MoneyRun(run, plan, own_row))
                continue
            hold_id = hold.id if hold is not None else None
            charged = hold.charged_ucredits if hold is not None else 0
            row = _job_run_row(run, flags=plan.flags, hold_id=hold_id, charged_ucredits=charged, now=now)
            if own_row is None:
                inserts.append(row)
            else:
                updates.append(row)
                adopted.extend(_adopting(run, own_row))
            counted[_counter(plan)] += 1  # matched / not_charged: counted, not listed
    summary.counts.update(counted)
    if inserts or updates:
        background.write(functools.partial(_write_rows, session_factory, inserts, updates, adopted))
    background.move_money(money)
    for run in per_run:
        summary.add(_reconcile_one(session_factory, run, policy, now))


def _write_rows(
    session_factory: SessionFactory,
    inserts: list[JobRunRow],
    updates: list[JobRunRow],
    adopted: list[AttemptKey],
) -> list[RunOutcome]:
    """The job_runs rows of runs that moved no money (already counted), in one transaction."""
    try:
        with session_factory() as s, s.begin():
            jobruns.adopt_submit_times(s, adopted)
            jobruns.insert_job_runs(s, inserts)
            jobruns.upsert_job_runs(s, updates)
    except IntegrityError:  # another writer stored one of these runs since we read: upsert all
        with session_factory() as s, s.begin():
            jobruns.adopt_submit_times(s, adopted)
            jobruns.upsert_job_runs(s, inserts + updates)
    return []


class _MoneyRun(NamedTuple):
    """A run whose plan moves money, with the stored row it was planned against."""

    run: SacctRun
    plan: Plan
    stored: StoredRun | None


def _move_money(
    session_factory: SessionFactory,
    by_account: Mapping[str, Sequence[_MoneyRun]],
    *,
    policy: Policy,
    now: datetime,
) -> list[RunOutcome]:
    """Queued money-moving runs of many accounts in one transaction.

    The accounts are locked first, in one statement in id order (as the daemon's group
    commit locks its batches: neither waits on the other in opposite orders); then every
    account's adjustments are one `adjust_holds_many` call and its unreserved runs one
    `record_unreserved_runs` call, and every job_runs row one statement. When the ledger
    refuses any run, the transaction rolls back and the accounts are redone one
    transaction each (and a refused account's runs one each), so a refusal is recorded
    against its own run and costs no other run.
    """
    try:
        with session_factory() as s, s.begin():
            api.lock_accounts(s, by_account.keys())
            outcomes = _execute_for_accounts(s, by_account)
            _write_money_rows(s, by_account, outcomes, now)
        return [outcome for account in by_account for outcome in outcomes[account]]
    except LedgerError:
        if len(by_account) == 1:
            items = next(iter(by_account.values()))
            return [_reconcile_one(session_factory, item.run, policy, now) for item in items]
        return [
            outcome
            for account, items in by_account.items()
            for outcome in _move_money(session_factory, {account: items}, policy=policy, now=now)
        ]


def _write_money_rows(
    s: Session,
    by_account: Mapping[str, Sequence[_MoneyRun]],
    outcomes: Mapping[str, list[RunOutcome]],
    now: datetime,
) -> None:
    rows = [
        _job_run_row(
            item.run,
            flags=item.plan.flags,
            hold_id=outcome.hold_id,
            charged_ucredits=outcome.charged_ucredits if outcome.hold_id is not None else 0,
            now=now,
        )
        for account, items in by_account.items()
        for item, outcome in zip(items, outcomes[account], strict=True)
    ]
    adopted = [
        key for items in by_account.values() for item in items for key in _adopting(item.run, item.stored)
    ]
    jobruns.adopt_submit_times(s, adopted)
    jobruns.upsert_job_runs(s, rows)


def _execute_for_accounts(
    s: Session, by_account: Mapping[str, Sequence[_MoneyRun]]
) -> dict[str, list[RunOutcome]]:
    """The plans of many accounts' runs (accounts locked by the caller); each account's
    outcomes in its `items` order.

    Per account, as one run after another would leave it: its adjustments first (one
    `adjust_holds_many` call for every account), then its other runs in order. An
    account's unreserved runs share one `record_unreserved_runs` call with the other
    accounts' when they are all it has besides adjustments (a lost epilog's settle or
    release between them keeps the one-run-at-a-time path, in order).
    """
    outcomes: dict[str, dict[int, RunOutcome]] = {account: {} for account in by_account}
    wanted: dict[str, list[api.Adjustment]] = {}
    adjusts: list[tuple[str, int, _MoneyRun]] = []
    unreserved: list[tuple[str, int, _MoneyRun]] = []
    for account, items in by_account.items():
        others = [(i, item) for i, item in enumerate(items) if item.plan.action != "adjust"]
        batchable = all(item.plan.action == "unreserved" for _, item in others)
        for i, item in enumerate(items):
            run, plan = item.run, item.plan
            if plan.action == "adjust":
                assert plan.hold is not None and run.end is not None  # adjust plans name a resolved hold
                wanted.setdefault(account, []).append(
                    api.Adjustment(plan.hold.id, plan.expected_ucredits, run.end, _reason(run, plan))
                )
                adjusts.append((account, i, item))
            elif batchable:
                unreserved.append((account, i, item))
    if wanted:
        after = api.adjust_holds_many(s, wanted)
        position = dict.fromkeys(wanted, 0)
        for account, i, (run, plan, _) in adjusts:
            hold = after[account][position[account]]
            position[account] += 1
            assert plan.hold is not None
            outcomes[account][i] = _outcome(
                run,
                _counter(plan),
                flags=plan.flags,
                hold_id=hold.id,
                change_ucredits=hold.charged_ucredits - plan.hold.charged_ucredits,
                charged_ucredits=hold.charged_ucredits,
            )
    if unreserved:
        done = api.record_unreserved_runs(s, [_unreserved(item.run) for _, _, item in unreserved])
        for (account, i, item), hold in zip(unreserved, done, strict=True):
            outcomes[account][i] = _outcome(
                item.run,
                "unreserved",
                flags=item.plan.flags,
                hold_id=hold.id,
                change_ucredits=hold.charged_ucredits,
                charged_ucredits=hold.charged_ucredits,
            )
    result: dict[str, list[RunOutcome]] = {}
    for account, items in by_account.items():
        for i, item in enumerate(items):
            if i not in outcomes[account]:
                outcomes[account][i] = _execute(s, item.run, item.plan)
        result[account] = [outcomes[account][i] for i in range(len(items))]
    return result


def _unreserved(run: SacctRun) -> api.UnreservedRun:
    assert run.start is not None  # plan_run charges only runs that started
    return api.UnreservedRun(
        run.account,
        run.user,
        run.cluster,
        run.job_id,
        run.run,
        run.gpus,
        run.start,
        run.elapsed_seconds,
        run.partition or None,
        run.submit,
    )


def _reconcile_one(
    session_factory: SessionFactory, run: SacctRun, policy: Policy, now: datetime
) -> RunOutcome:
    """One run in its own transaction; a ledger refusal is recorded, not raised."""
    try:
        with session_factory() as s, s.begin():
            return reconcile_run(s, run, policy, now=now)
    except LedgerError as error:
        with session_factory() as s, s.begin():
            key = (run.cluster, run.job_id)
            stored = _StoredRuns(jobruns.load_job_runs(s, {key})).of(run)
            # Keep what the row said (e.g. unreserved) next to the error, for the retry.
            before = stored.flags if stored is not None else ""
            flags = [flag for flag in before.split(",") if flag and flag != "error"]
            row = _job_run_row(run, flags=(*flags, "error"), hold_id=None, charged_ucredits=0, now=now)
            jobruns.adopt_submit_times(s, _adopting(run, stored))
            jobruns.upsert_job_runs(s, [row], keep_charge=True)
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
        submit=None if row.submitted_at == UNKNOWN_SUBMIT else row.submitted_at,
        start=row.start_at,
        end=row.end_at,
        elapsed_seconds=row.elapsed_seconds,
        time_limit_seconds=None,
        gpus=dict(_gpu_counts(row.gpus)),
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
        with session_factory() as s, s.begin():
            rows = jobruns.job_runs_page(
                s, last_id, batch_runs, failed_only=not include_all, ended_since=since
            )
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
