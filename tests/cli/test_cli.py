"""The CLI as a user drives it: exit codes, error codes on stderr, formats, and that bad
input changes nothing (balances and journal row counts compared before and after)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterator

import pytest
from click.testing import Result

from tests.support.cli import COUNTED_TABLES, cli_for, dispose_engine, ledger_state


@pytest.fixture
def gc(db_url: str) -> Iterator[Callable[..., Result]]:
    run = cli_for(db_url)
    run("price", "set", "a100", "2.00", "--effective", "2026-01-01")
    run("price", "set", "h100", "3.60", "--effective", "2026-01-01")
    run("account", "create", "physics")
    run("account", "create", "chemistry")
    run("user", "add", "alice", "physics")
    run("topup", "physics", "100", "--effective", "2026-11-01", "--idempotency-key", "pay-1")
    run("grant", "physics", "20", "--effective", "2026-12-01T00:00Z", "--expires", "2026-12-08T00:00Z")
    yield run
    dispose_engine(db_url)


BAD_INPUTS = [
    (("topup", "physics", "NaN"), 2, "invalid_amount"),
    (("topup", "physics", "inf"), 2, "invalid_amount"),
    (("topup", "physics", "--", "-5"), 2, "invalid_amount"),
    (("topup", "physics", "0"), 2, "invalid_amount"),
    (("topup", "physics", "1.0000001"), 2, "invalid_amount"),
    (("topup", "physics", "1e40"), 2, "invalid_amount"),
    (("topup", "physics", "12,5"), 2, "invalid_amount"),
    (("topup", "physics", "10", "--effective", "yesterday"), 2, "invalid_time"),
    (("topup", "physics", "10", "--effective", "2026-12-05", "--expires", "2026-12-01"), 2, "invalid_time"),
    (("topup", "nosuch", "10"), 1, "not_found"),
    (("topup", "physics", "5", "--idempotency-key", "pay-1"), 1, "idempotency_conflict"),
    (("consume", "physics", "1000"), 1, "insufficient_credits"),
    (("consume", "physics", "abc"), 2, "invalid_amount"),
    (("balance", "physics", "--at", "2026-13-01"), 2, "invalid_time"),
    (
        (
            "hold",
            "create",
            "physics",
            "--user",
            "alice",
            "--job-id",
            "7",
            "--gpus",
            "v100:1",
            "--seconds",
            "60",
        ),
        2,
        "unknown_gres",
    ),
    (
        (
            "hold",
            "create",
            "physics",
            "--user",
            "alice",
            "--job-id",
            "7",
            "--gpus",
            "h100:0",
            "--seconds",
            "60",
        ),
        2,
        "invalid_gpus",
    ),
    (
        (
            "hold",
            "create",
            "physics",
            "--user",
            "alice",
            "--job-id",
            "7",
            "--gpus",
            "h100",
            "--seconds",
            "60",
        ),
        2,
        "invalid_gpus",
    ),
    (
        (
            "hold",
            "create",
            "physics",
            "--user",
            "alice",
            "--job-id",
            "7",
            "--gpus",
            "h100:1",
            "--seconds=-60",
        ),
        2,
        "invalid_duration",
    ),
    (
        (
            "hold",
            "create",
            "nosuch",
            "--user",
            "alice",
            "--job-id",
            "7",
            "--gpus",
            "h100:1",
            "--seconds",
            "60",
        ),
        1,
        "not_found",
    ),
    (
        (
            "hold",
            "create",
            "physics",
            "--user",
            "alice",
            "--job-id",
            "7",
            "--gpus",
            "h100:1",
            "--seconds",
            "99999999",
        ),
        2,
        "invalid_duration",
    ),
    (("hold", "settle", "999", "--elapsed", "60"), 1, "not_found"),
    (("quote", "--account", "physics", "--gpus", "h100:2", "--time", "2:99:00"), 2, "invalid_duration"),
    (("limits", "set", "physics", "--max-rate=-1"), 2, "invalid_amount"),
    (("price", "set", "h100", "--", "-3"), 2, "invalid_amount"),
    (("price", "set", "h 100", "3"), 2, "invalid_gpus"),
    (("account", "create", "system:revenue"), 2, "invalid_account"),
    (("account", "create", "physics"), 1, "already_exists"),
]


@pytest.mark.parametrize(
    ("args", "status", "code"), BAD_INPUTS, ids=[f"{i}-{a[2]}" for i, a in enumerate(BAD_INPUTS)]
)
def test_bad_input_changes_nothing(gc, db_url, args, status, code) -> None:
    before = ledger_state(db_url)
    result = gc(*args, code=status)
    assert f"error: {code}:" in result.stderr
    assert "Traceback" not in result.output
    assert ledger_state(db_url) == before


def test_click_usage_errors_exit_2(gc) -> None:
    result = gc("hold", "create", "physics", "--job-id", "x", code=2)
    assert "Traceback" not in result.output


def test_topup_with_same_key_is_one_grant(gc, db_url) -> None:
    first = json.loads(
        gc(
            "topup",
            "physics",
            "100",
            "--effective",
            "2026-11-01",
            "--idempotency-key",
            "pay-1",
            "--format",
            "json",
        ).output
    )
    assert first["amount"] == "100.00" and first["id"] == 1
    assert ledger_state(db_url)[0][COUNTED_TABLES.index("grants")] == 2  # the top-up and the promotion


def test_balance_formats_and_worked_example_via_cli(gc) -> None:
    gc(
        "limits",
        "set",
        "physics",
        "--user",
        "alice",
        "--max-gpus",
        "4",
        "--max-rate",
        "0.005",
        "--daily-cap",
        "30",
    )
    out = json.loads(
        gc(
            "hold",
            "create",
            "physics",
            "--user",
            "alice",
            "--job-id",
            "1001",
            "--gpus",
            "h100:2",
            "--seconds",
            "7200",
            "--at",
            "2026-12-02T10:00Z",
            "--format",
            "json",
        ).output
    )
    assert {
        k: out[k]
        for k in ("id", "account", "user", "job_id", "run", "state", "amount", "charged", "expires_at")
    } == {
        "id": 1,
        "account": "physics",
        "user": "alice",
        "job_id": 1001,
        "run": 0,
        "state": "active",
        "amount": "14.40",
        "charged": "0.00",
        "expires_at": "2026-12-02T12:10:00Z",
    }
    refused = gc(
        "hold",
        "create",
        "physics",
        "--user",
        "alice",
        "--job-id",
        "1002",
        "--gpus",
        "a100:2",
        "--seconds",
        "14400",
        "--at",
        "2026-12-02T10:00Z",
        code=1,
    )
    assert refused.stderr.startswith("error: daily_cap: ")
    assert "30.40" in refused.stderr and "30.00" in refused.stderr
    gc("hold", "settle", "1", "--elapsed", "1800")
    balance = json.loads(gc("balance", "physics", "--at", "2026-12-02T12:00Z", "--format", "json").output)
    assert balance["available"] == "116.40" and balance["held"] == "0.00"
    assert [(g["amount"], g["remaining"], g["expires_at"]) for g in balance["grants"]] == [
        ("20.00", "16.40", "2026-12-08T00:00:00Z"),
        ("100.00", "100.00", None),
    ]
    table = gc("balance", "physics", "--at", "2026-12-09").output
    assert table.splitlines()[0] == "account physics at 2026-12-09T00:00:00Z: available 100.00, held 0.00"
    rows = list(csv.DictReader(io.StringIO(gc("report", "--by", "gres", "--format", "csv").output)))
    assert rows == [{"gres": "h100", "charged": "3.60", "gpu_seconds": "3600", "jobs": "1"}]
    # A report of nothing is still a CSV with its header, for the script that reads it.
    nothing = gc("report", "--by", "gres", "--from", "2030-01-01", "--format", "csv").output
    assert nothing == "gres,charged,gpu_seconds,jobs\n"
    quote = json.loads(
        gc(
            "quote",
            "--account",
            "physics",
            "--gpus",
            "h100:2",
            "--time",
            "2:00:00",
            "--at",
            "2026-12-02T13:00Z",
            "--format",
            "json",
        ).output
    )
    assert (quote["cost"], quote["available"], quote["affordable"]) == ("14.40", "116.40", True)
    assert gc("audit", "verify").output == "ok: 2 accounts, 4 entries, 0 problems\n"


def test_the_hold_lists_state_choices_are_the_hold_states() -> None:
    """`hold list --state` spells the states out (the CLI builds its commands before it
    imports SQLAlchemy), so it is checked against the one list, HoldStatus.ALL."""
    from ledger.cli import HOLD_STATES
    from ledger.store.models import HoldStatus

    assert tuple(HOLD_STATES) == HoldStatus.ALL
