"""Shared fixtures: a fresh, migrated database per test on each store.

SQLite always runs. PostgreSQL runs when it answers at GPUCREDIT_TEST_PG_URL
(default postgresql+psycopg://postgres@127.0.0.1:5432/postgres); when it does
not, its tests FAIL under CI (env CI set) and are skipped elsewhere with a hint.

Markers select what they say (docs/design.md, "Where the tests are"): every test on
the PostgreSQL store is marked `postgres` here, so `-m 'not postgres'` runs without it;
a test that takes the Slurm box is marked `slurm`, one that takes a browser `browser`,
one that takes the HA database box (tests/ha) `ha`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade
from tests.support.services import new_database, pg_admin, pg_database_url

# Fixtures that are a PostgreSQL database, and the markers fixtures imply.
POSTGRES_FIXTURES = {"pg_url", "tx_pg"}
MARKER_OF_FIXTURE = {"slurm_box": "slurm", "browser": "browser", "ha_cluster": "ha"}


def needs_postgres(item: pytest.Item) -> bool:
    """On the PostgreSQL store: the `store` parameter (the fixture's or a test's own
    parametrize) is "postgres", or the test takes a PostgreSQL-only fixture."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("store") == "postgres":
        return True
    return bool(POSTGRES_FIXTURES & set(getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if needs_postgres(item):
            item.add_marker(pytest.mark.postgres)
        fixtures = set(getattr(item, "fixturenames", ()))
        for fixture, marker in MARKER_OF_FIXTURE.items():
            if fixture in fixtures and item.get_closest_marker(marker) is None:
                item.add_marker(marker)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str | None]:
    """A migrated PostgreSQL database to clone per test (CREATE DATABASE ... TEMPLATE)."""
    admin = pg_admin()
    if admin is None:
        yield None
        return
    name = f"gpucredit_tmpl_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    engine = make_engine(pg_database_url(name))
    upgrade(engine)
    engine.dispose()
    yield name
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tmpl") / "template.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()  # the last connection to close checkpoints the WAL into the file
    assert not path.with_name(path.name + "-wal").exists()
    return path


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(store: str, tmp_path: Path, sqlite_template: Path, pg_template: str | None) -> Iterator[str]:
    yield from new_database(store, tmp_path, sqlite_template, pg_template)


@pytest.fixture
def pg_url(tmp_path: Path, sqlite_template: Path, pg_template: str | None) -> Iterator[str]:
    yield from new_database("postgres", tmp_path, sqlite_template, pg_template)


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


@pytest.fixture
def munge_socket() -> Iterator[str]:
    """A munged of the test's own, where users reach it (tests/support/munged.py)."""
    from tests.support.munged import users_munged

    with users_munged() as socket_path:
        yield socket_path
