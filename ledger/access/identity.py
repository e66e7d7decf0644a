"""Who may see and change which account: member roles, portal logins, API tokens.

The portal authenticates (argon2 for passwords, single sign-on headers); this module
stores what it needs and answers "which accounts, in which role". Token secrets are
random and long, so a plain SHA-256 of the secret is a safe and constant-time lookup
key; the secret itself is returned once, when the token is made, and never stored.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from ledger.books.accounts import check_name, read_account
from ledger.errors import InvalidInput, NotFound
from ledger.store.tables import accounts_t, members_t, portal_users_t, tokens_t
from ledger.timeutil import format_time, utcnow

MEMBER_ROLES = ("member", "manager")
TOKEN_ROLES = ("user", "admin", "service")
TOKEN_PREFIX = "gpc_"


@dataclass(frozen=True)
class TokenInfo:
    id: int
    user: str
    role: str
    label: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user,
            "role": self.role,
            "label": self.label,
            "created_at": format_time(self.created_at),
            "expires_at": format_time(self.expires_at),
            "revoked_at": format_time(self.revoked_at),
        }


def _hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def roles_of(s: Session, user: str) -> dict[str, str]:
    """The customer accounts `user` belongs to, with their role in each."""
    rows = s.execute(
        select(accounts_t.c.name, members_t.c.role)
        .join(accounts_t, accounts_t.c.id == members_t.c.account_id)
        .where(members_t.c.user == user)
        .order_by(accounts_t.c.name)
    )
    return {row.name: row.role for row in rows}


def member_roles(s: Session, account: str) -> list[dict[str, str]]:
    acct = read_account(s, account)
    rows = s.execute(
        select(members_t.c.user, members_t.c.role)
        .where(members_t.c.account_id == acct.id)
        .order_by(members_t.c.user)
    )
    return [{"user": row.user, "role": row.role} for row in rows]


def set_portal_user(
    s: Session,
    name: str,
    *,
    password_hash: str | None = None,
    is_admin: bool | None = None,
    end_sessions: bool | None = None,
) -> dict[str, Any]:
    """Create or change a portal login. `password_hash` is the portal's argon2 string.

    A new password ends the login's sessions (`end_sessions`, by default whenever a
    password is given); the portal passes False when it only rehashes the same password
    at a stronger cost."""
    check_name(name, "user")
    now = utcnow()
    row = s.execute(select(portal_users_t.c.id).where(portal_users_t.c.name == name)).first()
    values: dict[str, Any] = {"updated_at": now}
    if password_hash is not None:
        values["password_hash"] = password_hash
    if is_admin is not None:
        values["is_admin"] = is_admin
    if end_sessions is None:
        end_sessions = password_hash is not None
    if row is None:
        values.setdefault("is_admin", False)
        s.execute(insert(portal_users_t).values(name=name, created_at=now, **values))
    else:
        if end_sessions:
            values["session_generation"] = portal_users_t.c.session_generation + 1
        s.execute(update(portal_users_t).where(portal_users_t.c.id == row.id).values(**values))
    return portal_user(s, name) or {}


def end_portal_sessions(s: Session, name: str) -> int:
    """End every session of the login `name` (logout): its generation moves on. Returns
    the new generation; NotFound for a login that does not exist."""
    result = s.execute(
        update(portal_users_t)
        .where(portal_users_t.c.name == name)
        .values(session_generation=portal_users_t.c.session_generation + 1, updated_at=utcnow())
        .returning(portal_users_t.c.session_generation)
    ).first()
    if result is None:
        raise NotFound(f"portal login {name} does not exist", details={"user": name})
    return int(result[0])


def portal_user(s: Session, name: str) -> dict[str, Any] | None:
    row = s.execute(
        select(
            portal_users_t.c.name,
            portal_users_t.c.password_hash,
            portal_users_t.c.is_admin,
            portal_users_t.c.session_generation,
        ).where(portal_users_t.c.name == name)
    ).first()
    if row is None:
        return None
    return {
        "name": row.name,
        "password_hash": row.password_hash,
        "is_admin": bool(row.is_admin),
        "session_generation": int(row.session_generation),
    }


def create_token(
    s: Session, user: str, role: str, *, expires_at: datetime | None = None, label: str | None = None
) -> tuple[TokenInfo, str]:
    """A new token and its secret (shown once)."""
    check_name(user, "user")
    if role not in TOKEN_ROLES:
        raise InvalidInput(f"role must be one of {', '.join(TOKEN_ROLES)}", code="invalid_role")
    now = utcnow()
    if expires_at is not None and expires_at <= now:
        raise InvalidInput("a token must expire in the future", code="invalid_time")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = s.execute(
        insert(tokens_t)
        .values(
            user=user,
            role=role,
            token_hash=_hash_secret(secret),
            label=label,
            created_at=now,
            expires_at=expires_at,
        )
        .returning(tokens_t.c.id)
    ).scalar_one()
    return TokenInfo(token_id, user, role, label, now, expires_at, None), secret


def _token_info(row: Any) -> TokenInfo:
    return TokenInfo(row.id, row.user, row.role, row.label, row.created_at, row.expires_at, row.revoked_at)


def authenticate_token(s: Session, secret: str, now: datetime | None = None) -> TokenInfo | None:
    """The token this secret names, if it is neither revoked nor expired."""
    if not secret.startswith(TOKEN_PREFIX):
        return None
    row = s.execute(select(tokens_t).where(tokens_t.c.token_hash == _hash_secret(secret))).first()
    if row is None:
        return None
    info = _token_info(row)
    now = now or utcnow()
    if info.revoked_at is not None or (info.expires_at is not None and info.expires_at <= now):
        return None
    return info


def list_tokens(s: Session, user: str | None = None) -> list[TokenInfo]:
    query = select(tokens_t).order_by(tokens_t.c.id)
    if user is not None:
        query = query.where(tokens_t.c.user == user)
    return [_token_info(row) for row in s.execute(query)]


def revoke_token(s: Session, token_id: int) -> TokenInfo:
    row = s.execute(select(tokens_t).where(tokens_t.c.id == token_id)).first()
    if row is None:
        raise NotFound(f"token {token_id} does not exist", details={"token_id": token_id})
    if row.revoked_at is None:
        s.execute(update(tokens_t).where(tokens_t.c.id == token_id).values(revoked_at=utcnow()))
    return _token_info(s.execute(select(tokens_t).where(tokens_t.c.id == token_id)).one())
