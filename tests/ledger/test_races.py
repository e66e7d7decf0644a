"""Races between separate processes, each with its own connection, on both stores.

Every race starts its processes at a barrier (one per round), never orders them by
sleeping, and asserts only what must hold for every interleaving:

- one hold, several resolutions at once (settle, a second settle for other seconds,
  a repeated settle, a provisional charge, a release, the expiry sweep): exactly one
  resolution wins and is posted once, every other call is a replay or `hold_resolved`,
  and the run is charged what its winner says, never more than was settled;
- several reservations of one run at once, with the same request and another one:
  one hold, the same request replays it, the other is an `idempotency_conflict`;
- users racing holds of different sizes against their concurrent-GPU and daily caps:
  replaying the journal in commit order, no cap is passed at any point.

Every race ends with exact books: each entry sums to zero, each account's postings
sum to its balance, revenue is what the holds were charged, and the audit is clean.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import text

from ledger import api
from ledger.errors import LedgerError
from ledger.store.db import make_engine, make_sessionmaker

AT = datetime(2026, 12, 2, 10, tzinfo=UTC)
END = AT + timedelta(days=30)  # after every effective time the races use
PRICE_PER_GPU_HOUR = 3_600_000  # h100: 3.60 credits, 0.001 credit per GPU-second
BARRIER_TIMEOUT_S = 120  # a guard against a hung worker, never a measurement


def _cost(gpus: int, seconds: int) -> int:
    return gpus * PRICE_PER_GPU_HOUR * seconds // 3600  # exact for the figures used here


def _setup(url: str, topup: str = "100") -> None:
    engine = make_engine(url)
    with make_sessionmaker(engine)() as s, s.begin():
        api.set_price(s, "h100", "3.60", effective_at=AT - timedelta(days=1))
        api.create_account(s, "physics")
        api.topup(s, "physics", topup, effective_at=AT - timedelta(hours=1), at=AT - timedelta(hours=1))
    engine.dispose()


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """('ok', result) or ('refused', code); anything else is reported, not swallowed."""
    try:
        return "ok", call()
    except LedgerError as error:
        return "refused", error.code


def _worker(url: str, plan: str, worker: int, rounds: int, barrier: Any, results: Any) -> None:
    """Run `plan` for `rounds` rounds, each started at the barrier; report every outcome."""
    engine = make_engine(url, pool_size=1)
    factory = make_sessionmaker(engine)
    outcomes: list[tuple[int, str, Any]] = []
    try:
        for round_ in range(rounds):
            barrier.wait(timeout=BARRIER_TIMEOUT_S)
            for label, call in PLANS[plan](worker, round_):

                def once(call: Callable[[Any], Any] = call) -> Any:
                    with factory() as s, s.begin():
                        return call(s)

                kind, value = _outcome(once)
                outcomes.append((round_, label, (kind, _plain(value))))
        results.put((worker, "done", outcomes))
    except BaseException:
        results.put((worker, "crashed", traceback.format_exc()))
        barrier.abort()
    finally:
        engine.dispose()


def _plain(value: Any) -> Any:
    """What crosses back to the test: a hold as (id, state, charged, seconds), dicts as is."""
    if isinstance(value, api.HoldState):
        return (value.id, value.state, value.charged_ucredits, value.charged_seconds, value.limit_seconds)
    return value


def _race(url: str, plan: str, workers: int, rounds: int) -> dict[int, list[tuple[int, str, Any]]]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(workers)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(url, plan, w, rounds, barrier, results)) for w in range(workers)
    ]
    for p in procs:
        p.start()
    reports = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    crashed = [report for _w, status, report in reports if status == "crashed"]
    assert not crashed, crashed[0]
    return {worker: outcomes for worker, _status, outcomes in reports}


def _exact_books(url: str) -> None:
    engine = make_engine(url)
    with engine.connect() as c:
        assert (
            c.execute(
                text("SELECT entry_id FROM postings GROUP BY entry_id HAVING SUM(amount_ucredits) <> 0")
            ).all()
            == []
        )
        customer = c.execute(
            text(
                "SELECT a.name, COALESCE(SUM(p.amount_ucredits), 0) FROM accounts a "
                "LEFT JOIN postings p ON p.account_id = a.id WHERE a.kind = 'customer' GROUP BY a.name"
            )
        ).all()
        revenue = c.execute(
            text("SELECT COALESCE(SUM(amount_ucredits), 0) FROM postings WHERE account_id = -3")
        ).scalar_one()
        charged = c.execute(text("SELECT COALESCE(SUM(charged_ucredits), 0) FROM holds")).scalar_one()
        paid_in = c.execute(
            text("SELECT COALESCE(SUM(amount_ucredits), 0) FROM postings WHERE account_id IN (-1, -2)")
        ).scalar_one()
    with make_sessionmaker(engine)() as s:
        for name, total in customer:
            shown = api.balance(s, name, END)
            assert total == _ucredits(shown["available"]) + _ucredits(shown["held"]), name
        report = api.verify(s)
        assert report.ok, report.problems
    assert revenue == charged
    assert -paid_in == sum(total for _name, total in customer) + revenue
    engine.dispose()


def _ucredits(amount: str) -> int:
    return int(Decimal(amount) * 1_000_000)


# -- 1. one hold, every resolution at once ------------------------------------------------------

RESOLVE_ROUNDS = 6
RESOLVE_LIMIT_S = 3600  # 2×h100: the hold is 7.20 credits and expires 600 s after its limit


def _resolve_start(round_: int) -> datetime:
    """Each round's hold starts far enough from the last that a sweep expires only it."""
    return AT + timedelta(seconds=20_000 * round_)


