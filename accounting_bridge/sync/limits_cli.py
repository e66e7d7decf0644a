"""`gpucredit limits sync [--dry-run]` and `gpucredit limits show ACCOUNT --slurm`.

The `limits` group is the ledger's (ledger/cli.py: `set`, `show`); the CLI root adds
`sync` and replaces `show` with this one, which prints the ledger's caps exactly as
before and, with `--slurm`, what Slurm enforces for them (docs/limits-sync.md).
`--slurm` is a flag rather than the default because it runs Slurm commands, which the
ledger's own view never needs (hosts without Slurm, slurmdbd slow or down).

Tests inject the Slurm runner and the clock through the click context object:
``runner.invoke(root, [...], obj={"runner": FakeRunner(...), "clock": ...})``.
"""

from __future__ import annotations

import json
from typing import Any

import click

from accounting_bridge.cli_support import clock, fail, slurm_runner
from accounting_bridge.slurm.slurmcmd import SlurmCommandError
from accounting_bridge.sync.limits_sync import (
    LimitsPlan,
    SlurmView,
    apply_plan,
    caps_text,
    plan_limits,
    read_slurm,
    tres_text,
)
from accounting_bridge.sync.scarcity import ScarcityDecision, ScarcityPolicy
from ledger import api
from ledger.cli_support import emit, format_option, ledger_command, parse_time_option, transaction
from ledger.config import load_config
from ledger.timeutil import format_time
from slurmtext import SlurmTextError

__all__ = ["limits_show_command", "limits_sync_command"]

CHANGE_COLUMNS = ["scope", "name", "old", "new", "reason"]
SLURM_COLUMNS = ["scope", "wanted", "in_slurm", "reason"]
PARTITION_COLUMNS = ["partition", "gpus", "allocated", "caps", "in_slurm", "reason"]


def plan_document(plan: LimitsPlan) -> dict[str, Any]:
    """A plan as JSON: changes, scarcity decisions, notes and the sacctmgr calls."""
    return {
        "changes": [change.as_row() for change in plan.changes],
        "scarcity": [_decision_row(d) for d in plan.scarcity],
        "unchanged": plan.unchanged,
        "notes": list(plan.notes),
        "missing": list(plan.missing),
        "commands": [list(argv) for argv in plan.commands],
    }


def _decision_row(decision: ScarcityDecision) -> dict[str, Any]:
    return {
        "partition": decision.partition,
        "gpus": decision.gpus,
        "allocated": decision.allocated,
        "engaged": decision.engaged,
        "max_per_user": decision.max_per_user,
        "max_per_account": decision.max_per_account,
        "reason": decision.reason,
    }


def emit_plan_summary(plan: LimitsPlan, dry_run: bool) -> None:
    """The table form's closing lines: counts, notes, and with --dry-run the calls."""
    verb = "would change" if dry_run else "changed"
    calls = f"{len(plan.commands)} sacctmgr call{'s' if len(plan.commands) != 1 else ''}"
    done = f"{verb} {len(plan.changes)} with {calls}" if plan.changes else "no changes"
    click.echo(f"{done}; {plan.unchanged} already right")
    if plan.missing:
        click.echo(f"not in Slurm, left alone: {', '.join(plan.missing)}")
    for note in plan.notes:
        click.echo(f"note: {note}")
    if dry_run:
        for argv in plan.commands:
            click.echo(" ".join(argv))


