"""The cloud bill of one month: what the site's cloud instances cost at the configured
price, beside the credits charged to the jobs that ran on them, per partition and
account, with the instance time no job used (boot and idle) as the site's overhead.

One function computes it (`cloud_report`); `gpucredit cloud report` and the portal's
/admin/cloud only render it. It lives in the ledger because both may reach the ledger
and neither may reach the other (tests/architecture/test_boundaries.py: the portal
imports the ledger and slurmtext only). The ledger knows no journal file and no
`[cloud]` config: the caller hands it the instances as `InstanceSpan`s, each with its
type's price, and the names of the cloud nodes.

Two figures, two meanings, never added: the *provider cost* is the instance's price an
hour (`cloud.prices_ucredits_per_hour`, micro-credits) over its seconds in the month,
`charge_for` rounded once per instance and month; *charged* is what the ledger charged
the jobs (posted charges effective in the month, and running jobs' cost so far, as
`usage_report` counts them).

Which row an instance second goes to:

| the instance's node in that second                 | row (partition, account)           |
|----------------------------------------------------|------------------------------------|
| runs job runs (job_runs: start..end, its nodes)    | each run's (partition, account);   |
|                                                    | several at once share the second   |
|                                                    | by GPU count (largest remainders)  |
| runs none (booting, idle, waiting for suspend)     | (partition of the instance's first |
|                                                    | run in the month, or "-", OVERHEAD)|

An instance is cut at the month's bounds and, while it runs, at `now`. A job counts as a
cloud job when one of its nodes is a cloud node or its partition is a cloud partition
(`[partitions.NAME] site = "cloud"`); a running job the bridge has not ingested yet has
no nodes on record, so its time reads as overhead until `bridge sacct` has run: a month's
report is final once its jobs are ingested.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from ledger.errors import InvalidInput, LedgerError
from ledger.money import charge_for, format_credits
from ledger.pricing.prices import parse_pairs
from ledger.store.tables import job_runs_t
from ledger.timeutil import as_utc
from ledger.views.reports import PARTITION_ACCOUNT, charge_groups, split_by_weights

__all__ = [
    "COLUMNS",
    "COST_UNIT",
    "OVERHEAD",
    "CloudReport",
    "CloudReportRow",
    "InstanceSpan",
    "cloud_report",
    "month_bounds",
]

OVERHEAD = "(overhead)"  # the account column of the site's boot and idle time
NO_PARTITION = "-"
COST_UNIT = "credits at the configured instance prices (cloud.prices_ucredits_per_hour)"
COLUMNS = (
    "partition",
    "account",
    "instance_seconds",
    "instance_hours",
    "provider_cost",
    "gpu_seconds",
    "charged",
    "overhead_seconds",
    "overhead_share",
)
_MONTH = re.compile(r"^([0-9]{4})-([0-9]{2})$")
MAX_RUNS = 1_000_000  # job runs on cloud nodes in one month's report: a limit on the read
NODES_PER_QUERY = 100  # cloud nodes matched per query (SQLite bounds an expression's depth)


def month_bounds(text: str) -> tuple[datetime, datetime]:
    """[first instant, first instant of the next month) of `YYYY-MM`, UTC; InvalidInput
    (invalid_month) for anything else."""
    found = _MONTH.match(text.strip())
    year, month = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    if not found or not 1 <= month <= 12 or year < 1970:
        raise InvalidInput(
            f"month must be YYYY-MM (e.g. 2026-11), got {text!r}",
            code="invalid_month",
            details={"field": "month", "value": text},
        )
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return start, end


@dataclass(frozen=True)
class InstanceSpan:
    """One instance as the bill sees it: launched, ended (None: still running), its
    type's price an hour (None: no price configured for its type)."""

    id: str
    node: str | None
    instance_type: str
    launched_at: datetime
    ended_at: datetime | None
    price_ucredits_per_hour: int | None

    def bounds(
        self, now: datetime, start: datetime | None = None, end: datetime | None = None
    ) -> tuple[datetime, datetime]:
        """When it ran, cut at `start` and `end` when given; a running one runs to `now`."""
        begin = as_utc(self.launched_at)
        stop = as_utc(self.ended_at) if self.ended_at is not None else as_utc(now)
        if start is not None:
            begin = max(begin, start)
        if end is not None:
            stop = min(stop, end)
        return begin, max(begin, stop)

    def seconds(self, now: datetime, start: datetime | None = None, end: datetime | None = None) -> int:
        """Whole seconds it ran (the provider bills boot and idle too), cut as `bounds`."""
        begin, stop = self.bounds(now, start, end)
        return int((stop - begin).total_seconds())

    def cost_ucredits(
        self, now: datetime, start: datetime | None = None, end: datetime | None = None
    ) -> int | None:
        """charge_for(price, seconds), rounded once; None without a price."""
        if self.price_ucredits_per_hour is None:
            return None
        return charge_for(self.price_ucredits_per_hour, self.seconds(now, start, end))


