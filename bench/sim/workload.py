"""What the simulated fleet does: configurations and a seeded workload (pure, no I/O).

A configuration names the fleet (nodes per GPU type), the accounts and their money
(grants that start and expire, reactive top-ups, limits and caps), a month (or a
week) of job arrivals, and the faults to inject. `make_workload` turns it and a seed
into plain records the engine replays; the same seed gives the same workload.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

T0 = datetime(2026, 12, 1, tzinfo=UTC)
UCREDITS = 1_000_000
# Prices in micro-credits per GPU-hour, and one price change halfway (effective then).
PRICES_UCREDITS_PER_HOUR = {"a100": 2_000_000, "h100": 3_600_000, "l40s": 1_000_000}
PRICE_CHANGE = ("h100", 3_200_000)


@dataclass(frozen=True)
class Config:
    """One simulated fleet and month; every count is per whole simulation."""

    name: str
    nodes: dict[str, int]  # per GPU type
    gpus_per_node: int = 8
    accounts: int = 8
    users_per_account: int = 3
    jobs: int = 300
    days: int = 7
    burst_fraction: float = 0.15  # share of the jobs queued in the first hour
    duration_median_hours: float = 10.0
    duration_sigma: float = 0.8
    max_limit_hours: int = 72
    gpu_mix: tuple[tuple[int, float], ...] = ((1, 0.7), (2, 0.2), (4, 0.08), (8, 0.02))
    # Budget as a share of what an account's jobs would cost: below 1 runs dry.
    budget_range: tuple[float, float] = (0.7, 1.6)
    policy: str = "reject"  # policy.on_ledger_unreachable
    mode: str = "full"  # holds.mode; a lease is lease_seconds, or 4 meter intervals when 0
    lease_seconds: int = 0
    # Under accept, the hooks admit runs during an outage up to these lines (credits).
    outage_line_per_account: str | None = "200"
    outage_line_fleet: str | None = "1000"
    # True: at the end of the arrivals every job still waiting or running is cancelled
    # (the peak configuration: a few days at full concurrency, no drain).
    cancel_at_end: bool = False
    # Service loops, simulated seconds.
    sched_interval_seconds: int = 60
    meter_interval_seconds: int = 900
    bridge_interval_seconds: int = 3600
    sample_interval_seconds: int = 3600
    fairshare_interval_seconds: int = 86_400
    # Fleet-wide faults: (count, minutes each).
    node_failures: int = 2
    node_repair_hours: tuple[float, float] = (2.0, 12.0)
    daemon_outages: tuple[int, int] = (1, 120)
    database_outages: tuple[int, int] = (1, 60)
    partitions: tuple[int, int] = (1, 60)
    meter_kills: tuple[int, int] = (1, 180)
    agent_failures: int = 2
    # Per-job faults and outcomes: fraction of jobs.
    admin_requeue: float = 0.02
    lost_epilog: float = 0.02
    duplicate_epilog: float = 0.02
    epilog_skew: float = 0.03  # the epilog's end differs from sacct's by 1-2 s
    user_cancel: float = 0.03
    timeout: float = 0.04
    held_cancel_days: float = 3.0  # a job pending (blocked) this long is cancelled by its user

    def with_(self, **changes: object) -> Config:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def lease_window_seconds(self) -> int | None:
        if self.mode != "lease":
            return None
        return self.lease_seconds or 4 * self.meter_interval_seconds

    @property
    def gpus(self) -> int:
        return sum(self.nodes.values()) * self.gpus_per_node


SMALL = Config(
    name="small",
    nodes={"a100": 8, "h100": 6, "l40s": 6},
    jobs=400,
    duration_median_hours=24.0,
    meter_interval_seconds=3600,
)
# The size: >= 2,000 nodes x 8 GPUs, >= 20,000 concurrent jobs, >= 10^5 jobs a month.
FULL = Config(
    name="full",
    nodes={"a100": 1600, "h100": 1200, "l40s": 1200},
    accounts=300,
    users_per_account=10,
    jobs=120_000,
    days=30,
    burst_fraction=0.18,
    duration_median_hours=80.0,
    duration_sigma=1.0,
    max_limit_hours=336,
    # Holds take the whole time limit (1.1-2x the run time): budgets must cover that.
    budget_range=(1.2, 2.2),
    gpu_mix=((1, 0.85), (2, 0.10), (4, 0.04), (8, 0.01)),
    sched_interval_seconds=300,
    meter_interval_seconds=6 * 3600,
    bridge_interval_seconds=6 * 3600,
    sample_interval_seconds=6 * 3600,
    node_failures=200,
    daemon_outages=(3, 30),
    database_outages=(2, 20),
    partitions=(2, 45),
    meter_kills=(3, 240),
    agent_failures=50,
    admin_requeue=0.005,
    lost_epilog=0.002,
    duplicate_epilog=0.005,
    epilog_skew=0.005,
    user_cancel=0.03,
    timeout=0.04,
)
# The full fleet at full concurrency (>= 20,000 running jobs on 4,000 nodes) for three
# simulated days: what fits in ~20 minutes on a 2-core machine (docs/simulator.md).
PEAK = FULL.with_(
    name="peak",
    jobs=26_000,
    days=3,
    burst_fraction=0.85,
    meter_interval_seconds=12 * 3600,
    node_failures=40,
    agent_failures=10,
    daemon_outages=(1, 30),
    database_outages=(1, 20),
    partitions=(1, 45),
    meter_kills=(1, 240),
    admin_requeue=0.01,
    lost_epilog=0.005,
    duplicate_epilog=0.01,
    epilog_skew=0.01,
    outage_line_per_account="2000",
    outage_line_fleet="50000",
    cancel_at_end=True,
)
# A tenth of the full size, for a quick look at the scaling.
MEDIUM = FULL.with_(
    name="medium",
    nodes={"a100": 160, "h100": 120, "l40s": 120},
    accounts=60,
    jobs=12_000,
    node_failures=20,
    agent_failures=5,
)
CONFIGS = {c.name: c for c in (SMALL, MEDIUM, PEAK, FULL)}


@dataclass(frozen=True)
class JobSpec:
    job_id: int
    account: str
    user: str
    gpu_type: str
    gpus: int
    arrival: datetime
    duration_seconds: int  # what it runs if nothing stops it
    limit_seconds: int
    admin_requeue_after: int | None = None  # seconds into its first run
    cancel_after: int | None = None
    lost_epilog: bool = False
    duplicate_epilog: bool = False
    skew_seconds: int = 0  # the epilog's elapsed minus Slurm's


@dataclass(frozen=True)
class GrantSpec:
    account: str
    amount_ucredits: int
    effective_at: datetime
    expires_at: datetime | None
    kind: str  # "topup" | "grant"
    priority: int = 10


@dataclass(frozen=True)
class AccountSpec:
    name: str
    users: tuple[str, ...]
    weight: float
    budget_ucredits: int
    max_gpus: int | None = None
    daily_cap_ucredits: int | None = None
    user_max_gpus: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Fault:
    kind: str  # node_failure, daemon, database, partition, meter, agent
    at: datetime
    seconds: int
    target: int = 0  # node index for node failures


@dataclass
class Workload:
    config: Config
    accounts: list[AccountSpec]
    grants: list[GrantSpec]
    jobs: list[JobSpec]
    faults: list[Fault]
    end_of_arrivals: datetime


def _ucredits(credits: float) -> int:
    return round(credits * UCREDITS)


def make_workload(config: Config, seed: int) -> Workload:
    rng = random.Random(seed)
    horizon = timedelta(days=config.days)
    names = [f"acct{i:03d}" for i in range(config.accounts)]
    weights = [math.exp(rng.gauss(0.0, 0.8)) for _ in names]
    total_weight = sum(weights)
    types = list(config.nodes)
    type_weights = [config.nodes[t] for t in types]
    sizes = [n for n, _ in config.gpu_mix]
    size_weights = [w for _, w in config.gpu_mix]
    burst = int(config.jobs * config.burst_fraction)
    jobs: list[JobSpec] = []
    cost: dict[str, float] = dict.fromkeys(names, 0.0)
    cap = config.max_limit_hours * 3600
    for index in range(config.jobs):
        account_index = rng.choices(range(len(names)), weights)[0]
        account = names[account_index]
        user = f"{account}u{rng.randrange(config.users_per_account)}"
        gpu_type = rng.choices(types, type_weights)[0]
        gpus = rng.choices(sizes, size_weights)[0]
        if index < burst:
            arrival = T0 + timedelta(seconds=rng.randrange(3600))
        else:
            arrival = T0 + timedelta(seconds=rng.randrange(int(horizon.total_seconds())))
        hours = math.exp(math.log(config.duration_median_hours) + rng.gauss(0.0, config.duration_sigma))
        duration = max(60, min(int(hours * 3600), cap))
        limit = min(cap, int(duration * rng.uniform(1.1, 2.0)) // 60 * 60 + 60)
        roll = rng.random()
        if roll < config.timeout:
            limit = max(60, int(duration * rng.uniform(0.5, 0.95)) // 60 * 60)
        cancel_after = None
        if rng.random() < config.user_cancel:
            cancel_after = rng.randrange(30, max(31, duration))
        requeue_after = None
        if rng.random() < config.admin_requeue:
            requeue_after = rng.randrange(60, max(61, min(duration, limit)))
        skew = 0
        if rng.random() < config.epilog_skew:
            skew = rng.choice((-2, -1, 1, 2))
        jobs.append(
            JobSpec(
                job_id=1000 + index,
                account=account,
                user=user,
                gpu_type=gpu_type,
                gpus=gpus,
                arrival=arrival,
                duration_seconds=duration,
                limit_seconds=limit,
                admin_requeue_after=requeue_after,
                cancel_after=cancel_after,
                lost_epilog=rng.random() < config.lost_epilog,
                duplicate_epilog=rng.random() < config.duplicate_epilog,
                skew_seconds=skew,
            )
        )
        price = PRICES_UCREDITS_PER_HOUR[gpu_type]
        cost[account] += gpus * price * min(duration, limit) / 3600
    jobs.sort(key=lambda j: (j.arrival, j.job_id))
    jobs = [replace(j, job_id=1000 + i) for i, j in enumerate(jobs)]

    accounts: list[AccountSpec] = []
    grants: list[GrantSpec] = []
    weeks = max(1, config.days // 7)
    for index, (name, weight) in enumerate(zip(names, weights, strict=True)):
        users = tuple(f"{name}u{k}" for k in range(config.users_per_account))
        budget = int(cost[name] * rng.uniform(*config.budget_range)) + _ucredits(50)
        fair_gpus = max(8, int(config.gpus * weight / total_weight))
        # The first account is capped at its fair GPUs and the second at a daily spend,
        # so even the small configuration meets both refusals; then one in five, one in ten.
        roll = 0.0 if index == 0 else 0.25 if index == 1 else rng.random()
        max_gpus = (max(4, fair_gpus // 2) if index == 0 else 2 * fair_gpus) if roll < 0.2 else None
        daily_cap = budget // max(1, config.days) * 2 if 0.2 <= roll < 0.3 else None
        user_caps = {users[0]: max(8, fair_gpus // 2)} if rng.random() < 0.2 else {}
        accounts.append(AccountSpec(name, users, weight, budget, max_gpus, daily_cap, user_caps))
        grants.append(GrantSpec(name, budget * 40 // 100, T0 - timedelta(days=1), None, "topup"))
        allocation = budget * 60 // 100 // weeks
        for week in range(weeks):
            start = T0 + timedelta(days=7 * week)
            grants.append(GrantSpec(name, allocation, start, start + timedelta(days=14), "grant", 5))
        promo_start = T0 + timedelta(days=config.days / 3)
        grants.append(GrantSpec(name, budget // 10, promo_start, promo_start + timedelta(days=7), "grant", 1))
    grants.sort(key=lambda g: g.effective_at)

    faults: list[Fault] = []
    seconds = int(horizon.total_seconds())
    node_count = sum(config.nodes.values())
    for _ in range(config.node_failures):
        repair = int(rng.uniform(*config.node_repair_hours) * 3600)
        at = T0 + timedelta(seconds=rng.randrange(3600, seconds))
        faults.append(Fault("node_failure", at, repair, rng.randrange(node_count)))
    for kind, (count, minutes) in (
        ("daemon", config.daemon_outages),
        ("database", config.database_outages),
        ("partition", config.partitions),
        ("meter", config.meter_kills),
    ):
        for _ in range(count):
            at = T0 + timedelta(seconds=rng.randrange(3600, seconds - minutes * 60))
            faults.append(Fault(kind, at, minutes * 60))
    for _ in range(config.agent_failures):
        at = T0 + timedelta(seconds=rng.randrange(3600, seconds))
        faults.append(Fault("agent", at, int(rng.uniform(0.5, 4.0) * 3600), rng.randrange(node_count)))
    faults.sort(key=lambda f: f.at)
    return Workload(config, accounts, grants, jobs, faults, T0 + horizon)
