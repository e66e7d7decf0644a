"""Every gpucredit parser on what each real Slurm printed: the same jobs, the same figures.

The recordings are tests/fixtures/slurm-<version>/ (record_slurm_version.py made them in
each version's box; their README lists every file and the command behind it). The same
jobs ran in the same order on the same cluster in each version, so what a parser reads
from them must not depend on the version: the expected figures below are written once,
from what each job asked for, and checked against all three. Where the versions print
differently (docs/slurm-facts.md §16) the parser absorbs it in one place: slurmtext for
GRES and TRES spellings, records.py for the JSON data parsers, scontrol.py for the keys.
"""

from __future__ import annotations

import json
from datetime import UTC
from typing import Any

import pytest

from accounting_bridge.slurm import backends, records
from accounting_bridge.sync import associations, fairshare_sync, limits_sync
from job_submit.request import parse_submit
from slurm_hooks.scontrol import ScontrolParseError, parse_job, parse_node_gpus
from slurm_hooks.squeue import parse_jobs
from slurmtext import parse_partition_qos, parse_sinfo_gpu_types, parse_sinfo_gpu_use, parse_tres
from slurmtext.show_config import billing_notes, parse_show_config, release
from tests.support import FIXTURES
from tests.support.recorded_versions import (
    ALLOCATED,
    BUSY,
    SUBMITTED,
    TWO_NODES,
    VERSIONS,
    allocated,
    job_ids,
    recorded,
)

NUMBERS = {"22.05": (22, 5), "24.11": (24, 11), "26.05": (26, 5)}


def test_every_version_recorded_the_same_jobs() -> None:
    names = {version: set(job_ids(version)) for version in VERSIONS}
    assert names["22.05"] == names["24.11"] == names["26.05"] == set(ALLOCATED) | set(BUSY)
    for version in VERSIONS:
        outcomes = json.loads(recorded(version, "sbatch.json"))
        assert {name: rc for name, (rc, _, _) in outcomes.items()} == dict.fromkeys(SUBMITTED, 0)


# --------------------------------------------------------------------------- job_submit


@pytest.mark.parametrize("version", VERSIONS)
def test_job_desc_reads_as_what_was_asked(version: str) -> None:
    job_desc = json.loads(recorded(version, "job_desc.json"))
    assert set(job_desc) == set(SUBMITTED)
    for name, calls in job_desc.items():
        got = [
            (request.gpus, request.gpus_requested_as, request.time_limit_seconds, request.array_tasks)
            for request in map(parse_submit, calls)
        ]
        assert got == SUBMITTED[name], name


@pytest.mark.parametrize("version", VERSIONS)
def test_a_forged_comment_is_the_users_text_and_no_directive(version: str) -> None:
    (call,) = json.loads(recorded(version, "job_desc.json"))["comment_forged"]
    request = parse_submit(call)
    assert request.directives == {}
    assert request.user_comment == (
        "x|1|lab|alice|physics|onprem|COMPLETED\nTRES=cpu=1,gres/gpu:h100=8 AdminComment=gpucredit-hold"
    )


