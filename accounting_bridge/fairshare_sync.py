"""Push the formula's shares (accounting_bridge/fairshare.py) into Slurm's associations.

Read what Slurm has (`sacctmgr show associations`), plan the changes (pure), apply
them with as few `sacctmgr modify` calls as Slurm allows, and read `sshare` for
`gpucredit fairshare show`. Every call costs about 0.3 s on the box whatever its
length (bench/fairshare_sync.py), so the calls are batched:

* accounts that get the same shares: one `modify account where name=a,b set fairshare=N`;
* users that get the same shares: one `modify user where name=u1,u2 account=a,b set
  fairshare=N`, which changes every association in users x accounts. Accounts join a
  batch only while that product touches no association meant to get another value
  (nor one the ledger does not know), so it is exact, not approximate.

Lists are cut at MAX_LIST_CHARS so no argument nears the kernel's 128 KiB limit.
A sync that fails half-way leaves Slurm part-updated; the next one finishes it, as a
sync of what is already right plans nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accounting_bridge.fairshare import Shares
from accounting_bridge.slurmcmd import Runner, SlurmCommandError
from slurmtext import parse_parsable, parse_raw_shares

__all__ = [
    "MAX_LIST_CHARS",
    "SSHARE_ARGV",
    "Change",
    "Plan",
    "apply_plan",
    "plan_changes",
    "read_associations",
    "read_sshare",
    "show_argv",
]

MAX_LIST_CHARS = 32_000
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
    return [
        "sacctmgr",
        "--noheader",
        "--parsable2",
        "show",
        "associations",
        "where",
        f"cluster={cluster}",
        "format=account,user,partition,fairshare",
    ]


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
    commands = _account_commands(changes, cluster, max_list_chars)
    commands += _user_commands(changes, current, desired, cluster, max_list_chars)
    return Plan(tuple(changes), tuple(commands), unchanged, tuple(missing))


def _modify(kind: str, where: Sequence[str], cluster: str, shares: int) -> tuple[str, ...]:
    return (
        "sacctmgr",
        "--immediate",
        "modify",
        kind,
        "where",
        *where,
        f"cluster={cluster}",
        "set",
        f"fairshare={shares}",
    )


def _account_commands(changes: Sequence[Change], cluster: str, max_list_chars: int) -> list[tuple[str, ...]]:
    by_value: dict[int, list[str]] = {}
    for change in changes:
        if change.user is None:
            by_value.setdefault(change.new, []).append(change.account)
    commands = []
    for value, names in sorted(by_value.items()):
        for chunk in _chunks(sorted(names), max_list_chars):
            commands.append(_modify("account", [f"name={','.join(chunk)}"], cluster, value))
    return commands


def _chunks(names: Sequence[str], max_list_chars: int) -> Iterable[list[str]]:
    chunk: list[str] = []
    length = -1
    for name in names:
        if chunk and length + 1 + len(name) > max_list_chars:
            yield chunk
            chunk, length = [], -1
        chunk.append(name)
        length += 1 + len(name)
    if chunk:
        yield chunk


@dataclass
class _UserBatch:
    users: set[str]
    accounts: set[str]
    user_chars: int
    account_chars: int


def _user_commands(
    changes: Sequence[Change],
    current: Mapping[Association, tuple[str, ...]],
    desired: Mapping[Association, int],
    cluster: str,
    max_list_chars: int,
) -> list[tuple[str, ...]]:
    users_of: dict[str, set[str]] = {}
    accounts_of: dict[str, set[str]] = {}
    for account, user in current:
        if user:
            users_of.setdefault(account, set()).add(user)
            accounts_of.setdefault(user, set()).add(account)
    by_value: dict[int, dict[str, set[str]]] = {}
    for change in changes:
        if change.user is not None:
            by_value.setdefault(change.new, {}).setdefault(change.account, set()).add(change.user)
    commands = []
    for value, wanted in sorted(by_value.items()):
        batches: list[_UserBatch] = []
        for account, users in sorted(wanted.items()):
            batch = batches[-1] if batches else None
            if batch is None or not _fits(
                batch, account, users, value, users_of, accounts_of, desired, max_list_chars
            ):
                batch = _UserBatch(set(), set(), -1, -1)
                batches.append(batch)
            added = users - batch.users
            batch.user_chars += sum(len(user) + 1 for user in added)
            batch.account_chars += len(account) + 1
            batch.users |= added
            batch.accounts.add(account)
        for batch in batches:
            where = [f"name={','.join(sorted(batch.users))}", f"account={','.join(sorted(batch.accounts))}"]
            commands.append(_modify("user", where, cluster, value))
    return commands


def _fits(
    batch: _UserBatch,
    account: str,
    users: set[str],
    value: int,
    users_of: Mapping[str, set[str]],
    accounts_of: Mapping[str, set[str]],
    desired: Mapping[Association, int],
    max_list_chars: int,
) -> bool:
    """Whether `account` and `users` can join `batch`: the wider users x accounts product
    must reach only associations that are to get `value`, and the lists stay short."""
    new_users = users - batch.users
    if batch.user_chars + sum(len(user) + 1 for user in new_users) > max_list_chars:
        return False
    if batch.account_chars + len(account) + 1 > max_list_chars:
        return False
    for user in users_of.get(account, set()) & batch.users:  # old users x the new account
        if desired.get((account, user)) != value:
            return False
    for user in new_users:  # new users x the old accounts
        for other in accounts_of.get(user, set()) & batch.accounts:
            if desired.get((other, user)) != value:
                return False
    return True


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
