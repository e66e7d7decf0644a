"""The CLI as tests drive it: `gpucredit ARGS` on a test database, and the ledger's state
to compare before and after a command."""

from __future__ import annotations

from collections.abc import Callable

from click.testing import CliRunner, Result
from sqlalchemy import text

from gpucredit.cli import _build
from ledger import cli_support


def cli_for(db_url: str) -> Callable[..., Result]:
    """Run `gpucredit ARGS` against `db_url`; assert the exit status (`code`, default 0)."""
    runner = CliRunner()
    root = _build()

    def run(*args: str, code: int = 0) -> Result:
        result = runner.invoke(root, list(args), env={"GPUCREDIT_DATABASE_URL": db_url})
        assert result.exit_code == code, (args, result.output, result.stderr)
        return result

    return run


def dispose_engine(db_url: str) -> None:
    """Close the CLI's cached engine for `db_url` (a test database is dropped after the test)."""
    engine = cli_support._engines.pop(db_url, None)
    if engine is not None:
        engine.dispose()


COUNTED_TABLES = (
    "entries",
    "postings",
    "grants",
    "holds",
    "hold_allocations",
    "prices",
    "accounts",
    "members",
    "limits",
    "idempotency_keys",
)


def ledger_state(db_url: str) -> tuple:
    """Row counts of every ledger table, and the rows a repeat could change in place."""
    engine = cli_support.engine_for(db_url)
    with engine.connect() as c:
        counts = tuple(c.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar_one() for t in COUNTED_TABLES)
        rows = tuple(
            tuple(map(tuple, c.execute(text(query)).all()))
            for query in (
                "SELECT id, remaining_ucredits, earmarked_ucredits FROM grants ORDER BY id",
                "SELECT id, state, charged_ucredits, charged_seconds, debt_ucredits FROM holds ORDER BY id",
                "SELECT id, debt_ucredits, entry_count, head_hash FROM accounts ORDER BY id",
                'SELECT id, "user", max_gpus, max_rate_ucredits_per_second, daily_cap_ucredits'
                " FROM limits ORDER BY id",
            )
        )
    return counts, rows
