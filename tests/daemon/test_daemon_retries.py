"""The retry pass (gpucredit/daemon/retry_keeper.py), without Slurm: given squeue's lines
of failed jobs and the policies in a real ledger, it records each covered retry once and
requeues the job with its backoff; whatever the policy does not cover is left alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine

from accounting_bridge.slurm.records import sacct_jobs_argv
from accounting_bridge.slurm.slurmcmd import FakeResponse, FakeRunner
from gpucredit.daemon.retry_keeper import SQUEUE, SQUEUE_REQUEUED, RetryKeeper, failure_of
from ledger.jobs.retries import KEPT_WITHIN, RetryPolicy, job_retries, keep_retry_policy, record_retry
from ledger.store.db import make_sessionmaker
from slurmtext import format_time

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
SUBMITTED = NOW - timedelta(minutes=10)


def line(
    job_id: int, state: str, exit_code: str, run: int, submitted: datetime = SUBMITTED, begins: str = "N/A"
) -> str:
    """squeue's line; `begins`, its StartTime: a pending job's is when it may start."""
    ended = format_time(submitted + timedelta(minutes=5))
    return f"{job_id}|bob|{state}|{exit_code}|{run}|{format_time(submitted)}|{ended}|{begins}|"


def requeue(job_id: int, wait: int) -> list[tuple[str, ...]]:
    if not wait:
        return [("scontrol", "requeue", str(job_id))]
    return [
        ("scontrol", "requeuehold", str(job_id)),  # held, so it cannot start before its backoff
        ("scontrol", "update", f"JobId={job_id}", f"StartTime=now+{wait}"),
        ("scontrol", "release", str(job_id)),
    ]


class Policies:
    """The ledger's retry policies, kept as the portal keeps them."""

    def __init__(self, engine: Engine) -> None:
        self.sessions = make_sessionmaker(engine)

    def __call__(self, job_id: int, body: dict[str, Any], at: datetime = SUBMITTED) -> None:
        with self.sessions() as s, s.begin():
            keep_retry_policy(s, "lab", job_id, "bob", RetryPolicy.from_body(body), at)


@pytest.fixture
def keep(engine: Engine) -> Policies:
    return Policies(engine)


def keeper(
    keep: Policies, squeue: list[str], at: datetime = NOW, argv: tuple[str, ...] = SQUEUE
) -> tuple[RetryKeeper, FakeRunner]:
    runner = FakeRunner({argv: "\n".join(squeue) + "\n"})
    return RetryKeeper(runner, keep.sessions, "lab", clock=lambda: at), runner


@pytest.mark.parametrize(
    ("state", "exit_code", "failure"),
    [
        ("FAILED", "19200", "exit:75"),  # squeue's raw wait status (22.05): 75 << 8
        ("FAILED", "256", "exit:1"),
        ("FAILED", "9", None),  # killed by SIGKILL: no exit code to name
        ("FAILED", "75:0", "exit:75"),  # CODE:SIGNAL, as sacct writes it
        ("FAILED", "0:9", None),
        ("FAILED", "0", None),  # a failed start (the prolog, a launch failure)
        ("NODE_FAIL", "0", None),  # Slurm requeues it itself
        ("COMPLETED", "0", None),
        ("FAILED", "-1", None),
    ],
)
def test_how_a_run_ended_in_the_policys_words(state: str, exit_code: str, failure: str | None) -> None:
    assert failure_of(state, exit_code) == failure


