"""A run the retry pass requeued (accounting_bridge/sacct/ingest.py): sacct moves its End
to the requeue; the bridge charges it to the End the pass recorded, and only then."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from accounting_bridge.sacct.ingest import with_retried_ends
from accounting_bridge.slurm.records import SacctRun
from ledger.jobs.retries import RetryPolicy, job_retries, keep_retry_policy, record_retry
from ledger.store.db import make_sessionmaker

T = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def run(job_id: int, index: int, state: str, start: datetime, end: datetime) -> SacctRun:
    return SacctRun(
        cluster="lab",
        job_id=job_id,
        display_id=str(job_id),
        run=index,
        user="bob",
        account="physics",
        partition="onprem",
        state=state,
        submit=start,
        start=start,
        end=end,
        elapsed_seconds=int((end - start).total_seconds()),
        time_limit_seconds=60,
        gpus={"h100": 1},
        requested_gpus={"h100": 1},
        nodes=("node1",),
        node_count=1,
        name="",
    )


def retried_at_9s_after_failing_at_4s(engine: Engine) -> sessionmaker[Session]:
    """Job 71's run 0, as the retry pass recorded it: it ended at T+4 s, requeued at T+9 s."""
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        keep_retry_policy(s, "lab", 71, "bob", RetryPolicy(2, ("exit:75",), 5), T)
        ended, requeued = T + timedelta(seconds=4), T + timedelta(seconds=9)
        record_retry(s, job_retries(s, "lab", [71])[71], 0, "exit:75", requeued, ended)
    return sessions


def test_a_retried_run_ends_when_it_failed_not_at_its_requeue(engine: Engine) -> None:
    sessions = retried_at_9s_after_failing_at_4s(engine)
    failed = run(71, 0, "REQUEUED", T + timedelta(seconds=2), T + timedelta(seconds=9))  # End: the requeue
    again = run(71, 1, "COMPLETED", T + timedelta(seconds=15), T + timedelta(seconds=18))
    refused = run(72, 0, "REQUEUED", T, T)  # a prolog refusal: no retry of ours
    fixed = with_retried_ends(sessions, [failed, again, refused])
    assert [(r.state, r.end, r.elapsed_seconds) for r in fixed] == [
        ("FAILED", T + timedelta(seconds=4), 2),
        ("COMPLETED", T + timedelta(seconds=18), 3),
        ("REQUEUED", T, 0),
    ]


def test_an_end_outside_the_run_is_not_used(engine: Engine) -> None:
    """Job id 71 reused: the recorded End is an older job's run 0, before this run started."""
    sessions = retried_at_9s_after_failing_at_4s(engine)
    later = run(71, 0, "REQUEUED", T + timedelta(days=40), T + timedelta(days=40, seconds=30))
    assert with_retried_ends(sessions, [later]) == [later]


def test_a_suspended_part_of_the_run_stays_out_of_its_charge(engine: Engine) -> None:
    """Started at T, suspended 3 s, failed at T+10, requeued at T+15: sacct's ElapsedRaw is
    12 (15 less the suspension); charged 7 (10 less the suspension)."""
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        keep_retry_policy(s, "lab", 73, "bob", RetryPolicy(1, ("exit:75",), 5), T)
        requeued, ended = T + timedelta(seconds=15), T + timedelta(seconds=10)
        record_retry(s, job_retries(s, "lab", [73])[73], 0, "exit:75", requeued, ended)
    suspended = replace(run(73, 0, "REQUEUED", T, requeued), elapsed_seconds=12)
    [fixed] = with_retried_ends(sessions, [suspended])
    assert (fixed.state, fixed.end, fixed.elapsed_seconds) == ("FAILED", ended, 7)
