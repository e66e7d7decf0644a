"""A hold request, checked and normalised, with the digest that identifies its body:
what `create_hold` and the batch's `create_holds` check before they lock anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ledger.books.accounts import check_name
from ledger.books.idempotency import request_hash
from ledger.errors import InvalidInput
from ledger.pricing.prices import format_gpus, parse_gpus
from ledger.store.models import UNKNOWN_SUBMIT
from ledger.timeutil import parse_seconds, utcnow

DEFAULT_GRACE_SECONDS = 600
MAX_JOB_ID = 2**53


def check_job(job_id: int, run: int) -> None:
    if not isinstance(job_id, int) or isinstance(job_id, bool) or not 0 < job_id < MAX_JOB_ID:
        raise InvalidInput(
            f"job id {job_id!r} must be a positive whole number",
            code="invalid_job",
            details={"job_id": job_id},
        )
    if not isinstance(run, int) or isinstance(run, bool) or run < 0:
        raise InvalidInput(f"run {run!r} must be a whole number >= 0", code="invalid_job")


def submit_time(submitted_at: datetime | None) -> datetime:
    if submitted_at is None:
        return UNKNOWN_SUBMIT
    if submitted_at.tzinfo is None:
        raise InvalidInput("the attempt's submit time must carry a time zone", code="invalid_time")
    # Slurm's times are whole seconds; a fraction would make a repeat look like a new job.
    return submitted_at.replace(microsecond=0)


@dataclass
class HoldRequest:
    """A hold request, checked and normalised, with the digest that identifies its body."""

    account: str
    user: str
    gpus: dict[str, int]
    seconds: int
    cluster: str
    job_id: int
    run: int
    partition: str | None
    at: datetime
    grace_seconds: int
    started_at: datetime | None
    submitted_at: datetime
    output_path: str | None
    digest: str
    lease_seconds: int | None = None  # lease mode's window (see lease_window); None: a full hold

    @property
    def held_seconds(self) -> int:
        """The seconds the hold pays for: its lease window, or the whole time limit."""
        return self.seconds if self.lease_seconds is None else self.lease_seconds


def hold_request(
    account_name: str,
    *,
    user: str,
    job_id: int,
    gpus: str | dict[str, int],
    seconds: int | str,
    cluster: str = "default",
    run: int = 0,
    partition: str | None = None,
    at: datetime | None = None,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
    started_at: datetime | None = None,
    submitted_at: datetime | None = None,
    output_path: str | None = None,
    lease_seconds: int | None = None,
) -> HoldRequest:
    check_name(user, "user")
    gpu_map = parse_gpus(gpus)
    seconds = parse_seconds(seconds, field="seconds")
    if seconds < 1:  # a hold for no time holds nothing, and its rate would be unbounded by its amount
        raise InvalidInput(
            "seconds: a hold needs a time limit of at least 1 second",
            code="invalid_duration",
            details={"field": "seconds", "value": seconds, "minimum": 1},
        )
    check_job(job_id, run)
    body = {
        "account": account_name,
        "user": user,
        "gpus": format_gpus(gpu_map),
        "seconds": seconds,
        "partition": partition,
    }
    return HoldRequest(
        account_name,
        user,
        gpu_map,
        seconds,
        cluster,
        job_id,
        run,
        partition,
        at or utcnow(),
        grace_seconds,
        started_at,
        submit_time(submitted_at),
        output_path,
        request_hash("hold", body),
        lease_window(seconds, lease_seconds),
    )


def lease_window(limit_seconds: int, lease_seconds: int | None) -> int | None:
    """The lease window a new hold records (ledger.holds.leases): None, a full hold, when no
    lease is asked for or the window would cover the whole time limit anyway."""
    if lease_seconds is None:
        return None
    if not isinstance(lease_seconds, int) or isinstance(lease_seconds, bool) or lease_seconds < 1:
        raise InvalidInput(
            f"lease_seconds must be a whole number >= 1, got {lease_seconds!r}", code="invalid_lease"
        )
    return lease_seconds if lease_seconds < limit_seconds else None