def test_covered_failures_are_requeued_with_their_backoff_and_the_rest_left_alone(keep: Policies) -> None:
    keep(81, {"max": 2, "on": ["exit:75"], "backoff_seconds": 30})
    keep(82, {"max": 2, "on": ["exit:75"]})
    keep(83, {"max": 1, "on": ["exit:1"], "backoff_seconds": 0})
    keep(85, {"max": 1, "on": ["exit:75"]}, at=SUBMITTED + timedelta(minutes=11))  # a later job's of id 85
    keep(87, {"max": 1, "on": ["exit:75"]})
    burst, runner = keeper(
        keep,
        [
            line(81, "FAILED", "19200", 0),
            line(82, "FAILED", "256", 0),  # exit 1: not in its policy
            line(83, "FAILED", "256", 0),  # exit 1, no backoff: requeued to start at once
            line(84, "FAILED", "19200", 0),  # no policy
            line(85, "FAILED", "19200", 0),
            "87|carol|FAILED|19200|0|"
            + format_time(SUBMITTED)
            + "|Unknown|N/A|",  # bob's policy, carol's job
            "86_1|bob|FAILED|19200|0|not read|Unknown|N/A|",
        ],
    )
    for command in requeue(81, 30) + requeue(83, 0):
        runner.add(command)
    assert burst.tick() == [81, 83]
    assert runner.calls == [SQUEUE, *requeue(81, 30), *requeue(83, 0)]


def test_each_retry_waits_twice_the_last_and_none_is_past_the_policys_count(keep: Policies) -> None:
    keep(91, {"max": 2, "on": ["exit:75"], "backoff_seconds": 30})
    for run, at, wait in ((0, NOW, 30), (1, NOW + timedelta(minutes=5), 60)):
        burst, runner = keeper(keep, [line(91, "FAILED", "19200", run)], at)
        for command in requeue(91, wait):
            runner.add(command)
        assert burst.tick() == [91]
        assert runner.calls == [SQUEUE, *requeue(91, wait)]
    burst, runner = keeper(keep, [line(91, "FAILED", "19200", 2)], NOW + timedelta(minutes=10))
    assert burst.tick() == []  # two retries were all it allowed
    assert runner.calls == [SQUEUE]


def test_a_requeue_that_failed_is_done_again_with_the_same_retry_not_a_new_one(keep: Policies) -> None:
    keep(95, {"max": 1, "on": ["exit:75"], "backoff_seconds": 60})
    burst, runner = keeper(keep, [line(95, "FAILED", "19200", 0)])
    runner.add(requeue(95, 60)[0], FakeResponse(returncode=1, stderr="slurm_update error: Socket timed out"))
    assert burst.tick() == []
    later, runner = keeper(keep, [line(95, "FAILED", "19200", 0)], NOW + timedelta(seconds=20))
    for command in requeue(95, 40):  # the retry recorded first: its time, not a new backoff
        runner.add(command)
    assert later.tick() == [95]
    with keep.sessions() as s:
        assert len(job_retries(s, "lab", [95])[95].retries) == 1


def test_a_requeued_job_whose_start_was_not_set_stays_held_until_a_pass_sets_it(keep: Policies) -> None:
    """slurmctld took the requeue but not the update: without the hold the job would start
    at once, before its backoff. The keeper keeps it held, and its next pass sets the start
    (the time left) and releases it."""
    keep(97, {"max": 1, "on": ["exit:75"], "backoff_seconds": 60})
    clock = [NOW]
    runner = FakeRunner({SQUEUE: line(97, "FAILED", "19200", 0) + "\n"})
    burst = RetryKeeper(runner, keep.sessions, "lab", clock=lambda: clock[0])
    hold, update, release = requeue(97, 60)
    runner.add(hold)
    runner.add(update, FakeResponse(returncode=1, stderr="slurm_update error: Socket timed out"))
    assert burst.tick() == []
    assert runner.calls == [SQUEUE, hold, update]  # not released: it stays held
    clock[0] = NOW + timedelta(seconds=25)
    runner.add(SQUEUE, "")  # requeued: no longer FAILED
    runner.add(("scontrol", "update", "JobId=97", "StartTime=now+35"))
    runner.add(release)
    assert burst.tick() == [97]
    assert runner.calls[3:] == [("scontrol", "update", "JobId=97", "StartTime=now+35"), release, SQUEUE]
    assert burst.tick() == []  # released once


def test_a_held_job_cancelled_meanwhile_is_let_go(keep: Policies) -> None:
    keep(98, {"max": 1, "on": ["exit:75"], "backoff_seconds": 60})
    runner = FakeRunner({SQUEUE: line(98, "FAILED", "19200", 0) + "\n"})
    burst = RetryKeeper(runner, keep.sessions, "lab", clock=lambda: NOW)
    hold, update, _release = requeue(98, 60)
    runner.add(hold)
    runner.add(update, FakeResponse(returncode=1, stderr="slurm_update error: Socket timed out"))
    assert burst.tick() == []
    runner.add(SQUEUE, "")
    runner.add(update, FakeResponse(returncode=1, stderr="slurm_update error: Invalid job id specified"))
    assert burst.tick() == []
    assert burst.parked == {}


