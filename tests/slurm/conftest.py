"""The Slurm box fixtures (`slurm_box`, `e2e_ledger_url`, and `cluster` and `books` on
them; tests/support/cluster.py has the classes) for the suites in tests/slurm/, which
are marked `slurm`.

`slurm_box` is the host's Slurm (22.05), or the chroot box of the version
GPUCREDIT_E2E_SLURM names (24.11, 26.05: `make test-slurm-versions`); every Slurm
command the tests run goes through its `run`. It reuses a box that is already up
(`make slurm-up [SLURM=...]`) and leaves it running; otherwise it starts one for the
session and stops it at the end. A box
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
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from flask import Flask

from ledger import api, cli_support
from ledger.money import format_credits
from ledger.store.db import make_engine
from ledger.timeutil import parse_time, utcnow
from portal.jobs.backend import SubmitterBackend
from portal.jobs.submitter import Submitter, serve
from slurmbox import BoxError, SlurmBox
from slurmbox.chroot import ChrootBox
from tests.support.cluster import E2E_SLURM, PRICES, Books, Box, Cluster, e2e_dir, make_box
from tests.support.jobs_portal import rest_backend
from tests.support.portal import bearer, make_app
from tests.support.services import choose_e2e_ledger

_notes: list[str] = []  # said once in the session summary


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"Slurm box unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"Slurm box unavailable: {reason}")


@pytest.fixture(scope="session")
def slurm_box() -> Iterator[Box]:
    box = make_box()
    reused = box.is_up()
    if not reused:
        reason = box.cannot_start_reason()
        if reason:
            _unavailable(reason)
    try:
        box.up()  # reuses a running box (and reinstalls this box's hooks)
    except BoxError as e:
        _unavailable(str(e))
    said = box.run(["sinfo", "--version"]).stdout.strip() or "no sinfo --version"
    _notes.append(f"Slurm {E2E_SLURM} box ({type(box).__name__}): {said}")
    try:
        yield box
    finally:
        if not reused:
            box.down()


# --------------------------------------------------------------------------- the e2e ledger


@pytest.fixture(scope="module")
def e2e_ledger_url(pg_template: str | None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh, migrated ledger for one test module (see the module docstring)."""
    from sqlalchemy import text

    from ledger.store.db import make_engine
    from ledger.store.schema import upgrade
    from tests.support.services import IN_CI, PG_ADMIN_URL, pg_admin, pg_database_url

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
    admin = pg_admin()
    if admin is None:  # answered a moment ago for the template
        pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} stopped answering", pytrace=False)
    name = f"gpucredit_e2e_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    try:
        yield pg_database_url(name)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for note in _notes:
        terminalreporter.write_line(f"slurm e2e: {note}", yellow=True)


@pytest.fixture(scope="module")
def cluster(slurm_box: Box, e2e_ledger_url: str) -> Iterator[Cluster]:
    """The box wired to a daemon of this test module, on the e2e ledger (PostgreSQL;
    tests/slurm/conftest.py says when it may be SQLite)."""
    folder = e2e_dir(slurm_box)
    folder.mkdir(parents=True, exist_ok=True)
    engine = make_engine(e2e_ledger_url)
    previous_config, previous_hooks = slurm_box.config_path, slurm_box.hooks
    c = Cluster(slurm_box, e2e_ledger_url, engine, folder / "gpucredit.toml")
    with c.tx() as s:
        for gres, price in PRICES.items():
            api.set_price(s, gres, format_credits(price), effective_at=parse_time("2026-01-01"))
    c.write_config("reject")
    c.start_daemon()
    try:
        yield c
    finally:
        c.stop_daemon()
        for job in c.run("squeue", "-h", "-o", "%i|%a", check=False).splitlines():
            job_id, _sep, account = job.partition("|")
            if account in c.accounts:
                c.run("scancel", job_id, check=False)
        slurm_box.config_path = previous_config
        slurm_box.use_hooks(previous_hooks)
        if c.accounts:  # leave Slurm's association tree as we found it
            c.run("sacctmgr", "-i", "delete", "account", ",".join(c.accounts), check=False)
        cli_engine = cli_support._engines.pop(e2e_ledger_url, None)
        if cli_engine is not None:
            cli_engine.dispose()
        engine.dispose()


@pytest.fixture
def books(cluster: Cluster) -> Books:
    return Books(cluster, since=utcnow() - timedelta(seconds=2))


# --------------------------------------------------------------------------- the portal
# The portal of a module on its e2e ledger: through the root submitter on 22.05 (the
# host's box), through the box's slurmrestd on the chroot boxes (test_slurm_jobs_api.py,
# test_slurm_staging.py).


@pytest.fixture(scope="module")
def submitter(cluster: Cluster) -> Iterator[str]:
    """The submitter for this process's uid (the portal runs in this process, as root
    here: the peer check admits exactly that uid)."""
    if not isinstance(cluster.box, SlurmBox):
        pytest.skip("the submitter runs the host's sbatch; the chroot boxes (24.11, 26.05) use slurmrestd")
    path = str(cluster.dir / "submitter.sock")
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=serve,
        args=(path, os.getuid(), Submitter(min_uid=1000, bin_dir="/usr/bin")),
        kwargs={"ready": ready, "stop": stop},
        daemon=True,
    )
    thread.start()
    assert ready.wait(10)
    yield path
    stop.set()
    thread.join(10)


@pytest.fixture(scope="module")
def portal(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Flask]:
    app = make_app(cluster.url)
    if isinstance(cluster.box, ChrootBox):
        app.extensions["gpucredit.jobs_backend"] = rest_backend(cluster.box)
    else:
        app.extensions["gpucredit.jobs_backend"] = SubmitterBackend(request.getfixturevalue("submitter"))
    yield app
    app.extensions["gpucredit.engine"].dispose()


@pytest.fixture(scope="module")
def alice(cluster: Cluster, portal: Flask) -> dict[str, str]:
    with cluster.tx() as s:
        token = api.create_token(s, "alice", "user")[1]
    return bearer(token)
