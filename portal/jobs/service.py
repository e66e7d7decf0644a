"""What the API and the job pages do with jobs, once: who sees a job, who may cancel it
or read its output, submitting and cancelling through the backend, and a job's money
from the ledger.

The access rule is the portal's one (`portal.auth.accounts_of` / `own_user`): members
see their own jobs, managers their account's, admins all; a job the principal may not
see is "does not exist". A job's own user, its account's managers and admins may cancel
it: the submitter runs scancel as the job's own user (Slurm lets a user cancel their
own jobs; a manager need not be a Slurm coordinator), and the portal's log names who
asked. Only its own user may read its output (`portal.pages.output`'s rule: the file
is theirs). Costs are the ledger's figures (`ledger.api.cost_so_far`, a
hold's charge); nothing here prices anything.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from flask import Flask, current_app
from sqlalchemy.orm import Session

from ledger import api
from ledger.errors import NotFound
from ledger.jobs.retries import JobRetries, keep_retry_policy, policies_of
from ledger.jobs.staging import bind_job_data, forget_job_data, job_data, keep_job_data
from ledger.money import format_credits
from ledger.timeutil import format_time, utcnow
from portal.auth import Forbidden, Principal, accounts_of, own_user
from portal.jobs.backend import JobBackend, JobSpec, SlurmJob, SubmitterBackend
from portal.jobs.rest import RefusedBySlurm, RestBackend, words_of_refusal
from portal.jobs.spec import member_of, quote_spec
from portal.pages.output import output_tail
from portal.store import transaction

log = logging.getLogger("gpucredit.portal.jobs")

MAX_JOB_ID = 4294967293  # Slurm's ids are 32-bit; above are its NO_VAL markers
DEFAULT_SOCKET = "/run/gpucredit/submitter.sock"
DEFAULT_SLURMRESTD = "http://127.0.0.1:6820"
LIVE_STATES = ("queued", "running")  # the states scancel acts on
MANAGING = ("manager", "admin")  # the roles that may cancel anyone's job in the account


def backend_of(app: Flask) -> JobBackend:
    """The app's job backend: one set in app.extensions (tests), else the config's
    (`[portal] jobs_backend`: "submitter", the default, or "slurmrestd")."""
    backend = app.extensions.get("gpucredit.jobs_backend")
    if backend is None:
        config = app.config["GPUCREDIT"]
        portal = config["portal"]
        bin_dir = str(config.get("slurm", {}).get("bin_dir", "/usr/bin"))
        if portal.get("jobs_backend", "submitter") == "slurmrestd":
            url = str(portal.get("slurmrestd_url") or DEFAULT_SLURMRESTD)
            key = portal.get("jwt_key")  # else the submitter signs, which alone reads the key
            signer = None if key else str(portal.get("submitter_socket") or DEFAULT_SOCKET)
            uids = (int(portal.get("jobs_min_uid", 1000)), int(portal.get("jobs_max_uid", 59999)))
            backend = RestBackend(
                url, str(key) if key else None, bin_dir, min_uid=uids[0], max_uid=uids[1], signer=signer
            )
        else:
            backend = SubmitterBackend(str(portal.get("submitter_socket") or DEFAULT_SOCKET), bin_dir)
        app.extensions["gpucredit.jobs_backend"] = backend
    return backend


def _cluster() -> str:
    return str(current_app.config["GPUCREDIT"].get("slurm", {}).get("cluster", "lab"))


def visible(s: Session, who: Principal, job: SlurmJob) -> bool:
    return _sees(accounts_of(s, who), who, job)


def _sees(roles: dict[str, str], who: Principal, job: SlurmJob) -> bool:
    """The rule, given `who`'s roles (read once for a whole list)."""
    role = roles.get(job.account)
    return role is not None and own_user(role, who) in (None, job.user)


def may_cancel(who: Principal, job: SlurmJob, role: str | None) -> bool:
    """Whether `who`, whose role in the job's account is `role`, may cancel `job` now:
    while it is queued or running (a finished job has nothing to cancel)."""
    return job.state in LIVE_STATES and may_stop(who, job, role)


