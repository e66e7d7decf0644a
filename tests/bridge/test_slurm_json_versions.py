"""sacct --json and squeue --json as each Slurm version writes them (docs/slurm-facts.md §16).

The fixtures were recorded on each version's box (tests/fixtures/slurm-V/README.md): the
same jobs in the same order, so one version's JSON must read exactly as its own text and
as every other version's JSON.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC

import pytest

from accounting_bridge.slurm.records import SacctRun, parse_json, parse_parsable2, parse_squeue_json
from tests.support import FIXTURES

VERSIONS = ("22.05", "24.11", "26.05")
RUNS = 23  # every recorded job's run (tests/fixtures/slurm-V/jobs.json; a het job and an array are 2 each)


def recorded(version: str, name: str) -> str:
    return (FIXTURES / f"slurm-{version}" / name).read_text()


def text_runs(version: str) -> list[SacctRun]:
    """sacct_parsable2.txt was recorded with records.sacct_jobs_argv's own fields (no
    JobName: a name's line break cannot split a record)."""
    result = parse_parsable2(recorded(version, "sacct_parsable2.txt"), tz=UTC)
    assert result.errors == []
    return sorted(result.runs, key=lambda r: r.key)


def json_runs(version: str) -> list[SacctRun]:
    result = parse_json(recorded(version, "sacct.json"))
    assert result.errors == []
    return sorted((replace(run, name="") for run in result.runs), key=lambda r: r.key)


@pytest.mark.parametrize("version", VERSIONS)
def test_each_versions_sacct_json_reads_as_its_own_text(version: str) -> None:
    runs = json_runs(version)
    assert len(runs) == RUNS
    assert runs == text_runs(version)


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_newer_sacct_json_reads_as_22_05s(version: str) -> None:
    """Same jobs, GPUs, limits and states; the times of day differ, and so may how long
    each job ran by a second (`sleep 4` took 4 or 5 s; the `busy_*` jobs were cancelled
    after 0 or 1 s: tests/slurmtext/test_recorded_versions.py checks the range)."""

    def shape(runs: list[SacctRun]) -> list[SacctRun]:
        return [replace(run, submit=None, start=None, end=None, elapsed_seconds=-1) for run in runs]

    assert shape(json_runs(version)) == shape(json_runs("22.05"))


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_newer_squeue_json_gives_each_running_job_its_gpus_and_indices(version: str) -> None:
    result = parse_squeue_json(recorded(version, "squeue_all_json.json"))
    assert result.errors == []
    assert [
        (job.job_id, job.state, job.gpus, job.gpu_indices, job.node_count, job.time_limit_seconds, job.run)
        for job in result.jobs
    ] == [
        (15, "RUNNING", {"h100": 1}, {"node1": {2: "h100"}}, 1, 300, 0),
        (16, "RUNNING", {"a100": 2}, {"node1": {0: "a100", 1: "a100"}}, 1, 300, 0),
        (17, "RUNNING", {"a100": 1}, {"node2": {0: "a100"}}, 1, 300, 0),
    ]
    assert all(job.array_job_id is None and job.het_job_id is None for job in result.jobs)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_name_holding_a_whole_job_is_one_jobs_name(version: str) -> None:
    result = parse_squeue_json(recorded(version, "squeue_json_all_evil_name.json"))
    assert result.errors == []
    assert len({job.job_id for job in result.jobs}) == len(result.jobs)


def test_an_unset_or_infinite_number_is_no_number() -> None:
    job = (
        '{"jobs": [{"job_id": 5, "cluster": "lab", "job_state": ["PENDING", "REQUEUED"], "restart_cnt": 1,'
        ' "array_job_id": {"set": true, "infinite": false, "number": 0},'
        ' "time_limit": {"set": true, "infinite": true, "number": 0},'
        ' "start_time": {"set": false, "infinite": false, "number": 7}}]}'
    )
    (read,) = parse_squeue_json(job).jobs
    assert (read.state, read.run, read.array_job_id, read.time_limit_seconds, read.start) == (
        "PENDING",
        1,
        None,
        None,
        None,
    )


@pytest.mark.parametrize("state", ["[]", "[1]", "null"])
def test_a_state_that_is_not_a_state_is_an_error_not_a_guess(state: str) -> None:
    job = f'{{"job_id": 5, "cluster": "lab", "job_state": {state}, "restart_cnt": 0}}'
    result = parse_squeue_json(f'{{"jobs": [{job}]}}')
    assert result.jobs == [] and len(result.errors) == 1
