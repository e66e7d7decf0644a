"""`gpucredit slurm check [--sync]`: Slurm's associations against what the ledger implies.

The consistency check an admin runs after editing Slurm by hand. Every difference is a
row; `--sync` fixes what gpucredit may fix::

    what                in Slurm                          from the ledger             --sync
    account, member     an association                    a customer account, member  imports Slurm's
    parent              the account's parentname          the account's parent        imports Slurm's
    shares              Fairshare                         the fairshare formula       fairshare sync
    GPU limits, blocks  GrpTRES gres/gpu, gres/gpu:TYPE   caps, blocks                limits sync
    scarcity caps       partition QOS MaxTRESPerUser,     allocation, hysteresis      limits sync
                        MaxTRESPerAccount gres/gpu

An account or member only the ledger has is listed and left: Slurm decides who may
charge an account (`account import-slurm` mirrors it into the ledger), so giving a user
access stays an admin's act in sacctmgr. Slurm's `root` account is nobody's to pay.

It also names what makes bills untrustworthy whatever the associations say (from
`scontrol show config`): a Slurm release gpucredit is not tested on, and devices that
are not constrained (a job can then use a GPU it did not ask for). These are notes: they
do not change the exit status.

Exit status: 0 when Slurm and the ledger agree (with --sync: when nothing is left to
fix), 1 otherwise, like any check.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from typing import Any

import click
from sqlalchemy.orm import Session

from accounting_bridge.cli_support import clock, fail, slurm_runner
from accounting_bridge.slurm.slurmcmd import SlurmCommandError
from accounting_bridge.sync import fairshare_sync
from accounting_bridge.sync.associations import SKIPPED_ACCOUNTS, import_associations
from accounting_bridge.sync.fairshare import FairsharePolicy, account_shares
from accounting_bridge.sync.limits_sync import LimitsPlan, SlurmView, apply_plan, plan_limits, read_slurm
from accounting_bridge.sync.scarcity import ScarcityPolicy
from ledger import api
from ledger.cli_support import emit, format_option, ledger_command, transaction
from ledger.config import load_config
from slurmtext import SlurmTextError
from slurmtext.show_config import billing_notes, parse_show_config

__all__ = ["membership_rows", "parent_rows", "slurm_check_command"]

COLUMNS = ["kind", "name", "slurm", "ledger", "fix", "reason"]
IMPORT_FIX = "account import-slurm"
LEDGER_ONLY_FIX = "none (sacctmgr add, if it should run jobs)"
SHOW_CONFIG_ARGV = ("scontrol", "show", "config")


def _row(kind: str, name: str, in_slurm: bool, fix: str, reason: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "name": name,
        "slurm": "yes" if in_slurm else "-",
        "ledger": "-" if in_slurm else "yes",
        "fix": fix,
        "reason": reason,
    }


def membership_rows(view: SlurmView, s: Session) -> tuple[list[dict[str, Any]], dict[str, set[str]]]:
    """Accounts and members on one side only; and what of Slurm's the ledger lacks, as
    `import_associations` takes it ({account: users})."""
    slurm_accounts = {a for a, u in view.associations if not u and a not in SKIPPED_ACCOUNTS}
    slurm_members = {(a, u) for a, u in view.associations if u and a not in SKIPPED_ACCOUNTS}
    ledger_accounts = set(api.account_names(s))
    ledger_members = {(account, user) for user, account in api.memberships(s)}
    rows: list[dict[str, Any]] = []
    to_import: dict[str, set[str]] = {}
    unpaid = "the ledger has no account to charge"
    for account in sorted(slurm_accounts - ledger_accounts):
        rows.append(_row("account", account, True, IMPORT_FIX, unpaid))
        to_import.setdefault(account, set())
    for account in sorted(ledger_accounts - slurm_accounts):
        rows.append(_row("account", account, False, LEDGER_ONLY_FIX, "Slurm runs no job for it"))
    for account, user in sorted(slurm_members - ledger_members):
        rows.append(_row("member", f"{user}@{account}", True, IMPORT_FIX, "the ledger refuses their jobs"))
        to_import.setdefault(account, set()).add(user)
    for account, user in sorted(ledger_members - slurm_members):
        if account in slurm_accounts:  # an account Slurm lacks is listed once, above
            rows.append(
                _row("member", f"{user}@{account}", False, LEDGER_ONLY_FIX, "Slurm refuses their jobs")
            )
    return rows, to_import


def parent_rows(view: SlurmView, s: Session) -> tuple[list[dict[str, Any]], dict[str, str | None]]:
    """Accounts both sides have whose parent differs (Slurm's `root` is the ledger's top
    level, "-"); and Slurm's parents for them, as `api.set_parents` takes them."""
    ledger = api.account_parents(s)
    rows: list[dict[str, Any]] = []
    fixes: dict[str, str | None] = {}
    for account, slurm_parent in sorted(view.parents.items()):
        if account in SKIPPED_ACCOUNTS or account not in ledger:
            continue
        wanted = None if slurm_parent in SKIPPED_ACCOUNTS else slurm_parent
        if ledger[account] == wanted or (wanted is not None and wanted not in ledger):
            continue  # a parent the ledger lacks is listed as a missing account
        rows.append(
            {
                "kind": "parent",
                "name": account,
                "slurm": slurm_parent,
                "ledger": ledger[account] or "-",
                "fix": IMPORT_FIX,
                "reason": "fairshare ranks it among the wrong siblings",
            }
        )
        fixes[account] = wanted
    return rows, fixes


