"""Retries of jobs submitted through the portal: the policy, kept at submit, and each
retry the daemon decides (docs/api.md, "Retries").

A policy names the failures it retries on (`exit:N`, N 1-255: the script's own way to
say "transient"; `node_fail`: a node died under the run), how many retries it allows,
and the first wait. Slurm requeues a node failure itself (a job with a policy is
submitted `--requeue`) and the failed run is refunded; a policy that names `node_fail`
counts those retries against its `max` and waits its backoff, and past `max` the job is
cancelled. A start the prolog parked while the ledger was unreachable needs no policy:
the daemon releases it once a hold can be taken.

The n-th retry waits backoff_seconds x 2^(n-1), at most an hour. The daemon's retry
keeper (gpucredit/daemon/retry_keeper.py) records a retry, keyed by the run that failed,
before it acts: a decision is taken once, and a keeper that stopped between recording and
acting acts again on its next pass. No money moves here: each attempt is a run of its
own, with its own hold and charge.

Slurm reuses a job id once its state is lost or MaxJobId wraps, and moves a job's
SubmitTime to each requeue; so a policy is the job's when the job is the same user's and
was *first* submitted at most `CLOCK_SLACK` after the policy was kept and at most
`KEPT_WITHIN` before it (the portal keeps it once sbatch has returned; two hosts'
clocks). The first submission is the job's SubmitTime while it has never been requeued,
else its run-0 hold's (taken before any requeue). A requeued job with no run-0 hold (its
first start refused by the prolog) falls back to its SubmitTime now: kept at most
`MAX_JOB_LIFE` before it. A job of a reused id was first submitted after the policy was
kept; what is left open is such a job, requeued, without a run-0 hold of its own while
the old job's is there.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeGuard

from sqlalchemy import select
from sqlalchemy.orm import Session

from ledger.errors import InvalidInput
from ledger.store.tables import holds_t, retries_t, retry_policies_t
from ledger.timeutil import format_time

__all__ = [
    "NODE_FAIL",
    "JobRetries",
    "RetryPolicy",
    "job_retries",
    "keep_retry_policy",
    "names_node_fail",
    "policies_of",
    "record_retry",
    "retried_run_ends",
]

MAX_RETRIES = 10
MAX_EXIT_CODES = 16  # retry_on holds them comma-joined in 512 characters
MAX_BACKOFF_SECONDS = 3600
DEFAULT_BACKOFF_SECONDS = 60
CLOCK_SLACK = timedelta(seconds=60)
KEPT_WITHIN = timedelta(minutes=10)
MAX_JOB_LIFE = timedelta(days=30)
NODE_FAIL = "node_fail"  # the policy's word for a run Slurm ended NODE_FAIL (and requeued)
_EXIT = re.compile(r"exit:([1-9][0-9]{0,2})")


def _refuse(field: str, message: str) -> InvalidInput:
    return InvalidInput(f"{field}: {message}", details={"field": field})


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int
    on: tuple[str, ...]
    backoff_seconds: int = DEFAULT_BACKOFF_SECONDS

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> RetryPolicy:
        """The API's `retry` object: {"max": N, "on": [...], "backoff_seconds"?: S}; bad
        input is an InvalidInput naming the field (retry.max, retry.on, ...)."""
        unknown = sorted(set(body) - {"max", "on", "backoff_seconds"})
        if unknown:
            raise _refuse(f"retry.{unknown[0]}", "is not a retry setting (max, on, backoff_seconds)")
        most = body.get("max")
        if not _whole(most) or not 1 <= most <= MAX_RETRIES:
            raise _refuse("retry.max", f"must be a whole number from 1 to {MAX_RETRIES}")
        on = body.get("on")
        if not isinstance(on, list) or not on or not all(isinstance(f, str) for f in on):
            raise _refuse("retry.on", "must list the failures to retry on, like node_fail or exit:75")
        if len(set(on) - {NODE_FAIL}) > MAX_EXIT_CODES:
            raise _refuse("retry.on", f"lists more than {MAX_EXIT_CODES} exit codes")
        for failure in on:
            exit_code = _EXIT.fullmatch(failure)
            if failure != NODE_FAIL and (exit_code is None or int(exit_code[1]) > 255):
                raise _refuse("retry.on", f"{failure!r} is not node_fail or exit:1..255")
        backoff = body.get("backoff_seconds", DEFAULT_BACKOFF_SECONDS)
        if not _whole(backoff) or not 0 <= backoff <= MAX_BACKOFF_SECONDS:
            raise _refuse("retry.backoff_seconds", f"must be whole seconds from 0 to {MAX_BACKOFF_SECONDS}")
        return cls(most, tuple(dict.fromkeys(on)), backoff)

    def covers(self, failure: str) -> bool:
        return failure in self.on

    def wait_before(self, retry: int) -> timedelta:
        """The wait before the `retry`-th retry (1-based): doubling, at most an hour."""
        return timedelta(seconds=min(self.backoff_seconds * 2 ** (retry - 1), MAX_BACKOFF_SECONDS))

    def as_dict(self) -> dict[str, Any]:
        return {"max": self.max_retries, "on": list(self.on), "backoff_seconds": self.backoff_seconds}


@dataclass(frozen=True)
class Retry:
    run: int  # the run that failed
    cause: str
    not_before: datetime
    ended_at: datetime | None = None  # when that run ended, as slurmctld said before the requeue


@dataclass(frozen=True)
class JobRetries:
    """A job's policy and the retries decided so far, by run."""

    policy_id: int
    user: str
    policy: RetryPolicy
    kept_at: datetime
    retries: tuple[Retry, ...]

    def belongs_to(self, user: str, first_submitted_at: datetime) -> bool:
        """Whether this policy was kept for the job of its id that `user` first submitted
        at `first_submitted_at` (see the module's docstring)."""
        return (
            user == self.user
            and first_submitted_at - CLOCK_SLACK <= self.kept_at <= first_submitted_at + KEPT_WITHIN
        )

    @property
    def submitted_since(self) -> datetime:
        """The earliest its job's first submission can be (`belongs_to`): every run of the
        job, and none of an older job of the same id, came since."""
        return self.kept_at - KEPT_WITHIN

    @property
    def left(self) -> int:
        return self.policy.max_retries - len(self.retries)

    def for_run(self, run: int) -> Retry | None:
        return next((r for r in self.retries if r.run == run), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.policy.as_dict(),
            "done": len(self.retries),
            "retries": [
                {"after_run": r.run, "cause": r.cause, "not_before": format_time(r.not_before)}
                for r in self.retries
            ],
        }


