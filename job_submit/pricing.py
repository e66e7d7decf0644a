"""What job_submit prices a job's GPUs as, and how it describes them, for the plain
estimate (`job_submit.answer`) and the routed one (`job_submit.route_answer`) alike."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from job_submit.request import JobRequest
from ledger.api import Estimate, Snapshot
from ledger.errors import LedgerError
from ledger.money import format_credits

# The GPU types a partition offers, as the daemon last read them (None: not read yet).
PartitionTypes = Callable[[str | None], list[str] | None]


def describe_duration(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        minutes = seconds // 60
        return f"{minutes // 60} h {minutes % 60} min" if minutes > 60 else f"{minutes} min"
    return f"{seconds} s"


def gpu_text(gpus: Mapping[str, int]) -> str:
    return " + ".join(f"{n}×{gres}" for gres, n in sorted(gpus.items()))


def job_text(gpus: Mapping[str, int], seconds: int, tasks: int) -> str:
    """`2×h100 × 2 h`, with `, × 3 tasks` for an array."""
    text = f"{gpu_text(gpus)} × {describe_duration(seconds)}"
    return text + (f", × {tasks} tasks" if tasks > 1 else "")


def typed_gpus(
    snapshot: Snapshot, request: JobRequest, now: datetime, partition_types: PartitionTypes
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


def credit_words(estimate: Estimate, account: str) -> tuple[str, str]:
    """What the account has, as an accepted job's message says it and as a refusal's
    "but only ..." does: "20.00 available in grpc" / "20.00 are available in grpc", or, with
    a parent's pool, "0.00 in grpc + 20.00 from dept's pool" for both."""
    own = format_credits(estimate.available_ucredits)
    if estimate.pool.lender is not None:
        lent = format_credits(estimate.pool.ucredits)
        pooled = f"{own} in {account} + {lent} from {estimate.pool.lender}'s pool"
        return pooled, pooled
    return f"{own} available in {account}", f"{own} are available in {account}"
