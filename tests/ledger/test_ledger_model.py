"""The ledger against an independent model, driven by a hypothesis state machine.

The model below knows nothing of the ledger's code: it has its own price table (per
GPU-hour, integer micro-credits, versioned by effective time), its own half-up
rounding of a hold's cumulative GPU-seconds, its own burn order (priority, earliest
expiry, oldest; a hold's earmarks; only credit active at the charge's time), its own
debt (settling past what is held draws free credit, then goes negative; a top-up
already in effect pays debt first, a later one only once the sweep sees it in
effect) and its own limits (docs/design.md §4). From those it predicts every outcome: each
hold, consume, charge and release is admitted or refused with the exact code, and a
refusal or a replay posts nothing. Charges are effective at the scheduler's end of
the run (in the past) or at the clock, so effective times move backwards and
forwards; balances at past and future times are checked against the model's
effective-time history. After every step the store's projections (each grant's
remainder and earmark, the debt, each hold) and its books (every entry sums to zero,
revenue equals the model's charges) must agree with the model; the audit (`verify`)
runs at the end of every run.

Transfers (ledger/books/transfers.py) go out of the account in its burn order, all or
nothing, into a sibling (`chemistry`, funded without expiry) whose new grant must carry the
earliest expiry of what was taken, and come in from it as a grant effective at once that
pays debt first; they are no revenue, and the clearing account nets to zero.

In some runs `physics` sits below `dept`, whose pool is on (maybe with a cap per child):
a hold physics's own credit cannot cover borrows the rest from dept at the hold, dept's
free credit in its burn order becoming one `pool` grant of physics's (burnt after its own
grants, expiring at the earliest expiry of what it took), within what the cap leaves
(borrowed less returned); a refusal names physics's own available. When a hold resolves,
or a charge is lowered, the free part of physics's pool grants goes back to the dept
grants it came from, latest burn first. dept's grants are checked after every step too.

Run with `--hypothesis-show-statistics` to see how often each path is reached (the
`event`s); a run starts with jobs running and a third start in debt, so settles,
releases, expiries and debt are reached often.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from hypothesis.statistics import collector, describe_statistics
from sqlalchemy import text
from sqlalchemy.orm import Session

from ledger import api
from ledger.errors import LedgerError
from ledger.store.db import make_engine, make_sessionmaker
from tests.support.services import pg_admin, pg_database_url, require

START = datetime(2026, 12, 1, 9, tzinfo=UTC)
PRICE_FROM = START - timedelta(days=1)
GRACE = timedelta(seconds=600)  # the ledger's default: a hold expires at its limit + 600 s
GPU_SPECS = {
    "a100:1": {"a100": 1},
    "h100:2": {"h100": 2},
    "a100:1,h100:1": {"a100": 1, "h100": 1},
    "a100:4": {"a100": 4},
}
# The same requests spelled another way: a repeat must still be recognised as the same.
RESPELLED = {
    "a100:1": "a100:1",
    "h100:2": "h100:1,h100:1",
    "a100:1,h100:1": "h100:1,a100:1",
    "a100:4": "a100:4",
}
USERS = ("alice", "bob")
# What a reservation asks for (one rule per user draws these).
HOLD_ARGUMENTS = {
    "spec": st.sampled_from(sorted(GPU_SPECS)),
    "seconds": st.sampled_from([60, 600, 1800, 3600]) | st.integers(60, 7200),
    "started_early": st.sampled_from([0, 0, 1, 2]),
    "wait": st.integers(0, 1800),
}
FAR = datetime(9999, 1, 1, tzinfo=UTC)


def credits(ucredits: int) -> str:
    """Micro-credits as the decimal string the ledger takes (the model's own spelling)."""
    return str(Decimal(ucredits) / 1_000_000)


def ucredits(text_amount: str) -> int:
    value = Decimal(text_amount) * 1_000_000
    assert value == value.to_integral_value(), text_amount
    return int(value)


def cost(rate_per_hour: int, seconds: int) -> int:
    """Cumulative GPU-seconds at a per-hour rate, rounded half-up once: floor(x + 1/2)."""
    return (2 * rate_per_hour * seconds + 3600) // 7200


def per_second(rate_per_hour: int) -> Decimal:
    """A burn rate as credits per second, half-up to the micro-credit (how refusals show it)."""
    return Decimal((2 * rate_per_hour + 3600) // 7200) / 1_000_000


# -- the model -------------------------------------------------------------------------------


@dataclass
class MGrant:
    seq: int  # creation order: the ledger's "oldest first" and its id order
    source: str
    amount: int
    effective_at: datetime
    expires_at: datetime | None
    priority: int
    free: int = 0
    earmarked: int = 0
    id: int | None = None  # the store's id, learnt from its answer

    def active(self, at: datetime) -> bool:
        return self.effective_at <= at and (self.expires_at is None or at < self.expires_at)

    def burn_key(self) -> tuple[int, bool, datetime, int]:
        return (self.priority, self.expires_at is None, self.expires_at or FAR, self.seq)


@dataclass
class MHold:
    id: int
    user: str
    job_id: int
    spec: str
    seconds: int
    gpu_count: int
    rate: int  # micro-credits per hour, fixed at reserve
    amount: int
    started_at: datetime
    state: str = "active"
    charged: int = 0
    charged_seconds: int = 0
    debt: int = 0  # the part of this hold's charges that went to debt
    earmarks: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # grant seq -> credit
    drawn: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def expires_at(self) -> datetime:
        return self.started_at + timedelta(seconds=self.seconds) + GRACE


@dataclass
class Refused:
    code: str
    details: dict[str, Any] = field(default_factory=dict)


class Model:
    """What the ledger should do, from docs/design.md §4, by other means than the ledger's code."""

    def __init__(self) -> None:
        self.prices: list[tuple[datetime, int, str, int]] = []  # (effective, order, gres, per hour)
        self.grants: list[MGrant] = []
        self.holds: dict[int, MHold] = {}
        self.debt = 0
        self.limits: dict[str | None, dict[str, int | None]] = {}
        # Every change of a grant's free or earmarked credit and of the debt, by effective time.
        self.history: list[tuple[datetime, int | None, int, int, int]] = []
        self.revenue: list[tuple[datetime, str | None, int]] = []  # (effective, user, amount)
        # chemistry, the other side of transfers: its grants (a top-up of 1000 to start)
        self.partner = [MGrant(0, "topup", 1_000_000_000, PRICE_FROM, None, 10, free=1_000_000_000)]
        # dept, physics's parent, when its pool is on: its grants, each child's cap (None:
        # none), and each loan: [pool grant seq, dept grant seq, taken, returned]
        self.pooled = False
        self.dept: list[MGrant] = []
        self.pool_cap: int | None = None
        self.loans: list[list[int]] = []

    # money movements, each logged at its effective time
    def move(self, at: datetime, g: MGrant, free: int = 0, earmarked: int = 0) -> None:
        g.free += free
        g.earmarked += earmarked
        assert g.free >= 0 and g.earmarked >= 0, "the model itself went wrong"
        self.history.append((at, g.seq, free, earmarked, 0))

    def add_debt(self, at: datetime, amount: int) -> None:
        self.debt += amount
        self.history.append((at, None, 0, 0, amount))

    def burn_order(self) -> list[MGrant]:
        return sorted(self.grants, key=MGrant.burn_key)

    def price(self, gres: str, at: datetime) -> int:
        known = [(eff, order, p) for eff, order, g, p in self.prices if g == gres and eff <= at]
        return max(known)[2]

    def rate(self, spec: str, at: datetime) -> int:
        return sum(self.price(gres, at) * n for gres, n in GPU_SPECS[spec].items())

    def available(self, at: datetime) -> int:
        return sum(g.free for g in self.grants if g.active(at)) - self.debt

    def spent_on_day(self, user: str | None, at: datetime) -> int:
        day = at.date()
        return sum(a for t, u, a in self.revenue if t.date() == day and (user is None or u == user))

    # operations
    def add_grant(
        self,
        source: str,
        amount: int,
        at: datetime,
        effective_at: datetime,
        expires_at: datetime | None,
        priority: int,
        user: str | None = None,
    ) -> tuple[MGrant, int]:
        g = MGrant(len(self.grants), source, amount, effective_at, expires_at, priority)
        self.grants.append(g)
        self.move(effective_at, g, free=amount)
        paid = 0
        if self.debt > 0 and effective_at <= at:  # a top-up pays debt first, once in effect
            paid = min(self.debt, amount)
            self.move(effective_at, g, free=-paid)
            self.add_debt(effective_at, -paid)
        if source == "refund":
            self.revenue.append((at, user, -amount))
        return g, paid

    def limit_refusal(self, user: str, gpus: int, rate: int, amount: int, at: datetime) -> Refused | None:
        for scope, who in (("user", user), ("account", None)):
            caps = self.limits.get(who)
            if caps is None or all(v is None for v in caps.values()):
                continue
            mine = [h for h in self.holds.values() if h.state == "active" and who in (None, h.user)]
            gpus_now = sum(h.gpu_count for h in mine)
            rate_now = sum(h.rate for h in mine)
            held_now = sum(max(h.amount - h.charged, 0) for h in mine)
            if caps["max_gpus"] is not None and gpus_now + gpus > caps["max_gpus"]:
                return Refused(
                    "concurrent_gpus", {"scope": scope, "value": gpus_now + gpus, "cap": caps["max_gpus"]}
                )
            if caps["max_rate"] is not None and rate_now + rate > caps["max_rate"] * 3600:
                return Refused(
                    "spend_rate",
                    {
                        "scope": scope,
                        "value": per_second(rate_now + rate),
                        "cap": Decimal(caps["max_rate"]) / 1_000_000,
                    },
                )
            if caps["daily_cap"] is not None:
                spent = self.spent_on_day(who, at)
                if spent + held_now + amount > caps["daily_cap"]:
                    return Refused(
                        "daily_cap",
                        {
                            "scope": scope,
                            "value": Decimal(spent + held_now + amount) / 1_000_000,
                            "cap": Decimal(caps["daily_cap"]) / 1_000_000,
                        },
                    )
        return None

    def reserve(
        self, user: str, job_id: int, spec: str, seconds: int, at: datetime, started_at: datetime
    ) -> Refused | MHold:
        rate = self.rate(spec, at)
        amount = cost(rate, seconds)
        gpus = sum(GPU_SPECS[spec].values())
        refusal = self.limit_refusal(user, gpus, rate, amount, at)
        if refusal is not None:
            return refusal
        available = self.available(at)
        if amount > available:
            if not self.pooled or amount - available > self.pool_room(at):
                refused = Refused("insufficient_credits", {"needed": amount, "available": available})
                if self.pooled and amount - available <= sum(g.free for g in self.dept if g.active(at)):
                    refused.details["by the cap"] = True
                return refused
            self.borrow(amount - available, at)
        hold = MHold(0, user, job_id, spec, seconds, gpus, rate, amount, started_at)
        need = amount
        for g in self.burn_order():
            if need and g.active(at) and g.free > 0:
                take = min(need, g.free)
                self.move(at, g, free=-take, earmarked=take)
                hold.earmarks[g.seq] += take
                need -= take
        assert need == 0
        return hold

    def pool_room(self, at: datetime) -> int:
        """What dept would lend physics now: its free active credit, within the cap left."""
        room = sum(g.free for g in self.dept if g.active(at))
        if self.pool_cap is not None:
            room = min(room, self.pool_cap - sum(taken - back for _, _, taken, back in self.loans))
        return max(room, 0)

    def borrow(self, amount: int, at: datetime) -> None:
        """dept's free credit in its burn order into one new pool grant of physics's (which,
        like a top-up, pays debt first)."""
        need, taken = amount, []
        for g in sorted(self.dept, key=MGrant.burn_key):
            if need and g.active(at) and g.free > 0:
                take = min(need, g.free)
                g.free -= take
                need -= take
                taken.append((g, take))
        assert need == 0
        expiries = [g.expires_at for g, _ in taken if g.expires_at is not None]
        pool, _paid = self.add_grant("pool", amount, at, at, min(expiries) if expiries else None, 1001)
        self.loans += [[pool.seq, g.seq, take, 0] for g, take in taken]

    def give_back(self, at: datetime) -> int:
        """The free part of physics's pool grants back to the dept grants it came from,
        latest burn first, dated no earlier than the loans; returns what went back."""
        spare = [
            g for g in self.grants if g.source == "pool" and g.free > 0 and g.active(max(at, g.effective_at))
        ]
        if not spare:
            return 0
        when = max(at, *(g.effective_at for g in spare))
        total = 0
        by_seq = {g.seq: g for g in self.dept}
        for g in spare:
            left = g.free
            total += left
            self.move(when, g, free=-left)
            mine = [loan for loan in self.loans if loan[0] == g.seq]
            for loan in sorted(mine, key=lambda loan: by_seq[loan[1]].burn_key(), reverse=True):
                give = min(left, loan[2] - loan[3])
                loan[3] += give
                by_seq[loan[1]].free += give
                left -= give
            assert left == 0, "a pool grant held more than its loans"
        return total

    def consume(self, amount: int, at: datetime, user: str | None) -> Refused | None:
        available = self.available(at)
        if amount > available:
            return Refused("insufficient_credits", {"needed": amount, "available": available})
        need = amount
        for g in self.burn_order():
            if need and g.active(at) and g.free > 0:
                take = min(need, g.free)
                self.move(at, g, free=-take)
                need -= take
        self.revenue.append((at, user, amount))
        return None

    def partner_gives(self, amount: int, at: datetime) -> datetime | None:
        """Chemistry's side of a transfer in: its free credit active at `at` in burn order
        (it never runs short); the earliest expiry of what it gave."""
        need = amount
        expiries: list[datetime] = []
        for g in sorted(self.partner, key=MGrant.burn_key):
            if need and g.active(at) and g.free > 0:
                take = min(need, g.free)
                g.free -= take
                need -= take
                if g.expires_at is not None:
                    expiries.append(g.expires_at)
        assert need == 0, "the model's partner ran short"
        return min(expiries) if expiries else None

    def transfer_out(self, amount: int, at: datetime) -> Refused | datetime | None:
        """Like a direct charge, but to another account: the free credit of active grants in
        burn order; returns the earliest expiry of what it took (None: none expires)."""
        available = self.available(at)
        if amount > available:
            return Refused("insufficient_credits", {"needed": amount, "available": available})
        need = amount
        expiries: list[datetime] = []
        for g in self.burn_order():
            if need and g.active(at) and g.free > 0:
                take = min(need, g.free)
                self.move(at, g, free=-take)
                need -= take
                if g.expires_at is not None:
                    expiries.append(g.expires_at)
        expires = min(expiries) if expiries else None
        self.partner.append(MGrant(len(self.partner), "transfer", amount, at, expires, 10, free=amount))
        return expires

    def draw(self, hold: MHold, amount: int, at: datetime) -> list[str]:
        """Charge `amount` more: in burn order, the hold's own earmarks (even of a grant that
        has expired since) and the free credit of grants active at `at`; the rest is debt."""
        notes: list[str] = []
        need = amount
        for g in self.burn_order():
            mine = min(need, hold.earmarks.get(g.seq, 0))
            if mine:
                if not g.active(at):
                    notes.append("charge drew the earmark of a grant no longer active")
                hold.earmarks[g.seq] -= mine
                hold.drawn[g.seq] += mine
                self.move(at, g, earmarked=-mine)
                need -= mine
            if need and g.active(at) and g.free > 0:
                take = min(need, g.free)
                hold.drawn[g.seq] += take
                self.move(at, g, free=-take)
                need -= take
                notes.append("charge drew free credit beyond its earmarks")
        if need:
            hold.debt += need
            self.add_debt(at, need)
            notes.append("charge ran into debt")
        self.revenue.append((at, hold.user, amount))
        return notes

    def refund(self, hold: MHold, amount: int, at: datetime) -> list[str]:
        """Give back part of a hold's charge: its debt first, then its grants in reverse burn
        order; what neither takes becomes a refund grant."""
        left = amount
        from_debt = min(left, hold.debt, self.debt)
        if from_debt:
            hold.debt -= from_debt
            self.add_debt(at, -from_debt)
            left -= from_debt
        for g in reversed(self.burn_order()):
            give = min(left, hold.drawn.get(g.seq, 0))
            if give:
                hold.drawn[g.seq] -= give
                self.move(at, g, free=give)
                left -= give
        self.revenue.append((at, hold.user, -(amount - left)))
        if left:
            self.add_grant("refund", left, at, at, None, 10, user=hold.user)
            return ["refund became a new grant"]
        return []

    def recharge(self, hold: MHold, seconds: int, at: datetime) -> list[str]:
        target = cost(hold.rate, seconds)
        notes = []
        if (2 * hold.rate * seconds) % 7200 == 3600:
            notes.append("charge rounded at exactly one half")
        if target > hold.charged:
            notes += self.draw(hold, target - hold.charged, at)
        elif target < hold.charged:
            notes += self.refund(hold, hold.charged - target, at)
            notes.append("settle for fewer seconds than charged: refund")
        hold.charged = target
        hold.charged_seconds = seconds
        return notes

    def return_earmarks(self, hold: MHold, at: datetime) -> None:
        for g in self.grants:
            left = hold.earmarks.get(g.seq, 0)
            if left:
                hold.earmarks[g.seq] = 0
                self.move(at, g, free=left, earmarked=-left)

    def sweep(self, at: datetime) -> tuple[list[int], int, int]:
        expired_holds = [h.id for h in self.holds.values() if h.state == "active" and h.expires_at <= at]
        for hold_id in expired_holds:
            self.return_earmarks(self.holds[hold_id], at)
            self.holds[hold_id].state = "expired"
            self.give_back(at)
        expired = 0
        for g in self.grants:
            if g.expires_at is not None and g.expires_at <= at and g.free > 0:
                expired += g.free
                self.move(g.expires_at, g, free=-g.free)
        paid = 0
        for g in self.burn_order():
            if self.debt > paid and g.active(at) and g.free > 0:
                take = min(self.debt - paid, g.free)
                self.move(at, g, free=-take)
                paid += take
        if paid:
            self.add_debt(at, -paid)
        return sorted(expired_holds), expired, paid

    def balance_at(self, t: datetime) -> dict[str, Any]:
        free: dict[int, int] = defaultdict(int)
        earmarked: dict[int, int] = defaultdict(int)
        debt = 0
        for at, seq, f, e, d in self.history:
            if at <= t:
                if seq is not None:
                    free[seq] += f
                    earmarked[seq] += e
                debt += d
        active = [g for g in self.burn_order() if g.active(t)]
        return {
            "available": sum(free[g.seq] for g in active) - debt,
            "held": sum(earmarked.values()),
            "debt": debt,
            "grants": [(g.id, g.amount, free[g.seq] + earmarked[g.seq], g.priority) for g in active],
        }


# -- the machine ------------------------------------------------------------------------------

DEPT_GRANTS = (
    "SELECT g.remaining_ucredits, g.earmarked_ucredits FROM grants g "
    "JOIN accounts a ON a.id = g.account_id WHERE a.name = 'dept' ORDER BY g.id"
)

# The modelled account's grants (chemistry, the other side of transfers, has its own).
PHYSICS_GRANTS = (
    "SELECT {columns} FROM grants g JOIN accounts a ON a.id = g.account_id "
    "WHERE a.name = 'physics' ORDER BY g.id"
)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self, database: Callable[[], tuple[str, Callable[[], None]]]) -> None:
        super().__init__()
        self.url, self.drop = database()
        self.engine = make_engine(self.url)
        self.factory = make_sessionmaker(self.engine)
        self.model = Model()
        self.clock = START
        self.job_ids = itertools.count(1001)
        self.price_order = itertools.count()
        self.posted = 0  # entries the last attempt added

    def reached(self, path: str) -> None:
        """Count a path for --hypothesis-show-statistics."""
        event(path)

    def teardown(self) -> None:
        """The audit (hash chain, projections against the journal) once per run: a
        projection once wrong stays wrong, and the model checks them after every step."""
        try:
            if self.model.prices:
                with self.tx() as s:
                    report = api.verify(s)
                assert report.ok, report.problems
        finally:
            self.engine.dispose()
            self.drop()

    @contextmanager
    def tx(self) -> Iterator[Session]:
        with self.factory() as s, s.begin():
            yield s

    def tick(self, seconds: int) -> datetime:
        self.clock += timedelta(seconds=seconds)
        return self.clock

    def attempt(self, operation: Callable[[Session], Any]) -> tuple[Any, LedgerError | None]:
        """Run one operation in its own transaction; a refusal rolls it back."""
        before = self.entry_count()
        try:
            with self.tx() as s:
                result = operation(s)
        except LedgerError as error:
            assert self.entry_count() == before, f"{error.code}: a refusal posted entries"
            return None, error
        self.posted = self.entry_count() - before
        return result, None

    def entry_count(self) -> int:
        with self.engine.connect() as c:
            return int(c.execute(text("SELECT COUNT(*) FROM entries")).scalar_one())

    def expect_refusal(self, error: LedgerError | None, refused: Refused) -> None:
        assert error is not None, f"the ledger admitted what the model refuses with {refused.code}"
        assert error.code == refused.code, (error.code, refused.code, error.message)
        self.reached(f"refused: {refused.code}")

    def learn_grant_ids(self) -> None:
        """Store ids in creation order (refund grants are created inside a settle)."""
        with self.engine.connect() as c:
            ids = list(c.execute(text(PHYSICS_GRANTS.format(columns="g.id"))).scalars())
        assert len(ids) == len(self.model.grants), "the ledger made a grant the model did not"
        for g, grant_id in zip(self.model.grants, ids, strict=True):
            assert g.id in (None, grant_id)
            g.id = grant_id

    # -- setup

    @initialize(
        caps=st.fixed_dictionaries(
            {
                who: st.none()
                | st.fixed_dictionaries(
                    {
                        "max_gpus": st.one_of(st.none(), st.none(), st.integers(1, 10)),
                        # micro-credits per second: 2×h100 burn 2,000
                        "max_rate": st.one_of(st.none(), st.none(), st.integers(500, 12_000)),
                        "daily_cap": st.one_of(st.none(), st.none(), st.integers(5_000_000, 120_000_000)),
                    }
                )
                for who in ("alice", "bob", "account")
            }
        ),
        opening=st.integers(10_000_000, 40_000_000),
        promotion=st.integers(0, 10_000_000),
        # An odd price makes some charges land on exactly half a micro-credit.
        a100=st.sampled_from([2_000_000, 2_000_001]),
        h100=st.sampled_from([3_600_000, 3_600_001]),
        in_debt=st.sampled_from([False, False, True]),
        # two runs in three below a pooled dept: its credit, and each child's cap or none
        pooled=st.sampled_from([True, True, False]),
        pool_funds=st.integers(5_000_000, 60_000_000),
        pool_cap=st.one_of(st.integers(1_000_000, 12_000_000), st.integers(1_000_000, 12_000_000), st.none()),
        pending=st.integers(1_000_000, 20_000_000),
        running=st.lists(
            st.tuples(st.sampled_from(USERS), HOLD_ARGUMENTS["spec"], HOLD_ARGUMENTS["seconds"]),
            max_size=3,
        ),
    )
    def setup(
        self,
        caps: dict[str, dict[str, int | None] | None],
        opening: int,
        promotion: int,
        a100: int,
        h100: int,
        in_debt: bool,
        pooled: bool,
        pool_funds: int,
        pool_cap: int | None,
        pending: int,
        running: list[tuple[str, str, int]],
    ) -> None:
        """Prices, one account with its first top-up and maybe a 15-minute promotion, a
        few jobs running (their earmarks on the promotion outlive it), maybe a debt, then
        the caps.

        A third of the runs start in debt, from a run that went an hour past its 10-minute hold
        when everything else had been spent, with a top-up that comes into effect a second
        later: until a sweep pays the debt from it, its credit is free but not all of it is
        spendable, so debt and what it blocks are reached often."""
        with self.tx() as s:
            api.create_account(s, "dept")
            api.create_account(s, "physics", parent="dept")
            api.create_account(s, "chemistry", parent="physics")  # transfers' other side
            if pooled:  # dept shares: a top-up, and a grant that expires in 2 h
                funds, cap = pool_funds, pool_cap
                api.topup(s, "dept", credits(funds), effective_at=PRICE_FROM, at=PRICE_FROM)
                api.grant(s, "dept", "5", effective_at=PRICE_FROM, expires_at=START + timedelta(hours=2))
                api.set_pool(s, "dept", True, None if cap is None else credits(cap), at=PRICE_FROM)
                self.model.pooled, self.model.pool_cap = True, cap
                self.model.dept = [
                    MGrant(0, "topup", funds, PRICE_FROM, None, 10, free=funds),
                    MGrant(1, "grant", 5_000_000, PRICE_FROM, START + timedelta(hours=2), 10, free=5_000_000),
                ]
            api.topup(s, "chemistry", "1000", effective_at=PRICE_FROM, at=START)
            for gres, per_hour in (("a100", a100), ("h100", h100)):
                api.set_price(s, gres, credits(per_hour), effective_at=PRICE_FROM)
                self.model.prices.append((PRICE_FROM, next(self.price_order), gres, per_hour))
        self.add_credit("topup", opening, 0, None, 10, 0)
        if promotion:
            self.add_credit("grant", promotion, 0, 900, 10, 0)
        for user, spec, seconds in running:
            self.hold(user, spec, seconds, 0, 0)
        if in_debt:
            before = set(self.model.holds)
            self.hold("alice", "h100:2", 600, 0, 0)
            for overrun in set(self.model.holds) - before:  # unless the running jobs took it all
                self.consume("all available", None, 0)
                self.charge(self.model.holds[overrun], 600 + 3600, True, True, 0)
                assert self.model.debt > 0
                self.add_credit("topup", pending, 1, None, 10, 0)
        for who, limits in caps.items():
            if limits is not None:
                self._set_limits(None if who == "account" else who, limits, clear=False)

    # -- credit in

    @rule(
        source=st.sampled_from(["topup", "topup", "grant"]),
        amount=st.integers(1, 20_000_000),
        starts_in=st.sampled_from([0, 0, 0, 1, 600, 3600]),
        lasts=st.none() | st.integers(600, 86_400),
        priority=st.sampled_from([1, 5, 10, 10, 20]),
        wait=st.integers(0, 1800),
    )
    def add_credit(
        self, source: str, amount: int, starts_in: int, lasts: int | None, priority: int, wait: int
    ) -> None:
        """A top-up (priority 10, expiring or not) or a time-windowed grant, in effect now
        or later."""
        at = self.tick(wait)
        effective = at + timedelta(seconds=starts_in)
        if source == "grant" and lasts is None:
            lasts = 900  # a short promotion: holds often outlive it
        expires = None if lasts is None else effective + timedelta(seconds=lasts)
        window = {"effective_at": effective, "expires_at": expires, "at": at}
        if source == "topup":
            priority = 10
            result, error = self.attempt(lambda s: api.topup(s, "physics", credits(amount), **window))
        else:
            result, error = self.attempt(
                lambda s: api.grant(s, "physics", credits(amount), priority=priority, **window)
            )
        assert error is None, error
        debt_before = self.model.debt
        g, paid = self.model.add_grant(source, amount, at, effective, expires, priority)
        g.id = result["grant"]["id"]
        assert ucredits(result["debt_paid"]) == paid
        if paid:
            self.reached(f"{source} paid debt first" + (" in full" if paid == debt_before else " in part"))
        elif debt_before:
            self.reached(f"{source} not yet in effect left the debt to the sweep")

    # -- prices and limits

    @rule(
        gres=st.sampled_from(["a100", "h100"]),
        per_hour=st.sampled_from([1_000_001, 2_000_000, 2_500_000, 3_600_001, 4_000_000]),
        starts_in=st.integers(0, 3600),
        who=st.sampled_from(["alice", "bob", None]),
        limits=st.fixed_dictionaries(
            {},
            optional={
                "max_gpus": st.integers(0, 10),
                "max_rate": st.integers(0, 12_000),
                "daily_cap": st.integers(0, 120_000_000),
            },
        ),
        clear=st.booleans(),
    )
    def change_terms(
        self, gres: str, per_hour: int, starts_in: int, who: str | None, limits: dict[str, int], clear: bool
    ) -> None:
        """A new price for one GPU type from now or later, and new caps for a user or the
        account (some set, the others kept, or all cleared first)."""
        effective = self.clock + timedelta(seconds=starts_in)
        with self.tx() as s:
            api.set_price(s, gres, credits(per_hour), effective_at=effective)
        self.model.prices.append((effective, next(self.price_order), gres, per_hour))
        self._set_limits(who, limits, clear)

    def _set_limits(self, who: str | None, limits: dict[str, int | None], clear: bool) -> None:
        caps = self.model.limits.setdefault(who, {"max_gpus": None, "max_rate": None, "daily_cap": None})
        if clear:
            caps.update(max_gpus=None, max_rate=None, daily_cap=None)
        given = {k: v for k, v in limits.items() if v is not None}
        caps.update(given)
        with self.tx() as s:
            api.set_limits(
                s,
                "physics",
                user=who,
                max_gpus=given.get("max_gpus"),
                max_rate=None if "max_rate" not in given else credits(given["max_rate"]),
                daily_cap=None if "daily_cap" not in given else credits(given["daily_cap"]),
                clear=clear,
            )

    # -- holds

    @rule(**HOLD_ARGUMENTS)
    def alice_reserves(self, spec: str, seconds: int, started_early: int, wait: int) -> None:
        self.hold("alice", spec, seconds, started_early, wait)

    @rule(**HOLD_ARGUMENTS)
    def bob_reserves(self, spec: str, seconds: int, started_early: int, wait: int) -> None:
        self.hold("bob", spec, seconds, started_early, wait)

    def hold(self, user: str, spec: str, seconds: int, started_early: int, wait: int) -> None:
        at = self.tick(wait)
        started = at - timedelta(seconds=started_early)
        job_id = next(self.job_ids)
        predicted = self.model.reserve(user, job_id, spec, seconds, at, started)
        hold, error = self.attempt(
            lambda s: api.create_hold(
                s,
                api.HoldRequest(
                    "physics",
                    user=user,
                    job_id=job_id,
                    gpus=spec,
                    seconds=seconds,
                    cluster="lab",
                    at=at,
                    started_at=started,
                ),
            )
        )
        if isinstance(predicted, Refused):
            self.expect_refusal(error, predicted)
            self.check_refusal_details(error, predicted, "hold")
            return
        assert error is None, f"the model admits this hold; the ledger refused: {error.code} {error.message}"
        self.reached("hold: admitted")
        if len(self.model.grants) > len([g for g in self.model.grants if g.id is not None]):
            self.learn_grant_ids()
            self.reached("hold: borrowed from dept's pool")
        if self.model.debt:
            self.reached("hold: admitted while in debt")
        predicted.id = hold.id
        self.model.holds[hold.id] = predicted
        assert (hold.amount_ucredits, hold.rate_ucredits_per_hour) == (predicted.amount, predicted.rate)
        assert (hold.state, hold.expires_at, hold.started_at) == ("active", predicted.expires_at, started)

    def check_refusal_details(self, error: LedgerError | None, refused: Refused, what: str) -> None:
        assert error is not None
        details = error.details
        if refused.code == "insufficient_credits":
            if refused.details.get("by the cap"):
                self.reached(f"{what}: refused by the pool's cap, the pool had enough")
            assert ucredits(details["needed"]) == refused.details["needed"]
            assert ucredits(details["available"]) == refused.details["available"]
            if self.model.debt:
                self.reached(f"{what}: refused for credit while in debt")
                if self.model.available(self.clock) + self.model.debt >= refused.details["needed"]:
                    self.reached(f"{what}: refused only because of debt")
            return
        assert details["scope"] == refused.details["scope"]
        if refused.code == "concurrent_gpus":
            assert (details["value"], details["cap"]) == (refused.details["value"], refused.details["cap"])
        else:
            assert Decimal(details["value"]) == refused.details["value"], (details, refused.details)
            assert Decimal(details["cap"]) == refused.details["cap"], (details, refused.details)

    @precondition(lambda self: self.model.holds)
    @rule(data=st.data(), same=st.booleans(), wait=st.integers(0, 600))
    def repeat_hold(self, data: st.DataObject, same: bool, wait: int) -> None:
        """The same request for a run returns its hold, whatever its state; another
        request for that run is an idempotency conflict. Neither posts anything."""
        known = data.draw(st.sampled_from(sorted(self.model.holds)))
        h = self.model.holds[known]
        at = self.tick(wait)
        hold, error = self.attempt(
            lambda s: api.create_hold(
                s,
                api.HoldRequest(
                    "physics",
                    user=h.user,
                    job_id=h.job_id,
                    gpus=RESPELLED[h.spec] if same else h.spec,
                    seconds=h.seconds if same else h.seconds + 1,
                    cluster="lab",
                    at=at,
                ),
            )
        )
        if same:
            assert error is None, error
            assert (hold.id, hold.state, hold.charged_ucredits) == (h.id, h.state, h.charged)
            assert self.posted == 0
            self.reached("hold: repeat returned the first hold")
        else:
            self.expect_refusal(error, Refused("idempotency_conflict"))

    def pick_hold(self, data: st.DataObject) -> MHold:
        active = sorted(i for i, h in self.model.holds.items() if h.state == "active")
        if active and data.draw(st.integers(0, 5), label="resolved one instead") > 0:
            return self.model.holds[data.draw(st.sampled_from(active), label="active hold")]
        return self.model.holds[data.draw(st.sampled_from(sorted(self.model.holds)), label="any hold")]

    @precondition(lambda self: self.model.holds)
    @rule(data=st.data(), at_run_end=st.booleans(), wait=st.integers(0, 900))
    def usage(self, data: st.DataObject, at_run_end: bool, wait: int) -> None:
        h = self.pick_hold(data)
        self.charge(h, self.draw_elapsed(data, h), False, at_run_end, wait)

    @precondition(lambda self: self.model.holds)
    @rule(data=st.data(), at_run_end=st.booleans(), wait=st.integers(0, 900))
    def settle(self, data: st.DataObject, at_run_end: bool, wait: int) -> None:
        h = self.pick_hold(data)
        self.charge(h, self.draw_elapsed(data, h), True, at_run_end, wait)

    def draw_elapsed(self, data: st.DataObject, h: MHold) -> int:
        return data.draw(
            st.one_of(
                st.just(h.charged_seconds),
                # the scheduler's count a second or two short of the meter's: a refund
                st.integers(max(h.charged_seconds - 2, 0), h.charged_seconds),
                st.integers(0, h.seconds),
                st.integers(h.seconds, h.seconds + 4 * 3600),  # lease-like: far past the hold
            ),
            label="elapsed",
        )

    def charge(self, h: MHold, elapsed: int, final: bool, at_run_end: bool, wait: int) -> None:
        """A provisional (usage) or final (settle) charge for the run's elapsed seconds,
        effective at the run's end (the default, in the past) or at the clock."""
        run_end = h.started_at + timedelta(seconds=elapsed)
        self.clock = max(self.tick(wait), run_end)
        at = None if at_run_end else self.clock
        effective = run_end if at is None else at
        verb = api.settle_hold if final else api.hold_usage
        result, error = self.attempt(lambda s: verb(s, h.id, elapsed, at))
        name = "settle" if final else "usage"
        if h.state != "active":
            if final and h.state == "settled" and elapsed == h.charged_seconds:
                assert error is None, error
                assert (result.state, result.charged_ucredits, self.posted) == ("settled", h.charged, 0)
                self.reached("settle: repeat returned the settled hold")
            else:
                self.expect_refusal(error, Refused("hold_resolved"))
            return
        assert error is None, f"{name} of active hold {h.id}: {error.code} {error.message}"
        if not final and elapsed <= h.charged_seconds:
            assert self.posted == 0
            self.reached("usage: no further seconds, nothing charged")
            return
        lowered = cost(h.rate, elapsed) < h.charged
        for note in self.model.recharge(h, elapsed, effective):
            self.reached(note)
        if final:
            self.model.return_earmarks(h, effective)
            h.state = "settled"
        if (final or lowered) and self.model.give_back(effective):
            self.reached("pool credit went back to dept")
            self.reached("settle" + (" past the hold" if h.charged > h.amount else ""))
        else:
            self.reached("usage")
        if at is None:
            self.reached("charge effective at the run's end, before the clock")
        self.learn_grant_ids()
        assert (result.state, result.charged_seconds) == (h.state, elapsed)

    @precondition(lambda self: self.model.holds)
    @rule(data=st.data(), wait=st.integers(0, 900))
    def release(self, data: st.DataObject, wait: int) -> None:
        h = self.pick_hold(data)
        at = self.tick(wait)
        result, error = self.attempt(lambda s: api.release_hold(s, h.id, at))
        if h.state == "released":
            assert error is None, error
            assert (result.state, self.posted) == ("released", 0)
            self.reached("release: repeat returned the released hold")
        elif h.state != "active":
            self.expect_refusal(error, Refused("hold_resolved"))
        else:
            assert error is None, error
            self.model.return_earmarks(h, at)
            h.state = "released"
            if self.model.give_back(at):
                self.reached("pool credit went back to dept")
            self.reached("release")
            assert result.state == "released"

    @rule(
        amount=st.one_of(
            st.integers(1, 10_000_000),
            st.integers(1, 10_000_000),
            st.integers(1, 10_000_000),
            st.sampled_from(["all available", "one more than available"]),
        ),
        user=st.sampled_from([*USERS, None]),
        wait=st.integers(0, 1800),
    )
    def consume(self, amount: int | str, user: str | None, wait: int) -> None:
        """A direct charge: a few credits, or exactly what is available (or one micro-credit
        more), which also leaves later overruns nothing to draw but debt."""
        at = self.tick(wait)
        if isinstance(amount, str):
            amount = self.model.available(at) + (amount != "all available")
            if amount <= 0:
                return
        result, error = self.attempt(lambda s: api.consume(s, "physics", credits(amount), at=at, user=user))
        refused = self.model.consume(amount, at, user)
        if refused is not None:
            self.expect_refusal(error, refused)
            self.check_refusal_details(error, refused, "consume")
            return
        assert error is None, f"the model admits consuming {amount}; the ledger refused: {error.message}"
        assert ucredits(result["charged"]) == amount
        self.reached(
            "consume: admitted" + (", all that was available" if self.model.available(at) == 0 else "")
        )

    @rule(
        amount=st.one_of(
            st.integers(1, 10_000_000),
            st.sampled_from(["all available", "one more than available"]),
        ),
        wait=st.integers(0, 1800),
    )
    def transfer_out(self, amount: int | str, wait: int) -> None:
        """Credit out to chemistry: refused with the figures when short, else taken in burn
        order, the earliest expiry of what was taken kept on chemistry's new grant."""
        at = self.tick(wait)
        if isinstance(amount, str):
            amount = self.model.available(at) + (amount != "all available")
            if amount <= 0:
                return
        result, error = self.attempt(
            lambda s: api.transfer(s, "physics", "chemistry", credits(amount), at=at, user="alice")
        )
        outcome = self.model.transfer_out(amount, at)
        if isinstance(outcome, Refused):
            self.expect_refusal(error, outcome)
            self.check_refusal_details(error, outcome, "transfer")
            return
        assert error is None, f"the model admits transferring {amount}; the ledger refused: {error.message}"
        assert ucredits(result["amount"]) == amount
        assert result["expires_at"] == (
            None if outcome is None else outcome.isoformat().replace("+00:00", "Z")
        )
        assert result["grant"]["expires_at"] == result["expires_at"]
        self.reached("transfer out: " + ("keeps an expiry" if outcome else "nothing taken expires"))

    @rule(
        amount=st.integers(1, 20_000_000),
        lasts=st.none() | st.integers(1, 86_400),
        wait=st.integers(0, 1800),
    )
    def transfer_in(self, amount: int, lasts: int | None, wait: int) -> None:
        """Credit in from chemistry: a grant effective at once, expiring at the earliest
        expiry of what chemistry gave (credit physics sent it earlier) or at `--expires`
        if that is earlier, that pays debt first like a top-up."""
        at = self.tick(wait)
        given = None if lasts is None else at + timedelta(seconds=lasts)
        result, error = self.attempt(
            lambda s: api.transfer(s, "chemistry", "physics", credits(amount), expires_at=given, at=at)
        )
        assert error is None, error
        taken = self.model.partner_gives(amount, at)
        expires = min(e for e in (taken, given, FAR) if e is not None)
        expires = None if expires == FAR else expires
        assert result["expires_at"] == (
            None if expires is None else expires.isoformat().replace("+00:00", "Z")
        )
        g, paid = self.model.add_grant("transfer", amount, at, at, expires, 10)
        g.id = result["grant"]["id"]
        assert ucredits(result["debt_paid"]) == paid
        self.reached(
            "transfer in"
            + (": paid debt first" if paid else "")
            + (": kept chemistry's expiry" if taken and expires == taken else "")
        )

    @rule(wait=st.sampled_from([0, 600, 3600, 4 * 3600, 86_400, 2 * 86_400]))
    def sweep(self, wait: int) -> None:
        at = self.tick(wait)
        debt_before = self.model.debt
        with self.tx() as s:
            result = api.sweep(s, "physics", at)
        holds, expired, paid = self.model.sweep(at)
        assert sorted(result["expired_holds"]) == holds
        assert ucredits(result["expired_credits"]) == expired
        assert ucredits(result["debt_paid"]) == paid
        if holds:
            self.reached("sweep: expired holds")
        if expired:
            self.reached("sweep: expired grant credit")
        if paid:
            self.reached("sweep: paid debt" + (" in full" if paid == debt_before else " in part"))

    # -- balances at any time

    @rule(data=st.data())
    def balance_at_another_time(self, data: st.DataObject) -> None:
        """A balance taken in the past or the future, at a moment where something changed or
        at any second, must match the model's history at that moment."""
        moments = sorted({t for t, *_ in self.model.history} | {self.clock})
        at = data.draw(
            st.one_of(
                st.sampled_from(moments).flatmap(
                    lambda t: st.sampled_from([t - timedelta(seconds=1), t, t + timedelta(seconds=1)])
                ),
                st.integers(-86_400, 3 * 86_400).map(lambda s: START + timedelta(seconds=s)),
            ),
            label="balance at",
        )
        self.reached(
            "balance in the past"
            if at < self.clock
            else "balance in the future"
            if at > self.clock
            else "balance now"
        )
        self.check_balance(at)

    def check_balance(self, at: datetime) -> None:
        with self.tx() as s:
            shown = api.balance(s, "physics", at)
        want = self.model.balance_at(at)
        got = {
            "available": ucredits(shown["available"]),
            "held": ucredits(shown["held"]),
            "debt": ucredits(shown["debt"]),
            "grants": [
                (g["id"], ucredits(g["amount"]), ucredits(g["remaining"]), g["priority"])
                for g in shown["grants"]
            ],
        }
        assert got == want, f"balance at {at.isoformat()}"

    # -- after every step

    @invariant()
    def store_matches_model(self) -> None:
        if not self.model.prices:
            return
        with self.engine.connect() as c:
            grants = c.execute(
                text(PHYSICS_GRANTS.format(columns="g.id, g.remaining_ucredits, g.earmarked_ucredits"))
            ).all()
            clearing = c.execute(
                text("SELECT COALESCE(SUM(amount_ucredits), 0) FROM postings WHERE account_id = -5")
            ).scalar_one()
            debt = c.execute(text("SELECT debt_ucredits FROM accounts WHERE name = 'physics'")).scalar_one()
            holds = c.execute(
                text(
                    "SELECT id, state, amount_ucredits, charged_ucredits, charged_seconds "
                    "FROM holds ORDER BY id"
                )
            ).all()
            unbalanced = c.execute(
                text("SELECT entry_id FROM postings GROUP BY entry_id HAVING SUM(amount_ucredits) <> 0")
            ).all()
            revenue = c.execute(
                text("SELECT COALESCE(SUM(amount_ucredits), 0) FROM postings WHERE account_id = -3")
            ).scalar_one()
        assert [tuple(r) for r in grants] == [
            (g.id, g.free + g.earmarked, g.earmarked) for g in self.model.grants
        ]
        assert debt == self.model.debt
        assert [tuple(r) for r in holds] == [
            (h.id, h.state, h.amount, h.charged, h.charged_seconds)
            for _, h in sorted(self.model.holds.items())
        ]
        assert unbalanced == []
        assert revenue == sum(a for _, _, a in self.model.revenue)
        assert clearing == 0  # system:transfers nets to zero after every transfer (and loan)
        with self.engine.connect() as c:
            dept = c.execute(text(DEPT_GRANTS)).all()
        assert [tuple(r) for r in dept] == [(g.free + g.earmarked, g.earmarked) for g in self.model.dept]


# -- the stores ------------------------------------------------------------------------------


def _sqlite_databases(template: Path) -> Callable[[], tuple[str, Callable[[], None]]]:
    def new() -> tuple[str, Callable[[], None]]:
        folder = Path(tempfile.mkdtemp(prefix="gpucredit-model-"))
        shutil.copy(template, folder / "ledger.db")
        return f"sqlite:///{folder / 'ledger.db'}", lambda: shutil.rmtree(folder)

    return new


def _postgres_databases(template: str) -> Callable[[], tuple[str, Callable[[], None]]]:
    def new() -> tuple[str, Callable[[], None]]:
        admin = pg_admin()
        assert admin is not None
        name = f"gpucredit_m_{uuid.uuid4().hex[:10]}"
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))

        def drop() -> None:
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()

        return pg_database_url(name), drop

    return new


