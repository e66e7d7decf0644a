"""Jobs: submit, list, read, cancel, and read the output of a job, for the token's user.

A job is submitted as the token's own Unix user through the backend
(`portal.jobs.backend`: on Slurm 22.05 the root submitter runs the user's own sbatch),
so it passes job_submit.lua like any sbatch: the same quote, refusal and hold. The API
checks what it can first (a shebang, a priced GPU type, a time limit, membership, the
script's size) and refuses with 422 naming the field; job_submit's refusal comes back
with the ledger's code (402 `insufficient_credits`, 429 for a limit) and sbatch's words.
Nothing is submitted on any refusal.

Who sees which job is the portal's one rule (`portal.auth.accounts_of` / `own_user`):
members their own jobs, managers their account's, admins all. Whoever sees a job may
cancel it (scancel runs as the job's own user); only its own user may read its output
(the output rule is `portal.pages.output`'s).
"""

from __future__ import annotations

from typing import Any

from ledger.timeutil import utcnow
from portal.api.registry import Call, body_schema, endpoint
from portal.api.schemas import GPUS, NAME, nullable, obj
from portal.jobs import service
from portal.jobs.spec import GPUS as GPUS_PATTERN
from portal.jobs.spec import JOB_NAME, MAX_COST, MAX_CPUS, MAX_SCRIPT_BYTES, MEMORY, REGION, check_spec
from portal.store import transaction

USERS = ("user", "admin")
MAX_OUTPUT_LINES = 1000
API_STATES = ("queued", "running", "completed", "failed", "cancelled", "timeout", "node_fail", "preempted")

RETRY_POLICY = {
    "type": "object",
    "description": "requeue the job when it exits with one of these codes, up to max times, waiting "
    "backoff_seconds doubled each time (at most an hour); each attempt is charged as a run of its own",
    "required": ["max", "on"],
    "additionalProperties": False,
    "properties": {
        "max": {"type": "integer", "minimum": 1, "maximum": 10},
        "on": {
            "type": "array",
            "minItems": 1,
            "maxItems": 17,
            "items": {"type": "string", "pattern": r"^(node_fail|exit:[1-9][0-9]{0,2})$"},
            "example": ["node_fail", "exit:75"],
        },
        "backoff_seconds": {"type": "integer", "minimum": 0, "maximum": 3600, "default": 60},
    },
}
RETRY = nullable(
    obj(
        ["max", "on", "backoff_seconds", "done", "retries"],
        {
            "max": {"type": "integer"},
            "on": {"type": "array", "items": {"type": "string"}},
            "backoff_seconds": {"type": "integer"},
            "done": {"type": "integer", "description": "retries decided so far"},
            "retries": {
                "type": "array",
                "items": obj(
                    ["after_run", "cause", "not_before"],
                    {
                        "after_run": {"type": "integer"},
                        "cause": {"type": "string"},
                        "not_before": {"type": "string", "format": "date-time"},
                    },
                ),
            },
        },
    )
)
SUBMIT = body_schema(
    ["account", "script", "gpus", "time_limit"],
    {
        "account": NAME,
        "script": {
            "type": "string",
            "description": f"the batch script, #! first; at most {MAX_SCRIPT_BYTES} bytes",
        },
        "gpus": {**GPUS, "pattern": GPUS_PATTERN, "example": "h100:1"},
        "time_limit": {"type": "string", "description": "[D-]HH:MM:SS", "example": "02:00:00"},
        "name": {"type": "string", "pattern": JOB_NAME},
        "cpus": {"type": "integer", "minimum": 1, "maximum": MAX_CPUS},
        "memory": {"type": "string", "pattern": MEMORY, "description": "like 16G"},
        "max_cost": {"type": "string", "pattern": MAX_COST, "description": "credits"},
        "cloud": {
            "type": "string",
            "enum": ["yes", "no"],
            "description": "may it run in a cloud partition (docs/routing.md); default: the account's",
        },
        "region": {
            "type": "string",
            "pattern": REGION,
            "description": "the only cloud region it may run in (docs/routing.md); default: the account's",
        },
        "working_dir": {
            "type": "string",
            "maxLength": 4096,
            "description": "absolute; default: the user's home",
        },
        "environment": {
            "type": "object",
            "additionalProperties": {"type": "string", "maxLength": 65536},
            "maxProperties": 64,
        },
        "container": {
            "type": "string",
            "maxLength": 4096,
            "description": "an OCI bundle directory (config.json and rootfs/), absolute: the script "
            "runs in it (sbatch --container; the site's oci.conf names the runtime)",
        },
        "retry": RETRY_POLICY,
        "data": {
            "type": "array",
            "items": {"type": "string", "maxLength": 1024},
            "minItems": 1,
            "maxItems": 32,
            "description": "absolute paths a cloud node copies, as the job's user, before the job "
            "starts (docs/api.md, Data)",
        },
    },
)
SUBMIT["example"] = {
    "account": "physics",
    "script": "#!/bin/bash\npython train.py\n",
    "gpus": "h100:1",
    "time_limit": "02:00:00",
}
TIME_OR_NULL = nullable({"type": "string", "format": "date-time"})
ATTEMPT = obj(
    ["run", "state", "started_at", "ended_at", "charged", "refunded"],
    {
        "run": {"type": "integer"},
        "state": {"type": "string"},
        "started_at": TIME_OR_NULL,
        "ended_at": TIME_OR_NULL,
        "charged": {"type": "string"},
        "refunded": {"type": "boolean"},
    },
)
JOB = obj(
    ["job_id", "account", "user", "state", "reason", "cost", "attempts"],
    {
        "job_id": {"type": "integer"},
        "account": {"type": "string"},
        "user": {"type": "string"},
        "state": {"type": "string", "enum": list(API_STATES)},
        "reason": nullable({"type": "string", "description": "why a queued job waits, in plain words"}),
        "partition": nullable({"type": "string"}),
        "gpus": nullable({"type": "string"}),
        "time_limit": nullable({"type": "string"}),
        "submitted_at": TIME_OR_NULL,
        "started_at": TIME_OR_NULL,
        "ended_at": TIME_OR_NULL,
        "cost": {"type": "string", "description": "the ledger's charge so far, then final"},
        "estimated_total": nullable({"type": "string"}),
        "attempts": {"type": "array", "items": ATTEMPT},
        "retry": RETRY,
        "data": nullable(
            {
                "type": "object",
                "description": "the paths it asked to have staged, and each stage-in: run, node, "
                "files, bytes, seconds, error, at",
            }
        ),
    },
)
SUBMITTED = obj(
    ["job_id", "state", "quote", "message"],
    {
        "job_id": {"type": "integer"},
        "state": {"type": "string", "enum": ["queued"]},
        "quote": {"type": "object"},
        "message": {"type": "string", "description": "job_submit's words, as sbatch printed them"},
        "retry": {**RETRY_POLICY, "required": ["max", "on", "backoff_seconds"]},
    },
)
PAGE = obj(
    ["items", "next_cursor"],
    {"items": {"type": "array", "items": JOB}, "next_cursor": nullable({"type": "string"})},
)
OUTPUT = obj(
    ["job_id", "lines"],
    {"job_id": {"type": "integer"}, "lines": {"type": "array", "items": {"type": "string"}}},
)


