"""A hold request (`HoldRequest`), the one value every way of taking a hold shares, and
the same request checked and normalised (`CheckedHoldRequest`), with the digest that
identifies its body: what `create_hold` and the batch's `create_holds` check before they
lock anything.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
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


@dataclass(frozen=True)
class HoldRequest:
    """One run's hold request as its caller states it: the account to charge, the user,
    the job run (`cluster`, `job_id`, `run`, and Slurm's SubmitTime of the attempt), its
    GPUs ("h100:2,a100:1" or a mapping) and time limit, and when the hold takes effect.

    The one value every way of taking a hold shares: `create_hold(s, request)`, a
    heterogeneous job's parts (`create_holds_together`), the daemon's batches
    (`create_holds`, `apply_holds_and_settles`), and the daemon's reading of a prolog's
    message. `started_at` is when the run began by the scheduler's clock (default `at`,
    which defaults to now); `lease_seconds` asks for a lease (ledger.holds.leases);
    `output_path` is the run's StdOut, which the portal shows its owner.
    """

    account: str
    user: str
    job_id: int
    gpus: str | dict[str, int]
    seconds: int | str
    cluster: str = "default"
    run: int = 0
    partition: str | None = None
    at: datetime | None = None
    grace_seconds: int = DEFAULT_GRACE_SECONDS
    started_at: datetime | None = None
    submitted_at: datetime | None = None
    output_path: str | None = None
    lease_seconds: int | None = None

    def checked(self) -> CheckedHoldRequest:
        """The request checked and normalised, with the digest that identifies its body
        (what a repeat for the same run must match), before anything is locked."""
        check_name(self.user, "user")
        gpu_map = parse_gpus(self.gpus)
        seconds = parse_seconds(self.seconds, field="seconds")
        if seconds < 1:  # a hold for no time holds nothing, and its rate would be unbounded by its amount
            raise InvalidInput(
                "seconds: a hold needs a time limit of at least 1 second",
                code="invalid_duration",
                details={"field": "seconds", "value": seconds, "minimum": 1},
            )
        check_job(self.job_id, self.run)
        body = {
            "account": self.account,
            "user": self.user,
            "gpus": format_gpus(gpu_map),
            "seconds": seconds,
            "partition": self.partition,
        }
        at = self.at or utcnow()
        return CheckedHoldRequest(
            **{field.name: getattr(self, field.name) for field in fields(HoldRequest)}
            | {
                "gpus": gpu_map,
                "seconds": seconds,
                "at": at,
                "submitted_at": submit_time(self.submitted_at),
                "digest": request_hash("hold", body),
                "lease_seconds": lease_window(seconds, self.lease_seconds),
            }
        )


@dataclass(frozen=True, kw_only=True)
class CheckedHoldRequest(HoldRequest):
    """A `HoldRequest` checked and normalised (`HoldRequest.checked`): GPUs as a mapping,
    the time limit in seconds, its effective and submit times set, the lease window it
    records, and the digest of its body."""

    gpus: dict[str, int]
    seconds: int
    at: datetime
    submitted_at: datetime
    digest: str

    @property
    def held_seconds(self) -> int:
        """The seconds the hold pays for: its lease window, or the whole time limit."""
        return self.seconds if self.lease_seconds is None else self.lease_seconds


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
