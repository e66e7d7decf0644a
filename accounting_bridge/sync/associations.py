"""Mirror Slurm's accounts, their tree and their users into the ledger (`gpucredit account
import-slurm`).

Slurm is the authority on who may charge which account; the ledger needs an account
row to hold credit and a member row per user. It keeps each account's parent as Slurm
has it in the cluster (parentname; Slurm's `root` is the ledger's top level), so
fairshare can derive a parent's shares from its subtree. Importing twice changes nothing.

A parent Slurm names that is no account of the imported cluster (a row only another
cluster's associations have) is refused, `parent_other_cluster`, before anything is
written: the ledger keeps one tree, the imported cluster's.
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
from slurmtext import SlurmTextError

# every cluster: --cluster picks
SACCTMGR_ARGV = show_associations_argv("cluster", "account", "user", "parentname")
SKIPPED_ACCOUNTS = {"root"}  # Slurm's own tree root; nobody is billed to it


@dataclass
class ImportResult:
    accounts_created: list[str] = field(default_factory=list)
    members_added: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    parents_set: list[str] = field(default_factory=list)  # "child<parent" (or "child<" for the top)


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


def parse_parents(text: str, cluster: str) -> dict[str, str | None]:
    """The same output (with parentname, the fourth field) -> {account: parent} in
    `cluster`, None for a child of Slurm's root. A parent that is no account of `cluster`
    is InvalidInput: `parent_other_cluster` when another cluster has it, else
    `unknown_parent`."""
    parents: dict[str, str | None] = {}
    elsewhere: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 4:
            raise SlurmTextError(f"sacctmgr association line {number}: 4 fields expected, got {line!r}")
        row_cluster, account, user, parent = (part.strip() for part in parts)
        if row_cluster != cluster:
            elsewhere.add(account)
            continue
        if user or not account or account in SKIPPED_ACCOUNTS:
            continue
        parents[account] = None if parent in SKIPPED_ACCOUNTS or not parent else parent
    for account, named in sorted(parents.items()):
        if named is None or named in parents:
            continue
        parent = named
        code = "parent_other_cluster" if parent in elsewhere else "unknown_parent"
        where = "only in another cluster" if parent in elsewhere else "no account"
        raise InvalidInput(
            f"Slurm names {parent} the parent of {account} in cluster {cluster}, but {parent} is "
            f"{where} there; the ledger keeps {cluster}'s tree",
            code=code,
            details={"account": account, "parent": parent, "cluster": cluster},
        )
    return parents


def import_associations(
    s: Session, associations: dict[str, set[str]], parents: dict[str, str | None] | None = None
) -> ImportResult:
    """Create what the ledger lacks of `associations` ({account: users}) and give every
    account its parent from `parents` (ledger.books.tree checks the whole tree first)."""
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
    if parents:
        known = set(api.account_names(s))
        wanted = {
            account: parent
            for account, parent in parents.items()
            if account in known and (parent is None or parent in known)
        }
        changed = api.set_parents(s, wanted)
        result.parents_set = [f"{account}<{parent or ''}" for account, parent in changed.items()]
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
    cluster = cluster or config["slurm"]["cluster"]
    try:
        parents = parse_parents(text, cluster)
    except SlurmTextError as error:
        raise click.ClickException(str(error)) from error
    with transaction() as s:
        result = import_associations(s, parse_associations(text, cluster), parents)
    summary: dict[str, Any] = {
        "accounts_created": result.accounts_created,
        "members_added": result.members_added,
        "parents_set": result.parents_set,
        "skipped": result.skipped,
    }
    if fmt == "json":
        emit(summary, fmt)
    else:
        click.echo(
            f"{len(result.accounts_created)} accounts created, {len(result.members_added)} members "
            f"added, {len(result.parents_set)} parents set, {len(result.skipped)} skipped"
            + (f" ({', '.join(result.skipped)}: not valid ledger names)" if result.skipped else "")
        )