def may_stop(who: Principal, job: SlurmJob, role: str | None) -> bool:
    """Whether `who` may cancel `job` at all: its own user, a manager of its account, an admin."""
    return job.user == who.user or role in MANAGING


def find_job(s: Session, who: Principal, job_id: int) -> SlurmJob:
    job = backend_of(current_app).job(job_id) if 1 <= job_id <= MAX_JOB_ID else None
    if job is None or not visible(s, who, job):
        raise NotFound(f"job {job_id} does not exist", details={"job_id": job_id})
    return job


def visible_jobs(s: Session, who: Principal, account: str | None = None) -> list[SlurmJob]:
    """The jobs `who` may see, newest first; in one of their accounts when `account` is given."""
    roles = accounts_of(s, who)
    if account is not None and account not in roles:
        raise NotFound(f"account {account} does not exist", details={"account": account})
    accounts: Sequence[str] | None = [account] if account else (None if who.is_admin else list(roles))
    return [job for job in backend_of(current_app).jobs(accounts) if _sees(roles, who, job)]


def submit(
    who: Principal, spec: JobSpec, seconds: int, key: str | None, body: dict[str, Any]
) -> dict[str, Any]:
    """Submit `spec` as `who` (a member of its account) after the ledger's quote; a repeat
    of `key` with the same body returns the first result and submits nothing. A refusal
    (sbatch's, or a 422 here) keeps no result, so a retry submits."""
    keyed_body = {**body, "user": who.user}
    with transaction() as s:
        member_of(s, who, spec.account)
        first = api.first_result(s, spec.account, key, "job_submit", keyed_body)
        if first is not None:
            return first
        quote = quote_spec(s, spec, seconds)
        # Kept before sbatch, bound after: a job that starts at once finds its paths pending.
        data_id = keep_job_data(s, _cluster(), who.user, spec.data, utcnow()) if spec.data else None
    try:
        submitted = backend_of(current_app).submit(who.user, spec)
    except RefusedBySlurm as refused:  # slurmrestd keeps job_submit's words to itself
        _forget(data_id)
        cap = None
        if "routing" not in quote:
            with transaction() as s:
                cap = api.cap_refusal(s, spec.account, who.user, spec.gpus, seconds)
        raise words_of_refusal(quote, refused, cap) from None
    except BaseException:
        _forget(data_id)
        raise
    result = {"job_id": submitted.job_id, "state": "queued", "quote": quote, "message": submitted.message}
    with transaction() as s:
        if spec.retry is not None:  # its user and time tell this job from an older one of its id
            keep_retry_policy(s, _cluster(), submitted.job_id, who.user, spec.retry, utcnow())
            result["retry"] = spec.retry.as_dict()
        if data_id is not None:  # staged by a cloud node's Prolog, which asks for them by job
            bind_job_data(s, data_id, submitted.job_id)
            result["data"] = list(spec.data)
        api.keep_result(s, spec.account, key, "job_submit", keyed_body, result)
    return result


def _forget(data_id: int | None) -> None:
    if data_id is not None:
        with transaction() as s:
            forget_job_data(s, data_id)


def cancel(who: Principal, job_id: int, now: datetime) -> dict[str, Any]:
    """Cancel a job `who` may stop (403 for another member's it may see: none is, since a
    member sees only their own); the job right after. Cancelling a finished job changes
    nothing."""
    with transaction() as s:
        job = find_job(s, who, job_id)
        role = accounts_of(s, who).get(job.account)
    if not may_stop(who, job, role):
        raise Forbidden(
            f"only {job.user} or a manager of {job.account} may cancel job {job_id}",
            details={"job_id": job_id},
        )
    backend = backend_of(current_app)
    if may_cancel(who, job, role):
        backend.cancel(job.user, job_id)  # scancel as the job's own user
        if job.user != who.user:
            log.info("job %s of %s in %s cancelled by %s (%s)", job_id, job.user, job.account, who.user, role)
    with transaction() as s:
        return job_view(s, backend.job(job_id) or job, now)


def output_lines(who: Principal, job_id: int, lines: int) -> list[str] | None:
    """The last `lines` lines of the job's output for its own user (403 for another's it
    may see); None when there is no file the rule lets it show."""
    with transaction() as s:
        job = find_job(s, who, job_id)
        holds = job_holds(s, job)
    return tail_of(who, job, holds, lines)


