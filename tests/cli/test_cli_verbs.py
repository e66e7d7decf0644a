"""Every CLI verb as a user runs it, on both stores: each mutating verb is repeat-safe with
`--idempotency-key` (the repeat prints the first result and changes nothing; another body
under the same key is `idempotency_conflict`), and the verbs with exact figures: `init`,
`account list/show`, `price list`, `limits show`, `hold usage/release/list/show`,
`sweep`, `adjust`, and `agent` as a real process against the fake NVML.

Times are given with --at/--effective wherever a figure depends on them, and every
grant in the shared setup is effective since 2020 without expiry, so "now" (the wall
clock) never changes an asserted figure.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from click.testing import Result
from sqlalchemy import text

from ledger.store.schema import alembic_config
from tests.support import REPO
from tests.support.cli import cli_for, dispose_engine, ledger_state

KEY = ("--idempotency-key", "k-1")


def hold(
    job_id: int = 1001,
    gpus: str = "h100:2",
    seconds: int = 7200,
    at: str = "2026-12-02T10:00Z",
    account: str = "physics",
    user: str = "alice",
) -> tuple[str, ...]:
    """`gpucredit hold create` for one run, at a given time."""
    return (
        "hold",
        "create",
        account,
        "--user",
        user,
        "--job-id",
        str(job_id),
        "--gpus",
        gpus,
        "--seconds",
        str(seconds),
        "--at",
        at,
    )


HOLD = hold()


@pytest.fixture
def gc(db_url: str) -> Iterator[Callable[..., Result]]:
    """Prices a100 2.00 and h100 3.60; physics (member alice) with 100 credits; chemistry empty."""
    run = cli_for(db_url)
    run("price", "set", "a100", "2.00", "--effective", "2020-01-01")
    run("price", "set", "h100", "3.60", "--effective", "2020-01-01")
    run("account", "create", "physics")
    run("account", "create", "chemistry")
    run("user", "add", "alice", "physics")
    run("topup", "physics", "100", "--effective", "2020-01-01", "--idempotency-key", "pay-1")
    yield run
    dispose_engine(db_url)


def entries(db_url: str) -> list[tuple]:
    from ledger import cli_support

    with cli_support.engine_for(db_url).connect() as c:
        return [
            tuple(row)
            for row in c.execute(
                text(
                    "SELECT e.id, a.name, e.kind, e.hold_id, e.links_entry_id FROM entries e"
                    " JOIN accounts a ON a.id = e.account_id ORDER BY e.id"
                )
            )
        ]


# -- every mutating verb is repeat-safe -----------------------------------------------------

# name: (setup, the keyed request, the same key with another body)
REPEATS: dict[str, tuple[list[tuple[str, ...]], tuple[str, ...], tuple[str, ...]]] = {
    "account create": ([], ("account", "create", "biology"), ("account", "create", "geology")),
    "user add": ([], ("user", "add", "bob", "physics"), ("user", "add", "carol", "physics")),
    # No --effective: the repeat replays the version the first request made, effective then.
    "price set": ([], ("price", "set", "h100", "4.00"), ("price", "set", "h100", "4.10")),
    "limits set": (
        [],
        ("limits", "set", "physics", "--user", "alice", "--max-gpus", "4", "--max-rate", "0.005"),
        ("limits", "set", "physics", "--user", "alice", "--max-gpus", "5", "--max-rate", "0.005"),
    ),
    "topup": (
        [],
        ("topup", "physics", "10", "--effective", "2026-12-01T00:00Z", "--reference", "inv-7"),
        ("topup", "physics", "11", "--effective", "2026-12-01T00:00Z", "--reference", "inv-7"),
    ),
    "grant": (
        [],
        ("grant", "physics", "20", "--effective", "2026-12-01T00:00Z", "--expires", "2026-12-08T00:00Z"),
        ("grant", "physics", "20", "--effective", "2026-12-01T00:00Z", "--priority", "5"),
    ),
    "consume": (
        [],
        ("consume", "physics", "1.5", "--user", "alice", "--at", "2026-12-02T09:00Z"),
        ("consume", "physics", "2", "--user", "alice", "--at", "2026-12-02T09:00Z"),
    ),
    "adjust": (
        [("consume", "physics", "1", "--at", "2026-12-02T09:00Z")],  # entry 2
        ("adjust", "physics", "0.25", "--links", "2", "--at", "2026-12-02T10:00Z"),
        ("adjust", "physics", "0.30", "--links", "2", "--at", "2026-12-02T10:00Z"),
    ),
    "hold create": ([], HOLD, hold(seconds=3600)),
    "hold usage": (
        [HOLD],
        ("hold", "usage", "1", "--elapsed", "600"),
        ("hold", "usage", "1", "--elapsed", "900"),
    ),
    "hold settle": (
        [HOLD],
        ("hold", "settle", "1", "--elapsed", "1800"),
        ("hold", "settle", "1", "--elapsed", "1700"),
    ),
    "hold release": (
        [HOLD],
        ("hold", "release", "1", "--at", "2026-12-02T10:30Z"),
        ("hold", "release", "1", "--at", "2026-12-02T10:31Z"),
    ),
    "sweep": (
        [
            ("grant", "physics", "20", "--effective", "2026-12-01T00:00Z", "--expires", "2026-12-08T00:00Z"),
            HOLD,
        ],
        ("sweep", "--at", "2026-12-09T00:00Z"),
        ("sweep", "--at", "2026-12-10T00:00Z"),
    ),
}


NO_FORMAT = {"account create", "user add"}  # they print one line, no --format


@pytest.mark.parametrize("verb", list(REPEATS))
def test_a_keyed_repeat_prints_the_first_result_and_changes_nothing(gc, db_url, verb) -> None:
    setup, request, _other = REPEATS[verb]
    for args in setup:
        gc(*args)
    before = ledger_state(db_url)
    first = gc(*request, *KEY, "--format", "json") if verb not in NO_FORMAT else gc(*request, *KEY)
    after_first = ledger_state(db_url)
    assert after_first != before  # the first request did something
    again = gc(*request, *KEY, "--format", "json") if verb not in NO_FORMAT else gc(*request, *KEY)
    assert again.output == first.output
    assert ledger_state(db_url) == after_first


@pytest.mark.parametrize("verb", list(REPEATS))
def test_the_same_key_with_another_body_is_an_idempotency_conflict(gc, db_url, verb) -> None:
    setup, request, other = REPEATS[verb]
    for args in setup:
        gc(*args)
    gc(*request, *KEY)
    before = ledger_state(db_url)
    refused = gc(*other, *KEY, code=1)
    assert refused.stderr == (
        "error: idempotency_conflict: idempotency key 'k-1' was already used with a different request\n"
    )
    assert refused.output == refused.stderr  # nothing on stdout
    assert ledger_state(db_url) == before


def test_a_key_names_one_operation_in_its_account(gc, db_url) -> None:
    gc("topup", "physics", "10", "--effective", "2026-12-01T00:00Z", *KEY)
    before = ledger_state(db_url)
    refused = gc("consume", "physics", "10", "--at", "2026-12-02T00:00Z", *KEY, code=1)
    assert refused.stderr.startswith("error: idempotency_conflict: ")
    # Keys are scoped by account: the same key on another account is another request.
    gc("topup", "chemistry", "10", "--effective", "2026-12-01T00:00Z", *KEY)
    assert ledger_state(db_url)[0] != before[0]


def test_prices_and_accounts_share_one_global_key_scope(gc, db_url) -> None:
    gc("price", "set", "h100", "4.00", "--effective", "2027-01-01", *KEY)
    before = ledger_state(db_url)
    refused = gc("account", "create", "biology", *KEY, code=1)
    assert refused.stderr.startswith("error: idempotency_conflict: ")
    assert ledger_state(db_url) == before


def test_a_keyed_hold_create_replays_without_touching_the_runs_hold(gc, db_url) -> None:
    first = json.loads(gc(*HOLD, *KEY, "--format", "json").output)
    gc("hold", "settle", "1", "--elapsed", "1800")
    # The repeat returns the hold as first created (active, nothing charged), not as it is now.
    again = json.loads(gc(*HOLD, *KEY, "--format", "json").output)
    assert again == first
    assert (again["state"], again["amount"], again["charged"]) == ("active", "14.40", "0.00")
    shown = json.loads(gc("hold", "show", "1", "--format", "json").output)
    assert (shown["state"], shown["charged"]) == ("settled", "3.60")


TIME_DEFAULTED = [
    ("topup", "physics", "10"),
    ("grant", "physics", "10"),
    ("consume", "physics", "1"),
]


@pytest.mark.parametrize("request_args", TIME_DEFAULTED, ids=[r[0] for r in TIME_DEFAULTED])
def test_a_keyed_repeat_without_a_time_replays(gc, db_url, request_args) -> None:
    first = gc(*request_args, *KEY, "--format", "json")
    after_first = ledger_state(db_url)
    again = gc(*request_args, *KEY, "--format", "json")  # a retry: the clock has moved on
    assert again.output == first.output
    assert ledger_state(db_url) == after_first


# -- the verbs, with their figures ---------------------------------------------------------


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def test_init_twice_creates_then_changes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    gc = cli_for(url)
    try:
        first = gc("init")
        assert first.output == f"database {url} at revision {head_revision()}\n"
        gc("account", "create", "physics")
        gc("topup", "physics", "5", "--effective", "2020-01-01")
        before = ledger_state(url)
        assert gc("init").output == first.output
        assert ledger_state(url) == before
    finally:
        dispose_engine(url)


def test_init_on_a_ledger_in_use_changes_nothing(gc, db_url) -> None:
    before = ledger_state(db_url)
    out = gc("init").output
    assert out.startswith("database ") and out.endswith(f" at revision {head_revision()}\n")
    assert ledger_state(db_url) == before


def test_account_list_and_show(gc) -> None:
    gc(*hold(seconds=3600))  # 7.20 held
    assert gc("account", "list").output.splitlines() == [
        "ACCOUNT    AVAILABLE  HELD  DEBT",
        "chemistry  0.00       0.00  0.00",
        "physics    92.80      7.20  0.00",
    ]
    assert list(csv.reader(io.StringIO(gc("account", "list", "--format", "csv").output))) == [
        ["account", "available", "held", "debt"],
        ["chemistry", "0.00", "0.00", "0.00"],
        ["physics", "92.80", "7.20", "0.00"],
    ]
    shown = json.loads(gc("account", "show", "physics", "--format", "json").output)
    assert {k: shown[k] for k in ("account", "available", "held", "debt", "active_holds")} == {
        "account": "physics",
        "available": "92.80",
        "held": "7.20",
        "debt": "0.00",
        "active_holds": 1,
    }
    assert shown["grants"] == [
        {
            "id": 1,
            "source": "topup",
            "amount": "100.00",
            "remaining": "100.00",
            "effective_at": "2020-01-01T00:00:00Z",
            "expires_at": None,
            "priority": 10,
        }
    ]
    table = gc("account", "show", "physics").output.splitlines()
    assert table[0].startswith("account physics at ")  # now, whenever that is
    assert table[0].endswith(": available 92.80, held 7.20")
    assert table[1:] == [
        "ID  SOURCE  AMOUNT  REMAINING  EFFECTIVE_AT          EXPIRES_AT  PRIORITY",
        "1   topup   100.00  100.00     2020-01-01T00:00:00Z  -           10",
    ]
    refused = gc("account", "show", "nosuch", code=1)
    assert refused.stderr == "error: not_found: account 'nosuch' does not exist\n"


def test_price_list_shows_every_version_in_one_order_on_both_stores(gc) -> None:
    gc("price", "set", "h100", "5.00", "--partition", "cloud", "--effective", "2027-01-01")
    gc("price", "set", "h100", "4.00", "--effective", "2027-01-01")
    assert gc("price", "list").output.splitlines() == [
        "GRES  PARTITION  CREDITS_PER_GPU_HOUR  EFFECTIVE_AT",
        "a100  -          2.00                  2020-01-01T00:00:00Z",
        "h100  -          3.60                  2020-01-01T00:00:00Z",
        "h100  -          4.00                  2027-01-01T00:00:00Z",
        "h100  cloud      5.00                  2027-01-01T00:00:00Z",
    ]
    assert json.loads(gc("price", "list", "--format", "json").output)[3] == {
        "gres": "h100",
        "partition": "cloud",
        "credits_per_gpu_hour": "5.00",
        "effective_at": "2027-01-01T00:00:00Z",
    }
    # Versions are kept: a quote prices a job at the version in force at its time.
    quote = ("quote", "--account", "physics", "--gpus", "h100:1", "--time", "1:00:00", "--format", "json")
    assert json.loads(gc(*quote, "--at", "2026-12-31T00:00Z").output)["cost"] == "3.60"
    assert json.loads(gc(*quote, "--at", "2027-01-02T00:00Z").output)["cost"] == "4.00"
    assert (
        json.loads(gc(*quote, "--partition", "cloud", "--at", "2027-01-02T00:00Z").output)["cost"] == "5.00"
    )


def test_limits_show(gc) -> None:
    assert gc("limits", "show", "physics").output == (
        "SCOPE    MAX_GPUS  MAX_RATE  DAILY_CAP\naccount  -         -         -\n"
    )
    gc("limits", "set", "physics", "--max-gpus", "8")
    gc("limits", "set", "physics", "--user", "alice", "--max-gpus", "4", "--max-rate", "0.005")
    gc("limits", "set", "physics", "--user", "alice", "--daily-cap", "30")  # the others stay
    assert gc("limits", "show", "physics").output.splitlines() == [
        "SCOPE       MAX_GPUS  MAX_RATE  DAILY_CAP",
        "account     8         -         -",
        "user alice  4         0.005     30.00",
    ]
    assert json.loads(gc("limits", "show", "physics", "--format", "json").output) == {
        "account": "physics",
        "account_limits": {"max_gpus": 8, "max_rate": None, "daily_cap": None},
        "users": {"alice": {"max_gpus": 4, "max_rate": "0.005", "daily_cap": "30.00"}},
    }
    refused = gc("limits", "show", "nosuch", code=1)
    assert refused.stderr == "error: not_found: account 'nosuch' does not exist\n"


HOLD_SHAPE = (
    "id",
    "account",
    "user",
    "cluster",
    "job_id",
    "run",
    "state",
    "amount",
    "charged",
    "expires_at",
    "started_at",
    "resolved_at",
    "charged_seconds",
)


def test_hold_usage_release_list_show(gc, db_url) -> None:
    gc(*hold(seconds=3600))  # 2×h100 × 1 h: 7.20 held; 0.002 credit/s
    usage = json.loads(gc("hold", "usage", "1", "--elapsed", "600", "--format", "json").output)
    assert (usage["state"], usage["charged"], usage["charged_seconds"]) == ("active", "1.20", 600)
    # Usage never moves backwards: a late tick with fewer seconds charges nothing.
    before = ledger_state(db_url)
    late = json.loads(gc("hold", "usage", "1", "--elapsed", "300", "--format", "json").output)
    assert (late["charged"], late["charged_seconds"]) == ("1.20", 600)
    assert ledger_state(db_url) == before
    assert gc("hold", "release", "1", "--at", "2026-12-02T10:20Z").output.splitlines() == [
        "ID  ACCOUNT  USER   CLUSTER  JOB_ID  RUN  STATE     GPUS    AMOUNT  CHARGED  EXPIRES_AT",
        "1   physics  alice  lab      1001    0    released  h100:2  7.20    1.20     2026-12-02T11:10:00Z",
    ]
    balance = json.loads(gc("balance", "physics", "--at", "2026-12-02T10:30Z", "--format", "json").output)
    assert (balance["available"], balance["held"]) == ("98.80", "0.00")
    gc(*hold(job_id=1002, gpus="a100:1", seconds=3600, at="2026-12-02T11:00Z"))
    listed = list(csv.DictReader(io.StringIO(gc("hold", "list", "--format", "csv").output)))
    assert [(r["id"], r["job_id"], r["state"], r["amount"], r["charged"]) for r in listed] == [
        ("1", "1001", "released", "7.20", "1.20"),
        ("2", "1002", "active", "2.00", "0.00"),
    ]
    active = json.loads(gc("hold", "list", "--state", "active", "--format", "json").output)
    assert [h["id"] for h in active] == [2]
    assert gc("hold", "list", "--account", "chemistry").output == "(none)\n"
    shown = json.loads(gc("hold", "show", "1", "--format", "json").output)
    assert {k: shown[k] for k in HOLD_SHAPE} == {
        "id": 1,
        "account": "physics",
        "user": "alice",
        "cluster": "lab",
        "job_id": 1001,
        "run": 0,
        "state": "released",
        "amount": "7.20",
        "charged": "1.20",
        "expires_at": "2026-12-02T11:10:00Z",
        "started_at": "2026-12-02T10:00:00Z",
        "resolved_at": "2026-12-02T10:20:00Z",
        "charged_seconds": 600,
    }
    assert gc("hold", "show", "99", code=1).stderr == "error: not_found: hold 99 does not exist\n"
    assert gc("hold", "usage", "99", "--elapsed", "1", code=1).stderr == (
        "error: not_found: hold 99 does not exist\n"
    )
    assert gc("hold", "release", "99", code=1).stderr == "error: not_found: hold 99 does not exist\n"


def test_sweep_expires_holds_and_credit_and_pays_debt(gc, db_url) -> None:
    gc("account", "create", "geo")
    gc("grant", "geo", "5", "--effective", "2026-12-01T00:00Z", "--expires", "2026-12-08T00:00Z")
    # bob's job holds 3.60 for 1 h and runs 2 h: 7.20 charged, 5.00 from the grant, 2.20 debt.
    gc(*hold(account="geo", user="bob", job_id=2001, gpus="h100:1", seconds=3600))
    gc("hold", "settle", "1", "--elapsed", "7200")
    balance = json.loads(gc("balance", "geo", "--at", "2026-12-02T12:00Z", "--format", "json").output)
    assert (balance["available"], balance["debt"]) == ("-2.20", "2.20")
    # A grant that starts later cannot pay the debt before it exists; the sweep pays it then.
    gc(
        "grant",
        "geo",
        "3",
        "--effective",
        "2026-12-03T00:00Z",
        "--expires",
        "2026-12-04T00:00Z",
        "--at",
        "2026-12-02T13:00Z",
    )
    # alice's hold (0.60) outlives its limit + 600 s grace at 10:20 with no epilog.
    gc(*hold(job_id=3001, gpus="h100:1", seconds=600))
    assert gc("sweep", "--at", "2026-12-03T12:00Z").output.splitlines() == [
        "ACCOUNT    EXPIRED_HOLDS  EXPIRED_CREDITS  DEBT_PAID",
        "chemistry  0              0.00             0.00",
        "geo        0              0.00             2.20",
        "physics    1              0.00             0.00",
    ]
    geo = json.loads(gc("balance", "geo", "--at", "2026-12-03T12:00Z", "--format", "json").output)
    assert (geo["available"], geo["debt"]) == ("0.80", "0.00")
    physics = json.loads(gc("balance", "physics", "--at", "2026-12-03T12:00Z", "--format", "json").output)
    assert (physics["available"], physics["held"]) == ("100.00", "0.00")
    assert json.loads(gc("hold", "show", "2", "--format", "json").output)["state"] == "expired"
    # The rest of the later grant expires with it.
    swept = json.loads(gc("sweep", "--at", "2026-12-04T00:00Z", "--format", "json").output)
    assert swept == [
        {
            "account": account,
            "at": "2026-12-04T00:00:00Z",
            "expired_holds": 0,
            "expired_credits": expired,
            "debt_paid": "0.00",
        }
        for account, expired in (("chemistry", "0.00"), ("geo", "0.80"), ("physics", "0.00"))
    ]
    geo = json.loads(gc("balance", "geo", "--at", "2026-12-04T00:00Z", "--format", "json").output)
    assert (geo["available"], geo["debt"]) == ("0.00", "0.00")
    assert [kind for _id, account, kind, _hold, _link in entries(db_url) if account == "geo"] == [
        "grant",
        "hold",
        "settle",
        "grant",
        "debt_paid",
        "expiry",
    ]
    before = ledger_state(db_url)
    assert "0.00             0.00" in gc("sweep", "--at", "2026-12-04T00:00Z").output  # nothing left
    assert ledger_state(db_url) == before
    assert gc("audit", "verify").output == "ok: 3 accounts, 9 entries, 0 problems\n"


def test_adjust_up_and_down_linked_to_the_entry_it_corrects(gc, db_url) -> None:
    gc(*hold(job_id=4001, seconds=3600, at="2026-12-05T10:00Z"))
    gc("hold", "settle", "1", "--elapsed", "1800")  # 3.60
    (settle_id,) = [e[0] for e in entries(db_url) if e[2] == "settle"]
    # A run's charge is corrected through its hold: sacct says 1802 s, 0.004 more.
    up = json.loads(
        gc(
            "adjust",
            "physics",
            "0.004",
            "--links",
            str(settle_id),
            "--reason",
            "sacct says 1802 s",
            "--at",
            "2026-12-06T00:00Z",
            "--format",
            "json",
        ).output
    )
    assert (up["adjustment"], up["links_entry_id"], up["hold"]["charged"]) == ("0.004", settle_id, "3.604")
    down = json.loads(
        gc(
            "adjust",
            "physics",
            "--links",
            str(settle_id),
            "--at",
            "2026-12-06T00:00Z",
            "--format",
            "json",
            "--",
            "-1",
        ).output
    )
    assert (down["adjustment"], down["hold"]["charged"]) == ("-1.00", "2.604")
    refused = gc("adjust", "physics", "--links", str(settle_id), "--", "-5", code=2)
    assert (
        refused.stderr == "error: invalid_amount: a refund of 5.00 exceeds the 2.604 this run was charged\n"
    )
    # A charge with no hold is corrected from free credit, or refunded as a new grant.
    consumed = json.loads(
        gc("consume", "physics", "2", "--at", "2026-12-06T01:00Z", "--format", "json").output
    )
    consume_id = consumed["entry_id"]
    more = json.loads(
        gc(
            "adjust",
            "physics",
            "0.5",
            "--links",
            str(consume_id),
            "--at",
            "2026-12-06T02:00Z",
            "--format",
            "json",
        ).output
    )
    assert {k: more[k] for k in ("adjustment", "links_entry_id")} == {
        "adjustment": "0.50",
        "links_entry_id": consume_id,
    }
    back = json.loads(
        gc(
            "adjust",
            "physics",
            "--links",
            str(consume_id),
            "--at",
            "2026-12-06T03:00Z",
            "--format",
            "json",
            "--",
            "-0.5",
        ).output
    )
    assert (back["adjustment"], back["grant"]["source"], back["grant"]["amount"]) == (
        "-0.50",
        "refund",
        "0.50",
    )
    linked = [
        (kind, hold_id, link) for _id, _account, kind, hold_id, link in entries(db_url) if link is not None
    ]
    assert linked[:3] == [("adjust", 1, settle_id), ("adjust", 1, settle_id), ("adjust", None, consume_id)]
    # 100 - 2.604 (the run) - 2 (consumed) - 0.5 (charged) + 0.5 (refunded)
    balance = json.loads(gc("balance", "physics", "--at", "2026-12-06T04:00Z", "--format", "json").output)
    assert balance["available"] == "95.396"
    assert gc("adjust", "physics", "1", "--links", "999", code=1).stderr == (
        "error: not_found: entry 999 of account physics does not exist\n"
    )
    assert gc("adjust", "chemistry", "1", "--links", str(consume_id), code=1).stderr.startswith(
        "error: not_found: "
    )
    assert gc("audit", "verify").output.startswith("ok: ")


def test_a_refund_adjustment_without_a_hold_is_linked_in_the_journal(gc, db_url) -> None:
    consumed = json.loads(
        gc("consume", "physics", "2", "--at", "2026-12-06T01:00Z", "--format", "json").output
    )
    gc("adjust", "physics", "--links", str(consumed["entry_id"]), "--at", "2026-12-06T03:00Z", "--", "-0.5")
    last = entries(db_url)[-1]
    assert last[4] == consumed["entry_id"]


# -- gpucredit agent, a real process against the fake NVML ---------------------------------


@pytest.fixture
def agent_env(tmp_path: Path, db_url: str) -> Iterator[dict[str, str]]:
    """A config whose spool holds job lab/100/0 on GPUs 0 and 1 of node n1."""
    from accounting_bridge.nvml.sampler import GpuRegistry, JobRunKey

    spool = tmp_path / "spool"
    GpuRegistry(spool / "n1").register(JobRunKey("lab", 100, 0), {0: "a100", 1: "a100"})
    config = tmp_path / "gpucredit.toml"
    config.write_text(f'[agent]\nspool_dir = "{spool}/%n"\ninterval_seconds = 10\n')
    yield {
        **os.environ,
        "GPUCREDIT_CONFIG": str(config),
        "GPUCREDIT_DATABASE_URL": db_url,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    dispose_engine(db_url)


AGENT = [sys.executable, "-m", "gpucredit", "agent", "--node", "n1", "--fake-nvml", "a100:2@50,h100:1"]


def usage_rows(db_url: str) -> list[tuple]:
    from ledger import cli_support

    with cli_support.engine_for(db_url).connect() as c:
        return [
            tuple(row)
            for row in c.execute(
                text(
                    "SELECT cluster, job_id, run, node, gres, allocated_gpu_seconds, busy_gpu_seconds,"
                    " energy_joules, peak_memory_bytes FROM gpu_usage ORDER BY id"
                )
            )
        ]


def test_agent_once_writes_usage_rows_and_exits(agent_env, db_url) -> None:
    for total in (20, 40):  # a second run adds to the stored totals
        done = subprocess.run([*AGENT, "--once"], env=agent_env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {
            "interval_seconds": 10.0,
            "units": 3,
            "charged_units": 2,  # the h100 belongs to no job: charged to nobody
            "job_runs": 1,
            "rows_written": 1,
            "finished_runs": 0,
            "problems": 0,
        }
        assert "Traceback" not in done.stderr
        # One nominal interval (10 s) on 2 GPUs at 50 %: 20 GPU-seconds, 10 busy.
        assert usage_rows(db_url) == [("lab", 100, 0, "n1", "a100", total, total // 2, 0, 0)]


def test_agent_loop_writes_usage_rows_and_stops_cleanly_on_sigterm(agent_env, db_url) -> None:
    agent = subprocess.Popen(
        [*AGENT, "--interval", "0.2"],
        env=agent_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120  # a bound on start-up, not a measured time
        while not usage_rows(db_url) and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        seen = usage_rows(db_url)
        assert seen and seen[0][:5] == ("lab", 100, 0, "n1", "a100"), agent.poll()
        agent.send_signal(signal.SIGTERM)
        _out, err = agent.communicate(timeout=60)
        assert "Traceback" not in err
        assert agent.returncode == 0, err
        (row,) = usage_rows(db_url)
        assert row[5] >= seen[0][5] and row[6] <= row[5]  # the last write kept what was sent
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()


def test_racing_repeats_of_a_global_request_run_one_after_the_other(pg_url) -> None:
    """Two `price set` with one key at once on PostgreSQL: the second waits for the first
    and replays it (no second version, no unique-key error)."""
    from ledger import api
    from ledger.store.db import make_engine, make_sessionmaker

    engine = make_engine(pg_url)
    factory = make_sessionmaker(engine)
    effective = datetime(2027, 1, 1, tzinfo=UTC)
    outcome: dict[str, Any] = {}

    def repeat() -> None:
        try:
            with factory() as s, s.begin():
                outcome["result"] = api.set_price(
                    s, "h100", "4.00", effective_at=effective, idempotency_key="k"
                )
        except Exception as exc:  # reported by the assertion below, not lost in the thread
            outcome["error"] = repr(exc)

    try:
        with factory() as s:
            s.begin()
            first = api.set_price(s, "h100", "4.00", effective_at=effective, idempotency_key="k")
            second = threading.Thread(target=repeat)
            second.start()
            deadline = time.monotonic() + 60  # a bound, not a measured time
            while not waiting_on_a_lock(engine) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert waiting_on_a_lock(engine)  # the repeat waits for the first to finish
            s.commit()
        second.join(60)
        assert outcome == {"result": first}
        with engine.connect() as c:
            assert c.execute(text("SELECT COUNT(*) FROM prices")).scalar_one() == 1
    finally:
        engine.dispose()


def waiting_on_a_lock(engine: Any) -> bool:
    with engine.connect() as c:  # a new transaction: pg_stat_activity is a per-transaction snapshot
        return bool(
            c.execute(
                text(
                    "SELECT COUNT(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_setting_the_price_already_in_force_adds_no_version(gc, db_url) -> None:
    """An admin repeating the guide's `price set h100 3.60` adds no duplicate version: the
    price in force then is that already, so a version would change no price at any time."""
    versions = lambda: json.loads(gc("price", "list", "--format", "json").output)  # noqa: E731
    before = versions()
    again = gc("price", "set", "h100", "3.60")
    assert again.stderr == (
        "price of h100 unchanged: 3.60 credits per GPU-hour since 2020-01-01T00:00:00Z; no new version\n"
    )
    assert versions() == before
    # Another price, or the same one where another is in force, is a new version.
    gc("price", "set", "h100", "4.00", "--effective", "2027-01-01")
    gc("price", "set", "h100", "3.60", "--effective", "2028-01-01")
    # 4.00 is in force then already, but a version with its own time is kept: one set later,
    # effective before it (4.50 from 2027-03-01), must not outlast it.
    gc("price", "set", "h100", "4.00", "--effective", "2027-06-01")
    gc("price", "set", "h100", "4.50", "--effective", "2027-03-01")
    assert [
        (v["credits_per_gpu_hour"], v["effective_at"][:10]) for v in versions() if v["gres"] == "h100"
    ] == [
        ("3.60", "2020-01-01"),
        ("4.00", "2027-01-01"),
        ("4.50", "2027-03-01"),
        ("4.00", "2027-06-01"),
        ("3.60", "2028-01-01"),
    ]
    # A partition's own price is its own: the general 3.60 does not make a cloud 3.60 a repeat.
    gc("price", "set", "h100", "3.60", "--partition", "cloud")
    assert len(versions()) == len(before) + 5
