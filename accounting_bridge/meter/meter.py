"""`gpucredit bridge meter`: running time becomes cost so far; act on the holds that need it.

A running job's cost so far is computed on read (`ledger.holds.accrual`: the charge for its
cumulative seconds at its hold's rate, rounded once), so the meter does not post a
journal entry per job per tick. One tick (docs/design.md §3.3):

1. ``squeue --Format`` (:class:`CompactSqueue`; ``sacct.parse_squeue_compact``) lists
   the running jobs; one query lists the active holds (:func:`ledger.api.list_active_runs`).
2. Every active hold whose attempt is RUNNING (:func:`running_holds`: same cluster, job id
   and restart count, and the hold was taken with the attempt's submit time) is due
   ``now - start`` seconds, rounded down to the interval. Most of them only accrue. A
   charge is posted (:func:`ledger.api.hold_usage_many`, per account, one transaction and
   one account lock each) only for a hold that needs one:

   * it ran past what it holds (a full hold past its time limit, a lease past its window):
     the charge draws free credit or records debt, and debt is an action;
   * it expires this tick (time limit + grace) while its job still runs;
   * it is a lease with less than half a window left: the charge, then the renewal
     (:func:`ledger.api.renew_leases`), which earmarks the next window;
   * a UTC day ended since its last charge: one charge to the day's last second, so the
     epilog's settle covers only its own day (reports and daily caps count by day);
     at most MAX_CHECKPOINTS_PER_TICK a tick, the oldest first.

3. Accounts with a daily cap are checked against spend today, running jobs' cost so far
   included (:func:`ledger.api.daily_cap_overruns`).
4. Holds past time limit + grace are expired (:func:`ledger.api.sweep`). A hold whose job
   the meter saw running and no longer sees is charged first to the seconds last seen.
5. A running job whose charge ran into debt, whose lease renewal was refused, or whose user
   or account is over its daily cap gets ``meter.on_exhausted``: ``cancel`` (the job's
   comment says why, then ``scancel``), ``requeue-hold`` (the comment, then
   ``scontrol requeuehold``) or ``notify`` (a log line).

Why round the due seconds down to the interval: the cumulative target then depends on the
job, not on when the tick ran, so a restarted meter or two meters during a failover post
the same target, and the ledger ignores a target a hold already reached.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import Any, Protocol

import click
from sqlalchemy.orm import Session

from accounting_bridge.slurm.gc_pause import cycle_collection_paused
from accounting_bridge.slurm.records import SqueueJob, SqueueResult, parse_squeue_compact, squeue_compact_argv
from accounting_bridge.slurm.slurmcmd import Runner, SlurmCommandError
from ledger import api
from ledger.errors import LedgerError
from ledger.jobs import jobruns
from ledger.money import format_credits
from ledger.timeutil import MAX_JOB_SECONDS, as_utc, day_bounds, format_time, utcnow
from slurmtext import comment_text

__all__ = [
    "ACTIONS",
    "MAX_ACTIVE_HOLDS",
    "METER_CURSOR",
    "Action",
    "CompactSqueue",
    "Exhausted",
    "Meter",
    "MeterTick",
    "RunningJobs",
    "action_argvs",
    "cancel_argvs",
    "meter_command",
    "running_holds",
]

log = logging.getLogger(__name__)

ACTIONS = ("cancel", "notify", "requeue-hold")
# Concurrent account transactions per tick (each holds one database connection).
MAX_WORKERS = 32
# Active holds one tick reads; past it the newest holds wait (and the tick says so).
MAX_ACTIVE_HOLDS = 200_000
# Day-end charges per tick: after midnight UTC every running hold needs one; spread
# over the first ticks of the day, so no tick is slow.
MAX_CHECKPOINTS_PER_TICK = 1_000
# The cursor each tick moves to its time: the meter's heartbeat (a tick may post nothing).
METER_CURSOR = "meter"

Sessions = Callable[[], AbstractContextManager[Session]]
Usage = tuple[int, int, datetime]  # (hold id, cumulative seconds, effective time)


class RunningJobs(Protocol):
    """The part of a job source the meter needs (CompactSqueue, PyslurmSource, a fake)."""

    def running_jobs(self) -> SqueueResult: ...


class CompactSqueue:
    """Running jobs from ``squeue --Format`` of a few fields (``sacct.squeue_compact_argv``):
    about 100 bytes a job where ``squeue --json`` takes 2,800, which the meter reads every tick."""

    def __init__(self, runner: Runner, *, cluster: str, tz: tzinfo | None = None) -> None:
        self.runner = runner
        self.cluster = cluster
        self.tz = tz
        self._known: dict[str, SqueueJob] = {}  # last tick's lines: a running job's line repeats

    def running_jobs(self) -> SqueueResult:
        return self.parse(self.runner(squeue_compact_argv()))

    def parse(self, text: str) -> SqueueResult:
        """`parse_squeue_compact`, reading only the lines the last call did not see."""
        known: dict[str, SqueueJob] = {}
        result = SqueueResult()
        fresh: list[str] = []
        for line in text.split("\n"):
            job = self._known.get(line)
            if job is None:
                fresh.append(line)
            else:
                known[line] = job
                result.jobs.append(job)
        if fresh:
            parsed = parse_squeue_compact("\n".join(fresh), cluster=self.cluster, tz=self.tz)
            for job in parsed.jobs:
                assert job.line_no is not None
                known[fresh[job.line_no - 1]] = job
            result.jobs.extend(parsed.jobs)
            result.errors = parsed.errors
        self._known = known
        return result


@dataclass(frozen=True)
class Exhausted:
    """A running job whose hold cannot go on being charged, and why (in words for its owner)."""

    hold_id: int
    account: str
    user: str
    job_key: tuple[str, int, int]
    job_spec: str  # what scancel takes: 42, or 6_0 for an array task (6 alone is the whole array)
    cause: str  # "credit" | "daily_cap" | another limit's name (a refused lease renewal)
    reason: str


@dataclass(frozen=True)
class Action:
    hold_id: int
    job_spec: str
    kind: str  # "cancel" | "notify" | "requeue-hold"
    argvs: tuple[tuple[str, ...], ...] = ()
    error: str | None = None


@dataclass
class MeterTick:
    """What one tick did, and where its time went (seconds per phase)."""

    at: datetime
    running_jobs: int = 0
    active_holds: int = 0
    charged: int = 0  # holds given a posted charge
    accruing: int = 0  # running holds whose cost so far is read, not posted
    renewed: int = 0  # leases extended by a window
    not_due: int = 0
    not_running: int = 0
    accounts: int = 0
    expired: list[int] = field(default_factory=list)
    exhausted: list[Exhausted] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": format_time(self.at),
            "running_jobs": self.running_jobs,
            "active_holds": self.active_holds,
            "charged": self.charged,
            "accruing": self.accruing,
            "renewed": self.renewed,
            "not_due": self.not_due,
            "not_running": self.not_running,
            "accounts": self.accounts,
            "expired": len(self.expired),
            "exhausted": len(self.exhausted),
            "cancelled": sum(1 for a in self.actions if a.kind == "cancel" and a.error is None),
            "errors": len(self.errors),
            "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
        }


@dataclass
class _AccountPlan:
    """What one account's transaction does this tick."""

    checkpoints: list[Usage] = field(default_factory=list)  # charged first: a day's last second
    dues: list[Usage] = field(default_factory=list)
    renewals: list[Usage] = field(default_factory=list)
    running: list[api.ActiveRun] = field(default_factory=list)  # for the daily-cap check
    capped_id: int | None = None

    @property
    def writes(self) -> bool:
        return bool(self.checkpoints or self.dues or self.renewals)


