"""`gpucredit job ...` and `gpucredit balance` from a login node with no token: the CLI
(gpucredit/job_cli.py, gpucredit/user_balance.py) asks `munge` for a credential per
request and the real portal, served over HTTP on loopback, takes it (portal.munge_auth),
with a munged of the test's own and the fake job backend standing in for Slurm. `munge`
on PATH is a wrapper pointing at that munged (as `nobody` when the tests run as root)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from werkzeug.serving import make_server

from gpucredit.cli import _build
from gpucredit.user_balance import uses_portal
from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from tests.support.fake_jobs import FakeBackend
from tests.support.munge_site import USER, munge_wrapper, seed_munge_site
from tests.support.portal import make_app
from tests.support.services import new_database


@dataclass
class Portal:
    url: str
    backend: FakeBackend
    db_url: str
    bin_dir: Path  # holds the `munge` the CLI finds first on PATH


@pytest.fixture
def db(tmp_path: Path, sqlite_template: Path) -> Iterator[str]:
    yield from new_database("sqlite", tmp_path, sqlite_template, None)


def serve(db_url: str, socket: str, bin_dir: Path, **portal: Any) -> Iterator[Portal]:
    seed_munge_site(db_url)
    app = make_app(db_url, portal={"munge_auth": True, "munge_socket": socket, **portal})
    backend = FakeBackend()
    app.extensions["gpucredit.jobs_backend"] = backend
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Portal(f"http://127.0.0.1:{server.server_port}", backend, db_url, bin_dir)
    finally:
        server.shutdown()
        thread.join(5)
        app.extensions["gpucredit.engine"].dispose()


@pytest.fixture
def portal(db: str, munge_socket: str, tmp_path: Path) -> Iterator[Portal]:
    munge_wrapper(tmp_path / "bin", munge_socket)
    yield from serve(db, munge_socket, tmp_path / "bin")


def gpucredit(portal: Portal, *args: str, **env: str | None) -> tuple[int, str, str]:
    """The CLI as a user with no token and no database: only the portal's address."""
    environment: dict[str, str | None] = {
        "PATH": f"{portal.bin_dir}:{os.environ['PATH']}",
        "GPUCREDIT_URL": portal.url,
        "GPUCREDIT_TOKEN": None,
        "GPUCREDIT_DATABASE_URL": None,
        "GPUCREDIT_CONFIG": "/dev/null",
        **env,
    }
    result = CliRunner().invoke(_build(), list(args), env=environment)
    return result.exit_code, result.stdout, result.stderr


