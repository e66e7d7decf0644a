"""The sync's sacctmgr command lines: the one that reads associations, and `modify` calls
for many changes, as few as Slurm's where lists allow.

Every reader of Slurm's associations (`account import-slurm`, fairshare, limits, `slurm
check`) runs :func:`show_associations_argv` with the fields it needs.

One `sacctmgr modify` costs about 0.3 s on the box whatever it changes (one to 500
associations measured alike; commands piped into one sacctmgr cost the same each), and
its where clause takes lists, so changes to the same value share a call:

* accounts or QOS: one `modify account|qos where name=a,b,... set VALUE` per value;
* users: `modify user where name=u1,u2 account=a,b set VALUE` changes every association
  in users x accounts. A batch grows only while that product reaches no existing
  association meant to get another value, nor one nothing was planned for, so each call
  changes exactly what was planned. Associations already at the value count as planned
  for it (they may join a batch: setting them again changes nothing).

Lists are cut at `max_list_chars` so no argument nears the kernel's 128 KiB limit.
A value is the `set` clause's words, e.g. ("GrpTRES=gres/gpu=2,gres/gpu:a100=2",).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["MAX_LIST_CHARS", "Value", "named_commands", "show_associations_argv", "user_commands"]

MAX_LIST_CHARS = 32_000
SHOW_ASSOCIATIONS = ("sacctmgr", "--noheader", "--parsable2", "show", "associations")
Value = tuple[str, ...]
Command = tuple[str, ...]


def show_associations_argv(*fields: str, cluster: str | None = None) -> list[str]:
    """`sacctmgr show associations` printing `fields`, of one cluster (None: every cluster),
    one row per association, `|`-separated, without a header."""
    where = ["where", f"cluster={cluster}"] if cluster is not None else []
    return [*SHOW_ASSOCIATIONS, *where, f"format={','.join(fields)}"]


def _modify(kind: str, where: Sequence[str], value: Value) -> Command:
    return ("sacctmgr", "--immediate", "modify", kind, "where", *where, "set", *value)


def _chunks(names: Iterable[str], max_list_chars: int) -> Iterator[list[str]]:
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


def named_commands(
    kind: str,
    changes: Mapping[str, Value],
    *,
    where: Sequence[str] = (),
    max_list_chars: int = MAX_LIST_CHARS,
) -> list[Command]:
    """One call per value for accounts (`where`: ["cluster=C"]) or QOS, names sorted."""
    by_value: dict[Value, list[str]] = {}
    for name, value in changes.items():
        by_value.setdefault(value, []).append(name)
    return [
        _modify(kind, [f"name={','.join(chunk)}", *where], value)
        for value, names in sorted(by_value.items())
        for chunk in _chunks(sorted(names), max_list_chars)
    ]


@dataclass
class _Batch:
    users: set[str] = field(default_factory=set)
    accounts: set[str] = field(default_factory=set)
    user_chars: int = 0
    account_chars: int = 0


def user_commands(
    changes: Mapping[tuple[str, str], Value],
    planned: Mapping[tuple[str, str], Value],
    associations: Iterable[tuple[str, str]],
    *,
    cluster: str,
    max_list_chars: int = MAX_LIST_CHARS,
) -> list[Command]:
    """Calls that set each (account, user) in `changes` to its value and touch no other
    existing association (`associations`) unless `planned` gives it that same value.
    `planned` holds every association with a target, changed or already right."""
    users_of: dict[str, set[str]] = {}
    accounts_of: dict[str, set[str]] = {}
    for account, user in associations:
        users_of.setdefault(account, set()).add(user)
        accounts_of.setdefault(user, set()).add(account)
    by_value: dict[Value, dict[str, set[str]]] = {}
    for (account, user), value in changes.items():
        by_value.setdefault(value, {}).setdefault(account, set()).add(user)
    commands = []
    for value, wanted in sorted(by_value.items()):
        batches: list[_Batch] = []
        for account, all_users in sorted(wanted.items()):
            for chunk in _chunks(sorted(all_users), max_list_chars):
                users = set(chunk)
                home = next(
                    (
                        b
                        for b in batches
                        if _fits(b, account, users, value, users_of, accounts_of, planned, max_list_chars)
                    ),
                    None,
                )
                if home is None:
                    home = _Batch()
                    batches.append(home)
                added = users - home.users
                home.user_chars += sum(len(user) + 1 for user in added)
                home.account_chars += len(account) + 1
                home.users |= added
                home.accounts.add(account)
        for batch in batches:
            where = [
                f"name={','.join(sorted(batch.users))}",
                f"account={','.join(sorted(batch.accounts))}",
                f"cluster={cluster}",
            ]
            commands.append(_modify("user", where, value))
    return commands


def _fits(
    batch: _Batch,
    account: str,
    users: set[str],
    value: Value,
    users_of: Mapping[str, set[str]],
    accounts_of: Mapping[str, set[str]],
    planned: Mapping[tuple[str, str], Value],
    max_list_chars: int,
) -> bool:
    """Whether `account` and `users` may join `batch`: the product stays exact and short."""
    new_users = users - batch.users
    if batch.user_chars + sum(len(user) + 1 for user in new_users) > max_list_chars:
        return False
    if batch.account_chars + len(account) + 1 > max_list_chars:
        return False
    for user in users_of.get(account, set()) & (batch.users | users):  # all users x the new account
        if planned.get((account, user)) != value:
            return False
    for user in new_users:  # new users x the batch's accounts
        for other in accounts_of.get(user, set()) & batch.accounts:
            if planned.get((other, user)) != value:
                return False
    return True
