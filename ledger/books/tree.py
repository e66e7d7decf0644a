"""The account tree: each customer account may have a parent, as Slurm's accounts do.

Slurm keeps accounts in a tree (root -> college -> department -> group -> project) and
Fair Tree ranks siblings level by level; the ledger keeps the same tree so fairshare can
derive a parent's shares from its subtree, and transfers can ask "is this account in
that one's subtree?". A NULL parent is a top-level account (a child of Slurm's `root`,
which nobody pays and the ledger does not keep).

Changing the tree moves no money, so it locks no account. Every change is checked as a
whole before anything is written: the parent must be a customer account, and no
account may end up its own ancestor (`parent_cycle`). Either is InvalidInput (422,
exit status 2), and nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ledger.books import idempotency
from ledger.errors import InvalidInput, NotFound
from ledger.store.tables import accounts_t

__all__ = [
    "account_parents",
    "ancestors",
    "check_tree",
    "children_of",
    "set_parent",
    "set_parents",
    "subtree",
    "tree_order",
]

# A tree deeper than this is a mistake (Slurm sites use four or five levels); walks stop
# here instead of looping on a corrupt row.
MAX_DEPTH = 64


def account_parents(s: Session) -> dict[str, str | None]:
    """Every customer account's parent by name (None: top level), by account name."""
    parent = accounts_t.alias("parent")
    rows = s.execute(
        select(accounts_t.c.name, parent.c.name)
        .outerjoin(parent, parent.c.id == accounts_t.c.parent_id)
        .where(accounts_t.c.kind == "customer")
        .order_by(accounts_t.c.name)
    )
    return {name: parent_name for name, parent_name in rows}


def children_of(parents: Mapping[str, str | None]) -> dict[str | None, list[str]]:
    """{parent (None: the top level): its children, by name} from `account_parents`."""
    children: dict[str | None, list[str]] = {}
    for name in sorted(parents):
        children.setdefault(parents[name], []).append(name)
    return children


def ancestors(parents: Mapping[str, str | None], name: str) -> list[str]:
    """`name`'s parent, its parent, ... up to the top level (nearest first)."""
    found: list[str] = []
    current = parents.get(name)
    while current is not None:
        if current == name or current in found or len(found) >= MAX_DEPTH:
            raise InvalidInput(
                f"account {name} would be its own ancestor ({' -> '.join([name, *found, current])})",
                code="parent_cycle",
                details={"account": name, "path": [name, *found, current]},
            )
        found.append(current)
        current = parents.get(current)
    return found


def subtree(parents: Mapping[str, str | None], name: str) -> list[str]:
    """`name` and every account below it, each after its parent (siblings by name)."""
    children = children_of(parents)
    order: list[str] = []
    stack = [name]
    while stack:
        current = stack.pop()
        order.append(current)
        stack.extend(reversed(children.get(current, [])))
    return order


def tree_order(parents: Mapping[str, str | None]) -> list[tuple[str, int]]:
    """Every account with its depth (0: top level), depth first, siblings by name: the
    order `fairshare show` and the portal print the tree in."""
    children = children_of(parents)
    order: list[tuple[str, int]] = []
    stack = [(name, 0) for name in reversed(children.get(None, []))]
    while stack:
        name, depth = stack.pop()
        order.append((name, depth))
        stack.extend((child, depth + 1) for child in reversed(children.get(name, [])))
    return order


def check_tree(parents: Mapping[str, str | None], first: Iterable[str] = ()) -> None:
    """Raise InvalidInput unless every parent is an account and there is no cycle; the
    accounts in `first` (those being moved) are checked, and named, first."""
    order = [*sorted(first), *sorted(parents)]
    for name in order:
        parent = parents.get(name)
        if parent is not None and parent not in parents:
            raise InvalidInput(
                f"parent account {parent!r} of {name} does not exist",
                code="unknown_parent",
                details={"account": name, "parent": parent},
            )
    for name in order:
        ancestors(parents, name)


def set_parents(s: Session, changes: Mapping[str, str | None]) -> dict[str, str | None]:
    """Give each account in `changes` its new parent (None: top level), checked as one new
    tree: a swap that is a cycle half-way is fine when the end is a tree. Returns the
    changes that were not already so."""
    parents = account_parents(s)
    for name in sorted(changes):
        if name not in parents:
            raise NotFound(f"account {name!r} does not exist", details={"account": name})
    proposed = {**parents, **changes}
    check_tree(proposed, first=changes)
    changed = {name: parent for name, parent in sorted(changes.items()) if parents[name] != parent}
    for name, parent in changed.items():
        parent_id = (
            None
            if parent is None
            else select(accounts_t.c.id).where(accounts_t.c.name == parent).scalar_subquery()
        )
        s.execute(
            update(accounts_t)
            .where(accounts_t.c.name == name, accounts_t.c.kind == "customer")
            .values(parent_id=parent_id)
        )
    return changed


def set_parent(
    s: Session, name: str, parent: str | None, *, idempotency_key: str | None = None
) -> dict[str, Any]:
    """Move `name` under `parent` (None: to the top level) with its whole subtree."""
    request = {"account": name, "parent": parent}
    return idempotency.once(
        s,
        idempotency.GLOBAL_SCOPE,
        idempotency_key,
        "account_parent",
        request,
        lambda: _set_parent(s, name, parent),
    )


def _set_parent(s: Session, name: str, parent: str | None) -> dict[str, Any]:
    changed = set_parents(s, {name: parent})
    return {"account": name, "parent": parent, "changed": bool(changed)}