# -- node failures: Slurm requeues the job itself; a policy naming node_fail counts them ------------


def sacct_of(job_id: int, *ended: str) -> tuple[tuple[str, ...], str]:
    """sacct's answer (the argv the keeper asks, its text) for a job Slurm requeued after
    runs that ended in the states `ended`, the last at SUBMITTED + 5 min: a row for each
    run, then the pending one's."""
    argv = sacct_jobs_argv([job_id], SUBMITTED - KEPT_WITHIN, NOW)
    tres = "billing=1,cpu=1,gres/gpu:h100=1,gres/gpu=1,mem=1G,node=1"
    job, rows, last = f"{job_id}|{job_id}|lab|bob|physics|onprem", [], SUBMITTED
    for n, state in enumerate(ended):
        submit, start, end = (
            format_time(SUBMITTED + timedelta(minutes=5 * (n + 2 - len(ended)) + m)) for m in (-4, -3, 0)
        )
        rows.append(f"{job}|{state}|{submit}|{start}|{end}|180|10|1|node2|{tres}|{tres}")
        last = end
    rows.append(f"{job}|PENDING|{last}|Unknown|Unknown|0|10|0|None assigned||{tres}")
    return tuple(argv), "\n".join(rows) + "\n"


def requeued_line(job_id: int, run: int, begins: str = "N/A") -> str:
    """squeue's line for a job Slurm requeued: PENDING again, SubmitTime the requeue."""
    return line(job_id, "PENDING", "0", run, SUBMITTED + timedelta(minutes=5), begins)


def test_a_node_failure_a_policy_names_is_a_retry_with_its_backoff_and_past_max_the_job_is_cancelled(
    keep: Policies,
) -> None:
    keep(71, {"max": 1, "on": ["node_fail", "exit:75"], "backoff_seconds": 30})
    burst, runner = keeper(keep, [requeued_line(71, 1)], argv=SQUEUE_REQUEUED)
    runner.add(*sacct_of(71, "NODE_FAIL"))
    runner.add(("scontrol", "update", "JobId=71", "StartTime=now+30"))
    assert burst.tick() == []
    assert runner.calls[2:] == [("scontrol", "update", "JobId=71", "StartTime=now+30")]
    with keep.sessions() as s:
        [retry] = job_retries(s, "lab", [71])[71].retries
    assert (retry.run, retry.cause, retry.not_before) == (0, "node_fail", NOW + timedelta(seconds=30))
    assert retry.ended_at == SUBMITTED + timedelta(minutes=5)  # sacct's End of run 0
    assert burst.tick() == []  # decided once: no second retry, no second question to sacct
    assert runner.calls[3:] == [SQUEUE_REQUEUED]
    # Its one retry used, run 1 dies with its node too: Slurm requeued it, the keeper cancels it.
    again, runner = keeper(keep, [requeued_line(71, 2)], argv=SQUEUE_REQUEUED)
    runner.add(*sacct_of(71, "NODE_FAIL", "NODE_FAIL"))
    runner.add(("scancel", "71"))
    assert again.tick() == []
    assert runner.calls[2:] == [("scancel", "71")]


