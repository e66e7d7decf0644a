"""`gpucredit bridge gpu-usage` on the box: this version's sacct step lines read, and the
agent's efficiency set beside them. The box's GPUs are fake (no gpu/nvml plugin), so
Slurm's gauges are blank on every version -- read, not made up; the plugin's own lines
are read in tests/bridge/test_gpu_gauges.py."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from ledger import api
from ledger.timeutil import utcnow
from tests.support.cluster import Cluster

pytestmark = pytest.mark.slurm


def test_a_gpu_job_s_steps_and_the_agent_s_efficiency_side_by_side(cluster: Cluster) -> None:
    account = cluster.new_account("10")
    since = utcnow() - timedelta(seconds=2)
    job = cluster.run_job(account, "--gres=gpu:a100:2", "-t", "1", "--wrap", "sleep 2")
    [hold] = cluster.settled_holds(job, account)
    allocated = 2 * hold.charged_seconds
    with cluster.tx() as s:  # what a node agent reports: half the GPU-seconds busy (2 GPUs: even)
        api.add_gpu_usage(
            s,
            [api.UsageDelta("lab", job, hold.run, "gpu1", "a100", allocated, allocated // 2, 0, 0)],
        )
    out = cluster.gpucredit("bridge", "gpu-usage", "--since", since.isoformat(), "--format", "json")
    [row] = [row for row in json.loads(out) if row["job_id"] == job]
    assert {k: v for k, v in row.items() if k != "steps"} == {
        "job_id": job,
        "gpus": 2,
        "slurm_gpuutil_percent": None,
        "slurm_gpumem_peak_bytes": None,
        "agent_efficiency": "0.500",
    }
    assert "batch" in [step["step"] for step in row["steps"]]
    assert {step["gpuutil_percent"] for step in row["steps"]} == {None}
    table = cluster.gpucredit("bridge", "gpu-usage", "--since", since.isoformat(), "--format", "csv")
    assert (
        table.splitlines()[0] == "job_id,gpus,slurm_gpuutil_percent,slurm_gpumem_peak_bytes,agent_efficiency"
    )
