"""Retry policies (ledger/jobs/retries.py): what a policy may say, the backoff, and the
store: a policy belongs to the job of its id submitted when it was kept, and a retry is
recorded once per failed run."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine

from ledger import api
from ledger.errors import InvalidInput
from ledger.jobs.retries import RetryPolicy, job_retries, keep_retry_policy, policies_of, record_retry
from ledger.store.db import make_sessionmaker

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max": 0, "on": ["exit:75"]}, "retry.max: must be a whole number from 1 to 10"),
        ({"max": True, "on": ["exit:75"]}, "retry.max: must be a whole number from 1 to 10"),
        ({"on": ["exit:75"]}, "retry.max: must be a whole number from 1 to 10"),
        (
            {"max": 1, "on": "exit:75"},
            "retry.on: must list the failures to retry on, like node_fail or exit:75",
        ),
        ({"max": 1, "on": ["exit:256"]}, "retry.on: 'exit:256' is not node_fail or exit:1..255"),
        ({"max": 1, "on": [f"exit:{n}" for n in range(1, 18)]}, "retry.on: lists more than 16 exit codes"),
        ({"max": 1, "on": ["exit:0"]}, "retry.on: 'exit:0' is not node_fail or exit:1..255"),
        ({"max": 1, "on": ["exit:075"]}, "retry.on: 'exit:075' is not node_fail or exit:1..255"),
        (
            {"max": 1, "on": ["ledger_unreachable"]},
            "retry.on: 'ledger_unreachable' is not node_fail or exit:1..255",
        ),
        (
            {"max": 1, "on": ["exit:75"], "backoff_seconds": -1},
            "retry.backoff_seconds: must be whole seconds from 0 to 3600",
        ),
        (
            {"max": 1, "on": ["exit:75"], "tries": 3},
            "retry.tries: is not a retry setting (max, on, backoff_seconds)",
        ),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        RetryPolicy.from_body(body)
    assert str(refused.value) == message
    assert refused.value.details["field"] == message.split(":")[0]


def test_the_wait_doubles_from_the_backoff_and_stops_at_an_hour() -> None:
    policy = RetryPolicy.from_body({"max": 10, "on": ["exit:75", "exit:1", "exit:75"], "backoff_seconds": 30})
    assert policy.on == ("exit:75", "exit:1")
    assert [policy.wait_before(n).total_seconds() for n in (1, 2, 3, 7, 8)] == [30, 60, 120, 1920, 3600]
    assert RetryPolicy.from_body({"max": 1, "on": ["exit:75"]}).backoff_seconds == 60


def test_a_retry_is_recorded_once_per_failed_run_and_a_policy_is_its_own_jobs(engine: Engine) -> None:
    sessions = make_sessionmaker(engine)
    policy = RetryPolicy(2, ("exit:75",), 30)
    with sessions() as s, s.begin():
        keep_retry_policy(s, "lab", 41, "bob", policy, NOW)
        assert job_retries(s, "lab", [41, 42]).keys() == {41}
    with sessions() as s, s.begin():
        job = job_retries(s, "lab", [41])[41]
        assert (job.user, job.policy, job.left) == ("bob", policy, 2)
        assert job.belongs_to("bob", NOW - timedelta(seconds=1))  # first submitted just before
        assert job.belongs_to("bob", NOW - timedelta(minutes=9))  # a slow portal
        assert not job.belongs_to("bob", NOW - timedelta(minutes=11))  # an earlier job of id 41
        assert not job.belongs_to("bob", NOW + timedelta(minutes=2))  # a later one (Slurm lost its state)
        assert not job.belongs_to("carol", NOW)  # a job of another user given id 41
        first = record_retry(s, job, 0, "exit:75", NOW)
        assert first.not_before == NOW + timedelta(seconds=30)
    with sessions() as s, s.begin():
        job = job_retries(s, "lab", [41])[41]
        assert record_retry(s, job, 0, "exit:75", NOW + timedelta(minutes=5)) == first  # once per run
        second = record_retry(s, job, 1, "exit:75", NOW + timedelta(minutes=1))
        assert second.not_before == NOW + timedelta(minutes=1, seconds=60)  # doubled
    with sessions() as s, s.begin():
        job = job_retries(s, "lab", [41])[41]
        assert (job.left, job.as_dict()["done"]) == (0, 2)
        assert job.as_dict()["retries"][1] == {
            "after_run": 1,
            "cause": "exit:75",
            "not_before": "2026-12-05T12:02:00Z",
        }
        # Id 41 submitted again, days later, with a policy of its own: that one is read.
        keep_retry_policy(s, "lab", 41, "carol", RetryPolicy(1, ("exit:1",)), NOW + timedelta(days=3))
    with sessions() as s, s.begin():
        job = job_retries(s, "lab", [41])[41]
        assert (job.user, job.retries, job.left) == ("carol", (), 1)


def test_a_requeued_job_is_known_by_its_first_submission_and_a_reused_id_is_not(engine: Engine) -> None:
    """SubmitTime moves to each requeue, so a requeued job is matched by its run-0 hold's
    SubmitTime; a job given the same id after Slurm lost its state has a later first
    submission (its own SubmitTime, or its own run-0 hold)."""
    sessions = make_sessionmaker(engine)
    first = NOW - timedelta(seconds=2)  # sbatch returned, then the portal kept the policy
    with sessions() as s, s.begin():
        api.create_account(s, "physics")
        api.topup(s, "physics", "100", effective_at=NOW - timedelta(days=1))
        api.set_price(s, "h100", "3.60", effective_at=NOW - timedelta(days=1))
        keep_retry_policy(s, "lab", 41, "bob", RetryPolicy(2, ("exit:75",), 30), NOW)
    requeued = NOW + timedelta(days=2)
    with sessions() as s, s.begin():
        assert policies_of(s, "lab", {41: ("bob", first, 0)}).keys() == {41}  # never requeued
        assert policies_of(s, "lab", {41: ("carol", first, 0)}) == {}
        # Its first start refused by the prolog (no hold), requeued, run 1 failing: only
        # its SubmitTime now to go by, within the job's life.
        assert policies_of(s, "lab", {41: ("bob", requeued, 1)}).keys() == {41}
        assert policies_of(s, "lab", {41: ("bob", NOW + timedelta(days=31), 1)}) == {}
    hold = api.HoldRequest("physics", user="bob", job_id=41, gpus="h100:1", seconds=60, cluster="lab")
    with sessions() as s, s.begin():
        api.create_hold(s, replace(hold, at=first, submitted_at=first))
    with sessions() as s, s.begin():
        assert policies_of(s, "lab", {41: ("bob", requeued, 1)}).keys() == {41}
        assert policies_of(s, "lab", {41: ("bob", requeued, None)}).keys() == {41}  # sacct's: runs unknown
    reused = NOW + timedelta(hours=1)  # Slurm lost its state; id 41 again, bob's again
    with sessions() as s, s.begin():
        assert policies_of(s, "lab", {41: ("bob", reused, 0)}) == {}  # queued, or its first run failed
        api.create_hold(s, replace(hold, at=reused, submitted_at=reused))
    with sessions() as s, s.begin():
        assert policies_of(s, "lab", {41: ("bob", reused, 0)}) == {}
        assert policies_of(s, "lab", {41: ("bob", reused + timedelta(days=1), 1)}) == {}  # that one requeued
