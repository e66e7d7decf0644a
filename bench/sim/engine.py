"""The discrete-event run: simulated time, the real ledger, daemon, meter and bridge code.

Events in a heap, in whole simulated seconds from `T0`: job arrivals and ends, a
scheduler pass, meter ticks, bridge rounds, balance samples, a daily sweep (grant
expiry, debt, fairshare shares, stale jobs), grants taking effect, and faults.

What runs for real, through public entry points, with the simulated time passed in:

* the hooks' daemon side, `gpucredit.daemon.hook_service.hold` / `.settle` (the
  PrologSlurmctld hold and EpilogSlurmctld settle; `hold` reads the clock through
  `utcnow`, which the run points at the simulated clock while it lasts);
* the meter, `accounting_bridge.meter.meter.Meter.tick`, with a fake squeue (the running
  jobs) and a fake runner (its scancel comes back as a CANCELLED end);
* the bridge, `accounting_bridge.sacct.ingest.ingest_round`, with a fake sacct that returns
  the runs that ended in the window as `SacctRun` records, as the parser builds them;
* the ledger, `ledger.api`: accounts, members, limits, prices, grants and top-ups
  with effective and expiry times, sweeps, balances, fairness inputs, verify;
* the fairshare formula, `accounting_bridge.sync.fairshare.account_shares`, whose shares
  order the scheduler's accounts.

The scheduler is FIFO per account, accounts taken by fewest running GPUs per share,
no backfill: a job runs on one node with enough free GPUs of its type.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from accounting_bridge.meter.meter import Meter
from accounting_bridge.sacct import ingest
from accounting_bridge.sacct.reconcile import Policy, RunOutcome, reconcile_stored
from accounting_bridge.slurm.records import ParseResult, SacctRun, SqueueJob, SqueueResult
from accounting_bridge.sync.fairshare import FairsharePolicy, account_shares
from bench.sim.workload import PRICE_CHANGE, PRICES_UCREDITS_PER_HOUR, T0, Config, JobSpec, Workload
from gpucredit.daemon import hook_service
from ledger import api
from ledger.errors import LedgerError
from ledger.money import format_credits, parse_credits

CLUSTER = "sim"
PARTITION = "gpu"
GRACE_SECONDS = 600
# Test-only defects (tests/bench/test_simulate.py): each must make the books check fail.
# What a reconciliation round counts when it moves money.
MONEY_MOVES = ("charged", "adjusted", "unreserved", "refunded", "released")
DEFECTS = ("no_node_fail_refund", "double_charge_requeue")


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def credits(ucredits: int) -> str:
    return format_credits(ucredits)


@dataclass
class Node:
    index: int
    name: str
    gpu_type: str
    free: int
    up: bool = True
    jobs: set[int] = field(default_factory=set)


@dataclass
class Job:
    spec: JobSpec
    run: int = 0
    submit: int = 0  # this attempt's SubmitTime (Slurm resets it on requeue)
    state: str = "pending"  # pending | held | running | done
    node: Node | None = None
    start: int = 0
    hold_id: int | None = None
    avoid: int | None = None  # the node a requeued run left


@dataclass
class Books:
    """What the simulation observed, for the report (books.py)."""

    runs: list[SacctRun] = field(default_factory=list)
    ops: Counter[str] = field(default_factory=Counter)
    ledger_seconds: float = 0.0
    events: Counter[str] = field(default_factory=Counter)
    min_available: dict[str, int] = field(default_factory=dict)
    reconcile_changes: dict[str, Counter[str]] = field(default_factory=dict)
    reconcile_outcomes: list[tuple[str, RunOutcome]] = field(default_factory=list)
    reconcile_failures: list[str] = field(default_factory=list)
    meter_errors: list[str] = field(default_factory=list)
    share_sums: dict[str, float] = field(default_factory=dict)
    share_samples: int = 0
    peak_running_jobs: int = 0
    peak_running_gpus: int = 0
    duplicate_epilog_mismatches: list[str] = field(default_factory=list)
    # Per account, the ledger's own outage bound (ledger.holds.bounds) summed over the outages;
    # None: unbounded or not available from this ledger.
    outage_bounds: dict[str, int | None] = field(default_factory=dict)
    outage_bound_source: str = ""
    epilog_failures: list[str] = field(default_factory=list)  # settles the daemon refused
    recheck_moves: int = -1  # money-moving runs when every stored run is reconciled again at the end
    end: datetime = T0


class _SimSqueue:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def running_jobs(self) -> SqueueResult:
        jobs = []
        for job in self.sim.running.values():
            spec = job.spec
            assert job.node is not None
            jobs.append(
                SqueueJob(
                    cluster=CLUSTER,
                    job_id=spec.job_id,
                    display_id=str(spec.job_id),
                    run=job.run,
                    user=spec.user,
                    account=spec.account,
                    partition=PARTITION,
                    state="RUNNING",
                    submit=at(job.submit),
                    start=at(job.start),
                    end=at(job.start + spec.limit_seconds),
                    time_limit_seconds=spec.limit_seconds,
                    gpus={spec.gpu_type: spec.gpus},
                    requested_gpus={spec.gpu_type: spec.gpus},
                    nodes=(job.node.name,),
                    node_count=1,
                    name=f"sim-{spec.job_id}",
                    gpu_indices={},
                )
            )
        return SqueueResult(jobs=jobs)


class _SimSacct:
    """`sacct` for the bridge: the runs that ended in [since, until]."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def finished_runs(self, since: datetime, until: datetime) -> ParseResult:
        runs = self.sim.books.runs
        # Runs are appended in end order; scan back from the newest.
        picked = []
        for run in reversed(runs):
            assert run.end is not None
            if run.end < since:
                break
            if run.end <= until:
                picked.append(run)
        picked.reverse()
        return ParseResult(runs=picked)

    def running_jobs(self) -> SqueueResult:
        return _SimSqueue(self.sim).running_jobs()


