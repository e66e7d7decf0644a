"""The ledger's bounds (ledger.money): no amount and no product of amounts a caller can
enter overflows 2**63 - 1 micro-credits, on SQLite and PostgreSQL; and an account whose
figures already add up past that (a database written before the bounds) cannot stop the
job_submit snapshot, and with it every account's jobs (issue 27, P7).

Before the bounds, ten admin top-ups at the amount cap made SQLite's SUM overflow in the
snapshot's one grouped read: every quote on the cluster became "ledger unavailable".
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select

from gpucredit.daemon.server import Daemon
from ledger import api
from ledger.config import load_config
from ledger.errors import InvalidInput
from ledger.money import (
    MAX_ACCOUNT_UCREDITS,
    MAX_CHARGE_UCREDITS,
    MAX_GPUS_PER_JOB,
    MAX_RATE_UCREDITS_PER_HOUR,
    MAX_UCREDITS,
    UCREDITS_CEILING,
)
from ledger.pricing.snapshot import take_snapshot
from ledger.store.tables import accounts_t, grants_t

START = datetime(2026, 1, 1, tzinfo=UTC)
AT = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
CAP = "1000000000000"  # MAX_CREDITS: one amount's cap
NO_VAL = 4294967294


def test_the_bounds_nest_below_what_a_bigint_holds() -> None:
    assert MAX_CHARGE_UCREDITS <= MAX_UCREDITS <= MAX_ACCOUNT_UCREDITS
    # Every grant sum of one account, plus as much again of debt, fits a 64-bit integer.
    assert 2 * MAX_ACCOUNT_UCREDITS < UCREDITS_CEILING
    # One job at the highest rate for the longest time limit.
    assert MAX_RATE_UCREDITS_PER_HOUR * 366 * 24 < UCREDITS_CEILING


def seed(tx: Callable[[], Any]) -> None:
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=START)
        api.create_account(s, "physics")
        api.topup(s, "physics", "20", effective_at=START)
        api.create_account(s, "whale")


def test_top_ups_past_an_accounts_bound_are_refused_naming_it(tx: Callable[[], Any]) -> None:
    seed(tx)
    with tx() as s:
        api.topup(s, "whale", CAP, effective_at=START)
    for attempt in range(9):  # the attack: ten top-ups at the amount cap
        with pytest.raises(InvalidInput) as refused, tx() as s:
            api.topup(s, "whale", CAP, effective_at=START, idempotency_key=f"whale-{attempt}")
        assert refused.value.code == "invalid_amount"
        assert refused.value.details == {
            "limit": "account_credit",
            "account": "whale",
            "value": "2000000000000.00",
            "cap": "1000000000000.00",
        }
        assert refused.value.message == (
            "account whale: 2000000000000.00 credits granted in all would exceed the cap of "
            "1000000000000.00 an account may ever be granted (1000000000000.00 granted + "
            "1000000000000.00 now)"
        )
    with tx() as s:  # nothing changed, and every account is still read
        assert api.balance(s, "whale")["available"] == "1000000000000.00"
        assert {t.account: t.available_ucredits for t in api.account_totals(s, AT)} == {
            "physics": 20_000_000,
            "whale": MAX_UCREDITS,
        }
    assert take_snapshot(tx).available_ucredits["physics"] == 20_000_000


def test_a_price_a_rate_and_a_gpu_count_past_their_bounds_are_refused(tx: Callable[[], Any]) -> None:
    seed(tx)
    with tx() as s:
        api.set_price(s, "huge", "100000000", effective_at=START)  # the cap itself: allowed
    with pytest.raises(InvalidInput) as price, tx() as s:
        api.set_price(s, "huge", "100000000.000001", effective_at=START)
    assert (price.value.code, price.value.details["limit"], price.value.details["cap"]) == (
        "invalid_amount",
        "price_per_gpu_hour",
        "100000000.00",
    )
    # Two GPUs at the highest price are twice the highest rate one job may have: refused
    # before any product is stored (it was a 500, an integer too large for the column).
    with pytest.raises(InvalidInput) as rate, tx() as s:
        api.create_hold(
            s, api.HoldRequest("physics", user="alice", job_id=1, gpus="huge:2", seconds=31_622_400, at=AT)
        )
    assert rate.value.code == "invalid_gpus"
    assert rate.value.details == {"limit": "rate_per_job", "value": "200000000.00", "cap": "100000000.00"}
    assert rate.value.message == (
        "huge:2 cost 200000000.00 credits per hour, "
        "above the cap of 100000000.00 credits per hour for one job"
    )
    with pytest.raises(InvalidInput) as quote, tx() as s:
        api.quote(s, "physics", "huge:2", 3600)
    assert quote.value.details["limit"] == "rate_per_job"
    # The GPU cap is the job's total, not each part's.
    half = MAX_GPUS_PER_JOB // 2 + 1
    with pytest.raises(InvalidInput) as gpus, tx() as s:
        api.create_hold(
            s,
            api.HoldRequest(
                "physics", user="alice", job_id=2, gpus=f"h100:{half},a100:{half}", seconds=60, at=AT
            ),
        )
    assert gpus.value.details["limit"] == "gpus_per_job"
    assert gpus.value.message == (
        f"{2 * half} GPUs in one job exceed the cap of {MAX_GPUS_PER_JOB} GPUs per job"
    )
    # A hold for no time holds nothing.
    with pytest.raises(InvalidInput) as zero, tx() as s:
        api.create_hold(
            s, api.HoldRequest("physics", user="alice", job_id=3, gpus="h100:1", seconds=0, at=AT)
        )
    assert (zero.value.code, zero.value.details["minimum"]) == ("invalid_duration", 1)
    with tx() as s:
        assert api.list_holds(s, "physics") == []


def write_legacy_grants(tx: Callable[[], Any], account: str, amounts: list[int]) -> None:
    """Grants as a database written before the bounds might hold them: straight into the
    table (the ledger refuses to write them today)."""
    with tx() as s:
        account_id = s.execute(select(accounts_t.c.id).where(accounts_t.c.name == account)).scalar_one()
        for amount in amounts:
            s.execute(
                insert(grants_t).values(
                    account_id=account_id,
                    source="topup",
                    amount_ucredits=amount,
                    remaining_ucredits=amount,
                    earmarked_ucredits=0,
                    effective_at=START,
                    expires_at=None,
                    priority=10,
                )
            )


def submit(daemon: Daemon, account: str) -> Any:
    return daemon.handle(
        {
            "op": "submit",
            "user_name": "alice",
            "user_id": 1001,
            "account": account,
            "partitions": {"onprem": {"default_time": NO_VAL, "max_time": 4294967295, "default": True}},
            "tres_per_node": "gres:gpu:h100:2",
            "time_limit": 120,
            "num_tasks": NO_VAL,
            "min_nodes": NO_VAL,
        }
    )


def test_one_account_past_the_bounds_does_not_stop_every_accounts_quotes(
    db_url: str, tx: Callable[[], Any]
) -> None:
    """The snapshot's grouped read survives an account whose grants add up past 2**63 - 1
    (on SQLite a plain SUM failed, and every job on the cluster was refused "ledger
    unavailable"): the other accounts are quoted, and the bad one too, exactly."""
    seed(tx)
    write_legacy_grants(tx, "whale", [2**62, 2**62, 5])
    snapshot = take_snapshot(tx)
    assert snapshot.available_ucredits["physics"] == 20_000_000
    assert snapshot.available_ucredits["whale"] == 2**63 + 5
    assert snapshot.credit_ucredits["whale"] == 2**63 + 5
    with tx() as s:
        totals = {t.account: t.available_ucredits for t in api.account_totals(s, AT)}
    assert totals == {"physics": 20_000_000, "whale": 2**63 + 5}

    config = load_config(Path("/dev/null"))
    config["database"]["url"] = db_url
    config["daemon"]["metrics_port"] = 0
    daemon = Daemon(config, lambda *args, **kwargs: "")
    try:
        assert submit(daemon, "physics") == {
            "ok": True,
            "result": {
                "decision": "accept",
                "message": "gpucredit: ~14.40 credits (2×h100 × 2 h), 20.00 available in physics",
            },
        }
        whale = submit(daemon, "whale")
        assert whale["ok"] and whale["result"]["decision"] == "accept", whale
        assert "9223372036854.775813 available in whale" in whale["result"]["message"]
    finally:
        daemon.engine.dispose()
