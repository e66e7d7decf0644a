"""Push the formula's shares (accounting_bridge/sync/fairshare.py) into Slurm's associations.

Read what Slurm has (`sacctmgr show associations`), plan the changes (pure), apply
them with as few `sacctmgr modify` calls as Slurm allows, and read `sshare` for
`gpucredit fairshare show`. A call costs about 0.3 s whatever its length
(bench/fairshare_sync.py), so accounts that get the same shares share one call, and so
do users, across accounts, wherever the users x accounts product of the call reaches
only associations meant to get that value (accounting_bridge/sync/assoc_batch.py).

A sync that fails half-way leaves Slurm part-updated; the next one finishes it, as a
sync of what is already right plans nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from accounting_bridge.slurm.slurmcmd import Runner, SlurmCommandError
from accounting_bridge.sync.assoc_batch import (
    MAX_LIST_CHARS,
    Value,
    named_commands,
    show_associations_argv,
    user_commands,
)
from accounting_bridge.sync.fairshare import Shares
from slurmtext import parse_parsable, parse_raw_shares

__all__ = [
    "SSHARE_ARGV",
    "Change",
    "Plan",
    "apply_plan",
    "plan_changes",
    "read_associations",
    "read_sshare",
    "show_argv",
]

_ASSOC_FIELDS = ("account", "user", "partition", "fairshare")
_SSHARE_FIELDS = ("account", "user", "raw_shares", "norm_shares", "raw_usage", "effective_usage", "fairshare")
SSHARE_ARGV = (
    "sshare",
    "--noheader",
    "--parsable2",
    "--all",
    "--format=Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare",
)

Association = tuple[str, str]  # (account, user); user "" is the account's own association


def show_argv(cluster: str) -> list[str]:
    return show_associations_argv(*_ASSOC_FIELDS, cluster=cluster)


def read_associations(text: str) -> dict[Association, tuple[str, ...]]:
    """`show_argv`'s output -> each association's fairshare as printed (`7`, `parent`).

    A user with per-partition associations in one account has one value per partition;
    `modify user ... account=a` sets them all, so they are planned as one.
    """
    found: dict[Association, set[str]] = {}
    for row in parse_parsable(text, _ASSOC_FIELDS):
        parse_raw_shares(row["fairshare"])  # strict: a number or "parent"
        found.setdefault((row["account"], row["user"]), set()).add(row["fairshare"])
    return {key: tuple(sorted(values)) for key, values in found.items()}


@dataclass(frozen=True)
class Change:
    account: str
    user: str | None
    old: str
    new: int
    why: str

    def as_row(self) -> dict[str, Any]:
        return {"account": self.account, "user": self.user, "old": self.old, "new": self.new, "why": self.why}


@dataclass(frozen=True)
class Plan:
    """What a sync changes, the sacctmgr calls that do it, and what it leaves alone."""

    changes: tuple[Change, ...]
    commands: tuple[tuple[str, ...], ...]
    unchanged: int  # associations already right
    missing: tuple[str, ...]  # ledger accounts (`a`) and members (`u@a`) Slurm has no association for


def plan_changes(
    targets: Iterable[Shares],
    current: Mapping[Association, tuple[str, ...]],
    cluster: str,
    *,
    max_list_chars: int = MAX_LIST_CHARS,
) -> Plan:
    """Compare the targets with Slurm's associations and batch the differences (pure)."""
    desired: dict[Association, int] = {}
    changes: list[Change] = []
    missing: list[str] = []
    unchanged = 0
    for target in targets:
        key = (target.account, target.user or "")
        if key not in current:
            missing.append(target.account if target.user is None else f"{target.user}@{target.account}")
            continue
        desired[key] = target.shares
        if current[key] == (str(target.shares),):
            unchanged += 1
        else:
            changes.append(
                Change(target.account, target.user, ",".join(current[key]), target.shares, target.why)
            )
    accounts = {c.account: _value(c.new) for c in changes if c.user is None}
    users = {(c.account, c.user): _value(c.new) for c in changes if c.user is not None}
    commands = named_commands(
        "account", accounts, where=[f"cluster={cluster}"], max_list_chars=max_list_chars
    )
    commands += user_commands(
        users,
        {key: _value(shares) for key, shares in desired.items() if key[1]},
        [key for key in current if key[1]],
        cluster=cluster,
        max_list_chars=max_list_chars,
    )
    return Plan(tuple(changes), tuple(commands), unchanged, tuple(missing))


def _value(shares: int) -> Value:
    return (f"fairshare={shares}",)


def apply_plan(run: Runner, plan: Plan, *, timeout_seconds: float = 60.0) -> None:
    """Run the plan's sacctmgr calls in order. The first failure propagates (the runner's
    SlurmCommandError) with a note of how far it got; the next sync plans what is left."""
    for done, argv in enumerate(plan.commands):
        try:
            run(list(argv), timeout_seconds=timeout_seconds)
        except SlurmCommandError as error:
            error.add_note(f"{done} of {len(plan.commands)} sacctmgr calls were made; sync again to finish")
            raise


def read_sshare(text: str) -> dict[Association, dict[str, str]]:
    """`SSHARE_ARGV`'s output -> each association's row as sshare prints it (the Account
    column's indentation by depth removed)."""
    rows = {}
    for row in parse_parsable(text, _SSHARE_FIELDS):
        row["account"] = row["account"].strip()
        rows[(row["account"], row["user"])] = row
    return rows