def cancel_argvs(job_spec: str, reason: str) -> list[list[str]]:
    """The comment first, so the owner sees why in `squeue -o %k`/`sacct -o Comment`; then scancel."""
    return action_argvs("cancel", job_spec, reason)


def action_argvs(kind: str, job_spec: str, reason: str) -> list[list[str]]:
    """`cancel`: comment, then scancel; `requeue-hold`: comment, then the job goes back to
    the queue held (`scontrol requeuehold`), to be released when credit arrives."""
    if kind == "requeue-hold":
        comment = comment_text(f"requeued and held: {reason}")
        return [
            ["scontrol", "update", f"jobid={job_spec}", f"comment={comment}"],
            ["scontrol", "requeuehold", job_spec],
        ]
    return [
        ["scontrol", "update", f"jobid={job_spec}", f"comment={comment_text(f'cancelled: {reason}')}"],
        ["scancel", job_spec],
    ]


def running_holds(
    holds: Sequence[api.ActiveRun], running: Mapping[tuple[str, int, int], SqueueJob]
) -> dict[int, SqueueJob]:
    """The running job each active hold's time is charged to, by hold id.

    A hold is its job's when it was taken for the attempt squeue shows: same cluster,
    job id and run, and the attempt's submit time. Slurm reuses job ids, so an old job
    whose epilog was lost can leave an active hold under the id a new job runs with;
    that hold has the old submit time and is never charged for the new job (the sweep
    expires it). A hold taken without a submit time (older hooks, the CLI) is matched
    by run alone, unless the job has a hold of its own.
    """
    own: set[tuple[str, int, int]] = set()
    matched: dict[int, SqueueJob] = {}
    legacy: list[tuple[int, SqueueJob]] = []
    get = running.get
    unknown = api.UNKNOWN_SUBMIT
    for hold in holds:
        job = get((hold.cluster, hold.job_id, hold.run))
        if job is None:
            continue
        if hold.submitted_at == unknown:
            legacy.append((hold.hold_id, job))
        elif hold.submitted_at == job.submit:
            matched[hold.hold_id] = job
            own.add(job.key)
    for hold_id, job in legacy:
        if job.key not in own:
            matched[hold_id] = job
    return matched