def keep_retry_policy(
    s: Session, cluster: str, job_id: int, user: str, policy: RetryPolicy, now: datetime
) -> None:
    """Keep `policy` for the job just submitted as `job_id`."""
    s.execute(
        retry_policies_t.insert().values(
            cluster=cluster,
            job_id=job_id,
            user=user,
            max_retries=policy.max_retries,
            retry_on=",".join(policy.on),
            backoff_seconds=policy.backoff_seconds,
            created_at=now,
        )
    )


def names_node_fail(s: Session, cluster: str, now: datetime) -> bool:
    """Whether a policy that names node_fail may still be a live job's (kept within
    MAX_JOB_LIFE): only then does the retry pass look for jobs Slurm requeued."""
    p = retry_policies_t.c
    found = select(p.id).where(
        p.cluster == cluster, p.created_at >= now - MAX_JOB_LIFE, p.retry_on.contains(NODE_FAIL)
    )
    return s.execute(found.limit(1)).first() is not None


def job_retries(s: Session, cluster: str, job_ids: Collection[int]) -> dict[int, JobRetries]:
    """The newest policy of each of `job_ids` that has one, with its retries: one read."""
    if not job_ids:
        return {}
    p, r = retry_policies_t.c, retries_t.c
    rows = s.execute(
        select(p.id, p.job_id, p.user, p.max_retries, p.retry_on, p.backoff_seconds, p.created_at)
        .where(p.cluster == cluster, p.job_id.in_(sorted(set(job_ids))))
        .order_by(p.job_id, p.created_at, p.id)
    ).all()
    newest = {row.job_id: row for row in rows}
    retries: dict[int, list[Retry]] = {row.id: [] for row in newest.values()}
    if retries:
        for row in s.execute(
            select(r.policy_id, r.run, r.cause, r.not_before, r.ended_at)
            .where(r.policy_id.in_(sorted(retries)))
            .order_by(r.policy_id, r.run)
        ):
            retries[row.policy_id].append(Retry(row.run, row.cause, row.not_before, row.ended_at))
    return {
        job_id: JobRetries(
            row.id,
            row.user,
            RetryPolicy(row.max_retries, tuple(row.retry_on.split(",")), row.backoff_seconds),
            row.created_at,
            tuple(retries[row.id]),
        )
        for job_id, row in newest.items()
    }


