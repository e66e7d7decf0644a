"""A job's data to stage (ledger/jobs/staging.py): what the API may ask for, which job the
paths belong to (as a retry policy: by the run-0 hold's first submission), and each
stage-in recorded once per run and node."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from ledger import api
from ledger.errors import InvalidInput
from ledger.jobs.staging import (
    Staged,
    bind_job_data,
    check_data_paths,
    data_pending,
    data_to_stage,
    forget_job_data,
    job_data,
    keep_job_data,
    record_staged,
)
from ledger.store.db import make_sessionmaker

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ([], "data: must list 1 to 32 absolute paths"),
        ("/data/set.tar", "data: must list 1 to 32 absolute paths"),
        ([f"/d/{n}" for n in range(33)], "data: must list 1 to 32 absolute paths"),
        (["data/set.tar"], "data: 'data/set.tar' is not an absolute path of at most 1024 characters"),
        ([7], "data: 7 is not an absolute path of at most 1024 characters"),
        (["/data/../etc/shadow"], "data: '/data/../etc/shadow' holds a control character or '..'"),
        (["/data/a\nb"], "data: '/data/a\\nb' holds a control character or '..'"),
    ],
)
def test_bad_paths_are_refused_naming_the_field(paths: object, message: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_data_paths(paths)
    assert (str(refused.value), refused.value.details) == (message, {"field": "data"})


def test_paths_are_kept_once_each_in_order() -> None:
    assert check_data_paths(["/b", "/a", "/b", "/data/..x"]) == ("/b", "/a", "/data/..x")


def test_the_paths_are_the_jobs_of_their_first_submission_and_staged_once_per_run_and_node(
    engine: Engine,
) -> None:
    sessions = make_sessionmaker(engine)
    first = NOW - timedelta(seconds=2)  # sbatch returned, then the portal kept the paths
    with sessions() as s, s.begin():
        api.create_account(s, "physics")
        api.topup(s, "physics", "100", effective_at=NOW - timedelta(days=1))
        api.set_price(s, "h100", "3.60", effective_at=NOW - timedelta(days=1))
        kept = keep_job_data(s, "lab", "bob", ["/data/set.tar", "/data/cfg"], NOW - timedelta(seconds=3))
        # Kept before sbatch: until it is bound, bob's jobs' Prologs wait for it.
        assert data_to_stage(s, "lab", 41, "bob") is None
        assert data_pending(s, "lab", "bob", NOW) and not data_pending(s, "lab", "carol", NOW)
        assert not data_pending(s, "lab", "bob", NOW + timedelta(seconds=60))  # a submission that died
        bind_job_data(s, kept, 41)
        assert not data_pending(s, "lab", "bob", NOW)
        assert data_to_stage(s, "lab", 41, "bob") is None  # no run-0 hold: it has not started
    hold = api.HoldRequest("physics", user="bob", job_id=41, gpus="h100:1", seconds=60, cluster="lab")
    with sessions() as s, s.begin():
        api.create_hold(s, replace(hold, at=first, submitted_at=first))
    with sessions() as s, s.begin():
        found = data_to_stage(s, "lab", 41, "bob")
        assert found is not None and found.paths == ("/data/set.tar", "/data/cfg")
        assert data_to_stage(s, "lab", 41, "carol") is None  # another user's job of that id
        assert data_to_stage(s, "lab", 42, "bob") is None
        staged = Staged(0, "cloud1", 2, 1_048_576, 420, None, NOW)
        job = ("lab", 41, "bob")
        assert record_staged(s, found.data_id, *job, staged) is True
        assert record_staged(s, found.data_id, *job, replace(staged, bytes=1)) is False  # a Prolog run twice
        assert record_staged(
            s, found.data_id, *job, replace(staged, run=1, error="/data/cfg: Permission denied")
        )
        for other in (("lab", 42, "bob"), ("lab", 41, "carol"), ("gpu", 41, "bob")):  # not that job's paths
            with pytest.raises(InvalidInput, match="no data kept for"):
                record_staged(s, found.data_id, *other, replace(staged, run=2))
    with sessions() as s, s.begin():
        assert job_data(s, "lab", [41, 42])[41].as_dict() == {
            "paths": ["/data/set.tar", "/data/cfg"],
            "staged": [
                {"run": 0, "node": "cloud1", "files": 2, "bytes": 1_048_576, "seconds": "0.420",
                 "error": None, "at": "2026-12-06T12:00:00Z"},
                {"run": 1, "node": "cloud1", "files": 2, "bytes": 1_048_576, "seconds": "0.420",
                 "error": "/data/cfg: Permission denied", "at": "2026-12-06T12:00:00Z"},
            ],
        }  # fmt: skip
        for bad in (
            replace(staged, run=2, bytes=-1),
            replace(staged, run=2, files=2**31),
            replace(staged, node=""),
        ):
            with pytest.raises(InvalidInput):
                record_staged(s, found.data_id, *job, bad)
        failed = keep_job_data(s, "lab", "bob", ["/data/x"], NOW)
        forget_job_data(s, failed)  # sbatch refused it
        forget_job_data(s, found.data_id)  # bound: kept
        assert not data_pending(s, "lab", "bob", NOW) and data_to_stage(s, "lab", 41, "bob") is not None
    reused = NOW + timedelta(hours=1)  # Slurm lost its state; id 41 again, bob's again
    with sessions() as s, s.begin():
        api.create_hold(s, replace(hold, at=reused, submitted_at=reused))
    with sessions() as s, s.begin():
        assert data_to_stage(s, "lab", 41, "bob") is None
