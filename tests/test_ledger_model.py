"""A hypothesis state machine drives the ledger against a small reference model.

Invariants after every step: every entry's postings sum to zero; no grant's
remainder or earmark is negative and the projections equal the journal; total
revenue equals the model's charges (each run charged exactly charge_for(rate, s));
available = active remainders - earmarks - debt; and a balance taken at an earlier
time never changes when operations effective later are added.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from sqlalchemy import text

from ledger import api
from ledger.db import make_engine, make_sessionmaker
from ledger.errors import InsufficientCredits
from ledger.money import charge_for, format_credits
from ledger.schema import upgrade

PRICES = {"a100": 2_000_000, "h100": 3_600_000}
START = datetime(2026, 12, 1, tzinfo=UTC)

_template: dict[str, Path] = {}


def _fresh_sqlite() -> str:
    if "path" not in _template:
        path = Path(tempfile.mkdtemp()) / "template.db"
        engine = make_engine(f"sqlite:///{path}")
        upgrade(engine)
        engine.dispose()
        _template["path"] = path
    target = Path(tempfile.mkdtemp()) / "ledger.db"
    shutil.copy(_template["path"], target)
    return f"sqlite:///{target}"


class LedgerMachine(RuleBasedStateMachine):
    def new_database(self) -> str:
        return _fresh_sqlite()

    def __init__(self) -> None:
        super().__init__()
        self.url = self.new_database()
        self.engine = make_engine(self.url)
        self.factory = make_sessionmaker(self.engine)
        self.clock = START
        self.job_ids = itertools.count(1)
        self.active: dict[int, tuple[int, datetime, int]] = {}  # hold id -> (rate, start, charged s)
        self.expected_revenue = 0
        self.snapshots: list[tuple[datetime, dict]] = []

    def teardown(self) -> None:
        self.engine.dispose()
        self.drop_database()

    def drop_database(self) -> None:
        Path(self.url.removeprefix("sqlite:///")).unlink()

    def tx(self):
        return _Tx(self.factory)

    def tick(self, seconds: int) -> datetime:
        self.clock += timedelta(seconds=seconds)
        return self.clock

    @initialize()
    def setup(self) -> None:
        with self.tx() as s:
            for gres, price in PRICES.items():
                api.set_price(s, gres, str(price / 1_000_000), effective_at=START - timedelta(days=1))
            api.create_account(s, "physics")

    @rule(amount=st.integers(1, 50_000_000), wait=st.integers(1, 3600))
    def topup(self, amount: int, wait: int) -> None:
        at = self.tick(wait)
        with self.tx() as s:
            api.topup(s, "physics", format_credits(amount), effective_at=at, at=at)

    @rule(
        amount=st.integers(1, 30_000_000),
        starts_in=st.integers(0, 7200),
        lasts=st.integers(600, 86_400),
        priority=st.integers(1, 20),
        wait=st.integers(1, 600),
    )
    def grant(self, amount: int, starts_in: int, lasts: int, priority: int, wait: int) -> None:
        at = self.tick(wait)
        effective = at + timedelta(seconds=starts_in)
        with self.tx() as s:
            api.grant(
                s,
                "physics",
                format_credits(amount),
                effective_at=effective,
                expires_at=effective + timedelta(seconds=lasts),
                priority=priority,
                at=at,
            )

    @rule(
        gpus=st.sampled_from(["a100:1", "h100:2", "a100:1,h100:1", "a100:4"]),
        seconds=st.integers(60, 7200),
        wait=st.integers(1, 600),
    )
    def hold(self, gpus: str, seconds: int, wait: int) -> None:
        at = self.tick(wait)
        try:
            with self.tx() as s:
                h = api.create_hold(
                    s,
                    "physics",
                    user="alice",
                    job_id=next(self.job_ids),
                    gpus=gpus,
                    seconds=seconds,
                    cluster="lab",
                    at=at,
                )
        except InsufficientCredits:
            return
        self.active[h.id] = (h.rate_ucredits_per_hour, at, 0)

    @precondition(lambda self: self.active)
    @rule(data=st.data(), wait=st.integers(1, 3600), final=st.booleans())
    def charge(self, data: st.DataObject, wait: int, final: bool) -> None:
        hold_id = data.draw(st.sampled_from(sorted(self.active)))
        rate, started, charged_s = self.active[hold_id]
        at = self.tick(wait)
        elapsed = data.draw(st.integers(charged_s, int((at - started).total_seconds())))
        with self.tx() as s:
            if final:
                api.settle_hold(s, hold_id, elapsed, at)
            else:
                api.hold_usage(s, hold_id, elapsed, at)
        if elapsed > charged_s or final:
            self.expected_revenue += charge_for(rate, elapsed) - charge_for(rate, charged_s)
        if final:
            del self.active[hold_id]
        else:
            self.active[hold_id] = (rate, started, max(elapsed, charged_s))

    @precondition(lambda self: self.active)
    @rule(data=st.data(), wait=st.integers(1, 600))
    def release(self, data: st.DataObject, wait: int) -> None:
        hold_id = data.draw(st.sampled_from(sorted(self.active)))
        with self.tx() as s:
            api.release_hold(s, hold_id, self.tick(wait))
        del self.active[hold_id]

    @rule(amount=st.integers(1, 5_000_000), wait=st.integers(1, 600))
    def consume(self, amount: int, wait: int) -> None:
        at = self.tick(wait)
        try:
            with self.tx() as s:
                api.consume(s, "physics", format_credits(amount), at=at)
        except InsufficientCredits:
            return
        self.expected_revenue += amount

    @rule()
    def snapshot(self) -> None:
        with self.tx() as s:
            self.snapshots.append((self.clock, api.balance(s, "physics", self.clock)))

    @invariant()
    def books_balance(self) -> None:
        with self.engine.connect() as c:
            assert (
                c.execute(
                    text(
                        "SELECT COUNT(*) FROM (SELECT entry_id FROM postings GROUP BY entry_id "
                        "HAVING SUM(amount_ucredits) <> 0) t"
                    )
                ).scalar_one()
                == 0
            )
            assert (
                c.execute(
                    text("SELECT COUNT(*) FROM grants WHERE remaining_ucredits < 0 OR earmarked_ucredits < 0")
                ).scalar_one()
                == 0
            )
            revenue = c.execute(
                text("SELECT COALESCE(SUM(amount_ucredits), 0) FROM postings WHERE account_id = -3")
            ).scalar_one()
            assert revenue == self.expected_revenue
            c.rollback()
        with self.tx() as s:
            report = api.verify(s)
            assert report.ok, report.problems

    @invariant()
    def available_is_remainders_minus_earmarks(self) -> None:
        with self.engine.connect() as c:
            grants = c.execute(
                text("SELECT remaining_ucredits, earmarked_ucredits, effective_at, expires_at FROM grants")
            ).all()
            debt = c.execute(text("SELECT debt_ucredits FROM accounts WHERE name='physics'")).scalar()
            c.rollback()
        if debt is None:
            return
        at = self.clock.replace(tzinfo=None)
        expected = (
            sum(r - e for r, e, eff, exp in grants if _naive(eff) <= at and (exp is None or at < _naive(exp)))
            - debt
        )
        with self.tx() as s:
            assert api.balance(s, "physics", self.clock)["available"] == format_credits(expected)

    @invariant()
    def the_past_does_not_change(self) -> None:
        with self.tx() as s:
            for at, seen in self.snapshots:
                assert api.balance(s, "physics", at) == seen


class _Tx:
    def __init__(self, factory) -> None:
        self.factory = factory

    def __enter__(self):
        self.session = self.factory()
        self.session.begin()
        return self.session

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.session.commit()
        else:
            self.session.rollback()
        self.session.close()


def _naive(value) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


TestLedgerModel = LedgerMachine.TestCase
TestLedgerModel.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class PostgresLedgerMachine(LedgerMachine):
    """The same machine on PostgreSQL, one fresh database per example."""

    def new_database(self) -> str:
        from tests.conftest import IN_CI, PG_ADMIN_URL, _pg_admin, _pg_url

        self.admin = _pg_admin()
        if self.admin is None:
            message = f"PostgreSQL is not available at {PG_ADMIN_URL}"
            import pytest

            pytest.fail(message) if IN_CI else pytest.skip(message)
        self.dbname = f"gpucredit_m_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{self.dbname}"'))
        url = _pg_url(self.dbname)
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        return url

    def drop_database(self) -> None:
        with self.admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)'))
        self.admin.dispose()


TestPostgresLedgerModel = PostgresLedgerMachine.TestCase
TestPostgresLedgerModel.settings = settings(
    max_examples=12, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
