"""`gpucredit cloud report` from the CLI root, on a gpucredit.toml, a hand-written
instance journal and a hand-built ledger (tests/support/cloud_report.py): the CLI only
renders ledger.api.cloud_report, so these check the rendering and the wiring (journal,
prices, cloud nodes and partitions from the config; the clock), not the arithmetic,
which tests/ledger/test_cloud_report.py covers. No provider is called."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from gpucredit.cli import _build
from ledger.store.db import make_engine, make_sessionmaker
from tests.support.cloud_report import (
    INSTANCE_PRICE_UCREDITS_PER_HOUR,
    JOURNAL_LINES,
    NOVEMBER_CSV,
    NOVEMBER_NOW,
    seed_november,
)
from tests.support.services import new_database


@pytest.fixture
def toml(tmp_path: Path, sqlite_template: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    url = next(new_database("sqlite", tmp_path, sqlite_template, None))
    engine = make_engine(url)
    with make_sessionmaker(engine)() as s, s.begin():
        seed_november(s)
    engine.dispose()
    (tmp_path / "cloud").mkdir()
    (tmp_path / "cloud" / "instances.jsonl").write_text("\n".join(JOURNAL_LINES) + "\n", encoding="utf-8")
    path = tmp_path / "gpucredit.toml"
    path.write_text(
        f"""
[database]
url = "{url}"
[partitions.cloud]
site = "cloud"
[cloud]
region = "us-east-1"
image_id = "ami-12c6146b"
state_dir = "{tmp_path}/cloud"
[cloud.nodes]
"cloud[1-2]" = "h100"
[cloud.instance_types]
h100 = "p5.48xlarge"
[cloud.prices_ucredits_per_hour]
"p5.48xlarge" = {INSTANCE_PRICE_UCREDITS_PER_HOUR}
""",
        encoding="utf-8",
    )
    monkeypatch.setenv("GPUCREDIT_CONFIG", str(path))
    monkeypatch.setattr("accounting_bridge.cloud.cli.utcnow", lambda: NOVEMBER_NOW)
    yield path


def report(*args: str) -> Result:
    return CliRunner().invoke(_build(), ["cloud", "report", *args])


def test_csv_is_the_table_exactly(toml: Path) -> None:
    done = report("--month", "2026-11", "--format", "csv")
    assert done.exit_code == 0, done.output
    assert done.stdout == NOVEMBER_CSV


def test_json_states_the_cost_unit_and_the_cut(toml: Path) -> None:
    done = report("--month", "2026-11", "--format", "json")
    assert done.exit_code == 0, done.output
    body = json.loads(done.stdout)
    assert body["cost_unit"] == "credits at the configured instance prices (cloud.prices_ucredits_per_hour)"
    assert (body["start"], body["end"], body["at"]) == (
        "2026-11-01T00:00:00+00:00",
        "2026-12-01T00:00:00+00:00",
        "2026-11-30T23:30:00+00:00",
    )
    assert body["total"]["provider_cost"] == "24.00"
    assert body["total"]["charged"] == "0.72"
    assert [(r["partition"], r["account"]) for r in body["rows"]] == [
        ("-", "(overhead)"),
        ("cloud", "physics"),
        ("cloud", "(overhead)"),
    ]
    assert body["unpriced_instances"] == []


def test_text_says_what_each_money_column_is(toml: Path) -> None:
    done = report("--month", "2026-11")
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "cloud report 2026-11: 2026-11-01T00:00:00+00:00 to 2026-12-01T00:00:00+00:00, "
        "running instances and jobs to 2026-11-30T23:30:00+00:00"
    )
    assert lines[1].startswith("provider_cost: credits at the configured instance prices")
    assert lines[2].split() == [c.upper() for c in NOVEMBER_CSV.splitlines()[0].split(",")]
    assert lines[-1].split() == ["*", "*", "2400", "0.67", "24.00", "720", "0.72", "2040", "85.0%"]


def test_december_sees_only_what_ran_in_it(toml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """i-2 still runs on 1 December at 01:00: December holds its first hour, November
    its last hour of 30 November (the cut at the boundary)."""
    monkeypatch.setattr(
        "accounting_bridge.cloud.cli.utcnow", lambda: datetime.fromisoformat("2026-12-01T01:00:00+00:00")
    )
    december = report("--month", "2026-12", "--format", "csv")
    november = report("--month", "2026-11", "--format", "csv")
    assert december.stdout.splitlines()[1:] == [
        "-,(overhead),3600,1.00,36.00,0,0.00,3600,100.0%",
        "*,*,3600,1.00,36.00,0,0.00,3600,100.0%",
    ]
    assert november.stdout.splitlines()[1] == "-,(overhead),3600,1.00,36.00,0,0.00,3600,100.0%"


@pytest.mark.parametrize("month", ["2026-13", "11-2026", "last"])
def test_a_bad_month_is_exit_2_with_the_reason(toml: Path, month: str) -> None:
    done = report("--month", month)
    assert done.exit_code == 2
    assert done.stdout == ""
    assert done.stderr == f"error: invalid_month: month must be YYYY-MM (e.g. 2026-11), got {month!r}\n"


def test_a_journal_line_that_cannot_be_read_makes_no_report(toml: Path, tmp_path: Path) -> None:
    with open(tmp_path / "cloud" / "instances.jsonl", "a", encoding="utf-8") as journal:
        journal.write("{not json\n")
    done = report("--month", "2026-11")
    assert done.exit_code == 1
    assert done.stdout == ""
    assert done.stderr.startswith("Error: journal_unreadable: ")
    assert "instances.jsonl:4: not a journal event" in done.stderr