def test_a_requeue_for_another_cause_or_by_a_policy_without_node_fail_is_slurms_own(keep: Policies) -> None:
    keep(72, {"max": 2, "on": ["node_fail"]})  # its run 0's start refused by the prolog: REQUEUED
    keep(73, {"max": 2, "on": ["exit:75"]})  # a node failure, not named: Slurm's requeue stands
    keep(74, {"max": 2, "on": ["node_fail", "exit:75"]})  # requeued by the keeper on exit 75
    with keep.sessions() as s, s.begin():
        job = job_retries(s, "lab", [74])[74]
        record_retry(s, job, 0, "exit:75", NOW - timedelta(seconds=10))
    pending = [requeued_line(72, 1), requeued_line(73, 1), requeued_line(74, 1), line(75, "PENDING", "0", 0)]
    burst, runner = keeper(keep, pending, argv=SQUEUE_REQUEUED)
    runner.add(*sacct_of(72, "REQUEUED"))
    assert burst.tick() == []
    assert runner.calls == [SQUEUE_REQUEUED, sacct_of(72, "REQUEUED")[0]]
    assert burst.tick() == []  # 72's run 0 is known not to be a node failure: sacct not asked again
    assert runner.calls[2:] == [SQUEUE_REQUEUED]
    with keep.sessions() as s:
        assert [len(j.retries) for j in job_retries(s, "lab", [72, 73, 74]).values()] == [0, 0, 1]


def test_the_pending_jobs_are_listed_only_while_a_policy_names_node_fail(keep: Policies) -> None:
    keep(76, {"max": 1, "on": ["exit:75"]})
    burst, runner = keeper(keep, [])
    assert burst.tick() == []
    assert runner.calls == [SQUEUE]  # the failed jobs alone
    keep(77, {"max": 1, "on": ["node_fail"]}, at=NOW - timedelta(days=31))  # no live job's
    assert burst.tick() == []
    assert runner.calls == [SQUEUE, SQUEUE]
    keep(78, {"max": 1, "on": ["node_fail"]})
    runner.add(SQUEUE_REQUEUED, "")
    assert burst.tick() == []
    assert runner.calls[2:] == [SQUEUE_REQUEUED]


def test_a_start_slurm_already_holds_the_job_back_past_is_left_as_slurm_set_it(keep: Policies) -> None:
    """Slurm holds a requeued job back cred_expire + 1 s (121 s by default): a shorter
    backoff must not start it sooner."""
    keep(79, {"max": 2, "on": ["node_fail"], "backoff_seconds": 30})
    begins = format_time(NOW + timedelta(seconds=121))
    burst, runner = keeper(keep, [requeued_line(79, 1, begins)], argv=SQUEUE_REQUEUED)
    runner.add(*sacct_of(79, "NODE_FAIL"))
    assert burst.tick() == []
    assert runner.calls == [SQUEUE_REQUEUED, sacct_of(79, "NODE_FAIL")[0]]  # no StartTime set
    with keep.sessions() as s:
        assert [r.cause for r in job_retries(s, "lab", [79])[79].retries] == ["node_fail"]


def test_runs_are_read_as_the_jobs_own_and_only_once_sacct_has_them_all(keep: Policies) -> None:
    """sacct's --jobs 70 also returns an older job of id 70 (its state lost, the id given
    again): those runs are not this job's. And a run sacct has not closed yet leaves the
    decision to a later pass, never to the run before it."""
    keep(70, {"max": 2, "on": ["node_fail"], "backoff_seconds": 0})
    argv, text = sacct_of(70, "NODE_FAIL", "REQUEUED")
    old, new = (
        format_time(SUBMITTED - timedelta(days=2)),
        format_time(SUBMITTED - timedelta(days=2, minutes=-1)),
    )
    older = f"70|70|lab|bob|physics|onprem|NODE_FAIL|{old}|{new}|{new}|60|10|1|node1|billing=1|billing=1\n"
    # Run 2 pending; sacct has closed run 0 but not yet run 1 (an admin's requeue).
    unclosed = text.replace("|REQUEUED|", "|RUNNING|").replace("|180|10|1|node2|", "|0|10|1|node2|", 1)
    burst, runner = keeper(keep, [requeued_line(70, 2)], argv=SQUEUE_REQUEUED)
    runner.add(argv, older + unclosed)
    assert burst.tick() == []
    runner.add(argv, older + text)  # closed now: run 1 was not a node failure
    assert burst.tick() == []
    assert burst.tick() == []  # and that is remembered
    assert runner.calls == [SQUEUE_REQUEUED, argv, SQUEUE_REQUEUED, argv, SQUEUE_REQUEUED]
    with keep.sessions() as s:
        assert job_retries(s, "lab", [70])[70].retries == ()
