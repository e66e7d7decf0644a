"""The daemon's answer to job_submit.lua: accept with an estimate, or reject with the
cost, what is available and how to top up.

job_submit runs inside slurmctld under its locks, before Slurm validates the job,
so this never reserves and never touches the database: it quotes from the daemon's
in-memory picture of the ledger (:class:`ledger.api.Snapshot`), whose estimate is the
one `gpucredit quote` runs. This module only reads the request and words the answer.
The authoritative hold is PrologSlurmctld's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from job_submit.request import InvalidRequest, JobRequest, parse_submit
from ledger.api import Snapshot
from ledger.errors import LedgerError, NotFound
from ledger.money import format_credits
from ledger.timeutil import utcnow

TAG = "gpucredit"


def describe_duration(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        minutes = seconds // 60
        return f"{minutes // 60} h {minutes % 60} min" if minutes > 60 else f"{minutes} min"
    return f"{seconds} s"


def _gpu_text(gpus: Mapping[str, int]) -> str:
    return " + ".join(f"{n}×{gres}" for gres, n in sorted(gpus.items()))


def submit(
    snapshot: Snapshot,
    fields: Mapping[str, object],
    *,
    top_up_hint: str,
    partition_types: Callable[[str | None], list[str] | None],
) -> dict[str, str]:
    """Decide on one submission. Returns {"decision": "accept"|"reject", "message": ...}.

    `top_up_hint` ends a refusal for credit; "{account}" in it becomes the account.
    `partition_types(partition)` is the GPU types the partition offers, or None while
    the daemon has not read them from Slurm yet (untyped GPUs are then estimated at
    the dearest priced type, and the message says so).
    """
    try:
        request = parse_submit(fields)
    except InvalidRequest as error:
        return _reject(f"{error}")
    if not request.gpus:
        return {"decision": "accept", "message": ""}
    if request.account is None:
        return _reject("no account: submit with -A ACCOUNT")
    if request.time_limit_seconds is None:
        return _reject("GPU jobs need a time limit to be priced: submit with -t [D-]HH:MM:SS")
    try:
        return _estimate(snapshot, request, top_up_hint, partition_types)
    except NotFound:
        return _reject(
            f"account {request.account} has no GPU credit account; ask your admin "
            "to create it (gpucredit account import-slurm)"
        )
    except LedgerError as error:
        return _reject(error.message)


def _estimate(
    snapshot: Snapshot,
    request: JobRequest,
    top_up_hint: str,
    partition_types: Callable[[str | None], list[str] | None],
) -> dict[str, str]:
    assert request.account is not None and request.time_limit_seconds is not None
    now = utcnow()
    gpus, note = _typed_gpus(snapshot, request, now, partition_types)
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
    available = format_credits(estimate.available_ucredits)
    what = f"{_gpu_text(gpus)} × {describe_duration(seconds)}"
    if request.array_tasks > 1:
        what += f", × {request.array_tasks} tasks"
    breach = estimate.limit_breach
    if breach is not None:
        return _reject(f"{breach.code}: {breach.message} (job: {what})")
    if not estimate.affordable:
        return _reject(
            f"this job would cost ~{cost} credits ({what}){note} but only "
            f"{available} are available in {request.account}. "
            + top_up_hint.replace("{account}", request.account)
        )
    return {
        "decision": "accept",
        "message": f"{TAG}: ~{cost} credits ({what}){note}, {available} available in {request.account}",
    }


def _typed_gpus(
    snapshot: Snapshot,
    request: JobRequest,
    now: datetime,
    partition_types: Callable[[str | None], list[str] | None],
) -> tuple[dict[str, int], str]:
    """Untyped GPUs are estimated at the most expensive type the partition offers
    (every priced type while the partitions are not known yet)."""
    typed = {g: n for g, n in request.gpus.items() if g is not None}
    untyped = request.gpus.get(None, 0)
    if not untyped:
        return typed, ""
    offered = partition_types(request.partition)
    candidates = offered if offered is not None else snapshot.prices.gpu_types()
    dearest = snapshot.prices.dearest(candidates, request.partition, now)
    if dearest is None:
        raise LedgerError(
            "no priced GPU type in this partition; ask for a type, e.g. --gres=gpu:a100:1",
            code="unknown_gres",
        )
    typed[dearest] = typed.get(dearest, 0) + untyped
    if offered is None:
        return typed, (
            f"; untyped GPUs estimated as {dearest}, the dearest priced type "
            "(partitions not read from Slurm yet)"
        )
    return typed, f"; untyped GPUs estimated as {dearest}, the dearest type here"


def _reject(message: str) -> dict[str, str]:
    return {"decision": "reject", "message": f"{TAG}: {message}"}
