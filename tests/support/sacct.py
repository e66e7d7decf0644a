"""Runs as sacct reports them, made by hand: `synthetic(job_id, **fields)` is a finished
one-GPU run at T."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from accounting_bridge.slurm.records import SacctRun

T = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def synthetic(job_id: int, **fields: Any) -> SacctRun:
    """A finished run as sacct reports it; fields override."""
    start = fields.pop("start", T)
    elapsed = fields.pop("elapsed_seconds", 600)
    values: dict[str, Any] = {
        "cluster": "lab",
        "job_id": job_id,
        "display_id": str(job_id),
        "run": 0,
        "user": "alice",
        "account": "physics",
        "partition": "onprem",
        "state": "COMPLETED",
        "submit": start,
        "start": start,
        "end": start + timedelta(seconds=elapsed) if start is not None else T,
        "elapsed_seconds": elapsed,
        "time_limit_seconds": 3600,
        "gpus": {"a100": 1},
        "requested_gpus": {"a100": 1},
        "nodes": ("node1",),
        "node_count": 1,
        "name": "job",
    }
    values.update(fields)
    return SacctRun(**values)
