"""How the API reaches Slurm for a user: submit, cancel, read jobs.

`JobBackend` is the whole interface. Both backends read with squeue / sacct run by the
portal itself (`CommandReader`) and differ in how they act as the user:
`SubmitterBackend` (Slurm 22.05, no auth/jwt) asks the root submitter to run the user's
own sbatch/scancel (`portal.jobs.submitter`); `portal.jobs.rest.RestBackend` (24.11
and later) calls slurmrestd with a short-lived token minted for the user.

Refusals keep sbatch's own words: job_submit.lua's message ("gpucredit: this job would
cost ...") is what a user sees at a terminal, and the API returns it as the message
with the ledger's code (`refusal_of`).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import slurmtext
from ledger.errors import InsufficientCredits, InvalidInput, LedgerError, LimitExceeded
from ledger.jobs.retries import RetryPolicy
from portal.jobs.submitter import ask

COMMAND_TIMEOUT = 30.0
SQUEUE_FIELDS = (
    "JobID",
    "State",
    "Reason",
    "Account",
    "UserName",
    "Partition",
    "TimeLimit",
    "SubmitTime",
    "StartTime",
    "EndTime",
    "RestartCnt",
)
# Allocation lines; no free text (JobName, Comment) is asked, so "|" cannot occur in a value.
SACCT_FIELDS = (
    "JobIDRaw",
    "State",
    "Account",
    "User",
    "Partition",
    "TimelimitRaw",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
)
SACCT_WINDOW = "now-30days"
# Slurm's state words -> the API's.
STATES = {
    "PENDING": "queued",
    "REQUEUED": "queued",
    "REQUEUE_HOLD": "queued",
    "REQUEUE_FED": "queued",
    "RESV_DEL_HOLD": "queued",
    "CONFIGURING": "running",
    "RUNNING": "running",
    "COMPLETING": "running",
    "SUSPENDED": "running",
    "STOPPED": "running",
    "RESIZING": "running",
    "SIGNALING": "running",
    "STAGE_OUT": "running",
    "COMPLETED": "completed",
    "FAILED": "failed",
    "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed",
    "DEADLINE": "failed",
    "SPECIAL_EXIT": "failed",
    "CANCELLED": "cancelled",
    "REVOKED": "cancelled",
    "TIMEOUT": "timeout",
    "NODE_FAIL": "node_fail",
    "PREEMPTED": "preempted",
}
# squeue's reason codes for a pending job, in plain words.
REASONS = {
    "Resources": "waiting for GPUs",
    "Priority": "behind higher-priority jobs",
    "Dependency": "waiting for the jobs it depends on",
    "BeginTime": "waiting for its start time",
    "JobHeldUser": "held by its user",
    "JobHeldAdmin": "held by an administrator",
    "QOSMaxGRESPerUser": "scarcity cap: the user's GPUs in use are at the limit",
    "AssocGrpGRES": "account limit: the account's GPUs in use are at the limit",
    "AssocGrpBillingMinutes": "account blocked for credit",
    "AssocGrpGRESMinutes": "account blocked for credit",
    "Reservation": "waiting for a reservation",
    "PartitionDown": "the partition is down",
    "ReqNodeNotAvail": "the nodes it asked for are unavailable",
}


class SlurmUnavailable(LedgerError):
    """Slurm or the submitter did not answer; nothing is known to be submitted."""

    code = "slurm_unavailable"
    http_status = 503


@dataclass(frozen=True)
class JobSpec:
    """What a user asked for, checked (portal.jobs.spec)."""

    account: str
    script: str
    gpus: str  # TYPE:N
    time_limit: str  # [D-]HH:MM:SS
    name: str | None = None
    cpus: int | None = None
    memory: str | None = None
    working_dir: str | None = None
    container: str | None = None  # an OCI bundle directory: sbatch --container (the site's oci.conf)
    environment: dict[str, str] = field(default_factory=dict)
    max_cost: str | None = None  # credits: job_submit routes under it (gpucredit:max_cost=)
    cloud: str | None = None  # "yes" | "no": may job_submit route it to the cloud (gpucredit:cloud=)
    region: str | None = None  # the only cloud region it may run in (gpucredit:region=)
    retry: RetryPolicy | None = None  # kept in the ledger; the daemon's retry pass acts on it
    data: tuple[str, ...] = ()  # kept in the ledger; a cloud node's Prolog stages them

    def as_request(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"account": self.account, "gpus": self.gpus, "time_limit": self.time_limit}
        for name in ("name", "cpus", "memory", "working_dir", "container", "max_cost", "cloud", "region"):
            if getattr(self, name) is not None:
                spec[name] = getattr(self, name)
        if self.environment:
            spec["environment"] = dict(self.environment)
        if self.retry is not None:  # Slurm requeues only a requeueable job (retry_keeper.py)
            spec["requeue"] = "yes"
        return spec


@dataclass(frozen=True)
class Submitted:
    job_id: int
    message: str  # job_submit's words on acceptance (the quote), as sbatch printed them


@dataclass(frozen=True)
class SlurmJob:
    """One job as Slurm knows it (squeue while it is live, else sacct)."""

    job_id: int
    account: str
    user: str
    state: str  # the API's word
    slurm_state: str
    reason: str | None
    partition: str | None
    time_limit_seconds: int | None
    submitted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    elapsed_seconds: int | None = None
    restarts: int | None = 0  # squeue's RestartCnt: runs before the current one (None: sacct's, not known)


class JobBackend(Protocol):
    def submit(self, user: str, spec: JobSpec) -> Submitted: ...

    def cancel(self, user: str, job_id: int) -> None: ...

    def job(self, job_id: int) -> SlurmJob | None: ...

    def jobs(self, accounts: Sequence[str] | None) -> list[SlurmJob]: ...


def refusal_of(stderr: str) -> LedgerError:
    """The API error for sbatch's refusal (nothing was submitted): the ledger's code and
    sbatch's own words, which carry the figures (cost, available, the cap)."""
    words = _sbatch_words(stderr)
    found = re.search(r"gpucredit: (.*)$", words, re.S)
    details = {"sbatch": words}
    if found is None:  # Slurm's own refusal (an unknown account, a bad option)
        return InvalidInput(words, code="slurm_refused", details=details)
    said = found.group(1)
    if said.startswith("this job would cost"):
        return InsufficientCredits(words, details=details)
    limit = re.match(r"(concurrent_gpus|spend_rate|daily_cap): ", said)
    if limit:
        return LimitExceeded(limit.group(1), words, details)
    return InvalidInput(words, code="refused", details=details)


