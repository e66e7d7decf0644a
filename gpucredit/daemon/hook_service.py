"""The daemon's side of the hooks: hold at PrologSlurmctld, settle at EpilogSlurmctld,
and release jobs that were held for credit or a limit once their holds would be taken.

Runs inside `gpucredit daemon` (which owns the database), never in a hook process.

Releasing is decided by the hold's own rules (`api.hold_refusal`: the holds tried in a
SAVEPOINT and rolled back), never by a part of them: a job released because its account
could pay while a daily cap or spend rate still refused it was refused again at its
next start, requeued, released, ... every ~11 s, forever for a job over a cap on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from accounting_bridge.slurm.records import SqueueJob
from ledger import api
from ledger.errors import InvalidInput, LedgerError, NotFound
from ledger.timeutil import parse_time, utcnow
from slurm_hooks.hooks import HOLD_ADMIN_COMMENT

log = logging.getLogger("gpucredit.daemon")

Runner = Callable[[list[str]], str]


def hold(
    s: Session, request: Mapping[str, Any], *, grace_seconds: int, lease_seconds: int | None = None
) -> dict[str, Any]:
    """Reserve credit for one run, idempotently on (cluster, job_id, run); with
    `lease_seconds` (holds.mode = "lease") the hold covers that window (ledger.holds.leases)."""
    return api.create_hold(s, _hold_request(request, grace_seconds, lease_seconds)).as_dict()


def hold_together(
    s: Session, request: Mapping[str, Any], *, grace_seconds: int, lease_seconds: int | None = None
) -> dict[str, Any]:
    """Reserve credit for every part of a heterogeneous job, or refuse and reserve none
    (`request["parts"]`: one hold request each). Answered {"holds": [hold, ...]}."""
    parts = _parts(request, grace_seconds, lease_seconds)
    return {"holds": [hold.as_dict() for hold in api.create_holds_together(s, parts)]}


def _parts(
    request: Mapping[str, Any], grace_seconds: int, lease_seconds: int | None
) -> list[api.HoldRequest]:
    parts = request.get("parts")
    if not isinstance(parts, list) or not parts or not all(isinstance(p, Mapping) for p in parts):
        raise InvalidInput("hold_together needs 'parts': a list of hold requests", code="invalid_request")
    return [_hold_request(part, grace_seconds, lease_seconds) for part in parts]


def part_accounts(request: Mapping[str, Any]) -> set[str]:
    """The accounts a hold_together request names (the group commit locks them first)."""
    parts = request.get("parts")
    if not isinstance(parts, list):
        return set()
    return {p["account"] for p in parts if isinstance(p, Mapping) and isinstance(p.get("account"), str)}


def _hold_request(
    request: Mapping[str, Any], grace_seconds: int, lease_seconds: int | None = None
) -> api.HoldRequest:
    """The prolog's message as the ledger's hold request."""
    seconds = request.get("seconds")
    if seconds is None:
        raise InvalidInput(
            "this job has no time limit, so its cost cannot be bounded; resubmit with -t [D-]HH:MM:SS",
            code="invalid_duration",
        )
    gpus = {str(k): int(v) for k, v in dict(request.get("gpus") or {}).items()}
    return api.HoldRequest(
        str(request["account"]),
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
    few statements (ledger.holds.batch). Each request gets (its HoldState, None), (None, its
    refusal), or None: `hold` or `settle` answers it alone after this (repeats, limits, odd
    requests). The HoldState is worded for the reply (`reply_result`) by the daemon's socket
    thread, off the writer, which meanwhile starts the next batch."""
    answers: list[Answer | None] = [None] * len(requests)
    settles: list[tuple[int, tuple[str, int, datetime | None], Mapping[str, Any]]] = []
    holds: list[tuple[int, api.HoldRequest]] = []
    for i, (op, request) in enumerate(requests):
        try:
            if op == "settle":
                attempt = (str(request["cluster"]), int(request["job_id"]), _time(request.get("submit")))
                settles.append((i, attempt, request))
            elif op == "hold":
                holds.append((i, _hold_request(request, grace_seconds, lease_seconds)))
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
        [hold_request for _, hold_request in holds],
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


def held_jobs(jobs: Sequence[SqueueJob]) -> dict[str, list[SqueueJob]]:
    """The pending jobs the prolog held for credit or a limit, by the spec `scontrol
    release` takes: a heterogeneous job's parts together under its leader's id, an array
    task as ARRAYID_TASKID, else the job id.

    The mark is AdminComment as `squeue --json` has it, a field of its own: in scontrol's
    one-line text a user can write ` AdminComment=gpucredit-hold` into a job name, a work
    directory or a comment (docs/slurm-facts.md §13). A job held because its request
    could not be read carries another mark and is left to an admin.
    """
    held: dict[str, list[SqueueJob]] = {}
    marked = {job.het_job_id for job in jobs if job.het_job_id and _held_by_us(job)}
    for job in jobs:
        if job.het_job_id:
            if job.het_job_id in marked:
                held.setdefault(str(job.het_job_id), []).append(job)
        elif _held_by_us(job):
            spec = (
                f"{job.array_job_id}_{job.array_task_id}"
                if job.array_job_id is not None and job.array_task_id is not None
                else str(job.job_id)
            )
            held.setdefault(spec, []).append(job)
    return held


def _held_by_us(job: SqueueJob) -> bool:
    return job.state == "PENDING" and job.admin_comment == HOLD_ADMIN_COMMENT


def release_request(
    job: SqueueJob, typed: Callable[[Mapping[str, int], str | None], dict[str, int]]
) -> dict[str, Any]:
    """A held job's hold request as its prolog would send it, from what squeue says now
    (the user may have changed the job while it waited). `typed` prices untyped GPUs
    (Slurm picks their type only at allocation) as job_submit does: the dearest type."""
    gpus = dict(job.gpus or job.requested_gpus)
    return {
        "cluster": job.cluster,
        "job_id": job.job_id,
        "run": job.run,
        "account": job.account,
        "user": job.user,
        "partition": job.partition or None,
        "gpus": typed(gpus, job.partition or None),
        "seconds": job.time_limit_seconds,
        "submit": job.submit.strftime("%Y-%m-%dT%H:%M:%SZ") if job.submit else None,
    }


def hold_refusal(
    session_factory: Callable[[], Any],
    requests: Sequence[Mapping[str, Any]],
    *,
    grace_seconds: int,
    lease_seconds: int | None = None,
) -> LedgerError | None:
    """What the prolog would be told now for these parts: None when their holds would be
    taken (nothing is written either way)."""
    try:
        parts = _parts({"parts": list(requests)}, grace_seconds, lease_seconds)
    except LedgerError as error:
        return error
    with session_factory() as s, s.begin():
        return api.hold_refusal(s, parts)


def release(run: Runner, spec: str) -> None:
    """Clear our mark and the reason, then release: the prolog runs again and holds."""
    run(["scontrol", "update", f"jobid={spec}", "comment=", "admincomment="])
    run(["scontrol", "release", spec])
