"""The daemon's side of the hooks: hold at PrologSlurmctld, settle at EpilogSlurmctld,
and release jobs that were held for lack of credit once their account can pay.

Runs inside `gpucredit daemon` (which owns the database), never in a hook process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from accounting_bridge.sacct import parse_squeue_json
from ledger import api
from ledger.errors import InvalidInput, LedgerError, NotFound
from ledger.timeutil import parse_time, utcnow
from slurm_hooks.hooks import HOLD_ADMIN_COMMENT
from slurm_hooks.scontrol import ScontrolParseError, parse_job

log = logging.getLogger("gpucredit.daemon")

Runner = Callable[[list[str]], str]


def hold(
    s: Session, request: Mapping[str, Any], *, grace_seconds: int, lease_seconds: int | None = None
) -> dict[str, Any]:
    """Reserve credit for one run, idempotently on (cluster, job_id, run); with
    `lease_seconds` (holds.mode = "lease") the hold covers that window (ledger.leases)."""
    account, arguments = _hold_arguments(request, grace_seconds, lease_seconds)
    return api.create_hold(s, account, **arguments).as_dict()


def _hold_arguments(
    request: Mapping[str, Any], grace_seconds: int, lease_seconds: int | None = None
) -> tuple[str, dict[str, Any]]:
    """The prolog's request as `create_hold`'s account and keyword arguments."""
    seconds = request.get("seconds")
    if seconds is None:
        raise InvalidInput(
            "this job has no time limit, so its cost cannot be bounded; resubmit with -t [D-]HH:MM:SS",
            code="invalid_duration",
        )
    gpus = {str(k): int(v) for k, v in dict(request.get("gpus") or {}).items()}
    return str(request["account"]), dict(
        user=str(request["user"]),
        job_id=int(request["job_id"]),
        gpus=gpus,
        seconds=int(seconds),
        cluster=str(request["cluster"]),
        run=int(request.get("run", 0)),
        partition=request.get("partition"),
        at=utcnow(),
        # Slurm's StartTime of this run, which the prolog sends: settle measures from it.
        started_at=_time(request.get("start")),
        # Slurm's SubmitTime of this attempt: a new job that reuses an old id is not the old job.
        submitted_at=_time(request.get("submit")),
        grace_seconds=grace_seconds,
        output_path=request.get("stdout") or None,
        lease_seconds=lease_seconds,
    )


def settle(s: Session, request: Mapping[str, Any]) -> dict[str, Any]:
    """Charge a run for Slurm's own start..end; the rest of its hold returns.

    EpilogSlurmctld of a requeued run already sees SLURM_JOB_RESTART_COUNT
    incremented (measured on 22.05), so the job's active hold is settled whatever
    run the epilog names; a repeat for an already settled run replays its result.
    """
    cluster, job_id, run = str(request["cluster"]), int(request["job_id"]), int(request.get("run", 0))
    submitted_at = _time(request.get("submit"))
    found = api.find_active_hold(s, cluster, job_id, submitted_at)
    found = found or _resolved_attempt(s, cluster, job_id, run, submitted_at)
    if found is None:
        raise NotFound(f"no hold for job {cluster}/{job_id} run {run}", details={"job_id": job_id})
    return api.settle_hold(s, found.id, *_settle_times(request, found)).as_dict()


def _settle_times(request: Mapping[str, Any], found: api.HoldState) -> tuple[int, datetime]:
    """The run's elapsed seconds and end. The hold started at Slurm's StartTime of this
    run (sent by the prolog); the epilog's own StartTime is unusable after `scontrol
    requeue` (it then equals the requeue time), so the hold's start is the one to trust."""
    end = _time(request.get("end")) or utcnow()
    return max(0, int((end - found.started_at).total_seconds())), end


Answer = tuple[Any, BaseException | None]


def apply_batch(
    s: Session,
    requests: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    grace_seconds: int,
    lease_seconds: int | None = None,
    locked: api.LockedBatch | None = None,
) -> list[Answer | None]:
    """The group commit's fast path: a batch's settles, then its holds, each set written in a
    few statements (ledger.hold_batch). Each request gets (its HoldState, None), (None, its
    refusal), or None: `hold` or `settle` answers it alone after this (repeats, limits, odd
    requests). The HoldState is worded for the reply (`reply_result`) by the daemon's socket
    thread, off the writer, which meanwhile starts the next batch."""
    answers: list[Answer | None] = [None] * len(requests)
    settles: list[tuple[int, tuple[str, int, datetime | None], Mapping[str, Any]]] = []
    holds: list[tuple[int, tuple[str, dict[str, Any]]]] = []
    for i, (op, request) in enumerate(requests):
        try:
            if op == "settle":
                attempt = (str(request["cluster"]), int(request["job_id"]), _time(request.get("submit")))
                settles.append((i, attempt, request))
            elif op == "hold":
                holds.append((i, _hold_arguments(request, grace_seconds, lease_seconds)))
        except LedgerError as error:
            answers[i] = (None, error)
        except (KeyError, TypeError, ValueError):
            continue  # the request alone says what is wrong with it
    attempts = [attempt for _, attempt, _ in settles]
    # The holds `lock_batch` read under the batch's locks, or a read of them now.
    found = api.active_holds_among(locked.holds, attempts) if locked else api.find_active_holds(s, attempts)
    due = [
        (i, hold, request) for (i, _, request), hold in zip(settles, found, strict=True) if hold is not None
    ]
    created, settled = api.apply_holds_and_settles(
        s,
        [arguments for _, arguments in holds],
        [(hold.id, *_settle_times(request, hold)) for _, hold, request in due],
        locked=locked.accounts if locked else None,
        read=[hold for _, hold, _ in due] if locked else None,
        prefetched=locked.reads if locked else None,
    )
    for (i, _, _), outcome in zip(due, settled, strict=True):
        answers[i] = _answer(outcome)
    for (i, _), outcome in zip(holds, created, strict=True):
        answers[i] = _answer(outcome)
    return answers


def _answer(outcome: api.HoldState | LedgerError | None) -> Answer | None:
    if outcome is None:
        return None
    if isinstance(outcome, LedgerError):
        return (None, outcome)
    return (outcome, None)


def reply_result(result: Any) -> Any:
    """A hold or settle's result as its reply says it: a HoldState (the fast path's)
    becomes its dict; the one-at-a-time path's is one already."""
    return result.as_dict() if isinstance(result, api.HoldState) else result


def _resolved_attempt(
    s: Session, cluster: str, job_id: int, run: int, submitted_at: datetime | None
) -> api.HoldState | None:
    """The hold a repeated epilog replays: its own attempt's (the epilog of a requeued run
    names the next run but still its own SubmitTime), never an older job's with the same
    id; without a submit time (an old client), the newest hold of that run."""
    holds = api.find_job_holds(s, cluster, job_id)
    if submitted_at is not None:
        return next((h for h in holds if h.submitted_at == submitted_at.replace(microsecond=0)), None)
    return next((h for h in holds if h.run == run), None)


def _time(value: Any) -> datetime | None:
    return None if value in (None, "") else parse_time(str(value))


def credit_held_jobs(run: Runner) -> set[int]:
    """Pending jobs that the prolog held for credit, marked in AdminComment (users cannot
    edit it).

    Read from `squeue --json`, where the mark is a field of its own: in scontrol's
    one-line text a user can write ` AdminComment=gpucredit-hold` into a job name, a work
    directory or a comment, and when the job has no real AdminComment the text cannot
    tell (docs/slurm-facts.md §13). A full dump of every job: the daemon runs it rarely.
    """
    result = parse_squeue_json(run(["squeue", "--json"]))
    for error in result.errors:
        log.warning("squeue --json: %s", error)
    return {
        job.job_id
        for job in result.jobs
        if job.state == "PENDING" and job.admin_comment == HOLD_ADMIN_COMMENT
    }


def release_if_affordable(
    session_factory: Callable[[], Any], run: Runner, job_id: int, marked: Callable[[], set[int]]
) -> str:
    """Release one credit-held job if its account can pay now.

    `marked()` returns the jobs `credit_held_jobs` finds held by us; it is asked only
    for a job that would be released (callers cache it per round, as it dumps every
    job). Returns 'released', 'waiting' (still held), or 'gone' (no longer held by us).
    The runner's errors propagate: the caller decides how to retry.
    """
    try:
        job = parse_job(run(["scontrol", "show", "job", "-d", "-o", str(job_id)]), job_id)
    except ScontrolParseError as error:
        log.warning("job %s: cannot read it (%s)", job_id, error)
        return "gone"
    # The text's AdminComment is only a cheap first filter (see credit_held_jobs).
    if job.state != "PENDING" or job.fields.get("AdminComment") != HOLD_ADMIN_COMMENT:
        return "gone"
    if not job.gpus or job.account is None or job.time_limit_seconds is None:
        return "waiting"
    try:
        with session_factory() as s, s.begin():
            quote = api.quote(s, job.account, job.gpus, job.time_limit_seconds, partition=job.partition)
    except (NotFound, InvalidInput) as error:
        log.warning("job %s: %s; left held", job_id, error)
        return "waiting"
    if not quote["affordable"]:
        return "waiting"
    if job_id not in marked():
        log.warning("job %s: its scontrol text names our hold, but squeue does not; left alone", job_id)
        return "gone"
    array_id, task_id = job.fields.get("ArrayJobId"), job.fields.get("ArrayTaskId")
    spec = f"{array_id}_{task_id}" if array_id and task_id else str(job_id)
    run(["scontrol", "update", f"jobid={spec}", "comment=", "admincomment="])
    run(["scontrol", "release", spec])
    log.info("job %s: account %s can pay %s now; released", spec, job.account, quote["cost"])
    return "released"