@click.command("sync")
@click.option("--dry-run", is_flag=True, help="Print the changes and the sacctmgr calls; change nothing.")
@click.option("--at", "at", default=None, metavar="TIME", help="Blocks as at TIME (e.g. past midnight).")
@format_option
@click.pass_context
@ledger_command
def limits_sync_command(ctx: click.Context, dry_run: bool, at: str | None, fmt: str) -> None:
    """Write the ledger's GPU caps and blocks, and scarcity caps, into Slurm's limits;
    a second run changes nothing."""
    config = load_config()
    cluster = config["slurm"]["cluster"]
    now = parse_time_option(at, "at") or clock(ctx)()
    run = slurm_runner(ctx, config)
    try:
        policy = ScarcityPolicy.from_config(config)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    with transaction() as s:
        ledger = api.enforcement(s, now)
    try:
        plan = plan_limits(ledger, read_slurm(run, cluster), policy, cluster)
        if not dry_run:
            apply_plan(run, plan)
    except (SlurmCommandError, SlurmTextError) as error:
        fail(error)
    if fmt == "json":
        click.echo(json.dumps({"dry_run": dry_run, "at": format_time(now), **plan_document(plan)}, indent=2))
        return
    rows = [change.as_row() for change in plan.changes]
    if rows or fmt == "csv":
        emit(rows, fmt, CHANGE_COLUMNS)
    if fmt == "table":
        emit_plan_summary(plan, dry_run)


@click.command("show")
@click.argument("account")
@click.option("--slurm", "with_slurm", is_flag=True, help="Also what Slurm enforces, and scarcity caps.")
@format_option
@click.pass_context
@ledger_command
def limits_show_command(ctx: click.Context, account: str, with_slurm: bool, fmt: str) -> None:
    """ACCOUNT's caps; with --slurm, the GPU limits they give its Slurm associations
    (blocks included), what Slurm has now, and the partitions' scarcity caps, with reasons
    (CSV: the caps only; JSON: everything)."""
    config = load_config()
    now = clock(ctx)()
    with transaction() as s:
        result = api.show_limits(s, account)
        ledger = api.enforcement(s, now, [account]) if with_slurm else []
    view: SlurmView | None = None
    plan: LimitsPlan | None = None
    if with_slurm:
        cluster = config["slurm"]["cluster"]
        try:
            view = read_slurm(slurm_runner(ctx, config), cluster)
            plan = plan_limits(ledger, view, ScarcityPolicy.from_config(config), cluster)
        except (SlurmCommandError, SlurmTextError) as error:
            fail(error)
    slurm_rows = [] if plan is None or view is None else _association_rows(plan, view)
    partition_rows = [] if plan is None or view is None else _partition_rows(plan, view)
    if fmt == "json":
        if plan is not None:
            result["slurm"] = {
                "associations": slurm_rows,
                "partitions": partition_rows,
                "notes": list(plan.notes),
            }
        emit(result, fmt)
        return
    rows = [{"scope": "account", **result["account_limits"]}]
    rows += [{"scope": f"user {u}", **lim} for u, lim in result["users"].items()]
    emit(rows, fmt, ["scope", "max_gpus", "max_rate", "daily_cap"])
    if plan is None or fmt == "csv":
        return
    click.echo("")
    emit(slurm_rows, fmt, SLURM_COLUMNS)
    if partition_rows:
        click.echo("")
        emit(partition_rows, fmt, PARTITION_COLUMNS)
    for note in plan.notes:
        click.echo(f"note: {note}")


def _association_rows(plan: LimitsPlan, view: SlurmView) -> list[dict[str, Any]]:
    rows = []
    for target in plan.targets:
        current = view.associations[(target.account, target.user or "")]
        wanted = () if target.gpus is None else tuple((name, target.gpus) for name in view.gpu_tres)
        rows.append(
            {
                "scope": f"user {target.user}" if target.user else "account",
                "wanted": tres_text(wanted),
                "in_slurm": " | ".join(sorted({tres_text(limits) for limits in current})),
                "reason": target.reason,
            }
        )
    return rows


def _partition_rows(plan: LimitsPlan, view: SlurmView) -> list[dict[str, Any]]:
    rows = []
    for decision in plan.scarcity:
        qos = view.partition_qos[decision.partition]
        rows.append(
            {
                "partition": decision.partition,
                "gpus": decision.gpus,
                "allocated": decision.allocated,
                "caps": caps_text(decision.max_per_user, decision.max_per_account),
                "in_slurm": caps_text(*view.qos_limits[qos]) if qos is not None else "-",
                "reason": decision.reason,
            }
        )
    return rows
