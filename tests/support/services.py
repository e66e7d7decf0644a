"""Services a test may need and may not find: `require` skips outside CI and fails in CI
(env CI set) when one is missing; PostgreSQL at GPUCREDIT_TEST_PG_URL (default
postgresql+psycopg://postgres@127.0.0.1:5432/postgres) and fresh databases cloned from a
migrated template."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

PG_ADMIN_URL = os.environ.get(
    "GPUCREDIT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


IN_CI = bool(os.environ.get("CI"))


def require(condition: bool, what: str, hint: str) -> None:
    """Skip outside CI, fail in CI: a missing service must never pass silently there."""
    if condition:
        return
    message = f"{what} is not available; {hint}"
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def pg_admin() -> Engine | None:
    try:
        engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        return engine
    except Exception:
        return None


def pg_database_url(database: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(PG_ADMIN_URL).set(database=database).render_as_string(hide_password=False)


def new_database(store: str, tmp_path: Path, sqlite_template: Path, pg_template: str | None) -> Iterator[str]:
    if store == "sqlite":
        path = tmp_path / "ledger.db"
        shutil.copy(sqlite_template, path)
        yield f"sqlite:///{path}"
        return
    require(
        pg_template is not None,
        "PostgreSQL at " + PG_ADMIN_URL,
        "start it (pg_ctlcluster 15 main start) or set GPUCREDIT_TEST_PG_URL",
    )
    admin = pg_admin()
    assert admin is not None
    name = f"gpucredit_t_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    try:
        yield pg_database_url(name)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


PG_HINT = (
    "install and start PostgreSQL (apt-get install postgresql; pg_ctlcluster 15 main start) "
    "or set GPUCREDIT_TEST_PG_URL"
)


@dataclass(frozen=True)
class LedgerChoice:
    """Where the end-to-end ledger lives: `store` "postgres" or "sqlite", or None (fail)."""

    store: str | None
    message: str | None = None


def choose_e2e_ledger(pg_available: bool, in_ci: bool, pg_url: str) -> LedgerChoice:
    """PostgreSQL when it answers. Otherwise: in CI fail (a missing service must never
    pass silently, nor test the wrong store); outside CI, SQLite and say what to install."""
    if pg_available:
        return LedgerChoice("postgres")
    missing = f"PostgreSQL at {pg_url} does not answer"
    if in_ci:
        return LedgerChoice(None, f"{missing}; the Slurm end-to-end tests need it in CI: {PG_HINT}")
    return LedgerChoice("sqlite", f"{missing}: the Slurm end-to-end tests ran on SQLite; {PG_HINT}")
