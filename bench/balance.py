"""Balances on PostgreSQL as the journal grows: "now" at 10^4 and 10^6 entries, and a
balance at a past time with 10^6 entries (from checkpoints, with the full scan beside it).

Two accounts: "small" gets 10^4 entries (its balance now is timed then, alone), "big"
10^6. "Now" is then timed for both, taking turns, so the ratio of the two medians
compares 10^6 entries with 10^4 on the same machine at the same moment: on a shared
machine, two runs minutes apart differ by more than the ratio's margin.

Each account's history is built a chunk at a time, like a year of use: a weekly top-up, a
promotional grant that expires mid-chunk, charges spread over the chunk's effective
time, a checkpoint at the chunk's end (the periodic run), then the sweep, whose expiry
entry is late for that checkpoint (so the next run appends a new version of it).

The charges go through the ledger's own functions, many per statement: the burn order
(`grants.take_free`), `journal.post_many` (hash chain, postings that sum to zero) and
`grants.save_grants` (the remainders), exactly as `grants.consume` would write them one
by one without an idempotency key. `--verify` runs `audit verify` on the result.

    .venv/bin/python -m bench.balance [--entries 1000000] [--verify]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from bench.goals import report
from ledger import api
from ledger.books.accounts import lock_account
from ledger.books.checkpoints import checkpoint_balances, scan_sums
from ledger.books.grants import load_grants, save_grants, take_free
from ledger.books.journal import REVENUE, EntryDraft, Leg, post_many
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade
from ledger.timeutil import utcnow

ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
SMALL, BIG = "small", "big"  # accounts of 10^4 and 10^6 entries
PAST_READS = 200
CHUNK = 2_000  # entries between checkpoints: about 17 hours of this account's use
BATCH = 5_000  # charges per post_many
SPACING = timedelta(seconds=31)  # effective time between charges: 10^6 in about a year
CHARGE = 1_000_000  # 1 credit per charge
TOPUP_EVERY = 10  # chunks per top-up (about a week)
PROMO = 500  # credits of each chunk's promotional grant; an hour of charges uses ~116


def _url(database: str) -> str:
    return make_url(ADMIN_URL).set(database=database).render_as_string(hide_password=False)


class History:
    """One account's journal, grown a chunk at a time from `start` on."""

    def __init__(self, factory: sessionmaker[Session], account: str, start: datetime) -> None:
        self.factory = factory
        self.account = account
        self.start = start
        self.clock = start
        self.entries = 0
        self.checkpoints = 0
        self.chunks = 0

    def grow_to(self, target: int) -> None:
        analysed = self.entries
        while self.entries < target:
            self._chunk(min(CHUNK, target - self.entries))
            if self.entries > 2 * analysed:  # as autovacuum would, for the planner's estimates
                with self.factory() as s, s.begin():
                    s.execute(text("ANALYZE"))
                analysed = self.entries

    def _chunk(self, size: int) -> None:
        begin = self.clock
        charges = max(size - 3, 1)
        middle = begin + SPACING * (charges // 2)
        with self.factory() as s, s.begin():
            if self.chunks % TOPUP_EVERY == 0:
                amount = TOPUP_EVERY * CHUNK
                api.topup(s, self.account, str(amount), effective_at=begin, at=begin)
            api.grant(
                s, self.account, str(PROMO), effective_at=middle, expires_at=middle + timedelta(hours=1)
            )
        with self.factory() as s, s.begin():
            account = lock_account(s, self.account)
            grants = load_grants(s, account.id)
            drafts: list[EntryDraft] = []
            for i in range(charges):
                at = begin + SPACING * i
                legs: list[Leg] = []
                if take_free(grants, account, CHARGE, at, None, legs):
                    raise SystemExit("the bench's top-ups do not cover its charges")
                legs.append(Leg(REVENUE, CHARGE))
                drafts.append(EntryDraft("consume", at, legs))
                if len(drafts) == BATCH:
                    post_many(s, account, drafts)
                    drafts = []
            post_many(s, account, drafts)
            save_grants(s, grants)
        self.clock = begin + SPACING * charges
        self.chunks += 1
        with self.factory() as s, s.begin():
            checkpoint_balances(s, self.account, self.clock)
            self.checkpoints += 1
        with self.factory() as s, s.begin():
            api.sweep(s, self.account, self.clock)  # posts the promotion's unused part, late
            self.entries = lock_account(s, self.account).entry_count


def _median_ms(call: Callable[[], Any], count: int) -> float:
    times = []
    for _ in range(count):
        began = time.perf_counter()
        call()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def _now_ms(factory: sessionmaker[Session], accounts: list[str], calls: int) -> list[float]:
    """Median ms of `calls` balance-now reads per account, each its own transaction (as the
    portal's), the accounts taking turns so that both see the same machine."""
    times: dict[str, list[float]] = {name: [] for name in accounts}
    for i in range(calls + 50):
        for name in accounts:
            began = time.perf_counter()
            with factory() as s, s.begin():
                api.balance(s, name)
            if i >= 50:  # the first ones warm the pool and the caches
                times[name].append((time.perf_counter() - began) * 1000)
    return [statistics.median(times[name]) for name in accounts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=2_000, help="balance-now reads per size")
    parser.add_argument("--verify", action="store_true", help="run audit verify on the 10^6 entries")
    parser.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
    args = parser.parse_args()

    database = f"bench_balance_{uuid.uuid4().hex[:8]}"
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{database}"'))
    engine = make_engine(_url(database))
    try:
        upgrade(engine)
        factory = make_sessionmaker(engine)
        start = (utcnow() - timedelta(days=400)).replace(microsecond=0)
        with factory() as s, s.begin():
            for name in (SMALL, BIG):
                api.create_account(s, name, at=start - timedelta(days=1))
        small, big = History(factory, SMALL, start), History(factory, BIG, start)
        began = time.perf_counter()
        small.grow_to(args.small)
        with engine.begin() as c:
            c.execute(text("ANALYZE"))
        (alone_ms,) = _now_ms(factory, [SMALL], args.calls)
        print(
            f"balance now, {small.entries:,} entries in the journal: {alone_ms:.3f} ms (median)", flush=True
        )

        big.grow_to(args.entries)
        built = time.perf_counter() - began
        with engine.begin() as c:
            c.execute(text("ANALYZE"))
        total = small.entries + big.entries
        print(
            f"built {total:,} entries, {small.checkpoints + big.checkpoints} checkpoints in {built:.0f} s "
            f"({total / built:,.0f} entries/s)",
            flush=True,
        )
        small_ms, big_ms = _now_ms(factory, [SMALL, BIG], args.calls)
        print(
            f"balance now, {total:,} entries in the journal: {big_ms:.3f} ms for the account of "
            f"{big.entries:,}, {small_ms:.3f} ms for the account of {small.entries:,} "
            f"(median of {args.calls} each, taking turns)",
            flush=True,
        )

        span = big.clock - start
        rng = random.Random(8)
        times = [start + span * rng.random() for _ in range(PAST_READS)]
        pending = iter(times)

        def past() -> None:
            with factory() as s, s.begin():
                api.balance(s, BIG, next(pending))

        past_ms = _median_ms(past, len(times))
        print(
            f"balance at a past time, account of {big.entries:,}: {past_ms:.2f} ms (median of {len(times)})"
        )
        with factory() as s, s.begin():
            account_id = lock_account(s, BIG).id
        middle = start + span / 2

        def scan() -> None:
            with factory() as s, s.begin():
                scan_sums(s, account_id, middle)

        print(f"  the same by whole-journal scan: {_median_ms(scan, 3):.0f} ms (median of 3)", flush=True)

        if args.verify:
            began = time.perf_counter()
            with factory() as s, s.begin():
                result = api.verify(s)
            print(
                f"audit verify: {'ok' if result.ok else 'FAILED'}, {result.entries:,} entries, "
                f"{len(result.problems)} problems in {time.perf_counter() - began:.0f} s",
                flush=True,
            )
            for problem in result.problems[:5]:
                print(f"  PROBLEM: {problem}")

        report(
            f"balance: now at 10^{len(str(args.entries)) - 1} entries ÷ at 10^{len(str(args.small)) - 1}",
            big_ms / small_ms,
            goal=1.2,
            must=1.2,
            better="<=",
        )
        report(
            f"balance: at a past time t, 10^{len(str(args.entries)) - 1} entries",
            past_ms,
            goal=20,
            must=100,
            better="<=",
            unit="ms",
        )
    finally:
        engine.dispose()
        if args.keep:
            print(f"kept database {database}")
        else:
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
