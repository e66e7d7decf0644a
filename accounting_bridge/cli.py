"""`gpucredit bridge ...`: the bridge's services that follow Slurm's jobs, one group.

    gpucredit bridge sacct [--since T] [--follow] [--strict]   finished runs into the ledger  (sacct/cli.py)
    gpucredit bridge reconcile [--all] [--since T]             re-check ingested runs         (sacct/cli.py)
    gpucredit bridge meter [--once] [--interval S]             running jobs' cost so far      (meter/meter.py)
    gpucredit bridge gpu-usage --since T [--until T]           Slurm's GPU gauges per job     (sacct/cli.py)

The group is complete here; the CLI root (gpucredit/cli.py) adds it as it is. The
bridge's other commands are the root's own rows: `fairshare`, `policy`, `agent`, and
`account import-slurm`, `limits sync`, `limits show` and `slurm check` (sync/).
"""

from __future__ import annotations

import click

from accounting_bridge.meter.meter import meter_command
from accounting_bridge.sacct.cli import gpu_usage_command, reconcile_command, sacct_command

__all__ = ["bridge"]


@click.group("bridge")
def bridge() -> None:
    """Slurm accounting <-> ledger: sacct ingestion, reconciliation, metering."""


bridge.add_command(sacct_command)
bridge.add_command(reconcile_command)
bridge.add_command(meter_command)
bridge.add_command(gpu_usage_command)
