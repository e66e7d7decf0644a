"""The daemon's answer to job_submit.lua: accept with an estimate, or reject with the
cost, what is available and how to top up.

job_submit runs inside slurmctld under its locks, before Slurm validates the job,
so this never reserves and never touches the database: it quotes from the daemon's
in-memory picture of the ledger (:class:`ledger.api.Snapshot`), whose estimate is the
one `gpucredit quote` runs. This module only reads the request and words the answer.
The authoritative hold is PrologSlurmctld's.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from fractions import Fraction

from job_submit.pricing import PartitionTypes, credit_words, job_text, typed_gpus
from job_submit.request import InvalidRequest, JobRequest, parse_submit
from job_submit.route_answer import NoTimeLimit, answer_routed
from ledger.api import RoutingConfig, Snapshot
from ledger.errors import LedgerError, NotFound
from ledger.money import format_credits
from ledger.timeutil import utcnow

TAG = "gpucredit"
NO_TIME_LIMIT = "GPU jobs need a time limit to be priced: submit with -t [D-]HH:MM:SS"
NO_ROUTING = RoutingConfig({}, {})
# Slurm gives an --exclusive job every GPU of its nodes, asked for or not, and the
# prolog holds credit for them: said at submit, not priced (the nodes are not known yet).
EXCLUSIVE = (
    f"{TAG}: --exclusive gives this job every GPU of its node(s), and they are charged "
    "from when it starts; ask for GPUs with --gres to be quoted"
)


def submit(
    snapshot: Snapshot,
    fields: Mapping[str, object],
    *,
    parsed: JobRequest | InvalidRequest | None = None,
    now: datetime | None = None,
    top_up_hint: str,
    partition_types: PartitionTypes,
    routing: RoutingConfig = NO_ROUTING,
    warn_at_used_share: Fraction | None = None,
) -> dict[str, str]:
    """Decide on one submission. Returns {"decision": "accept"|"reject", "message": ...},
    and for a routed job (one with a cost limit or allowed to the cloud, see
    job_submit.route_answer) the "partition" and "comment" job_submit.lua sets.

    `top_up_hint` ends a refusal for credit; "{account}" in it becomes the account.
    `partition_types(partition)` is the GPU types the partition offers, or None while
    the daemon has not read them from Slurm yet (untyped GPUs are then estimated at
    the dearest priced type, and the message says so). An accepted job's message ends
    with a warning once its account has used `warn_at_used_share` of its credit.
    `parsed` is `parse(fields)`, when the caller has it; `now`, when the submission
    was read.
    """
    if parsed is None:
        parsed = parse(fields)
    if isinstance(parsed, InvalidRequest):
        return _reject(f"{parsed}")
    request = parsed
    if not request.gpus:
        if request.exclusive and partition_types(request.partition):
            return {"decision": "accept", "message": EXCLUSIVE}
        return {"decision": "accept", "message": ""}
    if request.account is None:
        return _reject("no account: submit with -A ACCOUNT")
    if request.time_limit_seconds is None:
        return _reject(NO_TIME_LIMIT)
    now = now or utcnow()
    try:
        named = [name.strip() for name in (request.partition or "").split(",") if name.strip()]
        limit = routing.limit_for(
            request.account,
            request.directives.get("max_cost"),
            _yes_no(request.directives.get("cloud")),
            names_cloud=routing.names_cloud(named),
            region=request.directives.get("region"),
        )
        if limit is None:
            not_offered = _not_offered(request, partition_types, snapshot.prices.gpu_types())
            if not_offered:
                return _reject(not_offered)
            decision = _estimate(snapshot, request, top_up_hint, partition_types, now)
        else:
            decision = answer_routed(
                snapshot,
                request,
                fields,
                limit,
                routing,
                top_up_hint=top_up_hint,
                partition_types=partition_types,
                now=now,
            )
        if decision["decision"] == "accept" and warn_at_used_share is not None:
            decision["message"] += _credit_warning(snapshot, request.account, warn_at_used_share, top_up_hint)
        return decision
    except NoTimeLimit:
        return _reject(NO_TIME_LIMIT)
    except NotFound:
        return _reject(
            f"account {request.account} has no GPU credit account; ask your admin "
            "to create it (gpucredit account import-slurm)"
        )
    except LedgerError as error:
        return _reject(error.message)


def parse(fields: Mapping[str, object]) -> JobRequest | InvalidRequest:
    """`parse_submit(fields)`, or the refusal it raised: what `submit` decides from."""
    try:
        return parse_submit(fields)
    except InvalidRequest as error:
        return error


def _estimate(
    snapshot: Snapshot,
    request: JobRequest,
    top_up_hint: str,
    partition_types: PartitionTypes,
    now: datetime,
) -> dict[str, str]:
    assert request.account is not None and request.time_limit_seconds is not None
    gpus, note = typed_gpus(snapshot, request, now, partition_types)
    seconds = request.time_limit_seconds
    estimate = snapshot.estimate(
        request.account,
        gpus,
        seconds,
        user=request.user,
        partition=request.partition,
        at=now,
        tasks=request.array_tasks,
    )
    cost = format_credits(estimate.cost_ucredits)
    available, only = credit_words(estimate, request.account)
    what = job_text(gpus, seconds, request.array_tasks)
    breach = estimate.limit_breach
    if breach is not None:
        return _reject(f"{breach.code}: {breach.message} (job: {what})")
    if not estimate.affordable:
        return _reject(
            f"this job would cost ~{cost} credits ({what}){note} but only {only}. "
            + top_up_hint.replace("{account}", request.account)
        )
    message = f"{TAG}: ~{cost} credits ({what}){note}, {available}"
    if estimate.limit_wait is not None:
        # Over a cap only beside what runs now: Slurm queues it, as it queues a job over
        # the caps `limits sync` writes; the prolog holds it until it fits.
        message += f"; it waits to start: {estimate.limit_wait.code}: {estimate.limit_wait.message}"
    return {"decision": "accept", "message": message}


def _not_offered(request: JobRequest, partition_types: PartitionTypes, priced: list[str]) -> str | None:
    """Why Slurm would refuse the job's (priced) GPU types, which gpucredit must not quote
    first (a quote that sbatch prints before its own refusal reads as an error), or None.
    Unknown until the daemon has read the partitions; every partition's types stand for
    the default partition and for a list of partitions. An unpriced type is the ledger's
    refusal to give."""
    offered = partition_types(request.partition)
    missing = sorted(
        t for t in request.gpus if t is not None and t in priced and offered is not None and t not in offered
    )
    if not missing or offered is None:
        return None
    wanted = "/".join(missing)
    if not request.partition:
        return f"no partition has {wanted} GPUs (GPU types here: {', '.join(offered) or 'none'})"
    return (
        f"partition {request.partition} has no {wanted} GPUs "
        f"(GPU types there: {', '.join(offered) or 'none'}); ask for a type it has"
    )


def _yes_no(value: str | None) -> bool | None:
    return None if value is None else value == "yes"


def _credit_warning(snapshot: Snapshot, account: str, share: Fraction, top_up_hint: str) -> str:
    """` physics has used 85% of its credit. Top up at ...` once `share` of it is used."""
    use = snapshot.credit_use(account)
    if not use.used_at_least(share):
        return ""
    return f". {account} has used {use.used_percent}% of its credit. " + top_up_hint.replace(
        "{account}", account
    )


def _reject(message: str) -> dict[str, str]:
    return {"decision": "reject", "message": f"{TAG}: {message}"}
