"""Credentials used once (ledger/access/credentials.py): a digest is spent once while it
is remembered, forgotten after its time, and of two connections racing with one digest
only one spends it; and the request a credential carries reads back as it was written."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from ledger import api
from ledger.store.db import make_sessionmaker
from ledger.timeutil import utcnow

DIGEST = "ab" * 32


def test_a_digest_is_spent_once_until_it_is_forgotten(engine: Engine) -> None:
    sessions = make_sessionmaker(engine)
    now = utcnow()
    with sessions() as s, s.begin():
        assert api.spend_credential(s, DIGEST, now + timedelta(minutes=5), now) is True
    with sessions() as s, s.begin():
        assert api.spend_credential(s, DIGEST, now + timedelta(minutes=5), now) is False
        assert api.spend_credential(s, "cd" * 32, now + timedelta(minutes=5), now) is True
    later = now + timedelta(minutes=6)  # munged refuses the credential by then: its row goes
    with sessions() as s, s.begin():
        assert api.spend_credential(s, DIGEST, later + timedelta(minutes=5), later) is True


def test_two_connections_racing_with_one_digest_spend_it_once(engine: Engine) -> None:
    sessions = make_sessionmaker(engine)
    now = utcnow()
    results: list[bool] = []
    start = threading.Barrier(2)

    def spend() -> None:
        with sessions() as s, s.begin():
            start.wait(10)
            results.append(api.spend_credential(s, DIGEST, now + timedelta(minutes=5), now))

    threads = [threading.Thread(target=spend) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == [False, True]


def test_a_digest_and_a_time_are_checked() -> None:
    now = utcnow()
    with pytest.raises(ValueError, match="SHA-256 in lower-case hex"):
        api.spend_credential(None, "AB" * 32, now + timedelta(minutes=1), now)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a time still to come"):
        api.spend_credential(None, DIGEST, now, now)  # type: ignore[arg-type]


def test_the_request_a_credential_carries_reads_back() -> None:
    payload = api.request_payload("0" * 32, "GET", "/api/v1/jobs?limit=5", b"")
    bound = api.read_request_payload(payload)
    empty_sha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert bound == api.BoundRequest("0" * 32, "GET", "/api/v1/jobs?limit=5", empty_sha256)
    for bad in (b"", payload + b"\nmore", payload.replace(b"GET", b"get"), b"\xff" + payload):
        assert api.read_request_payload(bad) is None
    with pytest.raises(ValueError, match="cannot bind"):
        api.request_payload("0" * 32, "GET", "/api/v1/jobs\nPOST", b"")
