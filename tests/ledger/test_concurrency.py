"""Real concurrency on both stores: separate OS processes, separate connections.

8 processes race hold requests (2,000 on PostgreSQL, 600 on SQLite, whose writers
queue on one lock) against one account whose credit covers exactly K of them:
exactly K are admitted, available credit never dips below zero at any point of the
journal, and every entry's postings sum to zero. Racing top-ups that share one
idempotency key create exactly one grant. tests/ledger/test_races.py races the rest.
"""

from __future__ import annotations

import multiprocessing as mp
from datetime import UTC, datetime

from sqlalchemy import text

from ledger import api
from ledger.errors import InsufficientCredits
from ledger.store.db import make_engine, make_sessionmaker

PROCESSES = 8
# (requests, K): the credit covers exactly K of the requests
SIZES = {"postgresql": (2000, 300), "sqlite": (600, 100)}
HOLD_UCREDITS = 60_000  # 1×h100 for 60 s at 3.60/h = 0.06 credits
AT = datetime(2026, 12, 2, 10, tzinfo=UTC)


def _sizes(url: str) -> tuple[int, int]:
    return SIZES["postgresql" if url.startswith("postgresql") else "sqlite"]


def _race_holds(url: str, worker: int, barrier, results) -> None:
    engine = make_engine(url, pool_size=1)
    factory = make_sessionmaker(engine)
    admitted = refused = 0
    requests, _k = _sizes(url)
    barrier.wait()
    for job_id in range(worker + 1, requests + 1, PROCESSES):
        try:
            with factory() as s, s.begin():
                api.create_hold(
                    s,
                    api.HoldRequest(
                        "physics",
                        user="alice",
                        job_id=job_id,
                        gpus="h100:1",
                        seconds=60,
                        cluster="lab",
                        at=AT,
                    ),
                )
            admitted += 1
        except InsufficientCredits:
            refused += 1
    engine.dispose()
    results.put((admitted, refused))


def _race_topup(url: str, barrier, results) -> None:
    engine = make_engine(url, pool_size=1)
    barrier.wait()
    with make_sessionmaker(engine)() as s, s.begin():
        grant = api.topup(
            s, "physics", "50", idempotency_key="stripe-evt-1", effective_at=datetime(2026, 11, 1, tzinfo=UTC)
        )
    engine.dispose()
    results.put(grant["grant"]["id"])


def _setup(tx, admitted: int) -> None:
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.topup(
            s,
            "physics",
            str(admitted * HOLD_UCREDITS / 1_000_000),
            effective_at=datetime(2026, 11, 1, tzinfo=UTC),
        )


def _run(target, args_for) -> list:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(i), barrier, results)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    out = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return out


def test_racing_holds_admit_exactly_k(db_url, tx) -> None:
    requests, admitted = _sizes(db_url)
    _setup(tx, admitted)
    outcomes = _run(_race_holds, lambda i: (db_url, i))
    assert sum(a for a, _ in outcomes) == admitted
    assert sum(a + r for a, r in outcomes) == requests
    engine = make_engine(db_url)
    with engine.connect() as c:
        assert c.execute(text("SELECT COUNT(*) FROM holds WHERE state = 'active'")).scalar_one() == admitted
        unbalanced = c.execute(
            text("SELECT entry_id FROM postings GROUP BY entry_id HAVING SUM(amount_ucredits) <> 0")
        ).all()
        assert unbalanced == []
        # The free credit after every entry, in commit order: never below zero.
        running = c.execute(
            text(
                "SELECT MIN(free) FROM (SELECT SUM(SUM(amount_ucredits)) OVER (ORDER BY entry_id) AS free "
                "FROM postings WHERE bucket = 'available' GROUP BY entry_id) t"
            )
        ).scalar_one()
        assert running == 0
    with make_sessionmaker(engine)() as s:
        assert api.balance(s, "physics", AT)["available"] == "0.00"
        assert api.verify(s).ok
    engine.dispose()


def test_racing_topups_with_one_key_make_one_grant(db_url, tx) -> None:
    _setup(tx, SIZES["sqlite"][1])
    ids = _run(_race_topup, lambda i: (db_url,))
    assert len(set(ids)) == 1
    engine = make_engine(db_url)
    with engine.connect() as c:
        assert (
            c.execute(text("SELECT COUNT(*) FROM grants WHERE amount_ucredits = 50000000")).scalar_one() == 1
        )
    engine.dispose()