# --------------------------------------------------------------------------- the controller hooks


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_format_gives_each_running_job_its_allocation(version: str) -> None:
    """slurm_hooks.squeue on squeue_format/NAME.txt: what the controller hooks bill."""
    by_id = allocated(version)
    for name, allocations in ALLOCATED.items():
        jobs = parse_jobs(recorded(version, f"squeue_format/{name}.txt"), tz=UTC)
        ids = job_ids(version)[name]
        mine = sorted((job for job in jobs if job.job_id in ids), key=lambda job: ids.index(job.job_id))
        assert [job.gpus for job in mine] == [gpus for gpus, _ in allocations], name
        for job in mine:
            assert (job.state, job.time_limit_seconds, job.account, job.user) == (
                "RUNNING",
                300 if name != "no_gpu_no_time" else 3600,  # the partition's DefaultTime
                "physics",
                "alice",
            ), name
            assert job.num_nodes == (2 if name in TWO_NODES else 1), name
            assert job.start_time is not None and job.end_time is not None
            assert by_id[job.job_id][0] == name


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("hook", ["prolog_slurmctld", "epilog_slurmctld"])
def test_what_the_controller_hooks_read_there(version: str, hook: str) -> None:
    """hook_env/HOOK.ID.ctld.squeue: squeue_argv's text as each hook ran, read for every
    recorded job: its GPUs, limit and state, and in the epilog the real end."""
    by_id = allocated(version)
    seen = set()
    for path in (FIXTURES / f"slurm-{version}" / "hook_env").glob(f"{hook}.*.ctld.squeue"):
        job_id = int(path.name.split(".")[1])
        if job_id not in by_id:
            continue  # an `srun hostname` round trip
        (job,) = [job for job in parse_jobs(path.read_text(), tz=UTC) if job.job_id == job_id]
        name, gpus, _ = by_id[job_id]
        assert job.gpus == gpus, (name, job_id)
        assert job.state == ("CONFIGURING" if hook == "prolog_slurmctld" else "COMPLETING"), (name, job_id)
        if hook == "epilog_slurmctld" and not name.startswith("busy_"):
            assert job.start_time and job.end_time
            assert 3 <= (job.end_time - job.start_time).total_seconds() <= 6, name  # `sleep 4`
        seen.add(job_id)
    assert seen == set(by_id)


# --------------------------------------------------------------------------- the node hooks


@pytest.mark.parametrize("version", VERSIONS)
def test_scontrol_gives_the_node_hooks_each_nodes_gpu_indices(version: str) -> None:
    by_id = allocated(version)
    for name in ALLOCATED:
        text = recorded(version, f"scontrol_show_job_d_o/{name}.txt")
        job_id = job_ids(version)[name][0]
        assert parse_node_gpus(text, job_id) == by_id[job_id][2], name
    for path in (FIXTURES / f"slurm-{version}" / "hook_env").glob("prolog_slurmctld.*.ctld.scontrol"):
        job_id = int(path.name.split(".")[1])
        if job_id in by_id:
            assert parse_node_gpus(path.read_text(), job_id) == by_id[job_id][2], path.name


@pytest.mark.parametrize("version", VERSIONS)
def test_parse_job_reads_every_job_whose_text_is_not_forged(version: str) -> None:
    by_id = allocated(version)
    for name in ALLOCATED:
        job_id = job_ids(version)[name][0]
        text = recorded(version, f"scontrol_show_job_d_o/{name}.txt")
        if name.startswith("evil_name") or name == "comment_forged":
            continue  # below
        job = parse_job(text, job_id, tz=UTC)
        assert (job.gpus, job.node_gpus) == by_id[job_id][1:], name
        assert job.num_nodes == (2 if name in TWO_NODES else 1), name


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["evil_name", "evil_name_one_line", "comment_forged"])
def test_parse_job_never_bills_a_forged_tres(version: str, name: str) -> None:
    """A name or comment spelling `TRES=`: read as the real allocation, or refused."""
    job_id = job_ids(version)[name][0]
    try:
        job = parse_job(recorded(version, f"scontrol_show_job_d_o/{name}.txt"), job_id, tz=UTC)
    except ScontrolParseError as error:
        assert "ambiguous" in str(error)
    else:
        assert job.gpus == allocated(version)[job_id][1]


# --------------------------------------------------------------------------- the bridge


def _sacct_figures(runs: list[records.SacctRun]) -> dict[int, tuple[Any, ...]]:
    return {
        run.job_id: (run.state, run.gpus, run.node_count, run.time_limit_seconds, run.account, run.user)
        for run in runs
    }


