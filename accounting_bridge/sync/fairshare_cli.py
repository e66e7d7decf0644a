"""`gpucredit fairshare sync [--dry-run] | show`: the ledger's credit as Slurm shares.

    gpucredit fairshare sync [--dry-run]   set each account's and member's shares in Slurm
    gpucredit fairshare show               the shares beside sshare's usage and factor

Tests inject the Slurm runner and the clock through the click context object:
``runner.invoke(root, [...], obj={"runner": FakeRunner(...), "clock": ...})``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import click

from accounting_bridge.cli_support import clock, fail, slurm_runner
from accounting_bridge.slurm.slurmcmd import SlurmCommandError
from accounting_bridge.sync.fairshare import FairsharePolicy, Shares, account_shares, subtree_figures
from accounting_bridge.sync.fairshare_sync import (
    SSHARE_ARGV,
    apply_plan,
    plan_changes,
    read_associations,
    read_sshare,
    show_argv,
)
from ledger import api
from ledger.cli_support import emit, format_option, ledger_command, transaction
from ledger.config import load_config
from ledger.money import format_credits

SYNC_COLUMNS = ["account", "user", "old", "new", "why"]
SHOW_COLUMNS = [
    "account",
    "user",
    "funded",
    "spent",
    "left",
    "shares",
    "slurm_shares",
    "norm_shares",
    "effective_usage",
    "fairshare",
]


@click.group("fairshare")
def fairshare() -> None:
    """Slurm shares from credit and spend (docs/fairshare.md)."""


def _targets(ctx: click.Context, config: dict[str, Any]) -> tuple[list[api.FairnessInputs], list[Shares]]:
    """The ledger's figures now, and the shares the formula gives them."""
    policy = FairsharePolicy.from_config(config)
    now = clock(ctx)()
    with transaction() as s:
        inputs = api.fairness_inputs(
            s,
            now,
            funded_since=now - timedelta(days=policy.funded_days),
            spent_since=now - timedelta(days=policy.spent_days),
        )
    return inputs, account_shares(inputs, policy)


@fairshare.command("sync")
@click.option("--dry-run", is_flag=True, help="Print the changes and the sacctmgr calls; change nothing.")
@format_option
@click.pass_context
@ledger_command
def sync_command(ctx: click.Context, dry_run: bool, fmt: str) -> None:
    """Set every ledger account's and member's shares in Slurm; a second run changes nothing."""
    config = load_config()
    cluster = config["slurm"]["cluster"]
    run = slurm_runner(ctx, config)
    _inputs, targets = _targets(ctx, config)
    try:
        plan = plan_changes(targets, read_associations(run(show_argv(cluster))), cluster)
        if not dry_run:
            apply_plan(run, plan)
    except SlurmCommandError as error:
        fail(error)
    rows = [change.as_row() for change in plan.changes]
    if fmt == "json":
        document = {
            "dry_run": dry_run,
            "changes": rows,
            "unchanged": plan.unchanged,
            "missing": list(plan.missing),
            "commands": [list(argv) for argv in plan.commands],
        }
        click.echo(json.dumps(document, indent=2))
        return
    if rows:
        emit(rows, fmt, SYNC_COLUMNS)
    if fmt != "table":
        return
    verb = "would change" if dry_run else "changed"
    calls = f"{len(plan.commands)} sacctmgr call{'s' if len(plan.commands) != 1 else ''}"
    done = f"{verb} {len(rows)} associations with {calls}" if rows else "no changes"
    click.echo(f"{done}; {plan.unchanged} associations already right")
    if plan.missing:
        click.echo(f"not in Slurm, left alone: {', '.join(plan.missing)}")
    if dry_run:
        for argv in plan.commands:
            click.echo(" ".join(argv))


@fairshare.command("show")
@format_option
@click.pass_context
@ledger_command
def show_command(ctx: click.Context, fmt: str) -> None:
    """Each account's (and member's) shares from credit beside Slurm's: RawShares,
    NormShares, EffectvUsage and, for users, the fairshare factor (sshare). Accounts go
    through the tree depth first (indented in the table); an account's funded, spent and
    left are its subtree's, the figures its shares come from."""
    config = load_config()
    inputs, targets = _targets(ctx, config)
    try:
        slurm = read_sshare(slurm_runner(ctx, config)(list(SSHARE_ARGV)))
    except SlurmCommandError as error:
        fail(error)
    own_figures = {item.account: item for item in inputs}
    figures = subtree_figures(inputs)  # what each account's shares were computed from
    rows = []
    for target in targets:
        seen = slurm.get((target.account, target.user or ""), {})
        account = figures[target.account]
        own = target.user is None
        indent = "  " * target.depth if fmt == "table" else ""
        rows.append(
            {
                "account": indent + target.account,
                "user": target.user,
                "funded": format_credits(account.funded_ucredits) if own else None,
                "spent": format_credits(
                    account.spent_ucredits
                    if own
                    else own_figures[target.account].member_spent_ucredits[target.user or ""]
                ),
                "left": format_credits(account.left_ucredits) if own else None,
                "shares": target.shares,
                "slurm_shares": seen.get("raw_shares"),
                "norm_shares": seen.get("norm_shares"),
                "effective_usage": seen.get("effective_usage"),
                "fairshare": seen.get("fairshare") or None,
                "parent": target.parent,
                "depth": target.depth,
            }
        )
    emit(rows, fmt, SHOW_COLUMNS + (["parent", "depth"] if fmt == "csv" else []))