@dataclass(frozen=True)
class CloudReportRow:
    partition: str
    account: str  # OVERHEAD: the site's boot and idle time in this partition
    instance_seconds: int = 0
    provider_cost_ucredits: int = 0
    gpu_seconds: int = 0
    charged_ucredits: int = 0
    overhead_seconds: int = 0
    share_of_seconds: int = 0  # the instance seconds overhead_share is a share of

    def cells(self) -> dict[str, Any]:
        """The row as the CLI and the portal show it (COLUMNS), money formatted."""
        return {
            "partition": self.partition,
            "account": self.account,
            "instance_seconds": self.instance_seconds,
            "instance_hours": _hours(self.instance_seconds),
            "provider_cost": format_credits(self.provider_cost_ucredits),
            "gpu_seconds": self.gpu_seconds,
            "charged": format_credits(self.charged_ucredits),
            "overhead_seconds": self.overhead_seconds,
            "overhead_share": _percent(self.overhead_seconds, self.share_of_seconds),
        }


@dataclass(frozen=True)
class CloudReport:
    month: str
    start: datetime
    end: datetime
    at: datetime  # running instances and jobs count to here
    rows: tuple[CloudReportRow, ...]
    total: CloudReportRow
    unpriced_instances: tuple[str, ...] = field(default=())
    cost_unit: str = COST_UNIT

    def table(self) -> list[dict[str, Any]]:
        """Every row, then the total (partition and account "*")."""
        return [row.cells() for row in (*self.rows, self.total)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "month": self.month,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "at": self.at.isoformat(),
            "cost_unit": self.cost_unit,
            "rows": [row.cells() for row in self.rows],
            "total": self.total.cells(),
            "unpriced_instances": list(self.unpriced_instances),
        }


@dataclass(frozen=True)
class _Run:
    hold_id: int | None
    key: tuple[str, str]  # (partition, account)
    nodes: frozenset[str]
    begin: datetime
    stop: datetime
    weight: int  # GPUs: the share of a node second when runs overlap


def cloud_report(
    s: Session,
    *,
    month: str,
    instances: Sequence[InstanceSpan],
    cloud_nodes: Collection[str],
    cloud_partitions: Collection[str] = (),
    now: datetime,
) -> CloudReport:
    """The month's cloud report (see the module's table); `now` cuts what still runs."""
    start, end = month_bounds(month)
    at = min(as_utc(now), end)
    # An instance's node is a cloud node, configured or not (one since removed from [cloud.nodes]).
    nodes = frozenset(cloud_nodes) | {span.node for span in instances if span.node}
    runs = _cloud_runs(s, start, at, nodes)
    runs_on: dict[str, list[_Run]] = {}
    for run in runs:
        for node in run.nodes:
            runs_on.setdefault(node, []).append(run)
    seconds: dict[tuple[str, str], int] = {}
    costs: dict[tuple[str, str], int] = {}
    unpriced: list[str] = []
    for span in instances:
        shares = _instance_shares(span, runs_on.get(span.node or "", []), start, end, at)
        cost = span.cost_ucredits(at, start, end)
        if cost is None and shares:
            unpriced.append(span.id)
        cost_parts = _split(cost or 0, shares)
        for key, part in shares.items():
            seconds[key] = seconds.get(key, 0) + part
            costs[key] = costs.get(key, 0) + cost_parts[key]
    holds = {run.hold_id for run in runs if run.hold_id is not None}
    partitions = frozenset(cloud_partitions)
    charged = charge_groups(
        s,
        by=PARTITION_ACCOUNT,
        start=start,
        end=end,
        at=at,
        keep=lambda hold_id, partition: hold_id in holds or (partition or "") in partitions,
    )
    rows = _rows(seconds, costs, charged)
    return CloudReport(month, start, end, at, rows, _total(rows), tuple(sorted(unpriced)))


def _cloud_runs(s: Session, start: datetime, at: datetime, nodes: frozenset[str]) -> list[_Run]:
    """Job runs that ran on a cloud node within [start, at): Slurm's record (job_runs).

    The database picks the runs whose node list names a cloud node as text (a few nodes
    at a time: a LIKE each), Python keeps those that hold it as a node. More than
    MAX_RUNS of them is refused (too_many_runs), never a report of the first ones."""
    if not nodes or at <= start:
        return []
    found: dict[int, _Run] = {}
    names = sorted(nodes)
    for first in range(0, len(names), NODES_PER_QUERY):
        chunk = names[first : first + NODES_PER_QUERY]
        query = (
            select(
                job_runs_t.c.id,
                job_runs_t.c.hold_id,
                job_runs_t.c.partition,
                job_runs_t.c.account,
                job_runs_t.c.nodes,
                job_runs_t.c.gpus,
                job_runs_t.c.start_at,
                job_runs_t.c.end_at,
            )
            .where(
                job_runs_t.c.start_at.is_not(None),
                job_runs_t.c.start_at < at,
                or_(job_runs_t.c.end_at.is_(None), job_runs_t.c.end_at > start),
                or_(*(job_runs_t.c.nodes.contains(node, autoescape=True) for node in chunk)),
            )
            .limit(MAX_RUNS + 1)
        )
        for row in s.execute(query):
            run = _run(row, nodes, start, at)
            if run is not None:
                found[row.id] = run
            if len(found) > MAX_RUNS:
                raise LedgerError(
                    f"more than {MAX_RUNS} job runs on cloud nodes in the month: too many to report at once",
                    code="too_many_runs",
                    details={"limit": MAX_RUNS},
                )
    return [found[key] for key in sorted(found)]


