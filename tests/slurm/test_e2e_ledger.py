"""Which ledger the Slurm end-to-end tests use, decided without a Slurm box.

In CI a PostgreSQL that does not answer fails them (they never fall back to
SQLite); elsewhere they fall back and say what to install.
"""

from __future__ import annotations

import pytest

from tests.support import REPO
from tests.support.services import PG_HINT, LedgerChoice, choose_e2e_ledger

pytest_plugins = ["pytester"]

URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@pytest.mark.parametrize("in_ci", [True, False])
def test_postgres_when_it_answers(in_ci: bool) -> None:
    assert choose_e2e_ledger(True, in_ci, URL) == LedgerChoice("postgres")


def test_in_ci_a_missing_postgres_fails_and_never_falls_back() -> None:
    assert choose_e2e_ledger(False, True, URL) == LedgerChoice(
        None,
        f"PostgreSQL at {URL} does not answer; the Slurm end-to-end tests need it in CI: {PG_HINT}",
    )


def test_outside_ci_sqlite_with_what_to_install() -> None:
    assert choose_e2e_ledger(False, False, URL) == LedgerChoice(
        "sqlite", f"PostgreSQL at {URL} does not answer: the Slurm end-to-end tests ran on SQLite; {PG_HINT}"
    )
    assert "apt-get install postgresql" in PG_HINT


# The fixture itself, in a pytest of its own whose PostgreSQL is a closed port.
FIXTURE_USER = """
pytest_plugins = ["tests.conftest", "tests.slurm.conftest"]


def test_uses_the_ledger(e2e_ledger_url):
    print("LEDGER", e2e_ledger_url)
"""


def _run_fixture(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> pytest.RunResult:
    monkeypatch.setenv("GPUCREDIT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:9/postgres")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makeconftest(FIXTURE_USER.split("\n\n\n")[0])
    pytester.makepyfile(test_ledger="\n\n\n".join(FIXTURE_USER.split("\n\n\n")[1:]))
    return pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")


def test_the_fixture_fails_in_ci_without_postgres(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run_fixture(pytester, monkeypatch, ci="true")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*PostgreSQL at *127.0.0.1:9* does not answer; *need it in CI*"])
    assert "LEDGER" not in result.stdout.str()


def test_the_fixture_falls_back_to_sqlite_outside_ci_and_says_so(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _run_fixture(pytester, monkeypatch, ci=None)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*LEDGER sqlite:///*/ledger.db", "slurm e2e: PostgreSQL at * ran on SQLite; *"]
    )