def _resolve_plan(worker: int, round_: int) -> list[tuple[str, Callable[[Any], Any]]]:
    hold_id = round_ + 1  # made in this order before the race
    start = _resolve_start(round_)

    def after(seconds: int) -> datetime:
        return start + timedelta(seconds=seconds)

    calls: list[tuple[str, Callable[[Any], Any]]] = [
        ("settle 1800", lambda s: api.settle_hold(s, hold_id, 1800, after(1800))),
        ("settle 1800", lambda s: api.settle_hold(s, hold_id, 1800, after(1800))),
        ("settle 2000", lambda s: api.settle_hold(s, hold_id, 2000, after(2000))),
        ("usage 2400", lambda s: api.hold_usage(s, hold_id, 2400, after(2400))),
        ("release", lambda s: api.release_hold(s, hold_id, after(3000))),
        ("sweep", lambda s: api.sweep(s, "physics", after(RESOLVE_LIMIT_S + 600 + 400))),
    ]
    return [calls[worker]]


def test_one_hold_resolves_once_whatever_races_it(db_url: str) -> None:
    _setup(db_url)
    engine = make_engine(db_url)
    with make_sessionmaker(engine)() as s, s.begin():
        for round_ in range(RESOLVE_ROUNDS):
            start = _resolve_start(round_)
            hold = api.create_hold(
                s,
                api.HoldRequest(
                    "physics",
                    user="alice",
                    job_id=round_ + 1,
                    gpus="h100:2",
                    seconds=RESOLVE_LIMIT_S,
                    cluster="lab",
                    at=start,
                ),
            )
            assert hold.id == round_ + 1
    outcomes = _race(db_url, "resolve", 6, RESOLVE_ROUNDS)

    winners: Counter[str] = Counter()
    with engine.connect() as c:
        for round_ in range(RESOLVE_ROUNDS):
            hold_id = round_ + 1
            got = {label: result for w in outcomes for r, label, result in outcomes[w] if r == round_}
            got_settles = [result for w in (0, 1) for r, _l, result in outcomes[w] if r == round_]
            state, charged, seconds = c.execute(
                text("SELECT state, charged_ucredits, charged_seconds FROM holds WHERE id = :h"),
                {"h": hold_id},
            ).one()
            kinds = Counter(
                c.execute(text("SELECT kind FROM entries WHERE hold_id = :h"), {"h": hold_id}).scalars()
            )
            resolutions = {k: n for k, n in kinds.items() if k in ("settle", "release", "expire")}
            assert len(resolutions) == 1 and sum(resolutions.values()) == 1, kinds
            assert kinds["hold"] == 1 and kinds["usage"] <= 1
            assert set(kinds) <= {"hold", "usage", "settle", "release", "expire"}
            used = kinds["usage"] == 1
            assert got["usage 2400"] == (
                ("ok", (hold_id, "active", _cost(2, 2400), 2400, RESOLVE_LIMIT_S))
                if used
                else ("refused", "hold_resolved")
            )
            resolved = "hold_resolved"
            if state == "settled":
                assert seconds in (1800, 2000) and charged == _cost(2, seconds)  # never more
                settled = ("ok", (hold_id, "settled", charged, seconds, RESOLVE_LIMIT_S))
                if seconds == 1800:  # the repeat of the winning settle replays it
                    assert got_settles == [settled, settled]
                    assert got["settle 2000"] == ("refused", resolved)
                else:
                    assert got_settles == [("refused", resolved)] * 2
                    assert got["settle 2000"] == settled
                assert got["release"] == ("refused", resolved)
                winners[f"settle {seconds}"] += 1
            else:
                assert state in ("released", "expired")
                assert charged == (_cost(2, 2400) if used else 0)  # what usage charged, if it ran
                assert got_settles == [("refused", resolved)] * 2
                assert got["settle 2000"] == ("refused", resolved)
                assert got["release"] == (
                    ("ok", (hold_id, "released", charged, seconds, RESOLVE_LIMIT_S))
                    if state == "released"
                    else ("refused", resolved)
                )
                winners[state] += 1
            swept = got["sweep"]
            assert swept[0] == "ok"
            assert swept[1]["expired_holds"] == ([hold_id] if state == "expired" else [])
    engine.dispose()
    assert sum(winners.values()) == RESOLVE_ROUNDS
    _exact_books(db_url)


