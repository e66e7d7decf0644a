"""A job backend standing in for Slurm (portal.jobs.backend.JobBackend) where the real
one cannot run: the portal's API tests and the OpenAPI test. It keeps jobs in a dict,
answers sbatch's refusal words when told to, and records every submit and cancel.
`seeded_backend` holds the seeded site's jobs (tests/support/portal.py) as Slurm shows them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ledger.timeutil import utcnow
from portal.jobs.backend import JobSpec, SlurmJob, Submitted, refusal_of


@dataclass
class FakeBackend:
    jobs_by_id: dict[int, SlurmJob] = field(default_factory=dict)
    submits: list[tuple[str, JobSpec]] = field(default_factory=list)
    cancels: list[tuple[str, int]] = field(default_factory=list)
    refuse_with: str | None = None
    next_id: int = 5000

    def submit(self, user: str, spec: JobSpec) -> Submitted:
        if self.refuse_with is not None:
            raise refusal_of(self.refuse_with)
        self.submits.append((user, spec))
        self.next_id += 1
        self.jobs_by_id[self.next_id] = SlurmJob(
            job_id=self.next_id,
            account=spec.account,
            user=user,
            state="queued",
            slurm_state="PENDING",
            reason="waiting for GPUs",
            partition=None,
            time_limit_seconds=None,
            submitted_at=utcnow(),  # slurmctld's clock, before the portal keeps a retry policy
            started_at=None,
            ended_at=None,
        )
        return Submitted(self.next_id, "gpucredit: ~0.06 credits (1×h100 × 1 min), 100.00 available")

    def cancel(self, user: str, job_id: int) -> None:
        self.cancels.append((user, job_id))
        self.jobs_by_id[job_id] = replace(self.jobs_by_id[job_id], state="cancelled", reason=None)

    def job(self, job_id: int) -> SlurmJob | None:
        return self.jobs_by_id.get(job_id)

    def jobs(self, accounts: Any) -> list[SlurmJob]:
        found = [j for j in self.jobs_by_id.values() if accounts is None or j.account in accounts]
        return sorted(found, key=lambda j: j.job_id, reverse=True)


def slurm_job(
    submitted_at: datetime, job_id: int, account: str, user: str, state: str, reason: str | None = None
) -> SlurmJob:
    return SlurmJob(
        job_id=job_id,
        account=account,
        user=user,
        state=state,
        slurm_state=state.upper(),
        reason=reason,
        partition="gpu",
        time_limit_seconds=7200,
        submitted_at=submitted_at,
        started_at=None,
        ended_at=None,
    )


def seeded_backend(submitted_at: datetime) -> FakeBackend:
    """The seeded site's jobs (its holds' ids), and bob's queued 1004, which holds nothing."""
    backend = FakeBackend()
    for job_id, account, user, state in (
        (1001, "physics", "alice", "completed"),
        (1002, "physics", "bob", "completed"),
        (2001, "chemistry", "carol", "completed"),
        (1003, "physics", "alice", "running"),
    ):
        backend.jobs_by_id[job_id] = slurm_job(submitted_at, job_id, account, user, state)
    backend.jobs_by_id[1004] = slurm_job(submitted_at, 1004, "physics", "bob", "queued", "waiting for GPUs")
    return backend
