"""The node agent's tests: a clock the test moves, and the GPU usage rows the agent wrote."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from accounting_bridge.nvml.sampler import JobRunKey
from ledger.store.tables import gpu_usage_t

GiB = 2**30


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def usage_rows(tx: Callable[[], Any]) -> dict[tuple[int, str], tuple[int, int, int, int]]:
    with tx() as s:
        return {
            (r.job_id, r.gres): (
                r.allocated_gpu_seconds,
                r.busy_gpu_seconds,
                r.energy_joules,
                r.peak_memory_bytes,
            )
            for r in s.execute(select(gpu_usage_t).where(gpu_usage_t.c.node == "node1"))
        }


JOB_A = JobRunKey("lab", 100, 0)
JOB_B = JobRunKey("lab", 101, 0)