def _job_spec(job: SqueueJob) -> str:
    # An array task's raw id may equal the array's own id, which names every task.
    return job.display_id if job.array_job_id is not None or job.het_job_id is not None else str(job.job_id)


class Meter:
    """The metering loop. No I/O until `tick`; every collaborator is injectable."""

    def __init__(
        self,
        *,
        sessions: Sessions,
        source: RunningJobs,
        runner: Runner,
        interval_seconds: int = 30,
        on_exhausted: str = "cancel",
        clock: Callable[[], datetime] = utcnow,
        workers: int = 1,
        max_checkpoints: int = MAX_CHECKPOINTS_PER_TICK,
    ) -> None:
        if (
            not isinstance(interval_seconds, int)
            or isinstance(interval_seconds, bool)
            or interval_seconds < 1
        ):
            raise ValueError(f"interval_seconds must be a whole number >= 1, got {interval_seconds!r}")
        if on_exhausted not in ACTIONS:
            raise ValueError(f"on_exhausted must be one of {', '.join(ACTIONS)}, got {on_exhausted!r}")
        self.sessions = sessions
        self.source = source
        self.runner = runner
        self.interval_seconds = interval_seconds
        self.on_exhausted = on_exhausted
        self.clock = clock
        # Accounts are independent (one lock each), so their transactions can run side by side;
        # on SQLite there is one writer and more workers only wait.
        if not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"workers must be 1..{MAX_WORKERS}, got {workers!r}")
        self.workers = workers
        self.max_checkpoints = max_checkpoints
        # Holds already acted on: a job being cancelled may still show RUNNING next tick.
        self._acted: set[int] = set()
        # Seconds each active hold's job was last seen running (due): where its cost so far
        # stops when it is no longer seen (`api.set_accrual`).
        self._seen: dict[int, int] = {}

    @classmethod
    def from_config(
        cls,
        config: dict[str, Any],
        *,
        sessions: Sessions,
        source: RunningJobs,
        runner: Runner,
        interval_seconds: int | None = None,
        workers: int = 1,
    ) -> Meter:
        """The meter for either hold mode: holds record their own (a lease its window), so
        the meter renews the leases whatever `holds.mode` says now."""
        mode = config["holds"]["mode"]
        if mode not in ("full", "lease"):
            raise ValueError(f"holds.mode must be 'full' or 'lease', got {mode!r}")
        interval = interval_seconds or int(config["meter"]["interval_seconds"])
        if mode == "lease" and interval > int(config["holds"]["lease_seconds"]) // 2:
            raise ValueError(
                f"meter.interval_seconds = {interval} is more than half of holds.lease_seconds = "
                f"{config['holds']['lease_seconds']}: a lease could run out between two ticks"
            )
        return cls(
            sessions=sessions,
            source=source,
            runner=runner,
            interval_seconds=interval,
            on_exhausted=str(config["meter"]["on_exhausted"]),
            workers=workers,
        )

    # -- one tick

    def tick(self) -> MeterTick:
        """One tick; the cyclic collector waits (a tick builds ~100,000 acyclic records
        per 50,000 jobs, and its re-scans took half of the tick)."""
        with cycle_collection_paused():
            return self._tick()

    def _tick(self) -> MeterTick:
        now = self.clock()
        report = MeterTick(at=now)
        clock = time.perf_counter
        started = clock()
        try:
            squeue = self.source.running_jobs()
        except SlurmCommandError as exc:  # no charges this tick; expiry does not need squeue
            report.errors.append(f"squeue: {exc}")
            squeue = None
        running: dict[tuple[str, int, int], SqueueJob] = {}
        if squeue is not None:
            report.errors.extend(f"squeue line {e.line_no}: {e.reason}" for e in squeue.errors)
            running = {j.key: j for j in squeue.jobs if j.state == "RUNNING" and j.start is not None}
        report.running_jobs = len(running)
        report.seconds["squeue"] = clock() - started

        started = clock()
        with self.sessions() as s:
            holds = api.list_active_runs(s, limit=MAX_ACTIVE_HOLDS)
            capped = api.capped_accounts(s)
            jobruns.write_cursor(s, METER_CURSOR, now, at=now)
        if len(holds) == MAX_ACTIVE_HOLDS:
            report.errors.append(f"more than {MAX_ACTIVE_HOLDS} active holds; the newest wait a tick")
        report.active_holds = len(holds)
        jobs = running_holds(holds, running)
        report.seconds["load"] = clock() - started

        started = clock()
        plan, expiring, stops = self._plan(holds, jobs, capped, now, report)
        if stops:
            with self.sessions() as s:
                api.set_accrual(s, stops)
        report.seconds["plan"] = clock() - started

        started = clock()
        accounts = sorted(a for a, p in plan.items() if p.writes or p.capped_id is not None)
        if self.workers > 1 and len(accounts) > 1:
            with ThreadPoolExecutor(self.workers, thread_name_prefix="meter") as pool:
                outcomes = list(pool.map(lambda a: self._charge_account(a, plan[a], jobs, now), accounts))
        else:
            outcomes = [self._charge_account(a, plan[a], jobs, now) for a in accounts]
        for account, (charged_count, renewed, exhausted, error) in zip(accounts, outcomes, strict=True):
            if error is not None:
                report.errors.append(f"account {account}: {error}")
                continue
            report.accounts += 1
            report.charged += charged_count
            report.renewed += renewed
            report.exhausted.extend(exhausted)
        report.seconds["charge"] = clock() - started

        started = clock()
        for account in sorted(expiring):
            try:
                with self.sessions() as s:
                    report.expired.extend(api.sweep(s, account, now)["expired_holds"])
            except LedgerError as exc:
                report.errors.append(f"account {account}: expiry: {exc.code}: {exc.message}")
        report.seconds["expire"] = clock() - started

        started = clock()
        self._acted &= set(jobs)
        for item in report.exhausted:
            if item.hold_id not in self._acted:
                report.actions.append(self._act(item))
                self._acted.add(item.hold_id)
        report.seconds["act"] = clock() - started
        return report

    def _charge_account(
        self, account: str, plan: _AccountPlan, jobs: dict[int, SqueueJob], now: datetime
    ) -> tuple[int, int, list[Exhausted], str | None]:
        """One account's charges and renewals in one transaction under its one lock, and its
        daily-cap check; (holds charged, leases renewed, exhausted, error)."""
        try:
            with self.sessions() as s:
                charged: dict[int, api.HoldState] = {}
                for usages in (plan.checkpoints, plan.dues):
                    if usages:
                        charged.update((h.id, h) for h in api.hold_usage_many(s, account, usages))
                exhausted = self._out_of_credit(account, list(charged.values()), jobs)
                renewed = 0
                if plan.renewals:
                    for renewal in api.renew_leases(s, account, plan.renewals):
                        if renewal.refused is None:
                            renewed += 1
                        elif renewal.hold.id in jobs:
                            exhausted.append(
                                self._exhausted(
                                    renewal.hold.id,
                                    account,
                                    renewal.hold.user,
                                    jobs,
                                    renewal.refused,
                                    renewal.reason,
                                )
                            )
                if plan.capped_id is not None and plan.running:
                    exhausted += self._over_daily_cap(s, account, plan, jobs, now)
        except LedgerError as exc:  # this account's tick is rolled back; the others go on
            return 0, 0, [], f"{exc.code}: {exc.message}"
        unique = {e.hold_id: e for e in reversed(exhausted)}  # one reason per job: the first
        return len(charged), renewed, sorted(unique.values(), key=lambda e: e.hold_id), None

    def _plan(
        self,
        holds: Sequence[api.ActiveRun],
        jobs: Mapping[int, SqueueJob],
        capped: Mapping[str, int],
        now: datetime,
        report: MeterTick,
    ) -> tuple[dict[str, _AccountPlan], set[str], list[tuple[int, int]]]:
        """Per account, what to post, renew and check; the accounts to sweep; and the
        holds whose job stopped or runs again (`api.set_accrual`)."""
        plan: dict[str, _AccountPlan] = {}
        expiring: set[str] = set()
        midnight, _ = day_bounds(now)
        checkpoints: list[tuple[int, str, Usage]] = []  # (charged seconds, account, usage)
        active: set[int] = set()
        seen_now: dict[int, int] = {}
        stops: list[tuple[int, int]] = []
        for hold in holds:
            active.add(hold.hold_id)
            expires = hold.expires_at <= now
            if expires:
                expiring.add(hold.account)
            job = jobs.get(hold.hold_id)
            if job is None or job.start is None:
                report.not_running += 1
                self._not_running(hold, expires, plan, stops)
                continue
            if hold.accrues_to_seconds != api.ACCRUES_NOW:
                stops.append((hold.hold_id, api.ACCRUES_NOW))  # seen running: its cost so far grows
            if hold.account in capped:
                account = plan.get(hold.account) or plan.setdefault(hold.account, _AccountPlan())
                account.capped_id = capped[hold.account]
                account.running.append(hold)
            elapsed_seconds = max(0, int((now - job.start).total_seconds()))
            due_seconds = elapsed_seconds - elapsed_seconds % self.interval_seconds
            if due_seconds > MAX_JOB_SECONDS:
                report.errors.append(f"hold {hold.hold_id}: job ran {due_seconds} s, beyond any job's limit")
                continue
            if due_seconds > 0:
                seen_now[hold.hold_id] = due_seconds
            if due_seconds <= hold.charged_seconds:
                report.not_due += 1
                continue
            if job.start < midnight:  # a day ended since the job started: charge its last second
                day_end = int((midnight - job.start).total_seconds()) - 1
                if hold.charged_seconds < day_end:
                    second = min(day_end, due_seconds)
                    checkpoints.append(
                        (
                            hold.charged_seconds,
                            hold.account,
                            (hold.hold_id, second, job.start + timedelta(seconds=second)),
                        )
                    )
            renew = hold.lease_seconds is not None and api.lease_needs_renewal(
                hold.rate_ucredits_per_hour,
                hold.amount_ucredits,
                due_seconds,
                hold.lease_seconds,
                hold.limit_seconds,
            )
            past_hold = (hold.lease_seconds is not None or due_seconds > hold.limit_seconds) and (
                api.charge_for(hold.rate_ucredits_per_hour, due_seconds) > hold.amount_ucredits
            )  # a full hold holds its whole limit: within it, the charge is covered
            if expires or renew or past_hold:
                usage = (hold.hold_id, due_seconds, job.start + timedelta(seconds=due_seconds))
                account = plan.get(hold.account) or plan.setdefault(hold.account, _AccountPlan())
                account.dues.append(usage)
                if renew:
                    account.renewals.append(usage)
            else:
                report.accruing += 1
        checkpoints.sort(key=lambda item: (item[0], item[2][0]))
        for _, account_name, usage in checkpoints[: self.max_checkpoints]:
            (plan.get(account_name) or plan.setdefault(account_name, _AccountPlan())).checkpoints.append(
                usage
            )
        self._seen = {h: seen for h, seen in self._seen.items() if h in active}
        self._seen.update(seen_now)
        return plan, expiring, stops

    def _not_running(
        self,
        hold: api.ActiveRun,
        expires: bool,
        plan: dict[str, _AccountPlan],
        stops: list[tuple[int, int]],
    ) -> None:
        """An active hold whose job squeue does not show running: its cost so far stops
        where the meter last saw it (the epilog or, if it never comes, the expiry charges).
        The meter cannot tell a finished job from a lost one; the bridge settles that."""
        last = self._seen.get(hold.hold_id, hold.charged_seconds)
        if hold.accrues_to_seconds == api.ACCRUES_NOW:
            stops.append((hold.hold_id, last))
        elif hold.accrues_to_seconds is not None:
            last = max(last, hold.accrues_to_seconds)
        if expires and last > hold.charged_seconds and hold.started_at is not None:
            at = as_utc(hold.started_at) + timedelta(seconds=last)
            plan.setdefault(hold.account, _AccountPlan()).dues.append((hold.hold_id, last, at))

    def _out_of_credit(
        self, account: str, charged: list[api.HoldState], jobs: dict[int, SqueueJob]
    ) -> list[Exhausted]:
        """Charged running holds the account cannot cover (the charge ran into debt)."""
        return [
            self._exhausted(
                hold.id,
                account,
                hold.user,
                jobs,
                "credit",
                f"account {account} is out of credit ({format_credits(hold.debt_ucredits)} credits "
                "of this run are unpaid); top up to run GPU jobs",
            )
            for hold in sorted(charged, key=lambda h: h.id)
            if hold.debt_ucredits > 0 and hold.id in jobs
        ]

    def _over_daily_cap(
        self, s: Session, account: str, plan: _AccountPlan, jobs: dict[int, SqueueJob], now: datetime
    ) -> list[Exhausted]:
        """Running holds whose user or account spent more than its daily cap today, running
        jobs' cost so far included."""
        assert plan.capped_id is not None
        found = []
        for over in api.daily_cap_overruns(s, plan.capped_id, {h.user for h in plan.running}, now):
            subject = f"user {over.user} in account {account}" if over.user else f"account {account}"
            text = (
                f"daily cap of {subject} reached ({format_credits(over.spent_ucredits)} of "
                f"{format_credits(over.cap_ucredits)} credits spent today)"
            )
            for hold in plan.running:
                if over.user is None or hold.user == over.user:
                    found.append(self._exhausted(hold.hold_id, account, hold.user, jobs, "daily_cap", text))
        return found

    @staticmethod
    def _exhausted(
        hold_id: int, account: str, user: str, jobs: Mapping[int, SqueueJob], cause: str, reason: str
    ) -> Exhausted:
        job = jobs[hold_id]
        return Exhausted(hold_id, account, user, job.key, _job_spec(job), cause, reason)

    def _act(self, item: Exhausted) -> Action:
        if self.on_exhausted == "notify":
            log.warning(
                "job %s (hold %d): %s; on_exhausted=notify, not cancelled",
                item.job_spec,
                item.hold_id,
                item.reason,
            )
            return Action(item.hold_id, item.job_spec, "notify")
        argvs = action_argvs(self.on_exhausted, item.job_spec, item.reason)
        errors: list[str] = []
        for argv in argvs:
            try:
                self.runner(argv)
            except SlurmCommandError as exc:  # e.g. the job ended meanwhile: say so, go on
                errors.append(str(exc))
        if errors:
            log.error(
                "job %s (hold %d): %s: %s", item.job_spec, item.hold_id, self.on_exhausted, "; ".join(errors)
            )
        else:
            log.warning(
                "job %s (hold %d) %s: %s", item.job_spec, item.hold_id, self.on_exhausted, item.reason
            )
        return Action(
            item.hold_id,
            item.job_spec,
            self.on_exhausted,
            tuple(tuple(a) for a in argvs),
            "; ".join(errors) or None,
        )

    # -- the loop

    def run(
        self,
        *,
        ticks: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Tick every interval (forever when `ticks` is None); a failed tick is logged and retried."""
        from sqlalchemy.exc import SQLAlchemyError

        done = 0
        while ticks is None or done < ticks:
            started = monotonic()
            try:
                report = self.tick()
            except SQLAlchemyError as exc:  # database down or busy: the next tick catches up
                log.error("meter tick failed: %s", exc)
            else:
                for error in report.errors:
                    log.error("meter: %s", error)
                log.info("meter tick: %s", report.as_dict())
            done += 1
            if ticks is None or done < ticks:
                sleep(max(0.0, self.interval_seconds - (monotonic() - started)))


@click.command("meter")
@click.option("--once", is_flag=True, help="Run one tick, print what it did, and exit.")
@click.option(
    "--interval",
    "interval_seconds",
    type=click.IntRange(min=1),
    default=None,
    metavar="S",
    help="Seconds between ticks (default: meter.interval_seconds, 30).",
)
@click.option(
    "--workers",
    type=click.IntRange(1, MAX_WORKERS),
    default=1,
    show_default=True,
    help="Accounts charged side by side (PostgreSQL; each uses a connection).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="Output format of --once.",
)
def meter_command(once: bool, interval_seconds: int | None, workers: int, fmt: str) -> None:
    """Count running jobs' cost so far, renew leases, act on holds that run out."""
    import json

    from accounting_bridge.slurm.backends import make_job_source
    from accounting_bridge.slurm.slurmcmd import SubprocessRunner
    from ledger.cli_support import transaction
    from ledger.config import load_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_config()
    runner = SubprocessRunner(config["slurm"]["bin_dir"])
    source: RunningJobs
    source, choice = make_job_source(runner, cluster=config["slurm"]["cluster"])
    if choice.kind != "pyslurm":
        source = CompactSqueue(runner, cluster=config["slurm"]["cluster"])
    log.info("running jobs from %s (%s)", choice.kind, choice.reason)
    try:
        meter = Meter.from_config(
            config,
            sessions=transaction,
            source=source,
            runner=runner,
            interval_seconds=interval_seconds,
            workers=workers,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if not once:
        meter.run()
        return
    report = meter.tick()
    if fmt == "json":
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        row = report.as_dict()
        for phase, seconds in row.pop("seconds").items():
            row[f"{phase}_seconds"] = seconds
        width = max(len(key) for key in row)
        for key, value in row.items():
            click.echo(f"{key.ljust(width)}  {value}")
    for error in report.errors:
        click.echo(f"error: {error}", err=True)
    for action in report.actions:
        if action.error:
            click.echo(f"error: cancel job {action.job_spec}: {action.error}", err=True)
    if report.errors or any(a.error for a in report.actions):
        raise SystemExit(1)
