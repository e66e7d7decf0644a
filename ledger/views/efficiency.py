"""GPU efficiency: how busy the GPUs a job run was charged for really were.

`gpu_usage` holds what the node agents measured with NVML, per job run, node and GPU
type: metrics, never charges (money moves only through holds and the journal).
Agents add *increments* (`add_gpu_usage`), so an agent that restarts loses at most
its unsent interval, never the totals already stored.

`efficiency_report` sets the GPU-seconds a run was allocated -- Slurm's record in
`job_runs` when the bridge has ingested it, else the hold's charged seconds -- beside
the busy GPU-seconds the agents measured, grouped by job run, user, account or GPU
type. Runs are selected by start time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select, tuple_
from sqlalchemy.orm import Session

from ledger.errors import InvalidInput
from ledger.holds.accrual import seconds_run
from ledger.money import div_round_half_up
from ledger.pricing.prices import check_gres, parse_pairs
from ledger.store.models import HoldStatus
from ledger.store.tables import accounts_t, gpu_usage_t, holds_t, job_runs_t
from ledger.timeutil import utcnow

__all__ = ["EFFICIENCY_COLUMNS", "EFFICIENCY_GROUPS", "UsageDelta", "add_gpu_usage", "efficiency_report"]

EFFICIENCY_GROUPS = ("job", "user", "account", "gres")
EFFICIENCY_COLUMNS = (
    "jobs",
    "allocated_gpu_seconds",
    "measured_gpu_seconds",
    "busy_gpu_seconds",
    "efficiency",
)
# Rows one agent writes per call; a node has a few GPUs, so this only stops a runaway.
MAX_USAGE_ROWS_PER_CALL = 10_000
# Job runs per `IN` query: keeps bind parameters well below driver limits.
_KEYS_PER_QUERY = 500
RunKey = tuple[str, int, int]


@dataclass(frozen=True)
class UsageDelta:
    """What one node measured for one job run and GPU type since it last reported."""

    cluster: str
    job_id: int
    run: int
    node: str
    gres: str
    allocated_gpu_seconds: int
    busy_gpu_seconds: int
    energy_joules: int
    peak_memory_bytes: int  # the peak so far, not an increment: stored as the max


def _check(delta: UsageDelta) -> None:
    check_gres(delta.gres)
    numbers = {
        "job_id": delta.job_id,
        "run": delta.run,
        "allocated_gpu_seconds": delta.allocated_gpu_seconds,
        "busy_gpu_seconds": delta.busy_gpu_seconds,
        "energy_joules": delta.energy_joules,
        "peak_memory_bytes": delta.peak_memory_bytes,
    }
    for name, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(f"{name} {value!r} must be a whole number >= 0", code="invalid_usage")
    if not delta.cluster or not delta.node:
        raise InvalidInput("cluster and node must not be empty", code="invalid_usage")


def add_gpu_usage(s: Session, deltas: Sequence[UsageDelta], at: datetime | None = None) -> int:
    """Add a node agent's increments to `gpu_usage` (one upsert per row); returns the row count.

    Locks no account: these rows are metrics that no balance depends on.
    """
    if len(deltas) > MAX_USAGE_ROWS_PER_CALL:
        raise InvalidInput(
            f"{len(deltas)} usage rows in one call; at most {MAX_USAGE_ROWS_PER_CALL}", code="too_many"
        )
    if not deltas:
        return 0
    for delta in deltas:
        _check(delta)
    dialect = s.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert

        statement: Any = postgresql_insert(gpu_usage_t)
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        statement = sqlite_insert(gpu_usage_t)
    else:  # pragma: no cover - the ledger supports these two stores
        raise RuntimeError(f"no upsert for {dialect}")
    new = statement.excluded
    # PostgreSQL's GREATEST; SQLite's two-argument max() is the same scalar function.
    greatest = func.greatest if dialect == "postgresql" else func.max
    statement = statement.on_conflict_do_update(
        index_elements=["cluster", "job_id", "run", "node", "gres"],
        set_={
            "allocated_gpu_seconds": gpu_usage_t.c.allocated_gpu_seconds + new.allocated_gpu_seconds,
            "busy_gpu_seconds": gpu_usage_t.c.busy_gpu_seconds + new.busy_gpu_seconds,
            "energy_joules": gpu_usage_t.c.energy_joules + new.energy_joules,
            "peak_memory_bytes": greatest(gpu_usage_t.c.peak_memory_bytes, new.peak_memory_bytes),
            "updated_at": new.updated_at,
        },
    )
    updated_at = at or utcnow()
    s.execute(
        statement,
        [
            {
                "cluster": d.cluster,
                "job_id": d.job_id,
                "run": d.run,
                "node": d.node,
                "gres": d.gres,
                "allocated_gpu_seconds": d.allocated_gpu_seconds,
                "busy_gpu_seconds": d.busy_gpu_seconds,
                "energy_joules": d.energy_joules,
                "peak_memory_bytes": d.peak_memory_bytes,
                "updated_at": updated_at,
            }
            for d in deltas
        ],
    )
    return len(deltas)


@dataclass
class _Run:
    account: str
    user: str
    gpus: dict[str, int]
    seconds: int


@dataclass
class _Group:
    runs: set[RunKey] = field(default_factory=set)
    allocated: int = 0
    measured: int = 0
    busy: int = 0


def _runs(
    s: Session, account: str | None, user: str | None, start: datetime | None, end: datetime | None
) -> dict[RunKey, _Run]:
    """Every job run in range: from holds, overridden by Slurm's record where ingested.
    A running job counts the seconds its cost so far is read to (ledger.holds.accrual): the
    meter no longer posts a charge per tick, so its charged seconds lag."""
    now = utcnow()
    runs: dict[RunKey, _Run] = {}
    holds = (
        select(
            holds_t.c.cluster,
            holds_t.c.job_id,
            holds_t.c.run,
            holds_t.c.user,
            holds_t.c.gpus,
            holds_t.c.charged_seconds,
            holds_t.c.state,
            holds_t.c.started_at,
            holds_t.c.limit_seconds,
            holds_t.c.accrues_to_seconds,
            accounts_t.c.name.label("account"),
        )
        .join(accounts_t, accounts_t.c.id == holds_t.c.account_id)
        .where(
            or_(
                holds_t.c.charged_seconds > 0,
                and_(holds_t.c.state == HoldStatus.ACTIVE, holds_t.c.accrues_to_seconds.is_not(None)),
            )
        )
    )
    slurm = select(job_runs_t).where(job_runs_t.c.elapsed_seconds > 0)
    if account is not None:
        holds = holds.where(accounts_t.c.name == account)
        slurm = slurm.where(job_runs_t.c.account == account)
    if user is not None:
        holds = holds.where(holds_t.c.user == user)
        slurm = slurm.where(job_runs_t.c.user == user)
    if start is not None:
        holds = holds.where(holds_t.c.started_at >= start)
        slurm = slurm.where(job_runs_t.c.start_at >= start)
    if end is not None:
        holds = holds.where(holds_t.c.started_at < end)
        slurm = slurm.where(job_runs_t.c.start_at < end)
    for row in s.execute(holds):
        seconds = row.charged_seconds
        if row.state == HoldStatus.ACTIVE and row.accrues_to_seconds is not None:
            run_so_far = seconds_run(row.started_at, row.limit_seconds, now)
            seconds = max(seconds, min(run_so_far, row.accrues_to_seconds))
        if seconds > 0:
            runs[(row.cluster, row.job_id, row.run)] = _Run(
                row.account, row.user, parse_pairs(row.gpus), seconds
            )
    for row in s.execute(slurm):
        runs[(row.cluster, row.job_id, row.run)] = _Run(
            row.account, row.user, parse_pairs(row.gpus), row.elapsed_seconds
        )
    return runs


def _usage_rows(s: Session, keys: list[RunKey] | None) -> list[Any]:
    columns = (
        gpu_usage_t.c.cluster,
        gpu_usage_t.c.job_id,
        gpu_usage_t.c.run,
        gpu_usage_t.c.gres,
        gpu_usage_t.c.allocated_gpu_seconds,
        gpu_usage_t.c.busy_gpu_seconds,
    )
    if keys is None:
        return list(s.execute(select(*columns)))
    rows: list[Any] = []
    run_key = tuple_(gpu_usage_t.c.cluster, gpu_usage_t.c.job_id, gpu_usage_t.c.run)
    for i in range(0, len(keys), _KEYS_PER_QUERY):
        rows.extend(s.execute(select(*columns).where(run_key.in_(keys[i : i + _KEYS_PER_QUERY]))))
    return rows


def _ratio(busy: int, allocated: int) -> str | None:
    """busy / allocated as a decimal string with three places (integer arithmetic)."""
    if allocated <= 0:
        return None
    thousandths = div_round_half_up(busy * 1000, allocated)
    return f"{thousandths // 1000}.{thousandths % 1000:03d}"


def efficiency_report(
    s: Session,
    *,
    by: str = "job",
    account: str | None = None,
    user: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> list[dict[str, Any]]:
    """Allocated vs busy GPU-seconds per job run, user, account or GPU type.

    `allocated_gpu_seconds` is what the run was billed for (GPUs × elapsed);
    `measured_gpu_seconds` is how much of it an agent sampled (less when an agent was
    down or a node has none) and `busy_gpu_seconds` how much of that was busy;
    `efficiency` = busy / allocated. A run the ledger never saw (no hold, no sacct
    record) shows under '-' when nothing filters by account, user or time.
    """
    if by not in EFFICIENCY_GROUPS:
        raise InvalidInput(
            f"cannot group efficiency by {by!r}; choose one of {', '.join(EFFICIENCY_GROUPS)}",
            code="invalid_group",
        )
    runs = _runs(s, account, user, start, end)
    filtered = any(v is not None for v in (account, user, start, end))
    groups: dict[str, _Group] = {}

    def group_key(run_key: RunKey, run: _Run | None, gres: str | None) -> str:
        if by == "job":
            return "/".join(str(part) for part in run_key)
        if by == "gres":
            return gres or "-"
        if run is None:
            return "-"
        return run.user if by == "user" else run.account

    for run_key, run in runs.items():
        if by == "gres":
            for gres, count in run.gpus.items():
                group = groups.setdefault(gres, _Group())
                group.runs.add(run_key)
                group.allocated += count * run.seconds
        else:
            group = groups.setdefault(group_key(run_key, run, None), _Group())
            group.runs.add(run_key)
            group.allocated += sum(run.gpus.values()) * run.seconds
    for row in _usage_rows(s, sorted(runs) if filtered else None):
        run_key = (row.cluster, row.job_id, row.run)
        found = runs.get(run_key)
        if found is None and filtered:
            continue
        group = groups.setdefault(group_key(run_key, found, row.gres), _Group())
        group.runs.add(run_key)
        group.measured += row.allocated_gpu_seconds
        group.busy += row.busy_gpu_seconds
    return [
        {
            by: key,
            "jobs": len(g.runs),
            "allocated_gpu_seconds": g.allocated,
            "measured_gpu_seconds": g.measured,
            "busy_gpu_seconds": g.busy,
            "efficiency": _ratio(g.busy, g.allocated),
        }
        for key, g in sorted(groups.items())
    ]