def _expected_sacct(version: str) -> dict[int, tuple[Any, ...]]:
    out = {}
    for job_id, (name, gpus, node_gpus) in allocated(version).items():
        state = "CANCELLED" if name.startswith("busy_") else "COMPLETED"
        limit = 3600 if name == "no_gpu_no_time" else 300
        out[job_id] = (state, gpus, max(len(node_gpus), 1), limit, "physics", "alice")
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_sacct_text_and_json_read_to_the_allocations(version: str) -> None:
    text = records.parse_parsable2(recorded(version, "sacct_parsable2.txt"), tz=UTC)
    json_ = records.parse_json(recorded(version, "sacct.json"))
    assert text.errors == [] and json_.errors == []
    assert _sacct_figures(text.runs) == _sacct_figures(json_.runs) == _expected_sacct(version)
    for runs in (text.runs, json_.runs):
        elapsed = {run.job_id: run.elapsed_seconds for run in runs}
        for job_id, (name, _, _) in allocated(version).items():
            if not name.startswith("busy_"):
                assert 3 <= elapsed[job_id] <= 6, (name, elapsed[job_id])  # `sleep 4`


@pytest.mark.parametrize("version", VERSIONS)
def test_sacct_step_lines_are_not_runs(version: str) -> None:
    """Without --allocations sacct adds batch/extern step lines: still one run per job."""
    text = records.parse_parsable2(recorded(version, "sacct_parsable2_steps.txt"), tz=UTC)
    assert text.errors == []
    assert _sacct_figures(text.runs) == _expected_sacct(version)


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_compact_and_json_see_the_three_busy_jobs(version: str) -> None:
    ids = {job_ids(version)[name][0]: name for name in BUSY}
    compact = records.parse_squeue_compact(recorded(version, "squeue_compact.txt"), cluster="lab", tz=UTC)
    assert compact.errors == []
    assert sorted((job.job_id, job.state, job.run) for job in compact.jobs) == sorted(
        (job_id, "RUNNING", 0) for job_id in ids
    )
    running = records.parse_squeue_json(recorded(version, "squeue_all_json.json"))
    assert running.errors == []
    busy = {job.job_id: (job.gpus, job.node_count) for job in running.jobs if job.state == "RUNNING"}
    assert busy == {job_id: (BUSY[name][0], 1) for job_id, name in ids.items()}


# --------------------------------------------------------------------------- sinfo, sacctmgr, sshare


