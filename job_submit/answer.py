"""The daemon's answer to job_submit.lua: accept with an estimate, or reject with the
cost, what is available and how to top up.

job_submit runs inside slurmctld under its locks, before Slurm validates the job,
so this never reserves and never touches the database: it quotes from the daemon's
in-memory Snapshot. The authoritative hold is PrologSlurmctld's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from job_submit.request import InvalidRequest, JobRequest, parse_submit
from job_submit.snapshot import Snapshot
from ledger.errors import LedgerError, NotFound
from ledger.money import charge_for, format_credits, format_rate
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
    partition_types: Callable[[str | None], list[str]],
) -> dict[str, str]:
    """Decide on one submission. Returns {"decision": "accept"|"reject", "message": ...}."""
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
    partition_types: Callable[[str | None], list[str]],
) -> dict[str, str]:
    assert request.account is not None and request.time_limit_seconds is not None
    now = utcnow()
    gpus, note = _typed_gpus(snapshot, request, now, partition_types)
    seconds = request.time_limit_seconds
    rate = snapshot.rate_for(gpus, request.partition, now)
    per_task = charge_for(rate, seconds)
    cost = per_task * request.array_tasks
    available_u = snapshot.available_in(request.account)
    available = format_credits(available_u)
    what = f"{_gpu_text(gpus)} × {describe_duration(seconds)}"
    if request.array_tasks > 1:
        what += f", × {request.array_tasks} tasks"
    refusal = _static_limit_refusal(
        snapshot, request.account, request.user, sum(gpus.values()), rate, per_task
    )
    if refusal:
        return _reject(f"{refusal} (job: {what})")
    if cost > available_u:
        return _reject(
            f"this job would cost ~{format_credits(cost)} credits ({what}){note} but only "
            f"{available} are available in {request.account}. {top_up_hint}"
        )
    return {
        "decision": "accept",
        "message": f"{TAG}: ~{format_credits(cost)} credits ({what}){note}, {available} available "
        f"in {request.account}",
    }


def _typed_gpus(
    snapshot: Snapshot,
    request: JobRequest,
    now: datetime,
    partition_types: Callable[[str | None], list[str]],
) -> tuple[dict[str, int], str]:
    """Untyped GPUs are estimated at the most expensive type the partition offers."""
    typed = {g: n for g, n in request.gpus.items() if g is not None}
    untyped = request.gpus.get(None, 0)
    if not untyped:
        return typed, ""
    priced = [(snapshot.price_at(g, request.partition, now), g) for g in partition_types(request.partition)]
    known = [(p, g) for p, g in priced if p is not None]
    if not known:
        raise LedgerError(
            "no priced GPU type in this partition; ask for a type, e.g. --gres=gpu:a100:1",
            code="unknown_gres",
        )
    _price, dearest = max(known)
    typed[dearest] = typed.get(dearest, 0) + untyped
    return typed, f"; untyped GPUs estimated as {dearest}, the dearest type here"


def _static_limit_refusal(
    snapshot: Snapshot, account: str, user: str, gpus: int, rate: int, cost: int
) -> str | None:
    """Caps this job breaks on its own, whatever else runs (the prolog checks the rest)."""
    for who, scope in ((user, f"user {user}"), (None, "the account")):
        limits = snapshot.limits_for(account, who)
        if limits.max_gpus is not None and gpus > limits.max_gpus:
            return f"concurrent_gpus: {gpus} GPUs exceed the cap of {limits.max_gpus} for {scope}"
        cap_rate = limits.max_rate_ucredits_per_second
        if cap_rate is not None and rate > cap_rate * 3600:
            return (
                f"spend_rate: {format_rate(rate)}/s exceeds the cap of {format_rate(cap_rate * 3600)}/s "
                f"for {scope}"
            )
        if limits.daily_cap_ucredits is not None and cost > limits.daily_cap_ucredits:
            return (
                f"daily_cap: {format_credits(cost)} credits exceed the daily cap of "
                f"{format_credits(limits.daily_cap_ucredits)} for {scope}"
            )
    return None


def _reject(message: str) -> dict[str, str]:
    return {"decision": "reject", "message": f"{TAG}: {message}"}
