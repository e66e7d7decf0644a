"""The journal is append-only: PostgreSQL refuses edits itself, and an edit made behind
the ledger's back on SQLite (whose triggers a file owner can drop) is found by
`gpucredit audit verify`."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from click.testing import CliRunner
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from gpucredit.cli import _build
from ledger import api, cli_support
from ledger.store.db import make_engine


def _books(tx) -> None:
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.topup(s, "physics", "100", effective_at=datetime(2026, 11, 1, tzinfo=UTC))
    with tx() as s:
        hold = api.create_hold(
            s,
            api.HoldRequest(
                "physics",
                user="alice",
                job_id=1,
                gpus="h100:2",
                seconds=7200,
                cluster="lab",
                at=datetime(2026, 12, 2, 10, tzinfo=UTC),
            ),
        )
    with tx() as s:
        api.settle_hold(s, hold.id, 1800)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE postings SET amount_ucredits = amount_ucredits + 1 WHERE id = 1",
        "UPDATE entries SET memo = 'x' WHERE id = 1",
        "DELETE FROM postings WHERE id = 1",
        "DELETE FROM entries WHERE id = 3",
        "TRUNCATE entries CASCADE",
    ],
)
def test_postgres_refuses_to_edit_the_journal(pg_url, tx_pg, statement) -> None:
    _books(tx_pg)
    engine = make_engine(pg_url)
    with pytest.raises(DBAPIError, match="append-only"), engine.begin() as c:
        c.execute(text(statement))
    engine.dispose()


def _verify(db_url: str) -> tuple[int, str]:
    result = CliRunner().invoke(_build(), ["audit", "verify"], env={"GPUCREDIT_DATABASE_URL": db_url})
    engine = cli_support._engines.pop(db_url, None)
    if engine is not None:
        engine.dispose()
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (
            "UPDATE postings SET amount_ucredits = amount_ucredits + 1000000 WHERE id = 2",
            "hash mismatch; the entry or its postings were edited",
        ),
        (
            "UPDATE entries SET effective_at = '2026-01-01 00:00:00.000000' WHERE seq = 2",
            "hash mismatch; the entry or its postings were edited",
        ),
        (
            "DELETE FROM entries WHERE id = (SELECT MAX(id) FROM entries)",
            "chain head does not match its last entry",
        ),
    ],
)
def test_sqlite_edit_is_reported_by_audit_verify(tmp_path, sqlite_template, edit, problem) -> None:
    import shutil

    path = tmp_path / "ledger.db"
    shutil.copy(sqlite_template, path)
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    from ledger.store.db import make_sessionmaker

    factory = make_sessionmaker(engine)

    class Tx:
        def __enter__(self):
            self.s = factory()
            self.s.begin()
            return self.s

        def __exit__(self, *exc):
            self.s.commit() if exc[0] is None else self.s.rollback()
            self.s.close()

    _books(Tx)
    engine.dispose()
    assert _verify(url) == (0, "ok: 1 accounts, 3 entries, 0 problems\n")
    import sqlite3

    db = sqlite3.connect(path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute(
            edit.replace(
                "DELETE FROM entries WHERE id = (SELECT MAX(id) FROM entries)",
                "DELETE FROM entries WHERE id = 1",
            )
        )
    # A tamperer with the file can drop the triggers; the hash chain still tells.
    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        db.execute(f"DROP TRIGGER {name}")
    if edit.startswith("DELETE FROM entries"):
        db.execute("DELETE FROM postings WHERE entry_id = (SELECT MAX(id) FROM entries)")
    db.execute(edit)
    db.commit()
    db.close()
    status, output = _verify(url)
    assert status == 1
    assert problem in output
    assert output.splitlines()[-1].startswith("FAILED: 1 accounts")