# -- 2. two reservations of one run -------------------------------------------------------------

SAME_RUN_ROUNDS = 6


def _same_run_plan(worker: int, round_: int) -> list[tuple[str, Callable[[Any], Any]]]:
    seconds = 3600 if worker % 2 == 0 else 1800  # even workers send one request, odd the other

    def reserve(s: Any) -> Any:
        return api.create_hold(
            s,
            api.HoldRequest(
                "physics",
                user="alice",
                job_id=500 + round_,
                gpus="h100:1",
                seconds=seconds,
                cluster="lab",
                at=AT,
            ),
        )

    return [(f"hold {seconds}", reserve)]


def test_two_holds_for_one_run_make_one_hold(db_url: str) -> None:
    _setup(db_url)
    outcomes = _race(db_url, "same_run", 4, SAME_RUN_ROUNDS)

    engine = make_engine(db_url)
    with engine.connect() as c:
        for round_ in range(SAME_RUN_ROUNDS):
            job_id = 500 + round_
            rows = c.execute(
                text("SELECT id, limit_seconds, amount_ucredits FROM holds WHERE job_id = :j"), {"j": job_id}
            ).all()
            assert len(rows) == 1
            hold_id, limit_seconds, amount = rows[0]
            assert amount == _cost(1, limit_seconds)
            assert c.execute(
                text("SELECT kind FROM entries WHERE hold_id = :h"), {"h": hold_id}
            ).scalars().all() == ["hold"]
            for w in outcomes:
                ((_r, label, result),) = [o for o in outcomes[w] if o[0] == round_]
                if label == f"hold {limit_seconds}":  # the winner's request, first or repeated
                    assert result == ("ok", (hold_id, "active", 0, 0, limit_seconds))
                else:
                    assert result == ("refused", "idempotency_conflict")
        held = c.execute(text("SELECT SUM(earmarked_ucredits) FROM grants")).scalar_one()
        assert held == c.execute(text("SELECT SUM(amount_ucredits) FROM holds")).scalar_one()
    engine.dispose()
    _exact_books(db_url)


# -- 3. holds of different sizes against per-user caps ------------------------------------------

ALICE_MAX_GPUS = 4
BOB_DAILY_CAP = 3_000_000  # 3.00 credits: five of bob's 0.60-credit jobs
LIMIT_ROUNDS = 9


