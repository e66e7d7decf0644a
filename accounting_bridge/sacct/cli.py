"""`gpucredit bridge sacct` and `gpucredit bridge reconcile`: finished runs into the ledger;
`gpucredit bridge gpu-usage`: Slurm's own GPU gauges beside the agents' (reads only).

    gpucredit bridge sacct [--since T] [--follow] [--interval S] [--strict]   ingest finished runs
    gpucredit bridge reconcile [--all] [--since T]                            re-check ingested runs
    gpucredit bridge gpu-usage --since T [--until T]                         sacct's gres/gpuutil per job

The `bridge` group that holds them, and the meter, is accounting_bridge/cli.py.

Tests inject the job source, the clock and the sleep through the click context
object: ``runner.invoke(root, [...], obj={"job_source": ..., "clock": ..., "sleep": ...})``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from accounting_bridge.cli_support import clock, injected, slurm_runner
from ledger.cli_support import emit, engine_for, format_option, ledger_command, parse_time_option

__all__ = ["gpu_usage_command", "reconcile_command", "sacct_command"]


# --------------------------------------------------------------------------- context


def _job_source(ctx: click.Context, config: dict[str, Any]) -> Any:
    """The injected source (tests), else sacct on this machine.

    Finished runs always come from sacct (see accounting_bridge/slurm/backends.py:
    pyslurm's accounting API loses requeued attempts), so no pyslurm probing here.
    """
    source = injected(ctx, "job_source")
    if source is not None:
        return source
    from accounting_bridge.slurm.backends import CommandsSource
    from accounting_bridge.slurm.slurmcmd import SubprocessRunner

    return CommandsSource(SubprocessRunner(config["slurm"]["bin_dir"]), cluster=config["slurm"]["cluster"])


def _session_factory() -> Any:
    from ledger.store.db import make_sessionmaker

    return make_sessionmaker(engine_for())


# --------------------------------------------------------------------------- output

_COUNT_LABELS = {
    "seen": "runs seen",
    "unchanged": "unchanged since last read",
    "matched": "charge already right",
    "charged": "settled here (epilog lost)",
    "adjusted": "adjusted",
    "unreserved": "charged without a hold",
    "refunded": "refunded (NODE_FAIL)",
    "released": "released (never ran)",
    "not_charged": "nothing to charge",
    "skipped": "skipped (not final)",
    "suspect": "skipped (malformed row in job)",
    "failed": "failed",
    "malformed": "malformed lines",
}


def _summary_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    totals = data["totals"]
    return [
        {"what": _COUNT_LABELS[name], "runs": count, "credits": totals.get(name)}
        for name, count in data["counts"].items()
    ]


def _emit_summary(data: dict[str, Any], fmt: str, heading: str, malformed: list[dict[str, Any]]) -> None:
    """JSON: one object. Table/CSV: the counts, then each malformed line and each run that moved money."""
    if fmt == "json":
        click.echo(json.dumps(data, indent=2))
        return
    if fmt == "table":
        click.echo(heading)
    emit(_summary_rows(data), fmt, ["what", "runs", "credits"])
    if fmt != "table":
        return
    for line in malformed:
        click.echo(f"malformed line {line['line_no']} ({line['output']}): {line['reason']}: {line['line']}")
    if data["runs"]:
        click.echo("")
        emit(data["runs"], fmt, ["job", "display_id", "result", "flags", "change", "charged", "detail"])


def _report_failures(data: dict[str, Any]) -> bool:
    failed = [run for run in data["runs"] if run["result"] == "failed"]
    for run in failed:
        click.echo(f"error: run {run['job']}: {run['detail']}", err=True)
    return bool(failed)


# --------------------------------------------------------------------------- commands


@click.command("sacct")
@click.option("--since", default=None, metavar="TIME", help="Read from TIME instead of the cursor.")
@click.option("--follow", is_flag=True, help="Keep ingesting, one round every --interval seconds.")
@click.option(
    "--interval",
    "interval_seconds",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    metavar="S",
    help="Seconds between rounds with --follow.",
)
@click.option(
    "--overlap",
    "overlap_seconds",
    type=click.IntRange(min=0),
    default=600,
    show_default=True,
    metavar="S",
    help="Re-read this much before the cursor: sacct rows surface late.",
)
@click.option("--strict", is_flag=True, help="A malformed sacct line is fatal: exit 1, cursor unchanged.")
@click.option(
    "--batch-runs",
    type=click.IntRange(min=1, max=100_000),
    default=5_000,
    show_default=True,
    metavar="N",
    help="Runs per reconciliation batch: one read, one bulk write, one transaction per paying account.",
)
@click.option("--rounds", type=click.IntRange(min=1), default=None, hidden=True)
@format_option
@click.pass_context
@ledger_command
def sacct_command(
    ctx: click.Context,
    since: str | None,
    follow: bool,
    interval_seconds: float,
    overlap_seconds: int,
    strict: bool,
    batch_runs: int,
    rounds: int | None,
    fmt: str,
) -> None:
    """Ingest finished runs from sacct and reconcile them with the ledger."""
    from datetime import timedelta

    from sqlalchemy.exc import OperationalError

    from accounting_bridge.sacct.ingest import ingest_round
    from accounting_bridge.sacct.reconcile import Policy
    from accounting_bridge.slurm.slurmcmd import SlurmCommandError
    from ledger.config import load_config

    config = load_config()
    policy = Policy.from_config(config)
    source = _job_source(ctx, config)
    time_now = clock(ctx)
    sleep: Callable[[float], None] = injected(ctx, "sleep") or time.sleep
    first_since = parse_time_option(since, "since")
    factory = _session_factory()
    done = 0
    status = 0
    while True:
        try:
            result = ingest_round(
                factory,
                source,
                now=time_now(),
                since=first_since if done == 0 else None,
                overlap=timedelta(seconds=overlap_seconds),
                policy=policy,
                strict=strict,
                batch_runs=batch_runs,
            )
        except (SlurmCommandError, OperationalError) as error:
            # Nothing moved: the next round reads the same window again.
            click.echo(f"error: {error}", err=True)
            status = 1
        else:
            data = result.as_dict()
            heading = f"sacct {data['since']} .. {data['until']}" + (
                f"; cursor {data['cursor_after']}" if data["cursor_after"] else "; cursor unchanged"
            )
            _emit_summary(data, fmt, heading, data["malformed"])
            if result.aborted:
                click.echo(
                    f"error: {len(result.malformed)} malformed sacct line(s) and --strict: "
                    "nothing reconciled, cursor unchanged",
                    err=True,
                )
                status = 1
            elif _report_failures(data):
                status = 1
            else:
                status = 0
        done += 1
        if not follow or (rounds is not None and done >= rounds):
            break
        sleep(interval_seconds)
    if status:
        sys.exit(status)


@click.command("reconcile")
@click.option("--all", "include_all", is_flag=True, help="Every ingested run, not only failed ones.")
@click.option("--since", default=None, metavar="TIME", help="Only runs that ended at or after TIME.")
@format_option
@click.pass_context
@ledger_command
def reconcile_command(ctx: click.Context, include_all: bool, since: str | None, fmt: str) -> None:
    """Reconcile runs already ingested (from job_runs, without asking Slurm) with the ledger.

    By default retries the runs a previous round could not reconcile (flag
    `error`: an unknown account or GPU type, ...); with --all, re-checks every
    charge against Slurm's record, e.g. after a price or policy change.
    """
    from accounting_bridge.sacct.reconcile import Policy, reconcile_stored
    from ledger.config import load_config

    summary = reconcile_stored(
        _session_factory(),
        Policy.from_config(load_config()),
        include_all=include_all,
        since=parse_time_option(since, "since"),
        now=clock(ctx)(),
    )
    data = summary.as_dict()
    data["counts"]["malformed"] = 0
    _emit_summary(data, fmt, "reconcile " + ("all ingested runs" if include_all else "failed runs"), [])
    if _report_failures(data):
        sys.exit(1)


GPU_USAGE_COLUMNS = ["job_id", "gpus", "slurm_gpuutil_percent", "slurm_gpumem_peak_bytes", "agent_efficiency"]


@click.command("gpu-usage")
@click.option("--since", required=True, metavar="TIME", help="Jobs active at or after TIME.")
@click.option("--until", default=None, metavar="TIME", help="...and before TIME (default: now).")
@format_option
@click.pass_context
@ledger_command
def gpu_usage_command(ctx: click.Context, since: str, until: str | None, fmt: str) -> None:
    """Per GPU job: Slurm's gres/gpuutil and gres/gpumem (gpu/nvml) beside the agent's efficiency.

    slurm_gpuutil_percent is the busiest step's last sample per allocated GPU; blank where
    slurmd does not run the gpu/nvml plugin. agent_efficiency is busy / allocated
    GPU-seconds of the job's latest run, as `gpucredit report --efficiency` shows it.
    """
    from accounting_bridge.slurm.gpu_gauges import gauge_rows, read_step_gauges, step_gauges_argv
    from ledger import api
    from ledger.config import load_config

    config = load_config()
    start = parse_time_option(since, "since")
    end = parse_time_option(until, "until") or clock(ctx)()
    assert start is not None
    if end < start:
        raise click.UsageError(f"--until ({end}) is before --since ({start})")
    run_sacct = slurm_runner(ctx, config)
    jobs = read_step_gauges(run_sacct(step_gauges_argv(start, end, cluster=config["slurm"]["cluster"])))
    cluster = config["slurm"]["cluster"]
    runs: list[tuple[int, int, str | None]] = []
    with _session_factory()() as s:
        for row in api.efficiency_report(s, by="job", start=start, end=end):
            row_cluster, job_id, run = row["job"].rsplit("/", 2)
            if row_cluster == cluster and int(job_id) in jobs:
                runs.append((int(job_id), int(run), row["efficiency"]))
    agent = {job_id: efficiency for job_id, _run, efficiency in sorted(runs)}  # the latest run's
    rows = gauge_rows(jobs, agent)
    if fmt == "json":
        emit(rows, fmt)
    else:
        emit([{c: row[c] for c in GPU_USAGE_COLUMNS} for row in rows], fmt, GPU_USAGE_COLUMNS)
