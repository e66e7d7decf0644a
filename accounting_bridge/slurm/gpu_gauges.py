"""Slurm's own GPU gauges beside the agents' measurement (`gpucredit bridge gpu-usage`).

Where slurmd runs the gpu/nvml plugin (gres.conf `AutoDetect=nvml`), sacct's step lines
carry `gres/gpuutil` and `gres/gpumem` in TRESUsageIn*. They are gauges -- the last sample,
summed over the step's GPUs -- not the busy GPU-seconds the node agent integrates, so
they are set beside the agent's efficiency for a reader to compare, never billed and
never stored. Without the plugin (every box here: its GPUs are fake) the steps carry
none, and the report says so rather than guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any

from slurmtext import (
    SlurmTextError,
    format_time,
    gpu_use_from_tres,
    gpus_from_tres,
    parse_parsable,
    parse_tres,
)

__all__ = ["STEP_FIELDS", "JobGauges", "StepGauge", "gauge_rows", "read_step_gauges", "step_gauges_argv"]

# Fields Slurm sets itself: none can hold `|` (never JobName, Comment or paths).
STEP_FIELDS = ("JobIDRaw", "AllocTRES", "TRESUsageInTot", "TRESUsageInMax")


def step_gauges_argv(
    since: datetime, until: datetime, *, cluster: str | None = None, tz: tzinfo | None = None
) -> list[str]:
    """sacct argv for every job's allocation line and step lines active in [since, until]
    (each job's latest attempt: the agent's figure beside it is the latest run's)."""
    if until < since:
        raise ValueError(f"until ({until}) is before since ({since})")
    argv = ["sacct", "--allusers"]
    if cluster is not None:
        argv += ["--clusters", cluster]
    return [
        *argv,
        "--starttime",
        format_time(since, tz),
        "--endtime",
        format_time(until, tz),
        "--parsable2",
        "--noheader",
        "--format",
        ",".join(STEP_FIELDS),
    ]


@dataclass(frozen=True)
class StepGauge:
    step: str  # batch, extern, 0, ...
    gpuutil: int | None  # TRESUsageInTot: percent, summed over the step's GPUs and tasks
    gpumem_peak: int | None  # TRESUsageInMax: bytes, the highest task


@dataclass
class JobGauges:
    job_id: int
    gpus: int = 0  # the allocation's GPUs (AllocTRES), what the job is billed for
    steps: list[StepGauge] = field(default_factory=list)


def read_step_gauges(text: str) -> dict[int, JobGauges]:
    """sacct's lines (:data:`STEP_FIELDS`) -> each job's GPUs and its steps' gauges."""
    jobs: dict[int, JobGauges] = {}
    for row in parse_parsable(text, STEP_FIELDS):
        raw, dot, step = row["JobIDRaw"].partition(".")
        if not raw.isascii() or not raw.isdigit() or (dot and not step):
            raise SlurmTextError(f"bad JobIDRaw {row['JobIDRaw']!r}")
        job = jobs.setdefault(int(raw), JobGauges(int(raw)))
        if not dot:
            job.gpus = sum(gpus_from_tres(parse_tres(row["AllocTRES"])).values())
            continue
        util, _ = gpu_use_from_tres(parse_tres(row["TRESUsageInTot"]))
        _, peak = gpu_use_from_tres(parse_tres(row["TRESUsageInMax"]))
        job.steps.append(StepGauge(step, util, peak))
    return jobs


def _per_gpu(util: int | None, gpus: int) -> int | None:
    """Percent per allocated GPU, whole, half up (a gauge, not money)."""
    return None if util is None or gpus <= 0 else (2 * util + gpus) // (2 * gpus)


def gauge_rows(jobs: Mapping[int, JobGauges], agent: Mapping[int, str | None]) -> list[dict[str, Any]]:
    """One row per GPU job: Slurm's busiest step gauge, per allocated GPU, and its peak
    memory, beside the agent's efficiency (busy ÷ allocated GPU-seconds, `agent`)."""
    rows = []
    for job_id in sorted(jobs):
        job = jobs[job_id]
        if job.gpus <= 0:
            continue
        utils = [step.gpuutil for step in job.steps if step.gpuutil is not None]
        peaks = [step.gpumem_peak for step in job.steps if step.gpumem_peak is not None]
        busiest = max(utils) if utils else None
        rows.append(
            {
                "job_id": job_id,
                "gpus": job.gpus,
                "slurm_gpuutil_percent": _per_gpu(busiest, job.gpus),
                "slurm_gpumem_peak_bytes": max(peaks) if peaks else None,
                "agent_efficiency": agent.get(job_id),
                "steps": [
                    {
                        "step": step.step,
                        "gpuutil_percent": _per_gpu(step.gpuutil, job.gpus),
                        "gpumem_peak_bytes": step.gpumem_peak,
                    }
                    for step in job.steps
                ],
            }
        )
    return rows