def _sbatch_words(stderr: str) -> str:
    """sbatch's message without its "sbatch: error: " prefixes, one line per line."""
    lines = [re.sub(r"^sbatch: (error: )?", "", line).strip() for line in stderr.strip().splitlines()]
    return " ".join(line for line in lines if line and line != "Batch job submission failed: ")


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class CommandReader:
    """Reads jobs with squeue and sacct (structured output) where the portal runs: the
    read half of both backends (slurmrestd's reads would need a token per user for a
    list across users)."""

    def __init__(self, bin_dir: str = "/usr/bin", run: Runner = subprocess.run) -> None:
        self.bin_dir = bin_dir
        self.run = run

    def _command(self, argv: list[str]) -> str:
        argv = [f"{self.bin_dir}/{argv[0]}", *argv[1:]]
        try:
            done = self.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SlurmUnavailable(f"{argv[0]}: {error}") from None
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            raise SlurmUnavailable(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return str(done.stdout)

    def job(self, job_id: int) -> SlurmJob | None:
        live = self._squeue(["-j", str(job_id)])
        if live:
            return live[0]
        done = self._sacct(["-j", str(job_id)])
        return done[0] if done else None

    def jobs(self, accounts: Sequence[str] | None) -> list[SlurmJob]:
        if accounts is not None and not accounts:
            return []
        which = [] if accounts is None else ["-A", ",".join(accounts)]
        live = {job.job_id: job for job in self._squeue(which)}
        ended = [job for job in self._sacct([*which, "-S", SACCT_WINDOW]) if job.job_id not in live]
        return sorted([*live.values(), *ended], key=lambda job: job.job_id, reverse=True)

    def _squeue(self, which: list[str]) -> list[SlurmJob]:
        fields = ",".join(f"{name}:|" for name in SQUEUE_FIELDS)
        text = self._command(["squeue", "--all", "--noheader", "--states=all", *which, f"--Format={fields}"])
        return [squeue_job(row) for row in slurmtext.parse_format_rows(text, SQUEUE_FIELDS)]

    def _sacct(self, which: list[str]) -> list[SlurmJob]:
        argv = [
            "sacct",
            "-X",
            "--noheader",
            "--parsable2",
            "--allusers",
            *which,
            "-o",
            ",".join(SACCT_FIELDS),
        ]
        rows = slurmtext.parse_parsable(self._command(argv), SACCT_FIELDS)
        return [sacct_job(row) for row in rows if row["JobIDRaw"].isdigit()]


class SubmitterBackend(CommandReader):
    """Slurm 22.05: the root submitter for sbatch/scancel, squeue/sacct for reading."""

    def __init__(self, socket_path: str, bin_dir: str = "/usr/bin", run: Runner = subprocess.run) -> None:
        super().__init__(bin_dir, run)
        self.socket_path = socket_path

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            return ask(self.socket_path, request)
        except OSError as error:
            raise SlurmUnavailable(
                f"the job submitter at {self.socket_path} did not answer: {error}"
            ) from None

    def submit(self, user: str, spec: JobSpec) -> Submitted:
        answer = self._ask({"op": "submit", "user": user, "spec": spec.as_request(), "script": spec.script})
        if answer.get("ok"):
            return Submitted(int(answer["job_id"]), _sbatch_words(answer.get("stderr", "")))
        if answer.get("error") == "refused":
            raise refusal_of(str(answer.get("stderr", "")))
        if answer.get("error") == "invalid_input":
            raise InvalidInput(f"{answer['field']} {answer['message']}", details={"field": answer["field"]})
        raise SlurmUnavailable(f"the job submitter refused: {answer.get('message', answer)}")

    def cancel(self, user: str, job_id: int) -> None:
        answer = self._ask({"op": "cancel", "user": user, "job_id": job_id})
        if not answer.get("ok"):
            raise SlurmUnavailable(f"scancel {job_id} failed: {str(answer.get('stderr', '')).strip()}")


def squeue_job(row: dict[str, str]) -> SlurmJob:
    slurm_state = row["State"].split()[0]
    state = STATES.get(slurm_state, "queued")
    limit = row["TimeLimit"]
    return SlurmJob(
        job_id=int(row["JobID"]),
        account=row["Account"],
        user=row["UserName"],
        state=state,
        slurm_state=slurm_state,
        reason=reason_words(row["Reason"]) if state == "queued" else None,
        partition=row["Partition"] or None,
        time_limit_seconds=None if limit in ("", "UNLIMITED") else slurmtext.parse_duration(limit),
        submitted_at=slurmtext.parse_time(row["SubmitTime"]),
        started_at=slurmtext.parse_time(row["StartTime"]) if state != "queued" else None,
        ended_at=slurmtext.parse_time(row["EndTime"]) if state not in ("queued", "running") else None,
        restarts=int(row["RestartCnt"]) if row["RestartCnt"].isdigit() else 0,
    )


def sacct_job(row: dict[str, str]) -> SlurmJob:
    slurm_state = row["State"].split()[0]
    state = STATES.get(slurm_state, "failed")
    minutes = row["TimelimitRaw"]
    return SlurmJob(
        job_id=int(row["JobIDRaw"]),
        account=row["Account"],
        user=row["User"],
        state=state,
        slurm_state=slurm_state,
        reason=None,
        partition=row["Partition"] or None,
        time_limit_seconds=int(minutes) * 60 if minutes.isdigit() else None,
        submitted_at=slurmtext.parse_time(row["Submit"]),
        started_at=slurmtext.parse_time(row["Start"]),
        ended_at=slurmtext.parse_time(row["End"]) if state not in ("queued", "running") else None,
        elapsed_seconds=int(row["ElapsedRaw"]) if row["ElapsedRaw"].isdigit() else None,
        restarts=None,
    )


def reason_words(reason: str) -> str | None:
    """squeue's reason for a pending job in plain words (gpucredit's own hold says credit)."""
    if reason in ("", "None", "(null)"):
        return None
    return REASONS.get(reason, reason)
