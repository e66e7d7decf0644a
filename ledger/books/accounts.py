"""Customer accounts (mirroring Slurm accounts) and their members (ledger.limits.caps: their caps)."""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import insert, or_, select, update
from sqlalchemy.orm import Session

from ledger.books import idempotency
from ledger.books.journal import LockedAccount
from ledger.errors import Conflict, InvalidInput, NotFound
from ledger.store.bulk import among, select_many
from ledger.store.tables import accounts_t, members_t
from ledger.timeutil import format_time, utcnow

# Slurm account and user names: letters, digits, '_', '-', '.'; ':' is reserved for system accounts.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


def check_name(name: str, what: str = "account") -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInput(
            f"{what} name {name!r} is not a valid Slurm name", code=f"invalid_{what}", details={"value": name}
        )
    return name


def create_account(
    s: Session,
    name: str,
    *,
    parent: str | None = None,
    at: datetime | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """A customer account, under `parent` (None: top level; ledger.books.tree). It locks no
    customer account yet, so its key is global."""
    request: dict[str, Any] = {"name": name, "at": format_time(at)}
    if parent is not None:  # a request without a parent hashes as it did before trees
        request["parent"] = parent
    return idempotency.once(
        s,
        idempotency.GLOBAL_SCOPE,
        idempotency_key,
        "account_create",
        request,
        lambda: _create_account(s, name, parent=parent, at=at),
    )


def _create_account(
    s: Session, name: str, *, parent: str | None = None, at: datetime | None = None
) -> dict[str, Any]:
    check_name(name)
    existing = s.execute(select(accounts_t.c.id).where(accounts_t.c.name == name)).first()
    if existing:
        raise Conflict(f"account {name} already exists", code="already_exists", details={"account": name})
    parent_id = None
    if parent is not None:
        found = s.execute(
            select(accounts_t.c.id).where(accounts_t.c.name == parent, accounts_t.c.kind == "customer")
        ).first()
        if found is None:
            raise InvalidInput(
                f"parent account {parent!r} of {name} does not exist",
                code="unknown_parent",
                details={"account": name, "parent": parent},
            )
        parent_id = found.id
    s.execute(
        insert(accounts_t).values(
            name=name,
            kind="customer",
            created_at=at or utcnow(),
            debt_ucredits=0,
            entry_count=0,
            head_hash="",
            parent_id=parent_id,
        )
    )
    return {"account": name, "created": True, "parent": parent}


def ensure_account(s: Session, name: str) -> bool:
    """Create `name` unless it exists; True when it was created."""
    check_name(name)
    if s.execute(select(accounts_t.c.id).where(accounts_t.c.name == name)).first():
        return False
    _create_account(s, name)
    return True


_LOCKED_COLUMNS = (
    accounts_t.c.id,
    accounts_t.c.name,
    accounts_t.c.debt_ucredits,
    accounts_t.c.entry_count,
    accounts_t.c.head_hash,
)


def lock_account(s: Session, name: str) -> LockedAccount:
    """Lock one customer account row for the rest of the transaction."""
    return read_account(s, name, lock=True)


def lock_accounts(s: Session, names: Collection[str] = (), ids: Any = None) -> dict[int, LockedAccount]:
    """Lock several customer accounts in one statement, in id order; returns them by id.

    For a batch of single-account operations in one transaction (the daemon's group
    commit): locked one by one in arrival order, two batches could take the same two
    accounts in opposite orders and deadlock. `ids` may be a subquery. On SQLite the rows
    are only read: BEGIN IMMEDIATE already holds the whole database. Names that are no
    customer account are left out (`no_account` is the refusal).
    """
    if not names and ids is None:
        return {}
    postgres = s.get_bind().dialect.name == "postgresql"
    if ids is None or isinstance(ids, (list, tuple, set, frozenset)):
        # One SQL text whatever the lists (select_many): on PostgreSQL, a transaction's
        # first statement goes out with its BEGIN, one round trip for both.
        params = {"names": sorted(names), "ids": sorted(ids or ())}
        return {row.id: LockedAccount(*row) for row in select_many(s, [(lock_query(postgres), params)])[0]}
    wanted = []
    if names:
        wanted.append(accounts_t.c.name.in_(sorted(names)))
    wanted.append(accounts_t.c.id.in_(ids))
    query = (
        select(*_LOCKED_COLUMNS)
        .where(accounts_t.c.kind == "customer", or_(*wanted))
        .order_by(accounts_t.c.id)
    )
    if s.get_bind().dialect.name == "postgresql":
        query = query.with_for_update()
    return {row.id: LockedAccount(*row) for row in s.execute(query)}


_LOCK_QUERIES: dict[bool, Any] = {}


def lock_query(postgres: bool) -> Any:
    """The statement of `lock_accounts`, taking lists `names` and `ids` (`select_many`)."""
    if postgres not in _LOCK_QUERIES:
        query = select(*_LOCKED_COLUMNS).where(
            accounts_t.c.kind == "customer",
            or_(among(accounts_t.c.name, "names", postgres), among(accounts_t.c.id, "ids", postgres)),
        )
        query = query.order_by(accounts_t.c.id)
        _LOCK_QUERIES[postgres] = query.with_for_update() if postgres else query
    return _LOCK_QUERIES[postgres]


def no_account(name: str) -> NotFound:
    return NotFound(f"account {name!r} does not exist", details={"account": name})


def lock_account_by_id(s: Session, account_id: Any) -> LockedAccount | None:
    """Lock a customer account by id (or by a scalar subquery yielding it)."""
    query = select(
        accounts_t.c.id,
        accounts_t.c.name,
        accounts_t.c.debt_ucredits,
        accounts_t.c.entry_count,
        accounts_t.c.head_hash,
    ).where(accounts_t.c.id == account_id, accounts_t.c.kind == "customer")
    if s.get_bind().dialect.name == "postgresql":
        query = query.with_for_update()
    row = s.execute(query).first()
    return (
        None
        if row is None
        else LockedAccount(row.id, row.name, row.debt_ucredits, row.entry_count, row.head_hash)
    )


def read_account(s: Session, name: str, *, lock: bool = False) -> LockedAccount:
    query = select(
        accounts_t.c.id,
        accounts_t.c.name,
        accounts_t.c.debt_ucredits,
        accounts_t.c.entry_count,
        accounts_t.c.head_hash,
    ).where(accounts_t.c.name == name, accounts_t.c.kind == "customer")
    if lock and s.get_bind().dialect.name == "postgresql":
        query = query.with_for_update()
    row = s.execute(query).first()
    if row is None:
        raise no_account(name)
    return LockedAccount(row.id, row.name, row.debt_ucredits, row.entry_count, row.head_hash)


def account_names(s: Session) -> list[str]:
    return list(
        s.execute(
            select(accounts_t.c.name).where(accounts_t.c.kind == "customer").order_by(accounts_t.c.name)
        ).scalars()
    )


def add_member(
    s: Session, user: str, account: str, *, role: str = "member", idempotency_key: str | None = None
) -> dict[str, Any]:
    """Let `user` charge `account`; a `manager` (PI) also manages its members, limits and top-ups."""
    check_name(user, "user")
    scope = lock_account(s, account).id
    body = {"user": user} if role == "member" else {"user": user, "role": role}
    return idempotency.once(
        s, scope, idempotency_key, "user_add", body, lambda: _add_member(s, user, account, role)
    )


def _add_member(s: Session, user: str, account: str, role: str) -> dict[str, Any]:
    """Add `user` to `account`, or change their role there."""
    check_name(user, "user")
    if role not in ("member", "manager"):
        raise InvalidInput("role must be member or manager", code="invalid_role", details={"value": role})
    acct = lock_account(s, account)
    where = (members_t.c.account_id == acct.id, members_t.c.user == user)
    if s.execute(select(members_t.c.id).where(*where)).first():
        s.execute(update(members_t).where(*where).values(role=role))
    else:
        s.execute(insert(members_t).values(account_id=acct.id, user=user, created_at=utcnow(), role=role))
    return {"account": account, "user": user, "role": role}


def members(s: Session, account: str) -> list[str]:
    """The users who may charge `account`, by name."""
    return members_of(s, read_account(s, account).id)


def members_of(s: Session, account_id: int) -> list[str]:
    return list(
        s.execute(
            select(members_t.c.user).where(members_t.c.account_id == account_id).order_by(members_t.c.user)
        ).scalars()
    )


def is_member(s: Session, account_id: int, user: str) -> bool:
    return (
        s.execute(
            select(members_t.c.id).where(members_t.c.account_id == account_id, members_t.c.user == user)
        ).first()
        is not None
    )