def tail_of(who: Principal, job: SlurmJob, holds: list[api.HoldState], lines: int) -> list[str] | None:
    """The output tail of a job `who` may see, from its latest run that names a file."""
    if job.user != who.user:
        raise Forbidden(
            f"only {job.user} may read the output of job {job.job_id}", details={"job_id": job.job_id}
        )
    path = next((h.output_path for h in reversed(holds) if h.output_path), None)
    tail = output_tail(path, who.user, lines)
    return None if tail is None else tail.split("\n")


def job_holds(s: Session, job: SlurmJob) -> list[api.HoldState]:
    """The ledger's holds of this job, by run. Ids are reused, and a requeue moves the
    job's SubmitTime: its holds are its account's newest run of that id and the runs
    before it (runs count up from 0 within one job), as long as that newest run started
    after the job's (latest) submission or is one of the runs before the current one."""
    holds = [
        h
        for h in api.find_job_holds(s, _cluster(), job.job_id)
        if h.account == job.account and h.user == job.user
    ]
    holds.sort(key=lambda h: (h.started_at is None, h.started_at, h.run))
    chain: list[api.HoldState] = []
    for hold in reversed(holds):
        if chain and hold.run >= chain[-1].run:
            break
        chain.append(hold)
    if not chain:
        return []
    newest, after = chain[0], job.submitted_at
    current = after is None or newest.started_at is None or newest.started_at >= after
    return sorted(chain, key=lambda h: h.run) if current or newest.run < (job.restarts or 0) else []


def retries_of(s: Session, jobs: Sequence[SlurmJob]) -> dict[int, JobRetries]:
    """The retry policies of these jobs that have one (an older job's of the same id is
    not theirs), in two reads."""
    known = {job.job_id: (job.user, job.submitted_at, job.restarts) for job in jobs if job.submitted_at}
    return policies_of(s, _cluster(), known)


def job_view(
    s: Session, job: SlurmJob, now: datetime, retries: Mapping[int, JobRetries] | None = None
) -> dict[str, Any]:
    """A job as the API and the pages show it: Slurm's state and reason, the ledger's
    cost (so far while it runs, then final), its attempts with their charges and its
    retry policy. `retries`: a whole page's (`retries_of`), else this job's is read."""
    retry = (retries if retries is not None else retries_of(s, [job])).get(job.job_id)
    holds = job_holds(s, job)
    cost = 0
    attempts = []
    for hold in holds:
        active = hold.state == "active"
        charged = api.cost_so_far(hold, now) if active else hold.charged_ucredits
        cost += charged
        record = api.job_record(s, hold.id)
        attempts.append(
            {
                "run": hold.run,
                "state": "running" if active else record.status,
                "started_at": format_time(hold.started_at),
                "ended_at": None if active else format_time(hold.resolved_at),
                "charged": format_credits(charged),
                "refunded": "node_fail_refund" in record.flags.split(","),
            }
        )
    latest = holds[-1] if holds else None
    running = job.state == "running"
    return {
        "job_id": job.job_id,
        "account": job.account,
        "user": job.user,
        "state": job.state,
        "reason": job.reason,
        "partition": job.partition,
        "gpus": latest.gpus if latest else None,
        "time_limit": _duration(job.time_limit_seconds),
        "submitted_at": format_time(job.submitted_at),
        "started_at": format_time(job.started_at),
        "ended_at": format_time(job.ended_at),
        "cost": format_credits(cost),
        "estimated_total": format_credits(latest.amount_ucredits) if running and latest else None,
        "attempts": attempts,
        "retry": None if retry is None else retry.as_dict(),
        "data": _data_of(s, job),
    }


def _data_of(s: Session, job: SlurmJob) -> dict[str, Any] | None:
    """The paths the job asked to have staged and each stage-in made (the newest kept for
    its id by its user: a reused id's older job of the same user may show its own)."""
    kept = job_data(s, _cluster(), [job.job_id]).get(job.job_id)
    return None if kept is None or kept.user != job.user else kept.as_dict()


def _duration(seconds: int | None) -> str | None:
    if seconds is None:
        return None
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text