EXAMPLES = {"sqlite": 80, "postgres": 30}
STEPS = 50


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_ledger_matches_the_model(
    store: str, sqlite_template: Path, pg_template: str | None, request: pytest.FixtureRequest
) -> None:
    if store == "sqlite":
        databases = _sqlite_databases(sqlite_template)
    else:
        require(pg_template is not None, "PostgreSQL", "start it or set GPUCREDIT_TEST_PG_URL")
        assert pg_template is not None
        databases = _postgres_databases(pg_template)
    with collector.with_value(_statistics_for(request.node)):
        run_state_machine_as_test(
            lambda: LedgerMachine(databases),
            settings=settings(
                max_examples=EXAMPLES[store],
                stateful_step_count=STEPS,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )


def _statistics_for(item: Any) -> Callable[[Any], None]:
    """Hand the run's statistics (with its `event`s) to hypothesis's pytest plugin, which
    prints them under --hypothesis-show-statistics; it does not see a machine run this way."""

    def note(stats: Any) -> None:
        stats["nodeid"] = item.nodeid
        item.hypothesis_statistics = describe_statistics(stats)

    return note


def test_settling_below_a_charge_whose_debt_was_paid_refunds_the_rest_as_a_grant(tx: Any) -> None:
    """A path the machine reaches rarely, pinned: a run metered far past its hold into
    debt, the debt paid by a top-up, then settled for fewer seconds. The run's charge is
    the cost of its settled seconds; what its grants cannot take back is a refund grant."""
    at = START
    with tx() as s:
        api.create_account(s, "physics")
        api.set_price(s, "h100", "3.60", effective_at=PRICE_FROM)
        api.topup(s, "physics", "10", effective_at=at, at=at)
        hold = api.create_hold(
            s, api.HoldRequest("physics", user="alice", job_id=1, gpus="h100:2", seconds=600, at=at)
        )
        api.consume(s, "physics", "8.80", at=at)
    with tx() as s:  # 4200 s at 7.20/h: 8.40, of which 1.20 held and 7.20 debt
        api.hold_usage(s, hold.id, 4200, at + timedelta(seconds=4200))
        later = at + timedelta(seconds=4300)
        paid = api.topup(s, "physics", "10", effective_at=later, at=later)
        assert paid["debt_paid"] == "7.20"
    with tx() as s:
        settled = api.settle_hold(s, hold.id, 100, at + timedelta(seconds=4400))
    assert (settled.state, settled.charged_ucredits, settled.charged_seconds) == ("settled", 200_000, 100)
    with tx() as s:
        shown = api.balance(s, "physics", at + timedelta(seconds=4500))
        assert (shown["available"], shown["held"], shown["debt"]) == ("11.00", "0.00", "0.00")
        assert [(g["source"], g["remaining"]) for g in shown["grants"]] == [
            ("topup", "1.20"),
            ("topup", "2.80"),
            ("refund", "7.00"),
        ]
        assert api.get_hold(s, hold.id).charged_ucredits == 200_000
        assert api.verify(s).ok