class Simulation:
    """One run of a workload against one database; `run()` returns the observed Books."""

    def __init__(
        self,
        workload: Workload,
        factory: sessionmaker[Session],
        *,
        seed: int = 1,
        defect: str | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        if defect is not None and defect not in DEFECTS:
            raise ValueError(f"defect must be one of {DEFECTS}, got {defect!r}")
        self.workload = workload
        self.config: Config = workload.config
        self.factory = factory
        self.rng = random.Random(seed + 17)
        self.defect = defect
        self.progress = progress
        self.books = Books()
        self.now = 0
        self._seq = 0
        self.events: list[tuple[int, int, str, Any]] = []
        self.jobs: dict[int, Job] = {}
        self.running: dict[int, Job] = {}
        self.nodes: list[Node] = []
        gpn = self.config.gpus_per_node
        self.buckets: dict[str, list[set[int]]] = {}
        self.free_total: Counter[str] = Counter()
        for gpu_type, count in self.config.nodes.items():
            self.buckets[gpu_type] = [set() for _ in range(gpn + 1)]
            for _ in range(count):
                node = Node(len(self.nodes), f"n{len(self.nodes):05d}", gpu_type, gpn)
                self.nodes.append(node)
                self.buckets[gpu_type][gpn].add(node.index)
                self.free_total[gpu_type] += gpn
        self.pending: dict[str, dict[str, deque[int]]] = {t: {} for t in self.config.nodes}
        self.blocked: dict[str, str] = {}
        self.unreachable_held: list[int] = []
        self.running_gpus: Counter[str] = Counter()
        self.shares: dict[str, int] = {a.name: 1 for a in workload.accounts}
        self.budgets = {a.name: a.budget_ucredits for a in workload.accounts}
        self.topups_done: Counter[str] = Counter()
        self.down: Counter[str] = Counter()  # daemon, database, partition, meter: active outages
        self.policy = Policy(refund_node_fail=defect != "no_node_fail_refund")
        self.meter = Meter(
            sessions=self._session,
            source=_SimSqueue(self),
            runner=self._runner,
            interval_seconds=self.config.meter_interval_seconds,
            on_exhausted="cancel",
            clock=lambda: at(self.now),
        )
        self._cancels: list[int] = []
        self.sched_dirty = True
        self.spool: Counter[str] = Counter()  # the hooks' outage spool: estimates per account
        self.lines = (
            None
            if self.config.outage_line_per_account is None
            else parse_credits(self.config.outage_line_per_account),
            None if self.config.outage_line_fleet is None else parse_credits(self.config.outage_line_fleet),
        )
        self.ledger_config = {
            "holds": {"mode": self.config.mode, "lease_seconds": self.config.lease_window_seconds},
            "meter": {"interval_seconds": self.config.meter_interval_seconds},
            "policy": {
                "on_ledger_unreachable": self.config.policy,
                "outage_credit_line_per_account": self.config.outage_line_per_account,
                "outage_credit_line_fleet": self.config.outage_line_fleet,
            },
        }

    # -- plumbing

    @contextmanager
    def _session(self) -> Iterator[Session]:
        with self.factory() as s, s.begin():
            yield s

    @contextmanager
    def _op(self, kind: str, count: int = 1) -> Iterator[Session]:
        started = time.perf_counter()
        try:
            with self._session() as s:
                yield s
        finally:
            self.books.ledger_seconds += time.perf_counter() - started
            self.books.ops[kind] += count

    def _push(self, when: int, kind: str, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self.events, (when, self._seq, kind, payload))

    def _runner(self, argv: Sequence[str], *, timeout_seconds: float | None = None) -> str:
        if argv and argv[0] == "scancel":
            self._cancels.append(int(argv[1]))
        return ""

    @property
    def hooks_down(self) -> bool:
        return bool(self.down["daemon"] or self.down["database"] or self.down["partition"])

    @property
    def controller_cut(self) -> bool:
        """The meter and the bridge (on the controller) cannot reach the database."""
        return bool(self.down["database"] or self.down["partition"])

    # -- setup

    def setup(self) -> None:
        with self._op("setup") as s:
            for gpu_type, price in PRICES_UCREDITS_PER_HOUR.items():
                api.set_price(s, gpu_type, credits(price), effective_at=T0 - timedelta(days=30))
            gpu_type, price = PRICE_CHANGE
            api.set_price(s, gpu_type, credits(price), effective_at=at(self.config.days * 86_400 // 2))
        for account in self.workload.accounts:
            with self._op("setup") as s:
                api.create_account(s, account.name, at=T0 - timedelta(days=2))
                for user in account.users:
                    api.add_member(s, user, account.name)
                if account.max_gpus is not None or account.daily_cap_ucredits is not None:
                    api.set_limits(
                        s,
                        account.name,
                        max_gpus=account.max_gpus,
                        daily_cap=None
                        if account.daily_cap_ucredits is None
                        else credits(account.daily_cap_ucredits),
                    )
                for user, cap in account.user_max_gpus.items():
                    api.set_limits(s, account.name, user=user, max_gpus=cap)

    # -- the loop

    def run(self) -> Books:
        self.setup()
        for job in self.workload.jobs:
            self.jobs[job.job_id] = Job(job, submit=int((job.arrival - T0).total_seconds()))
            self._push(self.jobs[job.job_id].submit, "arrive", job.job_id)
        for grant in self.workload.grants:
            self._push(max(0, int((grant.effective_at - T0).total_seconds())) - 1, "grant", grant)
        for fault in self.workload.faults:
            self._push(int((fault.at - T0).total_seconds()), "fault", fault)
        c = self.config
        self._push(0, "daily")
        self._push(c.sched_interval_seconds, "sched")
        self._push(c.meter_interval_seconds, "meter")
        self._push(c.bridge_interval_seconds, "bridge")
        self._push(c.sample_interval_seconds, "sample")
        self.arrivals_end = c.days * 86_400
        if c.cancel_at_end:
            self._push(self.arrivals_end, "cancel_all")
        self.hard_stop = self.arrivals_end + c.max_limit_hours * 3600 + 2 * 86_400
        saved = hook_service.utcnow
        hook_service.utcnow = lambda: at(self.now)  # the daemon's clock is the simulation's
        try:
            self._loop()
            self._finish()
        finally:
            hook_service.utcnow = saved
        return self.books

    def _loop(self) -> None:
        handlers: dict[str, Callable[[Any], None]] = {
            "arrive": self._arrive,
            "end": self._end_event,
            "sched": self._sched_event,
            "meter": self._meter_event,
            "bridge": self._bridge_event,
            "sample": self._sample_event,
            "daily": self._daily_event,
            "grant": self._grant_event,
            "topup": self._topup_event,
            "fault": self._fault_event,
            "recover": self._recover_event,
            "cancel_all": self._cancel_all_event,
        }
        periodic = {"sched", "meter", "bridge", "sample", "daily"}
        wall = time.perf_counter()
        while self.events:
            when, _seq, kind, payload = heapq.heappop(self.events)
            if kind in periodic and self._drained(when):
                continue  # services stop once every job is done
            if kind == "end" and not self._ends_now(payload):
                continue  # the run ended otherwise meanwhile (node failure, cancel)
            self.now = when
            self.books.events[kind] += 1
            handlers[kind](payload)
            if self.progress and time.perf_counter() - wall > 30:
                wall = time.perf_counter()
                self.progress(
                    f"day {when / 86400:.1f}: running {len(self.running)}, "
                    f"runs {len(self.books.runs)}, ledger ops {sum(self.books.ops.values())}"
                )

    def _drained(self, when: int) -> bool:
        return when > self.arrivals_end and not self.running and not self._any_pending()

    def _any_pending(self) -> bool:
        return any(j.state in ("pending", "held") for j in self.jobs.values())

    # -- jobs

    def _arrive(self, job_id: int) -> None:
        job = self.jobs[job_id]
        self._enqueue(job)

    def _enqueue(self, job: Job, front: bool = False) -> None:
        job.state = "pending"
        queue = self.pending[job.spec.gpu_type].setdefault(job.spec.account, deque())
        if front:
            queue.appendleft(job.spec.job_id)
        else:
            queue.append(job.spec.job_id)
        self.sched_dirty = True

    def _sched_event(self, _payload: Any) -> None:
        self._push(self.now + self.config.sched_interval_seconds, "sched")
        if not self.sched_dirty:
            return
        self.sched_dirty = False
        for gpu_type in self.pending:
            self._schedule(gpu_type)
        gpus = sum(self.running_gpus.values())
        self.books.peak_running_jobs = max(self.books.peak_running_jobs, len(self.running))
        self.books.peak_running_gpus = max(self.books.peak_running_gpus, gpus)

    def _priority(self, account: str) -> float:
        share = self.shares.get(account, 0)
        return self.running_gpus[account] / share if share > 0 else float("inf")

    def _schedule(self, gpu_type: str) -> None:
        queues = self.pending[gpu_type]
        heap = [(self._priority(a), a) for a, q in queues.items() if q and a not in self.blocked]
        heapq.heapify(heap)
        while heap and self.free_total[gpu_type] > 0:
            _key, account = heapq.heappop(heap)
            queue = queues[account]
            while queue and self.jobs[queue[0]].state != "pending":
                queue.popleft()  # cancelled while pending
            if not queue:
                continue
            job = self.jobs[queue[0]]
            node = self._place(gpu_type, job.spec.gpus, job.avoid)
            if node is None:
                continue  # no backfill: this account waits for the next pass
            queue.popleft()
            self._prolog(job, node)
            if queue and account not in self.blocked:
                heapq.heappush(heap, (self._priority(account), account))

    def _place(self, gpu_type: str, gpus: int, avoid: int | None) -> Node | None:
        buckets = self.buckets[gpu_type]
        for free in range(gpus, len(buckets)):
            for index in buckets[free]:
                if index != avoid:
                    return self.nodes[index]
        return None

    def _set_free(self, node: Node, free: int) -> None:
        if node.up:
            self.buckets[node.gpu_type][node.free].discard(node.index)
            self.buckets[node.gpu_type][free].add(node.index)
            self.free_total[node.gpu_type] += free - node.free
        node.free = free

    def _prolog(self, job: Job, node: Node) -> None:
        """PrologSlurmctld at allocation: hold, or refuse (the job is requeued and held)."""
        spec = job.spec
        if self.hooks_down:
            if self.config.policy == "accept" and self._within_lines(spec):
                self.books.events["unreserved_start"] += 1
                self._start(job, node, hold_id=None)
                return
            self._refused(job, node, "unreachable")
            return
        request = {
            "account": spec.account,
            "user": spec.user,
            "job_id": spec.job_id,
            "gpus": {spec.gpu_type: spec.gpus},
            "seconds": spec.limit_seconds,
            "cluster": CLUSTER,
            "run": job.run,
            "partition": PARTITION,
            "start": at(self.now).isoformat(),
            "submit": at(job.submit).isoformat(),
        }
        try:
            with self._op("hold") as s:
                hold = hook_service.hold(
                    s, request, grace_seconds=GRACE_SECONDS, lease_seconds=self.config.lease_window_seconds
                )
                hold_id = int(hold["id"])
        except LedgerError as error:
            self._refused(job, node, error.code)
            return
        self._start(job, node, hold_id=hold_id)

    def _within_lines(self, spec: JobSpec) -> bool:
        """The hooks' outage credit lines: admit a run while the spooled estimates
        (GPUs x time limit x price) stay within the account's line and the fleet's."""
        price = PRICES_UCREDITS_PER_HOUR[spec.gpu_type]
        if spec.gpu_type == PRICE_CHANGE[0] and self.now >= self.config.days * 86_400 // 2:
            price = PRICE_CHANGE[1]
        estimate = -(-spec.gpus * price * spec.limit_seconds // 3600)
        account_line, fleet_line = self.lines
        spooled = self.spool[spec.account]
        if account_line is not None and spooled + estimate > account_line:
            return False
        if fleet_line is not None and sum(self.spool.values()) + estimate > fleet_line:
            return False
        self.spool[spec.account] += estimate
        return True

    def _refused(self, job: Job, node: Node, code: str) -> None:
        """A refused prolog: Slurm shows a REQUEUED attempt with Start == End; the job
        is held (credit, a cap: until the account can run; unreachable: until the ledger is back)."""
        self.books.events[f"refused_{code}"] += 1
        self._record(job, node, "REQUEUED", start=self.now, end=self.now)
        job.run += 1
        job.submit = self.now
        if code == "unreachable":
            job.state = "held"
            self.unreachable_held.append(job.spec.job_id)
            return
        self._enqueue(job, front=True)
        account = job.spec.account
        self.blocked[account] = code
        if code == "insufficient_credits" and self.topups_done[account] < 4 and self.rng.random() < 0.6:
            self.topups_done[account] += 1
            self._push(self.now + self.rng.randrange(2 * 3600, 24 * 3600), "topup", account)

    def _unblock(self, account: str) -> None:
        if self.blocked.pop(account, None) is not None:
            self.sched_dirty = True

    def _start(self, job: Job, node: Node, hold_id: int | None) -> None:
        spec = job.spec
        job.state = "running"
        job.node = node
        job.start = self.now
        job.hold_id = hold_id
        node.jobs.add(spec.job_id)
        self._set_free(node, node.free - spec.gpus)
        self.running[spec.job_id] = job
        self.running_gpus[spec.account] += spec.gpus
        length, state = min(spec.duration_seconds, spec.limit_seconds), "COMPLETED"
        if spec.duration_seconds > spec.limit_seconds:
            state = "TIMEOUT"
        if job.run == 0 and spec.cancel_after is not None and spec.cancel_after < length:
            length, state = spec.cancel_after, "CANCELLED"
        if job.run == 0 and spec.admin_requeue_after is not None and spec.admin_requeue_after < length:
            length, state = spec.admin_requeue_after, "REQUEUED"
        self._push(self.now + length, "end", (spec.job_id, job.run, state))

    def _ends_now(self, payload: tuple[int, int, str]) -> bool:
        job_id, run, _state = payload
        job = self.jobs[job_id]
        return job.state == "running" and job.run == run

    def _end_event(self, payload: tuple[int, int, str]) -> None:
        job_id, _run, state = payload
        self._end(self.jobs[job_id], state)

    def _end(self, job: Job, state: str) -> None:
        spec = job.spec
        node = job.node
        assert node is not None
        del self.running[spec.job_id]
        self.running_gpus[spec.account] -= spec.gpus
        node.jobs.discard(spec.job_id)
        self._set_free(node, node.free + spec.gpus)
        run = self._record(job, node, state, start=job.start, end=self.now)
        self._epilog(job, run)
        self._unblock(spec.account)
        self.sched_dirty = True
        if state in ("REQUEUED", "NODE_FAIL"):
            job.run += 1
            job.submit = self.now
            job.avoid = node.index  # the next run migrates to another node
            job.hold_id = None
            self._enqueue(job, front=True)
        else:
            job.state = "done"

    def _epilog(self, job: Job, run: SacctRun) -> None:
        """EpilogSlurmctld: settle with the run's end; lost, or unreachable, the bridge settles it."""
        spec = job.spec
        if job.hold_id is None:
            return  # ran unreserved (policy accept): the bridge charges it
        if job.run == 0 and spec.lost_epilog:
            self.books.events["lost_epilog"] += 1
            return
        if self.hooks_down:
            self.books.events["epilog_unreachable"] += 1
            return
        request = {
            "cluster": CLUSTER,
            "job_id": spec.job_id,
            "run": job.run,
            "submit": at(job.submit).isoformat(),
            "end": at(self.now + (spec.skew_seconds if job.run == 0 else 0)).isoformat(),
        }
        try:
            with self._op("settle") as s:
                settled = hook_service.settle(s, request)
        except LedgerError as error:  # the books check reports it, with the job's attempts
            attempts = [
                f"run {r.run} {r.state} submit {r.submit:%d %H:%M:%S} "
                f"{'-' if r.start is None else f'{r.start:%d %H:%M:%S}'}..{r.end:%d %H:%M:%S}"
                for r in self.books.runs
                if r.job_id == spec.job_id
            ]
            self.books.epilog_failures.append(
                f"job {spec.job_id} run {job.run} ({run.state}): {error.code}: {error.message}; "
                f"attempts: {'; '.join(attempts)}"
            )
            return
        if job.run == 0 and spec.duplicate_epilog:
            self.books.events["duplicate_epilog"] += 1
            with self._op("settle_repeat") as s:
                again = hook_service.settle(s, request)
            if again["charged"] != settled["charged"] or again["id"] != settled["id"]:
                self.books.duplicate_epilog_mismatches.append(f"{spec.job_id}: {settled} then {again}")
        requeued = run.state in ("REQUEUED", "NODE_FAIL")
        if self.defect == "double_charge_requeue" and requeued and settled["charged"] != "0":
            with self._op("defect") as s:
                api.consume(s, spec.account, settled["charged"], at=at(self.now), user=spec.user)

    def _record(self, job: Job, node: Node | None, state: str, *, start: int | None, end: int) -> SacctRun:
        spec = job.spec
        gpus = {spec.gpu_type: spec.gpus} if start is not None else {}
        run = SacctRun(
            cluster=CLUSTER,
            job_id=spec.job_id,
            display_id=str(spec.job_id),
            run=job.run,
            user=spec.user,
            account=spec.account,
            partition=PARTITION,
            state=state,
            submit=at(job.submit),
            start=None if start is None else at(start),
            end=at(end),
            elapsed_seconds=0 if start is None else end - start,
            time_limit_seconds=spec.limit_seconds,
            gpus=gpus,
            requested_gpus={spec.gpu_type: spec.gpus},
            nodes=(node.name,) if node is not None and start is not None else (),
            node_count=1 if node is not None and start is not None else 0,
            name=f"sim-{spec.job_id}",
        )
        self.books.runs.append(run)
        return run

    def _cancel_pending(self, job: Job) -> None:
        """A job its user gave up on while it waited: sacct shows it CANCELLED, never started."""
        self._record(job, None, "CANCELLED", start=None, end=self.now)
        job.state = "done"
        self.books.events["cancelled_pending"] += 1

    def _cancel_all_event(self, _payload: Any) -> None:
        """The end of a window-only run: every job still waiting or running is cancelled."""
        for job in list(self.jobs.values()):
            if job.state in ("pending", "held"):
                self._cancel_pending(job)
            elif job.state == "running":
                self.books.events["cancelled_at_end"] += 1
                self._end(job, "CANCELLED")

    # -- services

    def _meter_event(self, _payload: Any) -> None:
        self._push(self.now + self.config.meter_interval_seconds, "meter")
        if self.down["meter"] or self.controller_cut:
            self.books.events["meter_tick_missed"] += 1
            return
        started = time.perf_counter()
        report = self.meter.tick()
        self.books.ledger_seconds += time.perf_counter() - started
        self.books.ops["meter_charge"] += report.charged
        self.books.ops["meter_tx"] += report.accounts
        self.books.ops["meter_expired_hold"] += len(report.expired)
        self.books.ops["lease_renewal"] += getattr(report, "renewed", 0)
        self.books.meter_errors.extend(report.errors)
        cancels, self._cancels = self._cancels, []
        for job_id in cancels:
            job = self.jobs[job_id]
            if job.state == "running":
                self.books.events["meter_cancel"] += 1
                self._end(job, "CANCELLED")

    def _bridge_event(self, _payload: Any) -> None:
        self._push(self.now + self.config.bridge_interval_seconds, "bridge")
        if self.controller_cut:
            self.books.events["bridge_round_missed"] += 1
            return
        self._bridge_round()

    def _bridge_round(self) -> ingest.RoundResult:
        started = time.perf_counter()
        result = ingest.ingest_round(self.factory, _SimSacct(self), now=at(self.now), policy=self.policy)
        self.books.ledger_seconds += time.perf_counter() - started
        summary = result.summary
        self.books.ops["reconcile_run"] += summary.counts["seen"]
        for outcome in summary.notable:
            account = self.jobs[outcome.job_id].spec.account
            if outcome.counter == "failed":
                self.books.reconcile_failures.append(f"{outcome.job_id}/{outcome.run}: {outcome.detail}")
                continue
            changes = self.books.reconcile_changes.setdefault(account, Counter())
            changes[outcome.counter] += outcome.change_ucredits
            self.books.reconcile_outcomes.append((account, outcome))
        return result

    def _sample_event(self, _payload: Any) -> None:
        self._push(self.now + self.config.sample_interval_seconds, "sample")
        if not self.down["database"]:
            self._sample()

    def _sample(self) -> None:
        with self._op("read") as s:
            totals = api.account_totals(s, at(self.now))
        low = self.books.min_available
        for row in totals:
            if row.available_ucredits < low.get(row.account, 0):
                low[row.account] = row.available_ucredits

    def _daily_event(self, _payload: Any) -> None:
        self._push(self.now + 86_400, "daily")
        if self.down["database"]:
            return
        for account in self.workload.accounts:
            with self._op("sweep") as s:
                api.sweep(s, account.name, at(self.now))
            if self.blocked.get(account.name) == "daily_cap":
                self._unblock(account.name)
        self._fairshare()
        # Jobs of accounts that cannot run give up after a while; after the month, all waiting jobs.
        cutoff = self.now - int(self.config.held_cancel_days * 86_400)
        for job in self.jobs.values():
            if job.state not in ("pending", "held"):
                continue
            stale = job.submit < cutoff and (job.spec.account in self.blocked or job.state == "held")
            if stale or self.now >= self.hard_stop:
                self._cancel_pending(job)

    def _fairshare(self) -> None:
        now = at(self.now)
        with self._op("read") as s:
            inputs = api.fairness_inputs(
                s, now, funded_since=now - timedelta(days=90), spent_since=now - timedelta(days=7)
            )
        shares = {
            sh.account: sh.shares for sh in account_shares(inputs, FairsharePolicy()) if sh.user is None
        }
        self.shares = shares
        total = sum(shares.values())
        if total > 0:
            self.books.share_samples += 1
            for account, value in shares.items():
                sums = self.books.share_sums
                sums[account] = sums.get(account, 0.0) + value / total
        self.sched_dirty = True

    def _grant_event(self, grant: Any) -> None:
        if self.down["database"]:
            self._push(self.now + 600, "grant", grant)  # the portal retries
            return
        with self._op("grant") as s:
            if grant.kind == "topup":
                api.topup(
                    s,
                    grant.account,
                    credits(grant.amount_ucredits),
                    effective_at=grant.effective_at,
                    expires_at=grant.expires_at,
                    at=min(at(self.now + 1), grant.effective_at),
                )
            else:
                api.grant(
                    s,
                    grant.account,
                    credits(grant.amount_ucredits),
                    effective_at=grant.effective_at,
                    expires_at=grant.expires_at,
                    priority=grant.priority,
                    at=min(at(self.now + 1), grant.effective_at),
                )
        self._unblock(grant.account)

    def _topup_event(self, account: str) -> None:
        if self.down["database"]:
            self._push(self.now + 600, "topup", account)
            return
        amount = self.budgets[account] // 4
        with self._op("grant") as s:
            api.topup(s, account, credits(amount), at=at(self.now))
        self.books.events["topup_reactive"] += 1
        self._unblock(account)

    # -- faults

    def _fault_event(self, fault: Any) -> None:
        self.books.events[f"fault_{fault.kind}"] += 1
        if fault.kind == "agent":
            return  # the NVML agent only feeds efficiency data: a usage gap, no charge changes
        if fault.kind == "node_failure":
            node = self.nodes[fault.target]
            if not node.up:
                return
            for job_id in sorted(node.jobs):
                self._end(self.jobs[job_id], "NODE_FAIL")
            self.buckets[node.gpu_type][node.free].discard(node.index)
            self.free_total[node.gpu_type] -= node.free
            node.up = False
            self._push(self.now + fault.seconds, "recover", fault)
            return
        if fault.kind in ("daemon", "database", "partition"):
            self._outage_bound(fault.seconds)
        elif fault.kind == "meter" and self.config.mode == "lease":
            self._outage_bound(fault.seconds, hooks_up=True)  # leases go unrenewed meanwhile
        self.down[fault.kind] += 1
        self._push(self.now + fault.seconds, "recover", fault)

    def _outage_bound(self, seconds: int, *, hooks_up: bool = False) -> None:
        """What `gpucredit policy bound --outage D` says as the outage begins (ledger.holds.bounds),
        added to each account's bound; without it in this ledger, reject's 0 only.
        `hooks_up`: only the meter is away (the hooks admit nothing unreserved)."""
        bounds = self.books.outage_bounds
        current = getattr(api, "current_outage_bound", None)
        names = [a.name for a in self.workload.accounts]
        if current is None:
            self.books.outage_bound_source = "0 for reject (ledger.holds.bounds not available)"
            for name in names:
                if self.config.policy == "reject":
                    bounds.setdefault(name, 0)
                else:
                    bounds[name] = None
            return
        self.books.outage_bound_source = (
            "ledger.holds.bounds (gpucredit policy bound), summed over the outages"
        )
        config = self.ledger_config
        if hooks_up:
            config = {**config, "policy": {"on_ledger_unreachable": "reject"}}
        with self._op("read") as s:
            bound = current(s, config, seconds, at(self.now))
        by_account = {row.account: row.bound_ucredits for row in bound.accounts}
        for name in names:
            value = by_account.get(name, bound.other_accounts.bound_ucredits)
            before = bounds.get(name, 0)
            bounds[name] = None if value is None or before is None else before + value

    def _recover_event(self, fault: Any) -> None:
        if fault.kind == "node_failure":
            node = self.nodes[fault.target]
            node.up = True
            self.buckets[node.gpu_type][node.free].add(node.index)
            self.free_total[node.gpu_type] += node.free
            self.sched_dirty = True
            return
        self.down[fault.kind] -= 1
        if not self.hooks_down:
            self.spool.clear()  # the daemon read the spool back
        if not self.hooks_down and self.unreachable_held:
            # The admin releases the jobs held while the ledger was unreachable.
            held, self.unreachable_held = self.unreachable_held, []
            for job_id in held:
                if self.jobs[job_id].state == "held":
                    self._enqueue(self.jobs[job_id], front=True)

    # -- the end

    def _finish(self) -> None:
        """After the last job: outages over, two bridge rounds (the second must change
        nothing), a sweep and a sample; the books are then read by books.py."""
        assert not self.down["database"] and not self.down["partition"], "an outage outlived the run"
        self.now = max(self.now, self.arrivals_end) + 3600
        self._bridge_round()
        self.now += 3600
        # Every stored run planned afresh from Slurm's record: a right ledger moves nothing.
        started = time.perf_counter()
        again = reconcile_stored(self.factory, self.policy, include_all=True, now=at(self.now))
        self.books.ledger_seconds += time.perf_counter() - started
        self.books.ops["reconcile_run"] += again.counts["seen"]
        self.books.recheck_moves = sum(again.counts[c] for c in MONEY_MOVES) + again.counts["failed"]
        for account in self.workload.accounts:
            with self._op("sweep") as s:
                api.sweep(s, account.name, at(self.now))
        self._sample()
        self.books.end = at(self.now)
