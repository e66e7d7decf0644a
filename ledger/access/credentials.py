"""Credentials that may be used once: the portal's MUNGE authentication spends each one
here, so that a copy of it is refused (portal/munge_auth.py); and what such a credential
carries, the request it was made for (the CLI writes it, the portal reads it):

    gpucredit-request 1\n NONCE\n METHOD\n TARGET\n SHA256(BODY)

one field a line, where TARGET is the path under the portal's root (/api/v1/jobs?limit=5)
and NONCE 32 random hex digits. A credential made for one request is refused for any
other, and the nonce makes each payload, so each digest, one of a kind.

A credential is remembered by a digest the portal chooses (the SHA-256 of its payload,
which carries a random nonce under munged's MAC) until `keep_until`, when munged would
refuse it as expired anyway; rows past that are deleted as new ones come. The insert
does nothing on a digest already there (ON CONFLICT DO NOTHING, SQLite and
PostgreSQL): of two workers racing with one credential, the second waits for the
first's commit and finds it spent.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.orm import Session

from ledger.store.tables import spent_credentials_t
from ledger.timeutil import utcnow

DIGEST_CHARS = 64  # a SHA-256, in hex
REQUEST_TAG = "gpucredit-request 1"
_NONCE = re.compile(r"[0-9a-f]{32}")
_METHOD = re.compile(r"[A-Z]{1,16}")
_TARGET = re.compile(r"/[\x21-\x7e]{0,4095}")  # printable, no spaces or line breaks
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class BoundRequest:
    """The request a credential was made for."""

    nonce: str
    method: str
    target: str
    body_sha256: str


def request_payload(nonce: str, method: str, target: str, body: bytes) -> bytes:
    """What a credential for this request carries (the format above)."""
    bound = BoundRequest(nonce, method, target, hashlib.sha256(body).hexdigest())
    if read_request_payload(_joined(bound)) != bound:
        raise ValueError(f"cannot bind a credential to {method} {target!r} with nonce {nonce!r}")
    return _joined(bound)


def _joined(bound: BoundRequest) -> bytes:
    fields = (REQUEST_TAG, bound.nonce, bound.method, bound.target, bound.body_sha256)
    return "\n".join(fields).encode("ascii")


def read_request_payload(payload: bytes) -> BoundRequest | None:
    """The request in `payload`, or None when it is not one in the format above."""
    try:
        lines = payload.decode("ascii").split("\n")
    except UnicodeDecodeError:
        return None
    if len(lines) != 5 or lines[0] != REQUEST_TAG:
        return None
    bound = BoundRequest(*lines[1:])
    checks = (
        (_NONCE, bound.nonce),
        (_METHOD, bound.method),
        (_TARGET, bound.target),
        (_SHA256, bound.body_sha256),
    )
    if not all(pattern.fullmatch(value) for pattern, value in checks):
        return None
    return bound


def spend_credential(s: Session, digest: str, keep_until: datetime, now: datetime | None = None) -> bool:
    """True the first time `digest` is spent; False while it is remembered (a replay)."""
    if len(digest) != DIGEST_CHARS or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError("a credential's digest is a SHA-256 in lower-case hex")
    now = now or utcnow()
    if keep_until <= now:
        raise ValueError("a spent credential is kept until a time still to come")
    s.execute(delete(spent_credentials_t).where(spent_credentials_t.c.keep_until <= now))
    dialect = s.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    else:
        raise RuntimeError(f"spent credentials support postgresql and sqlite, not {dialect}")
    statement = (
        insert(spent_credentials_t)
        .values(digest=digest, keep_until=keep_until)
        .on_conflict_do_nothing(index_elements=["digest"])
        .returning(spent_credentials_t.c.digest)
    )
    # A row comes back for the insert alone (rowcount is -1 here on psycopg 3).
    return s.execute(statement).first() is not None