@pytest.mark.parametrize("version", VERSIONS)
def test_sinfo_partitions_qos_and_tres_read_alike(version: str) -> None:
    assert parse_sinfo_gpu_use(recorded(version, "sinfo_gpu_use.txt")) == {"onprem": (8, 4), "cloud": (4, 0)}
    assert parse_sinfo_gpu_types(recorded(version, "sinfo_R_G.txt")) == {
        "onprem": ["a100", "h100"],
        "cloud": ["a100", "h100"],
    }
    assert parse_partition_qos(recorded(version, "scontrol_show_partition.txt")) == {
        "onprem": "gpucredit-onprem",
        "cloud": "gpucredit-cloud",
    }
    # 24.11 and 26.05 also list gres/gpumem and gres/gpuutil: not GPUs to limit.
    assert limits_sync.parse_gpu_tres(recorded(version, "sacctmgr_show_tres.txt")) == (
        "gres/gpu",
        "gres/gpu:a100",
        "gres/gpu:h100",
    )
    assert limits_sync.parse_qos_gpu_limits(recorded(version, "sacctmgr_show_qos.txt")) == {
        "normal": (None, None),
        "gpucredit-cloud": (None, None),
        "gpucredit-onprem": (4, 6),
    }
    assert backends.parse_slurm_version(recorded(version, "sinfo_version.txt")) == NUMBERS[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_associations_read_alike(version: str) -> None:
    """The import, fairshare and limits syncs' sacctmgr reads (set up by the recorder's
    SETUP) and sshare's shares: the same on every version (usage is the box's own)."""
    limits, _ = limits_sync.parse_associations(recorded(version, "sacctmgr_assoc_limits.txt"))
    gpu_limits = {key: value for key, value in limits.items() if value != ((),)}
    assert gpu_limits == {
        ("limleaf", ""): ((("gres/gpu", 4), ("gres/gpu:a100", 4), ("gres/gpu:h100", 4)),),
        ("limleaf", "alice"): ((("gres/gpu:a100", 1),),),
    }
    shares = fairshare_sync.read_associations(recorded(version, "sacctmgr_assoc_fairshare.txt"))
    assert {key: value for key, value in shares.items() if value != ("1",)} == {
        ("chemistry", ""): ("100",),
        ("physics", "alice"): ("parent",),
    }
    sshare = fairshare_sync.read_sshare(recorded(version, "sshare.txt"))
    assert {key: row["raw_shares"] for key, row in sshare.items() if row["raw_shares"] not in ("1", "")} == {
        ("chemistry", ""): "100",
        ("physics", "alice"): "parent",
    }
    assert associations.parse_associations(recorded(version, "sacctmgr_assoc_import.txt"), "lab") == {
        "research": {"root"},
        "biology": {"alice"},
        "chemistry": {"bob", "root"},
        "history": {"bob"},
        "limleaf": {"bob", "alice"},
        "physics": {"bob", "root", "alice", "carol"},
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_show_config_gives_the_same_notes(version: str) -> None:
    """`gpucredit slurm check`'s reading: the box confines no devices on any version."""
    settings = parse_show_config(recorded(version, "scontrol_show_config.txt"))
    assert release(settings["SLURM_VERSION"]) == version
    assert billing_notes(settings) == [
        "devices are not constrained (TaskPlugin task/none, ConstrainDevices unset): a job that asked for"
        " no GPU can use one unbilled; set TaskPlugin=task/cgroup and, in cgroup.conf, ConstrainDevices=yes"
    ]
    gpu_tres = [t for t in settings["AccountingStorageTRES"].split(",") if t.startswith("gres/gpu")]
    newer = ["gres/gpumem", "gres/gpuutil"] if version != "22.05" else []  # added unasked
    assert gpu_tres == ["gres/gpu", "gres/gpu:a100", "gres/gpu:h100", *newer]


@pytest.mark.parametrize("version", VERSIONS)
def test_step_tres_usage_holds_no_gpu_figures_without_the_nvml_plugin(version: str) -> None:
    """sacct TRESUsageInAve/Max/Tot of every step: read by slurmtext's TRES parser; with
    fake GPUs (no gpu/nvml) no version reports gres/gpuutil or gres/gpumem there."""
    for line in recorded(version, "sacct_tres_usage.txt").splitlines():
        job_id, _display, *usage = line.split("|")
        for text in usage:
            assert not any(name.startswith("gres/") for name in parse_tres(text)), (job_id, text)


def test_the_recordings_are_where_the_readme_says() -> None:
    for version in VERSIONS:
        readme = recorded(version, "README.md")
        for path in (FIXTURES / f"slurm-{version}").rglob("*"):
            if path.is_file() and path.parent.name not in ("hook_env",) and path.name != "README.md":
                relative = path.relative_to(FIXTURES / f"slurm-{version}")
                if path.suffix in (".txt", ".json") and path.name not in (
                    "jobs.json",
                    "sbatch.json",
                    "job_desc.json",
                    "timings.json",
                ):
                    assert f"`{relative}`" in readme, (version, str(relative))


def test_node_indices_forged_in_a_name_are_refused_not_read() -> None:
    """A name that spells a whole `JOB_GRES= Nodes= GRES=` group makes JOB_GRES appear
    twice: the node hooks then register nothing rather than the forged indices."""
    text = recorded("24.11", "scontrol_show_job_d_o/gres_a100_1.txt")
    job_id = job_ids("24.11")["gres_a100_1"][0]
    forged = text.replace(
        "JobName=gres_a100_1 ",
        "JobName=x JOB_GRES=gpu:h100:4 Nodes=node1 CPU_IDs=0 Mem=0 GRES=gpu:h100:4(IDX:0-3) ",
    )
    assert forged != text
    with pytest.raises(ScontrolParseError, match="JOB_GRES appears more than once"):
        parse_node_gpus(forged, job_id)
    with pytest.raises(ScontrolParseError, match="job 999 not in scontrol output"):
        parse_node_gpus(text, 999)
