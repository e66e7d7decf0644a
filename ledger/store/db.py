"""Engines and sessions for the two stores: embedded SQLite and PostgreSQL (psycopg 3).

A mutating transaction locks the customer account rows it changes (one, but for the
batches that share a commit: several, in id order). On PostgreSQL that is
`SELECT ... FOR UPDATE`; SQLite has one writer anyway, so every SQLite
transaction starts with `BEGIN IMMEDIATE` and takes the write lock up front
instead of failing later with "database is locked" on upgrade.

PostgreSQL may be an HA cluster reached through a multi-host URL (docs/failover.md), in
SQLAlchemy's form (`?host=h1:p1&host=h2:p2&target_session_attrs=read-write`) or libpq's
(`h1:p1,h2:p2`, rewritten to the former by `sqlalchemy_url`).

An embedded SQLite ledger is created private: its directory 0700 and the file 0600
(SQLite gives its -wal and -shm files the database file's mode), like the daemon's
socket. Every account's money is in it, and who can read the file can read it all.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 30_000


def make_engine(url: str, **kwargs: Any) -> Engine:
    parsed = make_url(sqlalchemy_url(url))
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            create_private_sqlite_file(Path(parsed.database))
        engine = create_engine(url, **kwargs)
        _configure_sqlite(engine)
        return engine
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(parsed, **kwargs)


# libpq's multi-host URI: postgresql[+driver]://[userinfo@]host1[:port1],host2[:port2],.../...
_LIBPQ_MULTI_HOST = re.compile(
    r"^(?P<scheme>postgresql(?:\+\w+)?://)(?P<user>[^@/?]*@)?(?P<hosts>[^/?@]*,[^/?@]*)(?P<path>/[^?]*)?(?:\?(?P<query>.*))?$"
)


def sqlalchemy_url(url: str) -> str:
    """`url` in a form SQLAlchemy parses. An HA cluster's URL as libpq writes it,
    `postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write`, is not one
    (its URL parser takes one host); SQLAlchemy's own form of the same is
    `postgresql://u@/db?host=h1:5432&host=h2:5432&target_session_attrs=read-write`,
    which psycopg turns back into libpq's host and port lists. Any other URL is
    returned as it is."""
    found = _LIBPQ_MULTI_HOST.match(url)
    if found is None:
        return url
    hosts = "&".join(f"host={host}" for host in found["hosts"].split(",") if host)
    query = f"{hosts}&{found['query']}" if found["query"] else hosts
    return f"{found['scheme']}{found['user'] or ''}{found['path'] or '/'}?{query}"


def create_private_sqlite_file(path: Path) -> None:
    """Make `path` an empty database file, mode 0600 in a 0700 directory, unless it
    exists: SQLite would create it with the umask's mode (0644, readable by everyone).
    An existing file or directory keeps its mode (an admin's choice, or a shared one)."""
    try:
        if path.exists():
            return
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except PermissionError:  # a folder this user may not enter: SQLite's own error says so
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:  # created meanwhile by another process: it chose the mode
        pass
    except OSError:  # a directory this user may not write: SQLite's own error says so
        pass


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event emit BEGIN itself (pysqlite's is deferred).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"
