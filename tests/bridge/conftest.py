"""Fixtures of the bridge's tests: a GPU node under the fake NVML (the agent and its channel)."""

from __future__ import annotations

from pathlib import Path

import pytest

from accounting_bridge.nvml.nvml_fake import FakeGpu, FakeNvml
from accounting_bridge.nvml.sampler import GpuRegistry
from tests.support.agent import JOB_A, JOB_B, GiB


@pytest.fixture
def node(tmp_path: Path) -> tuple[FakeNvml, GpuRegistry]:
    """node1: a100 ×2 then h100 ×2; job A has GPU 0, job B GPUs 2 and 3; GPU 1 is idle-owned by nobody."""
    nvml = FakeNvml(
        [
            FakeGpu(
                "GPU-a0", utilization_gpu_percent=50, energy_millijoules=1_000_000, memory_used_bytes=10 * GiB
            ),
            FakeGpu("GPU-a1", utilization_gpu_percent=100, energy_millijoules=5_000_000),
            FakeGpu("GPU-h0", name="NVIDIA H100", utilization_gpu_percent=25, memory_used_bytes=2 * GiB),
            FakeGpu("GPU-h1", name="NVIDIA H100", utilization_gpu_percent=0, memory_used_bytes=5 * GiB),
        ]
    )
    nvml.nvmlInit()
    registry = GpuRegistry(tmp_path / "spool" / "node1")
    registry.register(JOB_A, {0: "a100"})
    registry.register(JOB_B, {2: "h100", 3: "h100"})
    return nvml, registry
