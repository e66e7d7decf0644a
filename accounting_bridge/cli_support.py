"""What the bridge's commands share: the collaborators tests inject, and a Slurm failure's exit.

Tests pass a command's collaborators as click's context object, and each command takes
the one it needs from there, else the real one::

    runner.invoke(root, [...], obj={"runner": FakeRunner(...), "clock": ..., "job_source": ..., "sleep": ...})

What every gpucredit command shares (the ledger session, output formats, a ledger
refusal's exit) is the ledger's, `ledger.cli_support`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any, NoReturn

import click

from accounting_bridge.slurm.slurmcmd import Runner, SubprocessRunner
from ledger.timeutil import utcnow

__all__ = ["clock", "fail", "injected", "slurm_runner"]


def injected(ctx: click.Context, name: str) -> Any:
    """What the caller put in the context object under `name` (tests), else None."""
    obj = ctx.find_object(dict)
    return None if obj is None else obj.get(name)


def clock(ctx: click.Context) -> Callable[[], datetime]:
    """The injected clock, else UTC now."""
    found: Callable[[], datetime] = injected(ctx, "clock") or utcnow
    return found


def slurm_runner(ctx: click.Context, config: dict[str, Any]) -> Runner:
    """The injected runner, else Slurm's commands from `slurm.bin_dir`."""
    runner: Runner = injected(ctx, "runner") or SubprocessRunner(config["slurm"]["bin_dir"])
    return runner


def fail(error: Exception) -> NoReturn:
    """A Slurm command that failed or printed what we cannot read: exit 1, say which."""
    click.echo(f"error: {error}", err=True)
    for note in getattr(error, "__notes__", []):
        click.echo(f"error: {note}", err=True)
    sys.exit(1)
