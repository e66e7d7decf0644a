"""Pytest plugin: the Slurm box fixtures (`slurm_box`, `e2e_ledger_url`).

Register with `pytest_plugins = ["tests.slurm.conftest"]` in tests/conftest.py.
Tests that use them are marked `@pytest.mark.slurm`.

`slurm_box` reuses a box that is already up (`make slurm-up`) and leaves it
running; otherwise it starts one for the session and stops it at the end. A box
that cannot start fails the test in CI (env CI set) and skips it elsewhere,
saying what to install.

`e2e_ledger_url` is the ledger the end-to-end tests wire into the box: a fresh
PostgreSQL database (production's store) cloned from the migrated template. In CI
a PostgreSQL that does not answer fails the tests: they never fall back. Outside
CI they run on an SQLite file instead, and the session summary says so and what
to install.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurmbox import BoxError, SlurmBox

PG_HINT = (
    "install and start PostgreSQL (apt-get install postgresql; pg_ctlcluster 15 main start) "
    "or set GPUCREDIT_TEST_PG_URL"
)
_notes: list[str] = []  # said once in the session summary


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"Slurm box unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"Slurm box unavailable: {reason}")


@pytest.fixture(scope="session")
def slurm_box() -> Iterator[SlurmBox]:
    box = SlurmBox()
    reused = box.is_up()
    if not reused:
        reason = box.cannot_start_reason()
        if reason:
            _unavailable(reason)
    try:
        box.up()  # reuses a running box (and reinstalls this box's hooks)
    except BoxError as e:
        _unavailable(str(e))
    try:
        yield box
    finally:
        if not reused:
            box.down()


# --------------------------------------------------------------------------- the e2e ledger


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


@pytest.fixture(scope="module")
def e2e_ledger_url(pg_template: str | None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh, migrated ledger for one test module (see the module docstring)."""
    from sqlalchemy import text

    from ledger.store.db import make_engine
    from ledger.store.schema import upgrade
    from tests.conftest import IN_CI, PG_ADMIN_URL, _pg_admin, _pg_url

    choice = choose_e2e_ledger(pg_template is not None, IN_CI, PG_ADMIN_URL)
    if choice.store is None:
        pytest.fail(choice.message, pytrace=False)
    if choice.message and choice.message not in _notes:
        _notes.append(choice.message)
    if choice.store == "sqlite":
        url = f"sqlite:///{Path(tmp_path_factory.mktemp('e2e')) / 'ledger.db'}"
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        yield url
        return
    admin = _pg_admin()
    if admin is None:  # answered a moment ago for the template
        pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} stopped answering", pytrace=False)
    name = f"gpucredit_e2e_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    try:
        yield _pg_url(name)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for note in _notes:
        terminalreporter.write_line(f"slurm e2e: {note}", yellow=True)