def _plans(
    config: dict[str, Any], now: datetime, view: SlurmView, shares_text: str
) -> tuple[fairshare_sync.Plan, LimitsPlan]:
    """What fairshare sync and limits sync would change, from the ledger as it is now."""
    cluster = config["slurm"]["cluster"]
    fairshare = FairsharePolicy.from_config(config)
    with transaction() as s:
        inputs = api.fairness_inputs(
            s,
            now,
            funded_since=now - timedelta(days=fairshare.funded_days),
            spent_since=now - timedelta(days=fairshare.spent_days),
        )
        ledger = api.enforcement(s, now)
    shares = fairshare_sync.plan_changes(
        account_shares(inputs, fairshare), fairshare_sync.read_associations(shares_text), cluster
    )
    return shares, plan_limits(ledger, view, ScarcityPolicy.from_config(config), cluster)


def _difference_rows(shares: fairshare_sync.Plan, limits: LimitsPlan, fixed: bool) -> list[dict[str, Any]]:
    rows = [
        {
            "kind": "shares",
            "name": f"{c.user}@{c.account}" if c.user else c.account,
            "slurm": c.old,
            "ledger": str(c.new),
            "fix": "fixed" if fixed else "fairshare sync",
            "reason": c.why,
        }
        for c in shares.changes
    ]
    rows += [
        {
            "kind": "scarcity" if c.scope == "partition" else "limit",
            "name": c.name,
            "slurm": c.old,
            "ledger": c.new,
            "fix": "fixed" if fixed else "limits sync",
            "reason": c.reason,
        }
        for c in limits.changes
    ]
    return rows


@click.command("check")
@click.option(
    "--sync",
    "fix",
    is_flag=True,
    help="Fix it: Slurm's accounts and users into the ledger, shares and limits into Slurm.",
)
@format_option
@click.pass_context
@ledger_command
def slurm_check_command(ctx: click.Context, fix: bool, fmt: str) -> None:
    """Compare Slurm's associations (accounts, users, shares, GPU limits, blocks, scarcity
    caps) with what the ledger implies; list every difference, or fix it with --sync."""
    config = load_config()
    cluster = config["slurm"]["cluster"]
    run = slurm_runner(ctx, config)
    now = clock(ctx)()
    try:
        view = read_slurm(run, cluster)
        notes = billing_notes(parse_show_config(run(SHOW_CONFIG_ARGV)))
        shares_text = run(fairshare_sync.show_argv(cluster))
        with transaction() as s:
            rows, to_import = membership_rows(view, s)
            if fix and to_import:
                import_associations(s, to_import)
            moved, parents = parent_rows(view, s)
            rows += moved
            if fix and parents:
                api.set_parents(s, parents)
        shares, limits = _plans(config, now, view, shares_text)
        if fix:
            fairshare_sync.apply_plan(run, shares)
            apply_plan(run, limits)
    except (SlurmCommandError, SlurmTextError) as error:
        fail(error)
    if fix:
        rows = [{**row, "fix": "imported"} if row["fix"] == IMPORT_FIX else row for row in rows]
    rows += _difference_rows(shares, limits, fix)
    left = [row for row in rows if not fix or row["fix"] == LEDGER_ONLY_FIX]
    notes += limits.notes
    if fmt == "json":
        document = {"sync": fix, "differences": rows, "left": len(left), "notes": notes}
        click.echo(json.dumps(document, indent=2))
    else:
        if rows or fmt == "csv":
            emit(rows, fmt, COLUMNS)
        if fmt == "table":
            found = f"{len(rows)} difference{'s' if len(rows) != 1 else ''}"
            click.echo(f"{found}, {len(rows) - len(left)} fixed, {len(left)} left" if fix else found)
            for note in notes:
                click.echo(f"note: {note}")
    if left:
        sys.exit(1)
