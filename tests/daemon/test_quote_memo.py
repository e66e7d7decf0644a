"""The daemon's kept replies to repeated submission lines: the same answer as working the
line out again, every time (gpucredit.daemon.quote_memo)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from accounting_bridge.slurm.slurmcmd import FakeRunner
from gpucredit.daemon.quote_memo import QuoteMemo
from gpucredit.daemon.server import Daemon
from gpucredit.daemon.slurm_facts import SINFO_ARGV
from ledger import api
from ledger.config import load_config
from ledger.pricing.prices import PriceTable
from ledger.pricing.snapshot import STALE_AFTER_SECONDS, Snapshot, SnapshotKeeper
from ledger.store.db import make_engine, make_sessionmaker

NO_VAL = 4294967294
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def line(**fields: Any) -> bytes:
    """A submission as job_submit.lua writes it: compact, "op" first."""
    base = {
        "op": "submit",
        "user_name": "alice",
        "user_id": 1001,
        "account": "physics",
        "time_limit": 120,
        "num_tasks": NO_VAL,
        "min_nodes": NO_VAL,
        "partitions": {"onprem": {"default_time": NO_VAL, "max_time": 4294967295, "default": True}},
    }
    return json.dumps({**base, **fields}, separators=(",", ":")).encode()


class Answers(list[bytes]):
    def send(self, data: bytes) -> None:
        self.append(data)


def ask(daemon: Daemon, request: bytes) -> dict[str, str]:
    answers = Answers()
    daemon.dispatch(request, answers)  # type: ignore[arg-type]  # a Reply is what has send()
    [reply] = answers
    return json.loads(reply)["result"]


@pytest.fixture
def seeded(tx, db_url: str) -> Iterator[tuple[Daemon, FakeRunner]]:
    """A daemon (not serving: the tests call dispatch) on a ledger with physics at 20.00."""
    with tx() as s:
        api.set_price(s, "a100", "2.00", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.topup(s, "physics", "20", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
    runner = FakeRunner({SINFO_ARGV: "onprem|gpu:a100:2,gpu:h100:2\n"})
    config = load_config(Path("/dev/null"))
    config["database"]["url"] = db_url
    config["daemon"]["top_up_hint"] = "Top up: gpucredit topup {account} AMOUNT."
    daemon = Daemon(config, runner)
    daemon.slurm_facts.refresh()
    daemon.snapshots.refresh()
    yield daemon, runner
    daemon.engine.dispose()


H100 = line(tres_per_node="gres:gpu:h100:2")


def counted(daemon: Daemon) -> list[int]:
    """Count the quotes the daemon works out (a kept reply is sent without one)."""
    worked: list[int] = []
    decide = daemon._decide

    def counting(*args: Any) -> dict[str, str]:
        worked.append(1)
        return decide(*args)

    daemon._decide = counting  # type: ignore[method-assign,assignment]
    return worked


def test_a_kept_reply_follows_each_new_picture_of_the_ledger(seeded, tx) -> None:
    daemon, _ = seeded
    worked = counted(daemon)
    first = "gpucredit: ~14.40 credits (2×h100 × 2 h), 20.00 available in physics"
    assert ask(daemon, H100)["message"] == first
    assert daemon.quotes.get(H100, daemon.snapshots.current()) is not None
    with tx() as s:
        api.topup(s, "physics", "100")
    assert ask(daemon, H100)["message"] == first  # the same picture, the same answer
    assert len(worked) == 1  # sent as kept
    daemon.snapshots.refresh()  # a new picture, not yet worked out again: the line is
    assert ask(daemon, H100)["message"] == (
        "gpucredit: ~14.40 credits (2×h100 × 2 h), 120.00 available in physics"
    )
    with tx() as s:
        api.topup(s, "physics", "5")
    daemon.snapshots.refresh()
    daemon.quotes.refill(daemon.snapshots.current())  # what the snapshot thread does
    kept = daemon.quotes.get(H100, daemon.snapshots.current())
    assert kept is not None
    assert json.loads(kept.encoded)["result"]["message"].endswith("125.00 available in physics")
    worked.clear()
    assert ask(daemon, H100)["message"] == (
        "gpucredit: ~14.40 credits (2×h100 × 2 h), 125.00 available in physics"
    )
    assert worked == []


def test_a_refusal_is_never_kept_so_credit_given_a_moment_ago_counts(seeded, tx) -> None:
    daemon, _ = seeded
    big = line(tres_per_node="gres:gpu:h100:2", time_limit=600)  # 72.00 credits
    assert ask(daemon, big)["decision"] == "reject"
    assert len(daemon.quotes) == 0
    with tx() as s:
        api.topup(s, "physics", "100")
    assert ask(daemon, big) == {
        "decision": "accept",
        "message": "gpucredit: ~72.00 credits (2×h100 × 10 h), 120.00 available in physics",
    }
    # Worked out from the picture the refusal re-read, not the one the line came in under:
    # not kept under either, so the next one is worked out again.
    assert len(daemon.quotes) == 0
    assert ask(daemon, big)["decision"] == "accept"
    assert daemon.quotes.get(big, daemon.snapshots.current()) is not None
    with tx() as s:  # spent meanwhile: a refill drops the line it would now refuse
        api.consume(s, "physics", "100")
    daemon.snapshots.refresh()
    daemon.quotes.refill(daemon.snapshots.current())
    assert len(daemon.quotes) == 0
    assert ask(daemon, big)["decision"] == "reject"


def test_a_kept_reply_ends_when_slurm_s_partitions_are_read_again(seeded) -> None:
    daemon, runner = seeded
    untyped = line(tres_per_job="gres:gpu:2", time_limit=60)
    assert ask(daemon, untyped)["message"] == (
        "gpucredit: ~7.20 credits (2×h100 × 1 h); untyped GPUs estimated as h100, the dearest "
        "type here, 20.00 available in physics"
    )
    daemon.slurm_facts.refresh()  # read again, the same: the kept reply stays
    assert daemon.quotes.get(untyped, daemon.snapshots.current()) is not None
    runner.add(list(SINFO_ARGV), "onprem|gpu:a100:2\n")
    daemon.slurm_facts.refresh()
    assert ask(daemon, untyped)["message"] == (
        "gpucredit: ~4.00 credits (2×a100 × 1 h); untyped GPUs estimated as a100, the dearest "
        "type here, 20.00 available in physics"
    )


# -- the memo alone, against pictures made in memory ------------------------------------------


def picture(available: int, taken_at: datetime = T0, prices: tuple[Any, ...] = ()) -> Snapshot:
    return Snapshot(taken_at=taken_at, prices=PriceTable(prices), available_ucredits={"physics": available})


def accepting(request: bytes, snapshot: Snapshot) -> dict[str, Any]:
    available = snapshot.available_ucredits["physics"]
    decision = "accept" if available > 0 else "reject"
    return {"ok": True, "result": {"decision": decision, "message": f"{available}"}}


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now.timestamp()

    def __call__(self) -> float:
        return self.now


def memo(clock: Clock, **kwargs: Any) -> QuoteMemo:
    return QuoteMemo(accepting, lambda: None, lambda reply: json.dumps(reply).encode(), clock=clock, **kwargs)


def keep(quotes: QuoteMemo, request: bytes, snapshot: Snapshot) -> None:
    reply = accepting(request, snapshot)
    quotes.keep(request, snapshot, None, reply, json.dumps(reply).encode())


def test_a_kept_reply_ends_when_a_price_takes_effect_or_the_picture_goes_stale() -> None:
    clock = Clock(T0)
    quotes = memo(clock)
    new_price = T0 + timedelta(seconds=10)
    versions = (("h100", None, T0 - timedelta(days=1), 3_600_000), ("h100", None, new_price, 4_000_000))
    priced = picture(5, prices=versions)
    assert priced.quotes_hold_until() == new_price
    keep(quotes, b"a", priced)
    clock.now = (new_price - timedelta(microseconds=1)).timestamp()
    assert quotes.get(b"a", priced) is not None
    clock.now = new_price.timestamp()
    assert quotes.get(b"a", priced) is None
    clock.now = (T0 - timedelta(seconds=1)).timestamp()  # the clock stepped back
    assert quotes.get(b"a", priced) is None

    unpriced = picture(5)
    assert unpriced.quotes_hold_until() == T0 + timedelta(seconds=STALE_AFTER_SECONDS)
    clock.now = T0.timestamp()
    keep(quotes, b"b", unpriced)
    assert quotes.get(b"b", unpriced) is not None
    assert quotes.get(b"b", picture(5)) is None  # an equal picture is still another picture
    clock.now = (T0 + timedelta(seconds=STALE_AFTER_SECONDS)).timestamp()
    assert quotes.get(b"b", unpriced) is None


def test_the_memo_is_bounded_and_forgets_lines_no_longer_sent() -> None:
    clock = Clock(T0)
    quotes = memo(clock, max_lines=2, forget_after_seconds=15)
    now = picture(5)
    for request in (b"a", b"b"):
        keep(quotes, request, now)
        clock.now += 1
    assert quotes.get(b"a", now) is not None  # used last: b is now the one to drop
    keep(quotes, b"c", now)
    assert [quotes.get(r, now) is not None for r in (b"a", b"b", b"c")] == [True, False, True]
    clock.now += 10
    assert quotes.get(b"c", now) is not None
    clock.now += 10  # a unused for 20 s, c for 10 s
    later = picture(7, taken_at=T0 + timedelta(seconds=20))
    quotes.refill(later)
    assert quotes.get(b"a", later) is None
    kept = quotes.get(b"c", later)
    assert kept is not None and kept.reply["result"]["message"] == "7"


def test_a_reply_from_an_older_picture_never_replaces_a_refilled_one() -> None:
    clock = Clock(T0)
    quotes = memo(clock)
    older, newer = picture(5), picture(7, taken_at=T0 + timedelta(seconds=1))
    keep(quotes, b"a", older)
    clock.now += 1
    quotes.refill(newer)
    keep(quotes, b"a", older)  # worked out from `older` while the refill ran
    kept = quotes.get(b"a", newer)
    assert kept is not None and kept.reply["result"]["message"] == "7"


def test_the_snapshot_thread_hands_each_new_picture_over(db_url: str) -> None:
    engine = make_engine(db_url)
    keeper = SnapshotKeeper(make_sessionmaker(engine), max_age_seconds=0.01)
    stop, seen = threading.Event(), []

    def after_refresh(snapshot: Snapshot) -> None:
        seen.append(snapshot)
        if len(seen) == 2:
            stop.set()

    try:
        keeper.run(stop, on_error=lambda error: pytest.fail(str(error)), after_refresh=after_refresh)
    finally:
        engine.dispose()
    assert seen[0] is not seen[1] and seen[1] is keeper.current()


def test_a_failed_refill_does_not_stop_the_snapshot_thread(seeded, caplog) -> None:
    daemon, _ = seeded

    def failing(snapshot: Snapshot) -> None:
        raise RuntimeError("a bug")

    daemon.quotes.refill = failing
    daemon._refill_quotes(daemon.snapshots.current())
    assert "working the kept quotes out again failed" in caplog.text
