"""`gpucredit bridge meter`: running time becomes provisional charges every N seconds.

One tick (DESIGN §3 step 3):

1. ``squeue --json`` (through a job source) lists the running jobs; one query lists
   the active holds.
2. Every active hold whose attempt is RUNNING (:func:`running_holds`: same cluster,
   job id and restart count, and the hold was taken with the attempt's submit time)
   is due ``now - start`` seconds, rounded down to the interval. Holds already charged
   that far are skipped; the rest are charged per account, one transaction and one
   account lock each (:func:`ledger.api.hold_usage_many`). A charge is
   ``charge_for(rate, cumulative seconds)`` rounded once, so the ticks never drift
   from the epilog's final settle.
3. Holds past time limit + grace are expired (:func:`ledger.api.sweep`, for the
   accounts that have one), so a lost epilog never strands credit.
4. A hold just charged that its account cannot cover (the charge ran into debt), or
   whose user or account is over its daily cap, gets ``meter.on_exhausted``:
   ``cancel`` (the job's comment says why, then ``scancel``) or ``notify`` (a log line).

Holds of jobs that squeue does not show running are left to the epilog and the
bridge's reconciliation: the meter cannot tell a finished job from a lost one.

Why round the due seconds down to the interval: the cumulative target then depends
on the job, not on when the tick ran, so a restarted meter or two meters during a
failover post the same target, and the ledger ignores a target a hold already reached.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import click
from sqlalchemy.orm import Session

from accounting_bridge.sacct import SqueueJob, SqueueResult
from accounting_bridge.slurmcmd import Runner, SlurmCommandError
from ledger import api
from ledger.errors import LedgerError
from ledger.money import format_credits
from ledger.timeutil import MAX_JOB_SECONDS, format_time, utcnow
from slurmtext import comment_text

__all__ = [
    "ACTIONS",
    "MAX_ACTIVE_HOLDS",
    "Action",
    "Exhausted",
    "Meter",
    "MeterTick",
    "RunningJobs",
    "cancel_argvs",
    "meter_command",
    "renew_leases",
    "running_holds",
]

log = logging.getLogger(__name__)

ACTIONS = ("cancel", "notify")
# Concurrent account transactions per tick (each holds one database connection).
MAX_WORKERS = 32
# Active holds one tick reads; past it the newest holds wait (and the tick says so).
MAX_ACTIVE_HOLDS = 200_000

Sessions = Callable[[], AbstractContextManager[Session]]


class RunningJobs(Protocol):
    """The part of a job source the meter needs (CommandsSource, PyslurmSource, a fake)."""

    def running_jobs(self) -> SqueueResult: ...


@dataclass(frozen=True)
class Exhausted:
    """A running job whose hold cannot go on being charged, and why (in words for its owner)."""

    hold_id: int
    account: str
    user: str
    job_key: tuple[str, int, int]
    job_spec: str  # what scancel takes: 42, or 6_0 for an array task (6 alone is the whole array)
    cause: str  # "credit" | "daily_cap"
    reason: str


@dataclass(frozen=True)
class Action:
    hold_id: int
    job_spec: str
    kind: str  # "cancel" | "notify"
    argvs: tuple[tuple[str, ...], ...] = ()
    error: str | None = None


@dataclass
class MeterTick:
    """What one tick did, and where its time went (seconds per phase)."""

    at: datetime
    running_jobs: int = 0
    active_holds: int = 0
    charged: int = 0
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
            "not_due": self.not_due,
            "not_running": self.not_running,
            "accounts": self.accounts,
            "expired": len(self.expired),
            "exhausted": len(self.exhausted),
            "cancelled": sum(1 for a in self.actions if a.kind == "cancel" and a.error is None),
            "errors": len(self.errors),
            "seconds": {k: round(v, 4) for k, v in self.seconds.items()},
        }


def renew_leases(s: Session, account: str, charged: list[api.HoldState], now: datetime) -> list[Exhausted]:
    """Seam for lease mode (DESIGN §4 `lease`); not implemented.

    It will run inside each account's tick transaction, under that account's lock,
    after the charges: for each charged hold, reserve the next lease window
    (rate × `holds.lease_seconds`) from free credit, and return the holds whose
    renewal was refused (credit, daily cap) so the meter applies `meter.on_exhausted`.
    Until then `Meter.from_config` refuses `holds.mode = "lease"`, so no site runs
    leases that nobody renews (overspend would be unbounded, not rate × window).
    """
    raise NotImplementedError("lease mode: hold renewal is not implemented yet")


def cancel_argvs(job_spec: str, reason: str) -> list[list[str]]:
    """The comment first, so the owner sees why in `squeue -o %k`/`sacct -o Comment`; then scancel."""
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
    for hold in holds:
        job = running.get((hold.cluster, hold.job_id, hold.run))
        if job is not None and job.submit is not None and hold.submitted_at == job.submit:
            own.add(job.key)
    matched: dict[int, SqueueJob] = {}
    for hold in holds:
        job = running.get((hold.cluster, hold.job_id, hold.run))
        if job is None:
            continue
        if hold.submitted_at == api.UNKNOWN_SUBMIT:
            if job.key not in own:
                matched[hold.hold_id] = job
        elif job.submit is not None and hold.submitted_at == job.submit:
            matched[hold.hold_id] = job
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
        renew: Callable[[Session, str, list[api.HoldState], datetime], list[Exhausted]] | None = None,
        workers: int = 1,
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
        self.renew = renew
        # Accounts are independent (one lock each), so their transactions can run side by side;
        # on SQLite there is one writer and more workers only wait.
        if not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"workers must be 1..{MAX_WORKERS}, got {workers!r}")
        self.workers = workers
        # Holds already acted on: a job being cancelled may still show RUNNING next tick.
        self._acted: set[int] = set()

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
        mode = config["holds"]["mode"]
        if mode != "full":
            raise ValueError(
                f"holds.mode = {mode!r}: the meter renews no leases yet (see renew_leases); use 'full'"
            )
        return cls(
            sessions=sessions,
            source=source,
            runner=runner,
            interval_seconds=interval_seconds or int(config["meter"]["interval_seconds"]),
            on_exhausted=str(config["meter"]["on_exhausted"]),
            workers=workers,
        )

    # -- one tick

    def tick(self) -> MeterTick:
        now = self.clock()
        report = MeterTick(at=now)
        clock = time.perf_counter
        started = clock()
        try:
            squeue = self.source.running_jobs()
        except SlurmCommandError as exc:  # no charges this tick; expiry does not need squeue
            report.errors.append(f"squeue: {exc}")
            squeue = None
        report.seconds["squeue"] = clock() - started
        running: dict[tuple[str, int, int], SqueueJob] = {}
        if squeue is not None:
            report.errors.extend(f"squeue line {e.line_no}: {e.reason}" for e in squeue.errors)
            running = {j.key: j for j in squeue.jobs if j.state == "RUNNING" and j.start is not None}
        report.running_jobs = len(running)

        started = clock()
        with self.sessions() as s:
            holds = api.list_active_runs(s, limit=MAX_ACTIVE_HOLDS)
        if len(holds) == MAX_ACTIVE_HOLDS:
            report.errors.append(f"more than {MAX_ACTIVE_HOLDS} active holds; the newest wait a tick")
        report.active_holds = len(holds)
        jobs = running_holds(holds, running)
        plan, expiring = self._plan(holds, jobs, now, report)
        report.seconds["load"] = clock() - started

        started = clock()
        accounts = sorted(plan)
        if self.workers > 1 and len(accounts) > 1:
            with ThreadPoolExecutor(self.workers, thread_name_prefix="meter") as pool:
                outcomes = list(pool.map(lambda a: self._charge_account(a, plan[a], jobs, now), accounts))
        else:
            outcomes = [self._charge_account(a, plan[a], jobs, now) for a in accounts]
        for account, (charged_count, exhausted, error) in zip(accounts, outcomes, strict=True):
            if error is not None:
                report.errors.append(f"account {account}: {error}")
                continue
            report.accounts += 1
            report.charged += charged_count
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
        self,
        account: str,
        usages: list[tuple[int, int, datetime | None]],
        jobs: dict[int, SqueueJob],
        now: datetime,
    ) -> tuple[int, list[Exhausted], str | None]:
        """One account's charges in one transaction under its one lock; (charged, exhausted, error)."""
        try:
            with self.sessions() as s:
                charged = api.hold_usage_many(s, account, usages)
                exhausted = self._exhausted(s, account, charged, jobs, now)
                if self.renew is not None:
                    exhausted += self.renew(s, account, charged, now)
        except LedgerError as exc:  # this account's tick is rolled back; the others go on
            return 0, [], f"{exc.code}: {exc.message}"
        return len(charged), exhausted, None

    def _plan(
        self,
        holds: Sequence[api.ActiveRun],
        jobs: Mapping[int, SqueueJob],
        now: datetime,
        report: MeterTick,
    ) -> tuple[dict[str, list[tuple[int, int, datetime | None]]], set[str]]:
        """Per account, the (hold, due seconds, effective time) to charge; and accounts to sweep."""
        plan: dict[str, list[tuple[int, int, datetime | None]]] = {}
        expiring: set[str] = set()
        for hold in holds:
            if hold.expires_at <= now:
                expiring.add(hold.account)
            job = jobs.get(hold.hold_id)
            if job is None or job.start is None:
                report.not_running += 1
                continue
            elapsed_seconds = max(0, int((now - job.start).total_seconds()))
            due_seconds = elapsed_seconds - elapsed_seconds % self.interval_seconds
            if due_seconds <= hold.charged_seconds:
                report.not_due += 1
                continue
            if due_seconds > MAX_JOB_SECONDS:
                report.errors.append(f"hold {hold.hold_id}: job ran {due_seconds} s, beyond any job's limit")
                continue
            at = job.start + timedelta(seconds=due_seconds)
            plan.setdefault(hold.account, []).append((hold.hold_id, due_seconds, at))
        return plan, expiring

    def _exhausted(
        self,
        s: Session,
        account: str,
        charged: list[api.HoldState],
        jobs: dict[int, SqueueJob],
        now: datetime,
    ) -> list[Exhausted]:
        """Charged holds the account cannot cover, or whose user/account is over its daily cap."""
        if not charged:
            return []
        reasons: dict[int, tuple[str, str]] = {}
        for hold in charged:
            if hold.debt_ucredits > 0:
                reasons[hold.id] = (
                    "credit",
                    f"account {account} is out of credit ({format_credits(hold.debt_ucredits)} credits "
                    "of this run are unpaid); top up to run GPU jobs",
                )
        overruns = api.daily_cap_overruns(s, charged[0].account_id, {h.user for h in charged}, now)
        for over in overruns:
            subject = f"user {over.user} in account {account}" if over.user else f"account {account}"
            text = (
                f"daily cap of {subject} reached ({format_credits(over.spent_ucredits)} of "
                f"{format_credits(over.cap_ucredits)} credits spent today)"
            )
            for hold in charged:
                if hold.id not in reasons and (over.user is None or hold.user == over.user):
                    reasons[hold.id] = ("daily_cap", text)
        by_id = {h.id: h for h in charged}
        return [
            Exhausted(
                hold_id=hold_id,
                account=account,
                user=by_id[hold_id].user,
                job_key=jobs[hold_id].key,
                job_spec=_job_spec(jobs[hold_id]),
                cause=cause,
                reason=reason,
            )
            for hold_id, (cause, reason) in sorted(reasons.items())
        ]

    def _act(self, item: Exhausted) -> Action:
        if self.on_exhausted == "notify":
            log.warning(
                "job %s (hold %d): %s; on_exhausted=notify, not cancelled",
                item.job_spec,
                item.hold_id,
                item.reason,
            )
            return Action(item.hold_id, item.job_spec, "notify")
        argvs = cancel_argvs(item.job_spec, item.reason)
        errors: list[str] = []
        for argv in argvs:
            try:
                self.runner(argv)
            except SlurmCommandError as exc:  # e.g. the job ended meanwhile: say so, go on
                errors.append(str(exc))
        if errors:
            log.error("job %s (hold %d): cancel: %s", item.job_spec, item.hold_id, "; ".join(errors))
        else:
            log.warning("job %s (hold %d) cancelled: %s", item.job_spec, item.hold_id, item.reason)
        return Action(
            item.hold_id,
            item.job_spec,
            "cancel",
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
    """Turn running jobs' time into provisional charges; act on holds that run out."""
    import json

    from accounting_bridge.backends import make_job_source
    from accounting_bridge.slurmcmd import SubprocessRunner
    from ledger.cli_support import transaction
    from ledger.config import load_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_config()
    runner = SubprocessRunner(config["slurm"]["bin_dir"])
    source, choice = make_job_source(runner, cluster=config["slurm"]["cluster"])
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
