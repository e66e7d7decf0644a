"""Mirror Slurm's accounts and their users into the ledger (`gpucredit account import-slurm`).

Slurm is the authority on who may charge which account; the ledger needs an account
row to hold credit and a member row per user. Importing twice changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import click
from sqlalchemy.orm import Session

from accounting_bridge.slurm.slurmcmd import SlurmCommandError, SubprocessRunner
from accounting_bridge.sync.assoc_batch import show_associations_argv
from ledger import api
from ledger.cli_support import emit, format_option, ledger_command, transaction
from ledger.config import load_config
from ledger.errors import InvalidInput

SACCTMGR_ARGV = show_associations_argv("cluster", "account", "user")  # every cluster: --cluster picks
SKIPPED_ACCOUNTS = {"root"}  # Slurm's own tree root; nobody is billed to it


@dataclass
class ImportResult:
    accounts_created: list[str] = field(default_factory=list)
    members_added: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def parse_associations(text: str, cluster: str | None = None) -> dict[str, set[str]]:
    """`sacctmgr -nP show assoc format=cluster,account,user` -> {account: {users}}."""
    accounts: dict[str, set[str]] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 3 or (cluster and parts[0] != cluster):
            continue
        account, user = parts[1].strip(), parts[2].strip()
        if not account or account in SKIPPED_ACCOUNTS:
            continue
        users = accounts.setdefault(account, set())
        if user:
            users.add(user)
    return accounts


def import_associations(s: Session, associations: dict[str, set[str]]) -> ImportResult:
    result = ImportResult()
    for account in sorted(associations):
        try:
            if api.ensure_account(s, account):
                result.accounts_created.append(account)
        except InvalidInput:
            result.skipped.append(account)
            continue
        members = set(api.members(s, account))
        for user in sorted(associations[account]):
            if user not in members:
                api.add_member(s, user, account)
                result.members_added.append(f"{user}@{account}")
    return result


@click.command("import-slurm")
@click.option("--cluster", default=None, help="Only this cluster's associations (default: the config's).")
@format_option
@ledger_command
def import_slurm_command(cluster: str | None, fmt: str) -> None:
    """Create ledger accounts and members from Slurm's associations (repeat-safe)."""
    config = load_config()
    run = SubprocessRunner(config["slurm"]["bin_dir"])
    try:
        text = run(SACCTMGR_ARGV)
    except SlurmCommandError as error:
        raise click.ClickException(str(error)) from error
    with transaction() as s:
        result = import_associations(s, parse_associations(text, cluster or config["slurm"]["cluster"]))
    summary: dict[str, Any] = {
        "accounts_created": result.accounts_created,
        "members_added": result.members_added,
        "skipped": result.skipped,
    }
    if fmt == "json":
        emit(summary, fmt)
    else:
        click.echo(
            f"{len(result.accounts_created)} accounts created, {len(result.members_added)} members "
            f"added, {len(result.skipped)} skipped"
            + (f" ({', '.join(result.skipped)}: not valid ledger names)" if result.skipped else "")
        )
