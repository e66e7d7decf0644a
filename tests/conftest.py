"""Shared fixtures: a fresh, migrated database per test on each store.

SQLite always runs. PostgreSQL runs when it answers at GPUCREDIT_TEST_PG_URL
(default postgresql+psycopg://postgres@127.0.0.1:5432/postgres); when it does
not, its tests FAIL under CI (env CI set) and are skipped elsewhere with a hint.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade

pytest_plugins = ["tests.support.portal"]

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


def _pg_admin() -> Engine | None:
    try:
        engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        return engine
    except Exception:
        return None


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str | None]:
    """A migrated PostgreSQL database to clone per test (CREATE DATABASE ... TEMPLATE)."""
    admin = _pg_admin()
    if admin is None:
        yield None
        return
    name = f"gpucredit_tmpl_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    engine = make_engine(_pg_url(name))
    upgrade(engine)
    engine.dispose()
    yield name
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _pg_url(database: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(PG_ADMIN_URL).set(database=database).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tmpl") / "template.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()  # the last connection to close checkpoints the WAL into the file
    assert not path.with_name(path.name + "-wal").exists()
    return path


def _new_database(
    store: str, tmp_path: Path, sqlite_template: Path, pg_template: str | None
) -> Iterator[str]:
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
    admin = _pg_admin()
    assert admin is not None
    name = f"gpucredit_t_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    try:
        yield _pg_url(name)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(store: str, tmp_path: Path, sqlite_template: Path, pg_template: str | None) -> Iterator[str]:
    yield from _new_database(store, tmp_path, sqlite_template, pg_template)


@pytest.fixture
def pg_url(tmp_path: Path, sqlite_template: Path, pg_template: str | None) -> Iterator[str]:
    yield from _new_database("postgres", tmp_path, sqlite_template, pg_template)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def tx(engine: Engine) -> Callable[[], Any]:
    """`with tx() as s:` runs one committed transaction, like a CLI command or request."""
    factory = make_sessionmaker(engine)

    @contextmanager
    def run() -> Iterator[Session]:
        with factory() as session, session.begin():
            yield session

    return run


@pytest.fixture
def tx_pg(pg_url: str) -> Iterator[Callable[[], Any]]:
    eng = make_engine(pg_url)
    factory = make_sessionmaker(eng)

    @contextmanager
    def run() -> Iterator[Session]:
        with factory() as session, session.begin():
            yield session

    yield run
    eng.dispose()
