"""The retry pass: a job whose run failed with an exit code its retry policy names is
requeued after a backoff, and a node failure it names is counted and waits its backoff
(ledger.jobs.retries holds the policies and the rule; docs/api.md, "Retries").

Every tick the daemon lists the jobs slurmctld holds as FAILED, and PENDING while some
policy names node_fail (`squeue --Format`, no free text asked: MinJobAge keeps a finished
job there, 300 s by default), reads the policies of those jobs in one query, and for
each covered exit code with retries left records the retry (keyed by the failed run, so
it is decided once), commits, and runs

    scontrol requeuehold N                          (scontrol requeue N: no backoff)
    scontrol update JobId=N StartTime=now+BACKOFF
    scontrol release N

Held first, so the job cannot start before its backoff if the update fails: the keeper
then keeps it held and sets its start and releases it on its next passes (a daemon that
restarts meanwhile leaves it held: `scontrol release N`, its log says which).

The job runs again as a new run: its prolog takes a new hold, and the failed run's
charge stands. Requeueing a finished job moves its End in sacct to the requeue, seconds
after the failure; the retry records the End slurmctld showed before, and the bridge
charges the run to it (accounting_bridge/sacct/ingest.py).

Slurm requeues only a requeueable job ("Requested operation is presently disabled"
otherwise, and a finished job's flag cannot be changed), so the portal submits a job
with a policy `--requeue`: a node failure is then requeued by Slurm itself and refunded,
as any requeueable job's. The same squeue lists such a job PENDING again with a
RestartCnt; when its policy names node_fail and sacct says the run before ended
NODE_FAIL, the keeper records a retry and sets the job's StartTime to its backoff where
that is later than Slurm's own hold-back (BeginTime: cred_expire + 1 s, 121 s by default,
squeue's StartTime of the pending job), or cancels the job when the policy has no retries
left. sacct is asked for the job's runs since its first submit, and only that job's
(user, submit time) count: an older job of a reused id has rows under the same id. A
requeue sacct names otherwise (an admin's, a start the prolog refused) is Slurm's own,
as is a node failure of a policy that does not name it.
A start the prolog parked because the ledger was unreachable needs no policy either:
the daemon releases every such job once a hold can be taken (hook_service.release).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from accounting_bridge.slurm.records import SacctRun, parse_parsable2, sacct_jobs_argv
from accounting_bridge.slurm.slurmcmd import Runner, SlurmCommandError
from ledger.jobs.retries import NODE_FAIL, JobRetries, names_node_fail, policies_of, record_retry
from ledger.timeutil import utcnow
from slurmtext import SlurmTextError, parse_format_rows, parse_time

__all__ = ["SQUEUE", "SQUEUE_REQUEUED", "RetryKeeper", "failure_of"]

log = logging.getLogger("gpucredit.daemon")

# scontrol's words for a job no longer there to release.
JOB_GONE = ("Invalid job id", "already completing or completed")
FIELDS = ("JobID", "UserName", "State", "exit_code", "RestartCnt", "SubmitTime", "EndTime", "StartTime")
SQUEUE = (
    "squeue",
    "--all",
    "--noheader",
    "--states=FAILED",
    "--Format=" + ",".join(f"{f}:|" for f in FIELDS),
)
# The pending jobs too (to find those Slurm requeued), only while a policy names node_fail:
# a site's whole queue every pass is slurmctld's time.
SQUEUE_REQUEUED = (*SQUEUE[:3], "--states=FAILED,PENDING", *SQUEUE[4:])


def failure_of(state: str, exit_code: str) -> str | None:
    """The policy's word for how a run ended, exit:N, or None (not a failure a policy can
    name: another state, a signal, a failed start). squeue's exit_code is the raw wait
    status on 22.05 (exit 75 is 19200, docs/slurm-facts.md §18); CODE:SIGNAL, as sacct
    writes it, is read too."""
    if state != "FAILED" or not exit_code.isascii():
        return None
    if ":" in exit_code:
        code_text, _, signal_text = exit_code.partition(":")
        if not (code_text.isdigit() and signal_text.isdigit()):
            return None
        code, signal = int(code_text), int(signal_text)
    elif exit_code.isdigit():
        status = int(exit_code)
        code, signal = (status >> 8) & 0xFF, status & 0x7F
    else:
        return None
    return f"exit:{code}" if code > 0 and signal == 0 else None


class RetryKeeper:
    """No I/O until `tick`; the runner, the sessions and the clock are injectable."""

    def __init__(
        self,
        run: Runner,
        sessions: Callable[[], Session],
        cluster: str,
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.run = run
        self.sessions = sessions
        self.cluster = cluster
        self.clock = clock
        self.parked: dict[int, datetime] = {}  # requeued and held, not yet released: job -> its start
        self.refused: set[int] = set()  # jobs whose requeue failed, logged once (tried each pass)
        self.not_node_failed: set[tuple[int, int]] = set()  # (job, run) requeued for another cause

    def tick(self) -> list[int]:
        """One pass; the jobs requeued (and released)."""
        released = [job_id for job_id, start in list(self.parked.items()) if self._release(job_id, start)]
        # job id -> (failure, run, user, submitted, ended)
        failed: dict[int, tuple[str, int, str, datetime, datetime | None]] = {}
        # pending again: job id -> (run, user, submitted, the start Slurm holds it back to)
        requeued: dict[int, tuple[int, str, datetime, datetime | None]] = {}
        with self.sessions() as s:
            node_fail = names_node_fail(s, self.cluster, self.clock())
        for line in self.run(SQUEUE_REQUEUED if node_fail else SQUEUE).split("\n"):
            if not line.strip():
                continue
            try:
                [row] = parse_format_rows(line, FIELDS)
                submitted, ended = parse_time(row["SubmitTime"]), parse_time(row["EndTime"])
                begins = parse_time(row["StartTime"])
            except SlurmTextError as error:  # one unreadable job never stops the others
                log.warning("retry pass: squeue line %r: %s", line[:200], error)
                continue
            job_text, run_text = row["JobID"], row["RestartCnt"]
            if not (submitted and job_text.isascii() and job_text.isdigit() and run_text.isdigit()):
                continue
            failure = failure_of(row["State"], row["exit_code"])
            if failure:
                failed[int(job_text)] = (failure, int(run_text), row["UserName"], submitted, ended)
            elif row["State"] == "PENDING" and int(run_text) > 0:
                requeued[int(job_text)] = (int(run_text), row["UserName"], submitted, begins)
        self.refused.intersection_update(failed)  # the rest are gone from slurmctld
        self.not_node_failed.intersection_update(
            (job_id, run - 1) for job_id, (run, *_rest) in requeued.items()
        )
        if requeued:
            try:
                self._node_failures(requeued)
            except SlurmCommandError as error:  # sacct did not answer: asked again next pass
                log.warning("retry pass: node failures: %s", error)
        if not failed:
            return released
        now = self.clock()
        due: list[tuple[int, datetime]] = []  # job id -> its retry's earliest start
        with self.sessions() as s, s.begin():
            jobs = {
                job_id: (user, submitted, run) for job_id, (_f, run, user, submitted, _e) in failed.items()
            }
            policies = policies_of(s, self.cluster, jobs)
            for job_id, (failure, run, _user, _submitted, ended) in failed.items():
                job = policies.get(job_id)
                if job is None:
                    continue
                retry = job.for_run(run)
                if retry is None:
                    if not job.policy.covers(failure) or job.left <= 0:
                        continue
                    retry = record_retry(s, job, run, failure, now, ended)
                    log.info(
                        "job %s run %s ended %s: retry %s of %s, not before %s",
                        job_id,
                        run,
                        failure,
                        len(job.retries) + 1,
                        job.policy.max_retries,
                        retry.not_before.isoformat(),
                    )
                due.append((job_id, retry.not_before))
        return released + [job_id for job_id, not_before in due if self._requeue(job_id, not_before, now)]

    def _node_failures(self, requeued: dict[int, tuple[int, str, datetime, datetime | None]]) -> None:
        """Slurm requeued these jobs itself. Those whose policy names node_fail and whose
        run before sacct says ended NODE_FAIL: a retry recorded and its backoff set as the
        job's start, or, with no retries left, the job cancelled."""
        with self.sessions() as s, s.begin():
            jobs = {job_id: (user, submitted, run) for job_id, (run, user, submitted, _b) in requeued.items()}
            policies = policies_of(s, self.cluster, jobs)
        asked = {
            job_id: job
            for job_id, job in policies.items()
            if job.policy.covers(NODE_FAIL)
            and job.for_run(requeued[job_id][0] - 1) is None
            and (job_id, requeued[job_id][0] - 1) not in self.not_node_failed
        }
        if not asked:
            return
        since = min(job.submitted_since for job in asked.values())
        now = self.clock()
        runs = parse_parsable2(self.run(sacct_jobs_argv(asked, since, now))).runs
        decided: list[tuple[int, datetime | None]] = []  # job id -> its start (None: cancel)
        with self.sessions() as s, s.begin():
            for job_id, job in asked.items():
                run, _user, _submitted, begins = requeued[job_id]
                ended = _run_before(runs, job_id, job, run)
                if ended is None:  # not all in sacct yet: the next pass asks again
                    continue
                if ended.state != "NODE_FAIL":  # an admin's requeue, a refused start
                    self.not_node_failed.add((job_id, run - 1))
                    continue
                if job.left <= 0:
                    log.info(
                        "job %s run %s ended NODE_FAIL: no retries left of %s, cancelled",
                        job_id,
                        run - 1,
                        job.policy.max_retries,
                    )
                    decided.append((job_id, None))
                    continue
                retry = record_retry(s, job, run - 1, NODE_FAIL, now, ended.end)
                log.info(
                    "job %s run %s ended NODE_FAIL: retry %s of %s, not before %s",
                    job_id,
                    run - 1,
                    len(job.retries) + 1,
                    job.policy.max_retries,
                    retry.not_before.isoformat(),
                )
                # Slurm holds a requeued job back itself (cred_expire + 1 s): only a later start is set.
                if begins is None or retry.not_before > begins:
                    decided.append((job_id, retry.not_before))
        for job_id, start in decided:
            try:
                if start is None:
                    self.run(["scancel", str(job_id)])
                elif (wait := math.ceil((start - self.clock()).total_seconds())) > 0:
                    self.run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{wait}"])
            except SlurmCommandError as error:  # started or gone meanwhile: it starts as Slurm says
                log.warning("retry pass: job %s: %s", job_id, error)

    def _requeue(self, job_id: int, not_before: datetime, now: datetime) -> bool:
        wait = (not_before - now).total_seconds() > 0
        try:
            self.run(["scontrol", "requeuehold" if wait else "requeue", str(job_id)])
        except SlurmCommandError as error:  # it was purged, or requeued meanwhile; else tried again
            if job_id not in self.refused:
                log.warning("retry pass: job %s: %s", job_id, error)
                self.refused.add(job_id)
            return False
        self.refused.discard(job_id)
        return not wait or self._release(job_id, not_before)

    def _release(self, job_id: int, not_before: datetime) -> bool:
        """Start a requeued, held job no sooner than `not_before` and release it; kept
        parked (held) for the next pass when Slurm did not take it."""
        wait = max(0, math.ceil((not_before - self.clock()).total_seconds()))
        try:
            if wait:
                self.run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{wait}"])
            self.run(["scontrol", "release", str(job_id)])
        except SlurmCommandError as error:
            if any(gone in str(error) for gone in JOB_GONE):  # cancelled or purged meanwhile
                self.parked.pop(job_id, None)
                return False
            if job_id not in self.parked:
                log.warning("retry pass: job %s requeued, held until its start is set: %s", job_id, error)
            self.parked[job_id] = not_before
            return False
        self.parked.pop(job_id, None)
        return True

    def run_forever(self, stop: threading.Event, interval: float) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except (SlurmCommandError, SQLAlchemyError) as error:  # the next pass tries again
                log.warning("retry pass failed: %s", error)
            stop.wait(interval)


def _run_before(runs: list[SacctRun], job_id: int, job: JobRetries, run: int) -> SacctRun | None:
    """Run `run - 1` of the job, from sacct's runs of its id: those of the policy's user
    submitted since the policy was kept (an older job of a reused id is left out), and
    only when all `run` of them have ended (sacct writes a run's end a moment late)."""
    mine = [
        r
        for r in runs
        if r.job_id == job_id
        and r.user == job.user
        and r.submit is not None
        and r.submit >= job.submitted_since
    ]
    ended = sorted((r for r in mine if r.finished), key=lambda r: (r.submit, r.end))
    if len(ended) != run:
        return None
    return ended[-1]