def policies_of(
    s: Session, cluster: str, jobs: Mapping[int, tuple[str, datetime, int | None]]
) -> dict[int, JobRetries]:
    """The policies of these jobs (id -> their user, SubmitTime now, and runs before the
    current one, None where not known) that are theirs (the module's docstring): one read
    of the policies, one of the run-0 holds."""
    found = job_retries(s, cluster, jobs)
    if not found:
        return {}
    h = holds_t.c
    first: dict[int, datetime] = {}
    for row in s.execute(
        select(h.job_id, h.user, h.submitted_at).where(
            h.cluster == cluster, h.run == 0, h.job_id.in_(sorted(found))
        )
    ):
        user, submitted, _runs = jobs[row.job_id]
        if row.user == user and row.submitted_at <= submitted + CLOCK_SLACK:  # not a later job's of this id
            first[row.job_id] = max(first.get(row.job_id, row.submitted_at), row.submitted_at)
    belonging = {}
    for job_id, kept in found.items():
        user, submitted, runs = jobs[job_id]
        if runs == 0:
            ours = kept.belongs_to(user, submitted)
        elif job_id in first:
            ours = kept.belongs_to(user, first[job_id])
        else:  # requeued before any hold: only its SubmitTime now to go by
            ours = user == kept.user and submitted - MAX_JOB_LIFE <= kept.kept_at <= submitted + CLOCK_SLACK
        if ours:
            belonging[job_id] = kept
    return belonging


def record_retry(
    s: Session, job: JobRetries, run: int, cause: str, now: datetime, ended_at: datetime | None = None
) -> Retry:
    """Record the retry after `run` failed with `cause` at `ended_at` (the caller has
    checked that the policy covers it and has retries left); the one already recorded
    for that run, if any."""
    found = job.for_run(run)
    if found is not None:
        return found
    retry = Retry(run, cause, now + job.policy.wait_before(len(job.retries) + 1), ended_at)
    s.execute(
        retries_t.insert().values(
            policy_id=job.policy_id,
            run=run,
            cause=cause,
            ended_at=ended_at,
            not_before=retry.not_before,
            created_at=now,
        )
    )
    return retry


def retried_run_ends(s: Session, cluster: str, job_ids: Collection[int]) -> dict[tuple[int, int], datetime]:
    """(job id, run) -> when that run really ended, for the runs of `job_ids` the retry
    pass requeued. `scontrol requeue` of a finished job moves the run's End (sacct's) to
    the requeue, seconds later; the GPUs were free from the failure on."""
    if not job_ids:
        return {}
    p, r = retry_policies_t.c, retries_t.c
    rows = s.execute(
        select(p.job_id, r.run, r.ended_at)
        .join(retries_t, r.policy_id == p.id)
        .where(p.cluster == cluster, p.job_id.in_(sorted(set(job_ids))), r.ended_at.is_not(None))
        .order_by(p.created_at, p.id)  # an id's newest policy last: its runs win
    )
    return {(row.job_id, row.run): row.ended_at for row in rows}