def test_a_user_submits_lists_shows_and_cancels_with_no_token(portal: Portal, tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\npython train.py\n")
    args = ("job", "submit", str(script), "-A", "physics", "--gpus", "h100:1", "--time", "00:01:00")
    code, out, err = gpucredit(portal, *args)
    assert (code, out) == (0, "Submitted job 5001\n"), err
    [(user, spec)] = portal.backend.submits
    assert (user, spec.account) == (USER.pw_name, "physics")

    code, out, err = gpucredit(portal, "job", "list")
    assert code == 0, err
    assert out.splitlines()[1:] == [
        f"{5001:>8}  {'physics':<12} {USER.pw_name:<10} {'queued':<10} {'0.00':>12}  (waiting for GPUs)"
    ]
    code, out, err = gpucredit(portal, "job", "show", "5001")
    assert (code, json.loads(out)["user"]) == (0, USER.pw_name), err
    code, out, err = gpucredit(portal, "job", "cancel", "5001")
    assert (code, out) == (0, "job 5001: cancelled, cost 0.00\n"), err
    assert portal.backend.cancels == [(USER.pw_name, 5001)]
    code, out, err = gpucredit(portal, "job", "output", "4242")
    assert (code, err) == (1, "Error: not_found: job 4242 does not exist\n")


def test_balance_on_a_login_node_asks_the_portal(portal: Portal, tmp_path: Path) -> None:
    """A login node's config names the portal and no database: `gpucredit balance` is
    the user's own accounts, as the ledger has them."""
    config = tmp_path / "gpucredit.toml"
    config.write_text(f'[portal]\nurl = "{portal.url}"\n')
    engine = make_engine(portal.db_url)
    with make_sessionmaker(engine)() as s:
        physics = api.balance(s, "physics")
    engine.dispose()
    code, out, err = gpucredit(portal, "balance", GPUCREDIT_URL=None, GPUCREDIT_CONFIG=str(config))
    assert code == 0, err
    last = out.splitlines()[-1].split()
    assert last == ["physics", physics["available"], physics["held"]]
    code, out, err = gpucredit(
        portal, "balance", "physics", "--format", "json", GPUCREDIT_URL=None, GPUCREDIT_CONFIG=str(config)
    )
    assert (code, json.loads(out)["available"]) == (0, physics["available"]), err
    code, out, err = gpucredit(portal, "balance", "chemistry", GPUCREDIT_CONFIG=str(config))
    assert (code, err) == (1, "Error: not_found: account chemistry does not exist\n")


def test_an_admin_with_the_database_keeps_the_ledgers_balance(portal: Portal) -> None:
    """A database configured: the ledger's command, even with a portal address set
    (one that answers nothing here)."""
    code, out, err = gpucredit(
        portal, "balance", "physics", GPUCREDIT_URL="http://127.0.0.1:9", GPUCREDIT_DATABASE_URL=portal.db_url
    )
    assert code == 0, err
    assert out.startswith("account physics at ")


def test_a_portal_without_munge_auth_refuses_the_cli_in_words(
    db: str, munge_socket: str, tmp_path: Path
) -> None:
    munge_wrapper(tmp_path / "bin", munge_socket)
    for portal in serve(db, munge_socket, tmp_path / "bin", munge_auth=False):
        code, _out, err = gpucredit(portal, "job", "list")
        assert (code, err) == (
            1,
            "Error: unauthenticated: MUNGE authentication is not enabled on this portal "
            "(portal.munge_auth): send an API token, Authorization: Bearer gpc_...\n",
        )


def test_no_token_and_no_munge_says_what_to_do(portal: Portal, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _out, err = gpucredit(portal, "job", "list", PATH=str(empty))
    assert (code, err) == (
        1,
        "Error: no API token and no munge here: set GPUCREDIT_TOKEN to your API token (gpc_...), "
        "or run this on a cluster node (MUNGE)\n",
    )


def test_a_user_who_may_not_open_the_embedded_ledger_asks_the_portal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Slurm box's config names both (root's SQLite file, 0600 in a 0700 directory)."""
    ledger = tmp_path / "gpucredit.db"
    path = tmp_path / "gpucredit.toml"
    path.write_text(f'[database]\nurl = "sqlite:///{ledger}"\n[portal]\nurl = "http://127.0.0.1:8088/"\n')
    for name in ("GPUCREDIT_URL", "GPUCREDIT_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUCREDIT_CONFIG", str(path))
    ledger.touch()
    assert uses_portal() is False  # root, or the ledger's owner: the ledger's command
    monkeypatch.setattr("os.access", lambda where, mode: where != str(ledger))  # as alice
    assert uses_portal() is True


@pytest.mark.parametrize(
    ("config", "env", "portal"),
    [
        ('[portal]\nurl = "https://portal"\n', {}, True),  # a login node's config
        ('[database]\nurl = "sqlite:///x.db"\n[portal]\nurl = "https://portal"\n', {}, False),
        ("", {"GPUCREDIT_URL": "https://portal"}, True),
        ("", {"GPUCREDIT_URL": "https://portal", "GPUCREDIT_DATABASE_URL": "sqlite:///x.db"}, False),
        ("", {}, False),  # neither: the ledger's embedded database, as before
        (None, {"GPUCREDIT_URL": "https://portal"}, True),  # the controller's config, unreadable
        (None, {}, False),  # ... and no portal named: the ledger's command says config_forbidden
    ],
)
def test_which_balance_a_user_gets(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    config: str | None,
    env: dict[str, str],
    portal: bool,
) -> None:
    path = tmp_path / "gpucredit.toml"
    path.write_text(config or "")
    if config is None:  # as root reads it: the user may not (root:gpucredit 0640)

        def forbidden(handle: Any) -> Any:
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr("tomllib.load", forbidden)
    for name in ("GPUCREDIT_URL", "GPUCREDIT_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUCREDIT_CONFIG", str(path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert uses_portal() is portal