def _limits_plan(worker: int, round_: int) -> list[tuple[str, Callable[[Any], Any]]]:
    """Workers 0 and 1 are alice: 1, 2 then 3 GPUs, keeping her last hold and releasing
    the one before, so on her own she already asks past her 4-GPU cap. Workers 2 and 3
    are bob: one 1-GPU, 600-second job (0.60 credits) reserved and settled in full each
    round against his 3.00 daily cap."""
    job_id = 1000 * (worker + 1) + round_
    if worker < 2:
        gpus = 1 + round_ % 3

        def alice(s: Any) -> Any:
            hold = api.create_hold(
                s,
                api.HoldRequest(
                    "physics",
                    user="alice",
                    job_id=job_id,
                    gpus=f"h100:{gpus}",
                    seconds=600,
                    cluster="lab",
                    at=AT,
                ),
            )
            mine = [
                h
                for h in api.list_holds(s, "physics", state="active")
                if h.user == "alice" and 1000 * (worker + 1) <= h.job_id < job_id
            ]
            for older in mine[:-1]:
                api.release_hold(s, older.id, AT + timedelta(seconds=60))
            return hold

        return [(f"alice {gpus}", alice)]

    def bob(s: Any) -> Any:
        hold = api.create_hold(
            s,
            api.HoldRequest(
                "physics", user="bob", job_id=job_id, gpus="h100:1", seconds=600, cluster="lab", at=AT
            ),
        )
        return hold

    def settle(s: Any) -> Any:
        mine = [h for h in api.list_holds(s, "physics", state="active") if h.job_id == job_id]
        return [api.settle_hold(s, h.id, 600, AT + timedelta(seconds=600)).id for h in mine]

    return [("bob", bob), ("bob settles", settle)]


def test_per_user_caps_hold_at_every_point_of_the_journal(db_url: str) -> None:
    _setup(db_url)
    engine = make_engine(db_url)
    with make_sessionmaker(engine)() as s, s.begin():
        api.set_limits(s, "physics", user="alice", max_gpus=ALICE_MAX_GPUS)
        api.set_limits(s, "physics", user="bob", daily_cap="3.00")
    outcomes = _race(db_url, "limits", 4, LIMIT_ROUNDS)

    refusals: Counter[str] = Counter()
    for w in outcomes:
        for _r, label, (kind, value) in outcomes[w]:
            if kind == "refused":
                refusals[f"{label.split()[0]} {value}"] += 1
    # Alone, each alice worker holds 2 GPUs when she asks for 3: refused at least 3 times.
    assert refusals["alice concurrent_gpus"] >= 2 * 3
    # Every bob job is charged its whole hold, so exactly five fit the cap, in any order.
    assert sum(1 for w in (2, 3) for _r, label, (k, _v) in outcomes[w] if label == "bob" and k == "ok") == 5
    assert refusals["bob daily_cap"] == 2 * LIMIT_ROUNDS - 5
    assert set(refusals) <= {"alice concurrent_gpus", "bob daily_cap"}

    with engine.connect() as c:
        holds = {
            row.id: row
            for row in c.execute(
                text('SELECT id, "user", gpu_count, amount_ucredits, charged_ucredits FROM holds')
            )
        }
        journal = c.execute(text("SELECT kind, hold_id FROM entries ORDER BY seq")).all()
    engine.dispose()
    gpus_in_use: dict[str, int] = defaultdict(int)
    committed: dict[str, int] = defaultdict(int)  # today's charges plus what is still held
    for kind, hold_id in journal:  # in commit order: one account, one chain
        if hold_id is None:
            continue
        hold = holds[hold_id]
        if kind == "hold":
            gpus_in_use[hold.user] += hold.gpu_count
            committed[hold.user] += hold.amount_ucredits
        elif kind in ("settle", "release", "expire"):
            gpus_in_use[hold.user] -= hold.gpu_count
            committed[hold.user] -= hold.amount_ucredits - hold.charged_ucredits
        assert gpus_in_use["alice"] <= ALICE_MAX_GPUS
        assert committed["bob"] <= BOB_DAILY_CAP
    assert committed["bob"] == BOB_DAILY_CAP  # the cap was reached, not merely approached
    _exact_books(db_url)


PLANS: dict[str, Callable[[int, int], list[tuple[str, Callable[[Any], Any]]]]] = {
    "resolve": _resolve_plan,
    "same_run": _same_run_plan,
    "limits": _limits_plan,
}
