"""Operations: the Open OnDemand balance document and file, /metrics, /healthz, the
Grafana dashboard's metric names, and `gpucredit balance` for one's own accounts.

Figures are the seeded site's (tests/conftest_portal.py): physics 100.00 available and
14.40 held (job 1003 runs), 5.60 spent; chemistry 39.00 available, 1.00 spent.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpucredit.cli import _build
from ledger import cli_support
from ledger.db import make_engine, make_sessionmaker
from portal import ood
from portal.ood import ood_document
from tests.conftest_portal import Site

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def read_ood(db_url: str, **kwargs: object) -> dict[str, object]:
    engine = make_engine(db_url)
    try:
        with make_sessionmaker(engine)() as s, s.begin():
            return ood_document(s, **kwargs)  # type: ignore[arg-type]
    finally:
        engine.dispose()


@pytest.fixture
def gc(portal_db: str, site: Site) -> Iterator[Callable[..., Result]]:
    """`gpucredit ARGS` on the seeded site as `user` (its $USER); asserts the exit status."""
    root = _build()

    def run(*args: str, user: str = "alice", code: int = 0) -> Result:
        env = {"GPUCREDIT_DATABASE_URL": portal_db, "USER": user}
        result = CliRunner().invoke(root, list(args), env=env)  # type: ignore[arg-type]
        assert result.exit_code == code, (args, result.output, result.stderr)
        return result

    yield run
    engine = cli_support._engines.pop(portal_db, None)
    if engine is not None:
        engine.dispose()


# --- Open OnDemand -----------------------------------------------------------------------


def test_ood_document_lists_each_member_with_whole_credits_rounded_down(portal_db: str, site: Site) -> None:
    assert read_ood(portal_db, now=NOW) == {
        "version": 1,
        "timestamp": int(NOW.timestamp()),
        "config": {"unit": "credits", "project_type": "account"},
        "balances": [
            {"user": "alice", "project": "physics", "value": 100},
            {"user": "bob", "project": "physics", "value": 100},
            {"user": "carol", "project": "chemistry", "value": 39},
        ],
    }


def test_ood_document_for_one_user_and_for_none(portal_db: str, site: Site) -> None:
    assert read_ood(portal_db, user="carol")["balances"] == [
        {"user": "carol", "project": "chemistry", "value": 39}
    ]
    assert read_ood(portal_db, user="dave")["balances"] == []


def test_ood_value_is_rounded_down_not_to_nearest(portal_db: str, site: Site) -> None:
    from ledger import api

    engine = make_engine(portal_db)
    with make_sessionmaker(engine)() as s, s.begin():
        api.consume(s, "chemistry", "0.01")
    engine.dispose()
    assert read_ood(portal_db, user="carol")["balances"] == [
        {"user": "carol", "project": "chemistry", "value": 38}
    ]


def test_export_ood_balance_replaces_the_file_whole(
    gc: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "ood" / "balance.json"
    target.parent.mkdir()
    target.write_text("old")
    seen: list[tuple[str, int, object, str]] = []
    real_replace = os.replace

    def replace(source: str, destination: str) -> None:
        # At the rename the old file is still whole and the new one is complete beside it.
        seen.append(
            (
                target.read_text(),
                stat.S_IMODE(os.stat(source).st_mode),
                json.loads(Path(source).read_text()),
                str(Path(source).parent),
            )
        )
        real_replace(source, destination)

    monkeypatch.setattr(ood.os, "replace", replace)
    result = gc("export", "ood-balance", str(target))
    written = json.loads(target.read_text())
    assert [b["value"] for b in written["balances"]] == [100, 100, 39]
    assert seen == [("old", 0o644, written, str(target.parent))]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in target.parent.iterdir()) == ["balance.json"]
    assert "3 balances" in result.stderr


def test_export_that_fails_midway_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "balance.json"
    target.write_text("old")

    def broken_dump(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ood.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        ood.write_atomically(target, {"version": 1})
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["balance.json"]


# --- gpucredit balance without an account ---------------------------------------------


def test_balance_without_account_lists_the_callers_accounts(gc: Callable[..., Result]) -> None:
    assert json.loads(gc("balance", "--format", "json", user="alice").stdout) == [
        {"account": "physics", "available": "100.00", "held": "14.40"}
    ]
    assert gc("balance", "--format", "csv", user="carol").stdout == (
        "account,available,held\nchemistry,39.00,0.00\n"
    )
    table = gc("balance", user="bob").stdout.splitlines()
    assert table[0].split() == ["ACCOUNT", "AVAILABLE", "HELD"]
    assert table[1].split() == ["physics", "100.00", "14.40"]


def test_balance_without_account_for_a_user_in_none(gc: Callable[..., Result]) -> None:
    result = gc("balance", user="dave", code=1)
    assert result.stdout == ""
    assert "error: no_account: dave is a member of no account" in result.stderr


def test_balance_with_an_account_is_unchanged(gc: Callable[..., Result]) -> None:
    shown = json.loads(gc("balance", "physics", "--format", "json", user="dave").stdout)
    assert (shown["account"], shown["available"], shown["held"]) == ("physics", "100.00", "14.40")
