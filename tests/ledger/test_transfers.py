"""Transfers (ledger/books/transfers.py): FROM's available credit in its burn order to a
new grant of TO's that keeps the earliest expiry of what it took; all or nothing,
repeat-safe by key, audited; on both stores with exact figures, by the CLI and by
POST /api/v1/transfers with its access rule."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import Result
from sqlalchemy import func, select

from ledger import api
from ledger.errors import IdempotencyConflict, InsufficientCredits, InvalidInput, NotFound
from ledger.store.tables import postings_t
from tests.support.cli import cli_for, dispose_engine
from tests.support.portal import bearer, make_app, seed_site

AT = datetime(2026, 12, 2, 10, tzinfo=UTC)


def t(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def seed(s: Any) -> None:
    """physics: 100 without expiry, a promotion of 20 to Dec 8, an allocation of 30 to Dec 31."""
    api.set_price(s, "h100", "3.60", effective_at=t("2026-01-01T00:00Z"))
    for name in ("physics", "chemistry"):
        api.create_account(s, name)
    api.add_member(s, "alice", "physics")
    api.topup(s, "physics", "100", effective_at=t("2026-11-01T00:00Z"))
    api.grant(s, "physics", "20", effective_at=t("2026-12-01T00:00Z"), expires_at=t("2026-12-08T00:00Z"))
    api.grant(s, "physics", "30", effective_at=t("2026-12-01T00:00Z"), expires_at=t("2026-12-31T00:00Z"))


def grants(s: Any, account: str, at: datetime = AT) -> list[tuple[str, str | None, str]]:
    return [(g["remaining"], g["expires_at"], g["amount"]) for g in api.balance(s, account, at)["grants"]]


def test_a_transfer_takes_the_earliest_expiry_first_and_keeps_it(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
    with tx() as s:
        moved = api.transfer(s, "physics", "chemistry", "40", at=AT, user="alice")
    # 20 of the promotion (Dec 8) then 20 of the allocation (Dec 31); the top-up untouched
    assert [(x["amount"]) for x in moved["taken"]] == ["20.00", "20.00"]
    assert moved["expires_at"] == "2026-12-08T00:00:00Z"  # the earliest of what it took
    assert (moved["grant"]["amount"], moved["grant"]["source"]) == ("40.00", "transfer")
    with tx() as s:
        assert api.balance(s, "physics", AT)["available"] == "110.00"
        assert grants(s, "physics") == [
            ("0.00", "2026-12-08T00:00:00Z", "20.00"),
            ("10.00", "2026-12-31T00:00:00Z", "30.00"),
            ("100.00", None, "100.00"),
        ]
        assert api.balance(s, "chemistry", AT)["available"] == "40.00"
        assert api.balance(s, "chemistry", t("2026-12-08T00:00Z"))["available"] == "0.00"
        # the clearing account nets to zero; the journal verifies
        assert (
            s.execute(
                select(func.sum(postings_t.c.amount_ucredits)).where(postings_t.c.account_id == -5)
            ).scalar()
            == 0
        )
        assert api.verify(s).problems == []


def test_an_earlier_expiry_wins_and_held_credit_stays(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
        # a running job earmarks 14.40 of the promotion: it is not available to move
        api.create_hold(
            s, api.HoldRequest("physics", user="alice", job_id=1, gpus="h100:2", seconds=7200, at=AT)
        )
    with tx() as s:
        moved = api.transfer(s, "physics", "chemistry", "10", expires_at=t("2026-12-05T00:00Z"), at=AT)
    assert [x["amount"] for x in moved["taken"]] == ["5.60", "4.40"]  # 20 - 14.40 held, then Dec 31's
    assert moved["expires_at"] == "2026-12-05T00:00:00Z"
    with tx() as s:
        assert api.balance(s, "physics", AT)["available"] == "125.60"  # 150 - 14.40 held - 10
        assert api.balance(s, "physics", AT)["held"] == "14.40"


def test_too_little_to_oneself_or_a_bad_amount_is_refused_and_changes_nothing(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
    with tx() as s, pytest.raises(InsufficientCredits) as short:
        api.transfer(s, "physics", "chemistry", "150.01", at=AT)
    assert short.value.details == {
        "account": "physics",
        "to": "chemistry",
        "needed": "150.01",
        "available": "150.00",
    }
    for source, target, amount, code in (
        ("physics", "physics", "1", "transfer_to_self"),
        ("physics", "chemistry", "0", "invalid_amount"),
        ("physics", "chemistry", "-5", "invalid_amount"),
    ):
        with tx() as s, pytest.raises(InvalidInput) as bad:
            api.transfer(s, source, target, amount, at=AT)
        assert bad.value.code == code
    with tx() as s, pytest.raises(InvalidInput) as past:
        api.transfer(s, "physics", "chemistry", "1", at=AT, expires_at=AT)
    assert past.value.code == "invalid_time"
    with tx() as s, pytest.raises(NotFound):
        api.transfer(s, "physics", "ghost", "1", at=AT)
    with tx() as s:
        assert api.balance(s, "physics", AT)["available"] == "150.00"
        assert api.balance(s, "chemistry", AT)["available"] == "0.00"


def test_a_repeat_by_key_moves_once_and_another_body_conflicts(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
    with tx() as s:
        first = api.transfer(s, "physics", "chemistry", "5", at=AT, idempotency_key="t-1")
    with tx() as s:
        assert api.transfer(s, "physics", "chemistry", "5", at=AT, idempotency_key="t-1") == first
        with pytest.raises(IdempotencyConflict):
            api.transfer(s, "physics", "chemistry", "6", at=AT, idempotency_key="t-1")
    with tx() as s:
        assert api.balance(s, "chemistry", AT)["available"] == "5.00"


def test_a_transfer_pays_the_receivers_debt_first(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed(s)
        api.topup(s, "chemistry", "1", effective_at=t("2026-11-01T00:00Z"))
        hold = api.create_hold(
            s, api.HoldRequest("chemistry", user="bob", job_id=9, gpus="h100:1", seconds=600, at=AT)
        )
    with tx() as s:
        api.settle_hold(s, hold.id, 3600, at=t("2026-12-02T11:00Z"))  # ran 1 h: 3.60, 2.60 of it debt
    with tx() as s:
        moved = api.transfer(s, "physics", "chemistry", "5", at=t("2026-12-02T12:00Z"))
    assert moved["debt_paid"] == "2.60"
    with tx() as s:
        assert api.balance(s, "chemistry", t("2026-12-02T12:00Z"))["available"] == "2.40"


# -- the CLI --------------------------------------------------------------------------------


@pytest.fixture
def gc(db_url: str, tx: Callable[[], Any]) -> Iterator[Callable[..., Result]]:
    with tx() as s:
        seed(s)
    yield cli_for(db_url)
    dispose_engine(db_url)


def test_the_cli_prints_what_it_took(gc: Callable[..., Result]) -> None:
    at = ("--at", "2026-12-02T10:00Z")
    out = gc("transfer", "physics", "chemistry", "25", *at, "--idempotency-key", "k1").output
    assert out.splitlines() == [
        "transferred 25.00 from physics to chemistry, expiring 2026-12-08T00:00:00Z; taken:",
        "GRANT_ID  AMOUNT",
        "2         20.00",
        "3         5.00",
    ]
    again = json.loads(
        gc(
            "transfer", "physics", "chemistry", "25", *at, "--idempotency-key", "k1", "--format", "json"
        ).output
    )
    assert again["amount"] == "25.00"
    short = gc("transfer", "physics", "chemistry", "200", *at, code=1)
    assert short.stderr.startswith(
        "error: insufficient_credits: account physics: transferring 200.00 credits"
    )
    assert "needs more than the 125.00 available" in short.stderr
    assert gc("transfer", "physics", "physics", "1", code=2).stderr.startswith("error: transfer_to_self:")
    chemistry = json.loads(gc("balance", "chemistry", "--at", "2026-12-02T10:00Z", "--format", "json").output)
    assert chemistry["available"] == "25.00"  # once: the repeat moved nothing


# -- the HTTP API ---------------------------------------------------------------------------


@pytest.fixture
def http(db_url: str) -> Iterator[tuple[Any, dict[str, str]]]:
    site = seed_site(db_url)  # physics (alice manager, bob member), chemistry (carol manager)
    with _session(db_url) as s:
        api.create_account(s, "physgrp", parent="physics")
        api.add_member(s, "bob", "physgrp", role="manager")
        api.add_member(s, "carol", "physics", role="manager")
    app = make_app(db_url)
    yield app.test_client(), site.tokens
    app.extensions["gpucredit.engine"].dispose()


class _session:
    def __init__(self, db_url: str) -> None:
        from ledger.store.db import make_engine, make_sessionmaker

        self.engine = make_engine(db_url)
        self.s = make_sessionmaker(self.engine)()

    def __enter__(self) -> Any:
        self.s.begin()
        return self.s

    def __exit__(self, *exc: object) -> None:
        self.s.commit()
        self.s.close()
        self.engine.dispose()


def post(client: Any, token: str, body: dict[str, Any], key: str = "k") -> Any:
    return client.post("/api/v1/transfers", json=body, headers={**bearer(token), "Idempotency-Key": key})


def test_who_may_transfer_over_http(http: tuple[Any, dict[str, str]], db_url: str) -> None:
    client, tokens = http
    down = {"from": "physics", "to": "physgrp", "amount": "5"}
    # alice manages physics: into its subtree, yes
    made = post(client, tokens["alice"], down, "a1")
    assert made.status_code == 201, made.get_json()
    assert made.get_json()["to"] == "physgrp"
    # bob manages physgrp only: not out of physics (a member there), nor up
    refused = post(client, tokens["bob"], down, "b1")
    assert (refused.status_code, refused.get_json()["error"]["code"]) == (403, "forbidden")
    up = post(client, tokens["bob"], {"from": "physgrp", "to": "physics", "amount": "1"}, "b2")
    assert up.status_code == 403
    # alice may not see chemistry: as if it did not exist
    hidden = post(client, tokens["alice"], {"from": "physics", "to": "chemistry", "amount": "1"}, "a2")
    assert (hidden.status_code, hidden.get_json()["error"]["code"]) == (404, "not_found")
    # carol manages both physics and chemistry
    both = post(client, tokens["carol"], {"from": "chemistry", "to": "physics", "amount": "1"}, "c1")
    assert both.status_code == 201
    # an admin anything; too much is 402 with the figures; to oneself 422
    short = post(client, tokens["admin"], {"from": "chemistry", "to": "physics", "amount": "1000"}, "d1")
    assert short.status_code == 402
    assert set(short.get_json()["error"]["details"]) == {"account", "to", "needed", "available"}
    own = post(client, tokens["admin"], {"from": "physics", "to": "physics", "amount": "1"}, "d2")
    assert (own.status_code, own.get_json()["error"]["code"]) == (422, "transfer_to_self")
    # a repeat by key answers the first result and moves nothing again
    assert post(client, tokens["alice"], down, "a1").get_json() == made.get_json()
    with _session(db_url) as s:
        assert api.balance(s, "physgrp")["available"] == "5.00"