def _run(row: Any, nodes: frozenset[str], start: datetime, at: datetime) -> _Run | None:
    on = frozenset(node for node in row.nodes.split(",") if node) & nodes
    begin = max(as_utc(row.start_at), start)
    stop = min(as_utc(row.end_at) if row.end_at is not None else at, at)
    if not on or stop <= begin:
        return None
    gpus = sum(parse_pairs(row.gpus).values()) if row.gpus else 0
    return _Run(row.hold_id, (row.partition or NO_PARTITION, row.account), on, begin, stop, max(1, gpus))


def _instance_shares(
    span: InstanceSpan, runs: Sequence[_Run], start: datetime, end: datetime, at: datetime
) -> dict[tuple[str, str], int]:
    """The instance's seconds in the month by row: its runs', the rest overhead."""
    begin, stop = span.bounds(at, start, end)
    total = int((stop - begin).total_seconds())
    if total <= 0:
        return {}

    def offset(t: datetime) -> int:
        return min(total, max(0, int((t - begin).total_seconds())))

    pieces = [(offset(r.begin), offset(r.stop), r) for r in runs]
    pieces = [(lo, hi, r) for lo, hi, r in pieces if hi > lo]
    cuts = sorted({0, total, *(lo for lo, _, _ in pieces), *(hi for _, hi, _ in pieces)})
    shares: dict[tuple[str, str], int] = {}
    for lo, hi in pairwise(cuts):
        weights: dict[tuple[str, str], int] = {}
        for run_lo, run_hi, run in pieces:
            if run_lo <= lo and hi <= run_hi:
                weights[run.key] = weights.get(run.key, 0) + run.weight
        for key, part in _split(hi - lo, weights).items():
            shares[key] = shares.get(key, 0) + part
    used = sum(shares.values())
    if used < total:
        first = min(pieces, key=lambda p: (p[0], p[2].begin), default=None)
        overhead = (first[2].key[0] if first else NO_PARTITION, OVERHEAD)
        shares[overhead] = shares.get(overhead, 0) + total - used
    return shares


def _split(amount: int, weights: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """`amount` split by `weights`, the parts summing to it exactly (largest remainders)."""
    if not weights:
        return {}
    names = {f"{index:09d}": key for index, key in enumerate(weights)}
    parts = split_by_weights(amount, {name: weights[key] for name, key in names.items()})
    return {names[name]: part for name, part in parts.items()}


def _rows(
    seconds: dict[tuple[str, str], int], costs: dict[tuple[str, str], int], charged: dict[Any, dict[str, Any]]
) -> tuple[CloudReportRow, ...]:
    per_partition: dict[str, int] = {}
    for (partition, _), value in seconds.items():
        per_partition[partition] = per_partition.get(partition, 0) + value
    rows = []
    for key in sorted({*seconds, *charged}, key=lambda k: (k[0], k[1] == OVERHEAD, k[1])):  # overhead last
        partition, account = key
        figures = charged.get(key, {})
        overhead = seconds.get(key, 0) if account == OVERHEAD else 0
        rows.append(
            CloudReportRow(
                partition,
                account,
                instance_seconds=seconds.get(key, 0),
                provider_cost_ucredits=costs.get(key, 0),
                gpu_seconds=int(figures.get("gpu_seconds", 0)),
                charged_ucredits=int(figures.get("charged", 0)),
                overhead_seconds=overhead,
                share_of_seconds=per_partition.get(partition, 0) if overhead else 0,
            )
        )
    return tuple(rows)


def _total(rows: Sequence[CloudReportRow]) -> CloudReportRow:
    instance_seconds = sum(row.instance_seconds for row in rows)
    return CloudReportRow(
        "*",
        "*",
        instance_seconds=instance_seconds,
        provider_cost_ucredits=sum(row.provider_cost_ucredits for row in rows),
        gpu_seconds=sum(row.gpu_seconds for row in rows),
        charged_ucredits=sum(row.charged_ucredits for row in rows),
        overhead_seconds=sum(row.overhead_seconds for row in rows),
        share_of_seconds=instance_seconds,
    )


def _hours(seconds: int) -> str:
    """Seconds as hours with two decimals, rounded half up (3600 s -> "1.00")."""
    hundredths = (seconds * 100 + 1800) // 3600
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def _percent(part: int, whole: int) -> str:
    """`part` of `whole` as a percentage with one decimal, rounded half up; "-" of nothing."""
    if whole <= 0:
        return "-"
    tenths = (part * 1000 * 2 + whole) // (2 * whole)
    return f"{tenths // 10}.{tenths % 10}%"
