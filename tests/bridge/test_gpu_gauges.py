"""Slurm's own GPU gauges (gpu/nvml's gres/gpuutil and gres/gpumem in a step's
TRESUsageIn*) read beside the agent's efficiency: `gpucredit bridge gpu-usage`.

No box here runs the gpu/nvml plugin (its GPUs are fake), so the plugin's lines are
Slurm's own documented output (doc/html/gres.shtml, "Accounting": a two-task step on
two A100s); the recorded steps of every version, which carry none, are read too.
The box test (tests/slurm/test_slurm_gpu_usage.py) runs the command on each version.
"""

from __future__ import annotations

import pytest

from accounting_bridge.slurm.gpu_gauges import gauge_rows, read_step_gauges, step_gauges_argv
from slurmtext import SlurmTextError, gpu_use_from_tres, parse_tres, tres_bytes
from tests.support.recorded_versions import VERSIONS, recorded

# Slurm's documentation, sacct -j 1277.0 --format=tresusageinave / tresusageintot.
DOC_AVE = "cpu=00:00:11,energy=0,fs/disk=87613,gres/gpumem=36266M,gres/gpuutil=100,mem=628748K,pages=0,vmem=0"
DOC_TOT = (
    "cpu=00:00:22,energy=0,fs/disk=175227,gres/gpumem=72532M,gres/gpuutil=200,mem=1257496K,pages=0,vmem=0"
)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("0", 0),
        ("87613", 87613),
        ("628748K", 628748 * 1024),
        ("36266M", 36266 * 2**20),
        ("1.50G", 3 * 2**29),
        ("1.5G", 3 * 2**29),
        ("0.01K", 10),  # 10.24 bytes, half up
        ("2T", 2 * 2**40),
    ],
)
def test_sizes_as_sacct_prints_them(text: str, size: int) -> None:
    assert tres_bytes(text) == size


@pytest.mark.parametrize("text", ["", "M", "1.234G", "-1K", "1KB", "1 K", "1e3", "١٢"])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(SlurmTextError, match="bad size"):
        tres_bytes(text)


def test_the_plugins_gauges_as_slurm_documents_them() -> None:
    assert gpu_use_from_tres(parse_tres(DOC_AVE)) == (100, 36266 * 2**20)
    assert gpu_use_from_tres(parse_tres(DOC_TOT)) == (200, 72532 * 2**20)
    assert gpu_use_from_tres(parse_tres("cpu=00:00:01,energy=0,mem=0")) == (None, None)
    with pytest.raises(SlurmTextError, match="gpuutil"):
        gpu_use_from_tres(parse_tres("gres/gpuutil=12.5"))


@pytest.mark.parametrize("version", VERSIONS)
def test_no_recorded_step_carries_a_gauge(version: str) -> None:
    """Every version's recorded steps (fake GPUs, no gpu/nvml): nothing to read, nothing made up."""
    for line in recorded(version, "sacct_tres_usage.txt").splitlines():
        _raw, _display, *usage = line.split("|")
        assert {gpu_use_from_tres(parse_tres(text)) for text in usage} == {(None, None)}


def test_a_job_s_busiest_step_per_allocated_gpu_beside_the_agent() -> None:
    text = "\n".join(
        [
            "41|billing=8,cpu=2,gres/gpu:a100=2,gres/gpu=2,mem=2G,node=1||",
            "41.batch|cpu=2,gres/gpu:a100=2,gres/gpu=2,mem=2G,node=1|cpu=00:00:01,energy=0,mem=0|cpu=00:00:01",
            f"41.0|cpu=2,gres/gpu=2,mem=2G,node=1|{DOC_TOT}|{DOC_AVE}",
            "42|billing=1,cpu=1,mem=1G,node=1||",  # no GPU: not in the report
            "42.batch|cpu=1,mem=1G,node=1|energy=0|energy=0",
            "43|billing=1,cpu=1,gres/gpu:h100=1,gres/gpu=1,node=1||",  # a run with no step yet
        ]
    )
    rows = gauge_rows(read_step_gauges(text), {41: "0.875"})
    assert rows == [
        {
            "job_id": 41,
            "gpus": 2,
            "slurm_gpuutil_percent": 100,  # 200 summed over 2 GPUs
            "slurm_gpumem_peak_bytes": 36266 * 2**20,
            "agent_efficiency": "0.875",
            "steps": [
                {"step": "batch", "gpuutil_percent": None, "gpumem_peak_bytes": None},
                {"step": "0", "gpuutil_percent": 100, "gpumem_peak_bytes": 36266 * 2**20},
            ],
        },
        {
            "job_id": 43,
            "gpus": 1,
            "slurm_gpuutil_percent": None,
            "slurm_gpumem_peak_bytes": None,
            "agent_efficiency": None,
            "steps": [],
        },
    ]


@pytest.mark.parametrize("raw", ["x1", "1.", "1_2", "", "٣"])
def test_a_line_that_is_not_a_job_or_step_is_refused(raw: str) -> None:
    with pytest.raises(SlurmTextError):
        read_step_gauges(f"{raw}|cpu=1||")


def test_the_sacct_command_asks_only_for_fields_slurm_sets() -> None:
    from datetime import UTC, datetime

    argv = step_gauges_argv(
        datetime(2026, 12, 3, 10, tzinfo=UTC), datetime(2026, 12, 3, 11, tzinfo=UTC), tz=UTC
    )
    assert argv[-1] == "JobIDRaw,AllocTRES,TRESUsageInTot,TRESUsageInMax"
    assert "--allocations" not in argv  # the steps are the point
    with pytest.raises(ValueError, match="before since"):
        step_gauges_argv(datetime(2026, 12, 3, 11, tzinfo=UTC), datetime(2026, 12, 3, 10, tzinfo=UTC))
