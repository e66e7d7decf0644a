"""A job a user asks for, checked once for the API and the New job page alike.

Bad input is an `InvalidInput` (422) whose message starts with the field's name and whose
details name it (`details["field"]`), so the API answers it and the form marks that field.
The quote is the ledger's (`ledger.api.quote`, and `ledger.api.route_quote` where the
site routes the job between on-premise and cloud); the sbatch command line shown to the
user is built by the same function that builds the submitter's argv
(`portal.jobs.submitter.sbatch_options`), so what the page shows is what runs.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from flask import Flask, current_app
from sqlalchemy.orm import Session

from ledger import api
from ledger.errors import InvalidInput, LedgerError
from ledger.jobs.retries import RetryPolicy
from ledger.jobs.staging import check_data_paths
from ledger.timeutil import parse_slurm_duration
from portal.auth import Principal, accounts_of
from portal.jobs.backend import JobSpec
from portal.jobs.submitter import CONTAINER, CONTAINER_WORDS, BadRequest, sbatch_options

MAX_SCRIPT_BYTES = 256 * 1024
MAX_CPUS = 4096
SLURM_TIME = r"^([0-9]{1,3}-)?[0-9]{1,2}:[0-9]{2}:[0-9]{2}$"
GPUS = r"^[A-Za-z0-9_.\-]{1,32}:[0-9]{1,3}$"
JOB_NAME = r"^[A-Za-z0-9_.\-]{1,64}$"
MEMORY = r"^[0-9]{1,9}[KMGT]?$"
MAX_COST = r"^[0-9]{1,13}(\.[0-9]{1,6})?$"
REGION = r"^[a-z][a-z0-9-]{0,31}$"
CLOUD = ("yes", "no")  # gpucredit:cloud= in the job's comment (docs/routing.md)
# What each optional text field must look like, and the words a refusal uses.
PATTERNS = {
    "name": (JOB_NAME, "must be 1 to 64 letters, digits, '_', '.' or '-'"),
    "memory": (MEMORY, "must be a number with an optional K, M, G or T (like 16G)"),
    "max_cost": (MAX_COST, "must be credits, like 25 or 12.5"),
    "region": (REGION, "must be a region name, like us-west-2"),
}
# The ledger's codes for a GPU request it cannot price: the gpus field's fault.
GPU_CODES = ("invalid_input", "unknown_gres", "invalid_gpus")


def refuse(field: str, message: str) -> InvalidInput:
    return InvalidInput(f"{field}: {message}", details={"field": field})


def check_script(script: str) -> None:
    if len(script.encode()) > MAX_SCRIPT_BYTES:
        raise refuse("script", f"is over {MAX_SCRIPT_BYTES} bytes")
    if not script.startswith("#!"):
        raise refuse("script", "must start with a #! line (like #!/bin/bash)")
    if "\0" in script:
        raise refuse("script", "must not hold NUL bytes")


def check_time_limit(limit: str) -> int:
    """The time limit in seconds."""
    if not re.fullmatch(SLURM_TIME, limit):
        raise refuse("time_limit", "must be [D-]HH:MM:SS")
    seconds = parse_slurm_duration(limit, field="time_limit")
    if seconds <= 0:
        raise refuse("time_limit", "must be more than zero")
    return seconds


def _check_options(body: dict[str, Any]) -> None:
    """The optional fields the API's schema also checks; the form has no schema."""
    if not re.fullmatch(GPUS, body["gpus"]):
        raise refuse("gpus", "must be TYPE:N, like h100:1")
    for field, (pattern, words) in PATTERNS.items():
        value = body.get(field)
        if value is not None and not re.fullmatch(pattern, value):
            raise refuse(field, words)
    cpus = body.get("cpus")
    whole = isinstance(cpus, int) and not isinstance(cpus, bool)
    if cpus is not None and (not whole or not 1 <= cpus <= MAX_CPUS):
        raise refuse("cpus", f"must be a whole number from 1 to {MAX_CPUS}")
    if body.get("cloud") is not None and body["cloud"] not in CLOUD:
        raise refuse("cloud", "must be yes or no")


def check_spec(body: dict[str, Any], *, script: bool = True) -> tuple[JobSpec, int]:
    """The job a body asks for, and its time limit in seconds; 422 naming the field.
    `script=False` checks everything but the script (the form's live quote sends none)."""
    if script:
        check_script(body["script"])
    seconds = check_time_limit(body["time_limit"])
    _check_options(body)
    working_dir = body.get("working_dir")
    if working_dir is not None and (
        not working_dir.startswith("/") or "\0" in working_dir or "\n" in working_dir
    ):
        raise refuse("working_dir", "must be an absolute path")
    container = body.get("container")
    if container is not None and not CONTAINER.fullmatch(container):
        raise refuse("container", CONTAINER_WORDS)
    for name in body.get("environment") or {}:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name) or name.startswith(
            ("SBATCH_", "SLURM_", "LD_", "GPUCREDIT_")
        ):
            raise refuse("environment", f"{name} may not be set")
    data = body.get("data")
    retry = body.get("retry")
    if retry is not None and not isinstance(retry, dict):
        raise refuse("retry", "must be an object: max, on, backoff_seconds")
    spec = JobSpec(
        account=body["account"],
        script=body.get("script", ""),
        gpus=body["gpus"],
        time_limit=body["time_limit"],
        name=body.get("name"),
        cpus=body.get("cpus"),
        memory=body.get("memory"),
        working_dir=working_dir,
        container=container,
        environment=dict(body.get("environment") or {}),
        max_cost=body.get("max_cost"),
        cloud=body.get("cloud"),
        region=body.get("region"),
        retry=None if retry is None else RetryPolicy.from_body(retry),
        data=() if data is None else check_data_paths(data),
    )
    return spec, seconds


def member_of(s: Session, who: Principal, account: str) -> None:
    if account not in accounts_of(s, who):
        raise refuse("account", f"{who.user} is not a member of account {account}")


def quote_spec(s: Session, spec: JobSpec, seconds: int) -> dict[str, Any]:
    """The ledger's quote for the job, with its placement under the site's routing when it
    is routed (`routing`: each partition's cost and verdict, as sbatch will word them); a
    GPU request it cannot price is the gpus field's."""
    cloud = None if spec.cloud is None else spec.cloud == "yes"
    try:
        quote = dict(api.quote(s, spec.account, spec.gpus, seconds))
        placement = api.route_quote(
            s,
            routing_of(current_app),
            spec.account,
            spec.gpus,
            seconds,
            max_cost=spec.max_cost,
            cloud=cloud,
            region=spec.region,
        )
    except LedgerError as error:
        if (error.details or {}).get("field") == "region":
            raise refuse("region", error.message.removeprefix("region: ")) from None
        if error.code in GPU_CODES:
            raise refuse("gpus", error.message) from None
        raise
    if placement is not None:
        quote["routing"] = placement
    return quote


def routing_of(app: Flask) -> api.RoutingConfig:
    """The site's partition tags and routing defaults, read once per app."""
    routing = app.extensions.get("gpucredit.routing")
    if routing is None:
        routing = app.extensions["gpucredit.routing"] = api.RoutingConfig.from_config(app.config["GPUCREDIT"])
    return routing


def sbatch_line(spec: JobSpec, script_name: str = "job.sh") -> str:
    """The sbatch command that submits `spec` from a shell, shell-quoted: the submitter's
    own options (its `-D` and environment aside, which the form does not set)."""
    try:
        options = sbatch_options(spec.as_request())
    except BadRequest as error:
        raise refuse(error.field, error.message) from None
    return shlex.join(["sbatch", *options, script_name])