@endpoint(
    "POST",
    "/jobs",
    tag="jobs",
    summary="Submit a job",
    roles=USERS,
    body=SUBMIT,
    idempotency="optional",
    errors=(402, 503),
    responses={201: SUBMITTED},
)
def submit_job(call: Call) -> Any:
    """Submit a batch job as the token's user: sbatch through job_submit.lua, so the quote,
    a refusal and the hold are sbatch's. Refused with 422 naming the field (no #!, an
    unpriced GPU type, a bad time limit, not a member, a script over the cap), 402
    `insufficient_credits` or 429 (`concurrent_gpus`, `spend_rate`, `daily_cap`) with
    sbatch's figures; nothing is submitted on a refusal. A repeat with the same
    Idempotency-Key returns the first job."""
    spec, seconds = check_spec(call.body)
    return service.submit(call.principal, spec, seconds, call.idempotency_key, call.body), 201


@endpoint(
    "GET",
    "/jobs",
    tag="jobs",
    summary="List jobs",
    roles=USERS,
    query={"account": NAME, "state": {"type": "string", "enum": list(API_STATES)}},
    paginated=True,
    errors=(404, 503),
    responses={200: PAGE},
)
def list_jobs(call: Call) -> Any:
    """Jobs newest first (queued and running from squeue, ended ones of the last 30 days
    from sacct): a member's own, every job of the accounts they manage, every job for an
    admin. The cursor is the last job id of the previous page."""
    state = call.query.get("state")
    now = utcnow()
    with transaction() as s:
        jobs = [
            job
            for job in service.visible_jobs(s, call.principal, call.query.get("account"))
            if (state is None or job.state == state)
            and (call.page.cursor is None or job.job_id < call.page.cursor)
        ]
        shown = jobs[: call.page.limit]
        retries = service.retries_of(s, shown)
        items = [service.job_view(s, job, now, retries) for job in shown]
    more = len(jobs) > call.page.limit
    return {"items": items, "next_cursor": str(shown[-1].job_id) if more else None}


@endpoint(
    "GET",
    "/jobs/{job_id}",
    tag="jobs",
    summary="Read a job",
    roles=USERS,
    errors=(503,),
    responses={200: JOB},
)
def show_job(call: Call, job_id: int) -> Any:
    """One job: its state (a queued job's reason in plain words), its cost from the ledger
    (so far while it runs, then final) and its attempts with their charges."""
    with transaction() as s:
        return service.job_view(s, service.find_job(s, call.principal, job_id), utcnow())


@endpoint(
    "DELETE",
    "/jobs/{job_id}",
    tag="jobs",
    summary="Cancel a job",
    roles=USERS,
    errors=(503,),
    responses={200: JOB},
)
def cancel_job(call: Call, job_id: int) -> Any:
    """Cancel a job: the token's user's own, or any in an account they manage (an admin:
    any), by scancel as the job's own user. A queued job costs nothing, a running one is
    settled to the second by the epilog. Answers the job as Slurm shows it right after."""
    return service.cancel(call.principal, job_id, utcnow())


@endpoint(
    "GET",
    "/jobs/{job_id}/output",
    tag="jobs",
    summary="Read a job's output",
    roles=USERS,
    query={"lines": {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUT_LINES}},
    errors=(503,),
    responses={200: OUTPUT},
)
def job_output(call: Call, job_id: int) -> Any:
    """The last `lines` lines (default 50) of the job's output file, while it runs too;
    for the job's own user only, from a regular file that user owns (never a symlink)."""
    lines = service.output_lines(call.principal, job_id, call.query.get("lines", 50))
    return {"job_id": job_id, "lines": lines or []}
