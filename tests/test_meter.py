"""The meter (`gpucredit bridge meter`) and the ledger's batched charge, on both stores."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

import ledger.holds
from accounting_bridge.meter import Meter, cancel_argvs, renew_leases
from accounting_bridge.sacct import ParseError, SqueueJob, SqueueResult
from accounting_bridge.slurmcmd import FakeResponse, FakeRunner
from ledger import api
from ledger.errors import NotFound
from ledger.journal import REVENUE, entries_t, postings_t
from ledger.money import charge_for

T0 = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
A100_RATE = 2_000_000  # µc per GPU-hour: 555.5… µc/s, so every tick rounds


def running(
    job_id: int,
    *,
    account: str = "physics",
    user: str = "alice",
    start: datetime = T0,
    run: int = 0,
    state: str = "RUNNING",
    array: tuple[int, int] | None = None,
) -> SqueueJob:
    return SqueueJob(
        cluster="lab",
        job_id=job_id,
        display_id=f"{array[0]}_{array[1]}" if array else str(job_id),
        run=run,
        user=user,
        account=account,
        partition="gpu",
        state=state,
        submit=start - timedelta(seconds=5),
        start=start,
        end=start + timedelta(hours=1),
        time_limit_seconds=3600,
        gpus={"a100": 1},
        requested_gpus={"a100": 1},
        nodes=("node1",),
        node_count=1,
        name="train",
        gpu_indices={"node1": {0: "a100"}},
        array_job_id=array[0] if array else None,
        array_task_id=array[1] if array else None,
    )


class FakeSqueue:
    def __init__(self, jobs: list[SqueueJob] | None = None) -> None:
        self.jobs = list(jobs or [])
        self.errors: list[ParseError] = []

    def running_jobs(self) -> SqueueResult:
        return SqueueResult(jobs=list(self.jobs), errors=list(self.errors))


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def at(self, seconds: int) -> None:
        self.now = T0 + timedelta(seconds=seconds)


def setup_account(tx: Callable[[], Any], name: str = "physics", credits: str = "100") -> None:
    with tx() as s:
        if not api.list_prices(s):
            api.set_price(s, "a100", "2.00", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, name)
        api.add_member(s, "alice", name)
        api.topup(s, name, credits, effective_at=datetime(2026, 11, 1, tzinfo=UTC))


def hold(tx: Callable[[], Any], job_id: int, *, account: str = "physics", seconds: int = 3600) -> int:
    with tx() as s:
        return api.create_hold(
            s, account, user="alice", job_id=job_id, gpus="a100:1", seconds=seconds, cluster="lab", at=T0
        ).id


def make_meter(
    tx: Callable[[], Any], squeue: FakeSqueue, clock: Clock, runner: FakeRunner | None = None, **kw: Any
) -> Meter:
    return Meter(
        sessions=tx, source=squeue, runner=runner or FakeRunner(), interval_seconds=30, clock=clock, **kw
    )


def revenue_of(s: Any, hold_id: int) -> int:
    return int(
        s.execute(
            select(func.coalesce(func.sum(postings_t.c.amount_ucredits), 0))
            .join(entries_t, entries_t.c.id == postings_t.c.entry_id)
            .where(entries_t.c.hold_id == hold_id, postings_t.c.account_id == REVENUE)
        ).scalar_one()
    )


# --------------------------------------------------------------------------- charges


def test_provisional_charge_grows_per_tick_and_settle_matches_without_drift(tx) -> None:
    setup_account(tx)
    hold_id = hold(tx, 1001)
    clock = Clock(T0)
    meter = make_meter(tx, FakeSqueue([running(1001)]), clock)
    seen = []
    for elapsed, due in ((31, 30), (65, 60), (89, 60), (100, 90), (151, 150)):
        clock.at(elapsed)
        report = meter.tick()
        assert report.errors == []
        with tx() as s:
            h = api.get_hold(s, hold_id)
        assert (h.charged_seconds, h.charged_ucredits) == (due, charge_for(A100_RATE, due))
        seen.append((report.charged, report.not_due))
    assert seen == [(1, 0), (1, 0), (0, 1), (1, 0), (1, 0)]
    assert [charge_for(A100_RATE, d) for d in (30, 60, 90, 150)] == [16_667, 33_333, 50_000, 83_333]
    with tx() as s:
        entries = s.execute(
            select(entries_t.c.kind, entries_t.c.effective_at)
            .where(entries_t.c.hold_id == hold_id)
            .order_by(entries_t.c.id)
        ).all()
        settled = api.settle_hold(s, hold_id, 163, at=T0 + timedelta(seconds=163))
    # Usage is effective when it happened: start + the seconds charged.
    assert [(k, (e.replace(tzinfo=UTC) - T0).seconds) for k, e in entries[1:]] == [
        ("usage", 30),
        ("usage", 60),
        ("usage", 90),
        ("usage", 150),
    ]
    with tx() as s:
        assert revenue_of(s, hold_id) == settled.charged_ucredits == charge_for(A100_RATE, 163) == 90_556
        assert api.balance(s, "physics", T0 + timedelta(hours=1))["available"] == "99.909444"
        assert api.verify(s).ok


def test_only_running_runs_are_charged(tx) -> None:
    setup_account(tx)
    charged, requeued, completing, gone = (hold(tx, j) for j in (2001, 2002, 2003, 2004))
    squeue = FakeSqueue([running(2001), running(2002, run=1), running(2003, state="COMPLETING")])
    clock = Clock(T0 + timedelta(seconds=45))
    report = make_meter(tx, squeue, clock).tick()
    assert (report.charged, report.not_running, report.running_jobs) == (1, 3, 2)
    with tx() as s:
        assert [api.get_hold(s, h).charged_seconds for h in (charged, requeued, completing, gone)] == [
            30,
            0,
            0,
            0,
        ]


def test_expired_holds_are_expired_after_the_last_charge(tx) -> None:
    setup_account(tx)
    lost = hold(tx, 3001, seconds=60)  # expires at T0 + 60 + 600 s; its epilog never came
    overrun = hold(tx, 3002, seconds=60)  # still running past limit + grace
    fresh = hold(tx, 3003, seconds=3600)
    clock = Clock(T0 + timedelta(seconds=661))
    report = make_meter(tx, FakeSqueue([running(3002), running(3003)]), clock).tick()
    assert sorted(report.expired) == [lost, overrun]
    with tx() as s:
        states = {h: api.get_hold(s, h) for h in (lost, overrun, fresh)}
    assert [states[h].state for h in (lost, overrun, fresh)] == ["expired", "expired", "active"]
    assert states[overrun].charged_ucredits == charge_for(A100_RATE, 660)
    assert states[lost].charged_ucredits == 0
    with tx() as s:
        # Only the running job's hold still earmarks credit: 2.00 less its 660 s so far.
        assert api.balance(s, "physics", clock.now)["held"] == "1.633333"


# --------------------------------------------------------------------------- exhausted


def test_job_past_its_credit_is_cancelled_with_the_reason_first(tx) -> None:
    setup_account(tx, credits="1")
    hold_id = hold(tx, 4001, seconds=1800)  # holds exactly the 1.00 the account has
    comment = (
        "comment=gpucredit: cancelled: account physics is out of credit (0.05 credits of this run "
        "are unpaid); top up to run GPU jobs"
    )
    expected = [("scontrol", "update", "jobid=4001", comment), ("scancel", "4001")]
    runner = FakeRunner({argv: "" for argv in expected})
    clock = Clock(T0 + timedelta(seconds=1800))
    meter = make_meter(tx, FakeSqueue([running(4001)]), clock, runner)
    assert meter.tick().exhausted == []  # 1800 s is exactly what was held
    clock.at(1890)
    report = meter.tick()
    assert runner.calls == expected
    assert [(e.hold_id, e.cause, e.job_spec) for e in report.exhausted] == [(hold_id, "credit", "4001")]
    assert [(a.kind, a.error) for a in report.actions] == [("cancel", None)]
    with tx() as s:
        h = api.get_hold(s, hold_id)
        assert (h.charged_ucredits, h.debt_ucredits, h.state) == (1_050_000, 50_000, "active")
        assert api.balance(s, "physics", clock.now)["available"] == "-0.05"
    clock.at(1920)  # scancel takes a moment: the job may still show RUNNING; no second cancel
    meter.tick()
    assert runner.calls == expected


def test_daily_cap_cancels_an_array_task_by_its_task_id(tx) -> None:
    setup_account(tx)
    with tx() as s:
        api.set_limits(s, "physics", user="alice", daily_cap="1")
    hold(tx, 7, seconds=1800)  # 1.00: spent 0 + held 0 + 1.00 <= cap 1.00
    comment = (
        "comment=gpucredit: cancelled: daily cap of user alice in account physics reached "
        "(1.05 of 1.00 credits spent today)"
    )
    expected = [("scontrol", "update", "jobid=6_0", comment), ("scancel", "6_0")]
    runner = FakeRunner({argv: "" for argv in expected})
    clock = Clock(T0 + timedelta(seconds=1890))
    report = make_meter(tx, FakeSqueue([running(7, array=(6, 0))]), clock, runner).tick()
    assert runner.calls == expected
    assert [e.cause for e in report.exhausted] == ["daily_cap"]


def test_failed_cancel_is_reported_and_the_tick_goes_on(tx) -> None:
    setup_account(tx, credits="1")
    hold(tx, 4101, seconds=1800)
    runner = FakeRunner()
    reason = "account physics is out of credit (0.05 credits of this run are unpaid); top up to run GPU jobs"
    for argv in cancel_argvs("4101", reason):
        runner.add(argv, FakeResponse(returncode=1, stderr="Invalid job id specified"))
    clock = Clock(T0 + timedelta(seconds=1890))
    report = make_meter(tx, FakeSqueue([running(4101)]), clock, runner).tick()
    assert len(runner.calls) == 2  # scancel is tried even when the comment could not be set
    assert report.charged == 1
    assert report.actions[0].error is not None and "Invalid job id" in report.actions[0].error


def test_notify_mode_only_logs(tx, caplog: pytest.LogCaptureFixture) -> None:
    setup_account(tx, credits="1")
    hold(tx, 4201, seconds=1800)
    runner = FakeRunner()  # any command would raise UnexpectedCommandError
    clock = Clock(T0 + timedelta(seconds=1890))
    meter = make_meter(tx, FakeSqueue([running(4201)]), clock, runner, on_exhausted="notify")
    with caplog.at_level(logging.WARNING, logger="accounting_bridge.meter"):
        report = meter.tick()
    assert runner.calls == []
    assert [(a.kind, a.argvs) for a in report.actions] == [("notify", ())]
    assert "job 4201" in caplog.text and "out of credit" in caplog.text and "not cancelled" in caplog.text


# --------------------------------------------------------------------------- scale


@pytest.fixture
def lock_counter(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    real = ledger.holds.lock_account

    def counting(s: Any, name: str) -> Any:
        counts[name] += 1
        return real(s, name)

    monkeypatch.setattr(ledger.holds, "lock_account", counting)
    yield counts


@pytest.mark.parametrize("workers", [1, 3])
def test_a_tick_locks_each_account_once(tx, lock_counter: Counter[str], workers: int) -> None:
    jobs = []
    for a, name in enumerate(("astro", "bio", "chem")):
        setup_account(tx, name)
        for j in range(6):
            hold(tx, 100 * (a + 1) + j, account=name)
            jobs.append(running(100 * (a + 1) + j, account=name))
    lock_counter.clear()
    clock = Clock(T0 + timedelta(seconds=95))
    report = make_meter(tx, FakeSqueue(jobs), clock, workers=workers).tick()
    assert (report.charged, report.accounts, report.errors) == (18, 3, [])
    assert lock_counter == {"astro": 1, "bio": 1, "chem": 1}
    with tx() as s:
        assert {h.charged_ucredits for h in api.list_holds(s)} == {charge_for(A100_RATE, 90)}
        assert api.verify(s).ok


def test_lease_mode_is_refused_until_renewals_exist(tx) -> None:
    config = {"holds": {"mode": "lease"}, "meter": {"interval_seconds": 30, "on_exhausted": "cancel"}}
    with pytest.raises(ValueError, match="lease"):
        Meter.from_config(config, sessions=tx, source=FakeSqueue(), runner=FakeRunner())
    with pytest.raises(NotImplementedError):
        renew_leases(None, "physics", [], T0)  # type: ignore[arg-type]


def attempt_hold(tx: Callable[[], Any], job_id: int, submitted_at: datetime | None, *, at: datetime) -> int:
    """The prolog's hold: it names the attempt by Slurm's SubmitTime (None: an older hook)."""
    with tx() as s:
        return api.create_hold(
            s,
            "physics",
            user="alice",
            job_id=job_id,
            gpus="a100:1",
            seconds=3600,
            cluster="lab",
            at=at,
            submitted_at=submitted_at,
        ).id


def test_an_old_jobs_stale_hold_is_not_charged_for_a_new_job_with_its_id(tx) -> None:
    """Old job 1 lost its epilog (its hold is active until it expires); the cluster reused
    id 1. The meter charges the new job's hold only, and a second tick changes nothing."""
    setup_account(tx)
    old = attempt_hold(tx, 1, T0 - timedelta(minutes=40), at=T0 - timedelta(minutes=30))
    job = running(1)  # submitted 5 s before T0, started at T0
    new = attempt_hold(tx, 1, job.submit, at=T0)
    clock = Clock(T0 + timedelta(seconds=65))
    meter = make_meter(tx, FakeSqueue([job]), clock)

    report = meter.tick()

    assert (report.charged, report.not_running, report.errors) == (1, 1, [])
    again = meter.tick()
    assert (again.charged, again.not_due, again.not_running) == (0, 1, 1)
    with tx() as s:
        assert [api.get_hold(s, h).charged_seconds for h in (old, new)] == [0, 60]
        assert (revenue_of(s, old), revenue_of(s, new)) == (0, charge_for(A100_RATE, 60)) == (0, 33_333)
        # 100 less the two holds' 2.00 each: a charge draws on its own hold's earmark.
        assert api.balance(s, "physics")["available"] == "96.00"
        assert api.verify(s).ok


def test_a_hold_without_a_submit_time_is_charged_unless_the_job_has_its_own(tx) -> None:
    """Holds from older hooks or the CLI carry no submit time: matched by run alone."""
    setup_account(tx)
    legacy = attempt_hold(tx, 7, None, at=T0)
    clock = Clock(T0 + timedelta(seconds=31))
    meter = make_meter(tx, FakeSqueue([running(7), running(8)]), clock)
    assert meter.tick().charged == 1
    legacy_of_8 = attempt_hold(tx, 8, None, at=T0)
    own_of_8 = attempt_hold(tx, 8, running(8).submit, at=T0)
    clock.at(61)
    assert meter.tick().charged == 2
    with tx() as s:
        charged = [api.get_hold(s, h).charged_seconds for h in (legacy, legacy_of_8, own_of_8)]
    assert charged == [60, 0, 60]


def test_squeue_parse_errors_are_reported(tx) -> None:
    setup_account(tx)
    squeue = FakeSqueue()
    squeue.errors.append(ParseError(3, "{...}", "bad start_time", 55))
    report = make_meter(tx, squeue, Clock(T0)).tick()
    assert report.errors == ["squeue line 3: bad start_time"]


# --------------------------------------------------------------------------- ledger: hold_usage_many


def key(h: api.HoldState) -> tuple[int, int, int]:
    return (h.charged_ucredits, h.charged_seconds, h.debt_ucredits)


def test_hold_usage_many_equals_hold_usage_one_by_one(tx) -> None:
    """Same holds, same seconds: the batch leaves every projection where single charges do."""
    for name in ("one", "many"):
        setup_account(tx, name, credits="1.7")
    ids: dict[str, list[int]] = {"one": [], "many": []}
    for name in ids:
        for j, seconds in enumerate((1800, 900, 300)):
            with tx() as s:
                ids[name].append(
                    api.create_hold(
                        s,
                        name,
                        user="alice",
                        job_id=(1 if name == "one" else 2) * 1000 + j,
                        gpus="a100:1",
                        seconds=seconds,
                        cluster="lab",
                        at=T0,
                    ).id
                )
    plan = [(2000, T0 + timedelta(seconds=2000)), (1000, None), (4000, T0 + timedelta(seconds=4000))]
    with tx() as s:
        for hold_id, (elapsed, at) in zip(ids["one"], plan, strict=True):
            api.hold_usage(s, hold_id, elapsed, at)
    with tx() as s:
        batch = api.hold_usage_many(
            s, "many", [(h, e, at) for h, (e, at) in zip(ids["many"], plan, strict=True)]
        )
    assert len(batch) == 3
    with tx() as s:
        one = [api.get_hold(s, h) for h in ids["one"]]
        many = [api.get_hold(s, h) for h in ids["many"]]
        assert [key(h) for h in one] == [key(h) for h in many]
        assert [key(h) for h in batch] == [key(h) for h in many]
        assert any(h.debt_ucredits for h in many)  # the case that matters: past the credit
        b1, b2 = (api.balance(s, n, T0 + timedelta(hours=2)) for n in ("one", "many"))
        assert (b1["available"], b1["held"]) == (b2["available"], b2["held"])
        assert api.verify(s).ok


def test_hold_usage_many_skips_resolved_and_refuses_foreign_holds(tx) -> None:
    setup_account(tx)
    setup_account(tx, "other")
    settled, active = hold(tx, 5001), hold(tx, 5002)
    foreign = hold(tx, 5003, account="other")
    with tx() as s:
        api.settle_hold(s, settled, 10)
    with tx() as s:
        charged = api.hold_usage_many(s, "physics", [(settled, 60, None), (active, 60, None)])
        again = api.hold_usage_many(s, "physics", [(active, 60, None)])
    assert [h.id for h in charged] == [active] and again == []
    with tx() as s, pytest.raises(NotFound):
        api.hold_usage_many(s, "physics", [(foreign, 60, None)])


def test_hold_usage_many_after_an_adjustment_refunds_like_hold_usage(tx) -> None:
    """A correction may have charged more than the seconds cost; the next tick brings it back."""
    setup_account(tx)
    hold_id = hold(tx, 6001)
    with tx() as s:
        api.hold_usage(s, hold_id, 60)
        api.adjust_hold(s, hold_id, 100_000, reason="sacct")
    with tx() as s:
        (charged,) = api.hold_usage_many(s, "physics", [(hold_id, 90, None)])
    assert (charged.charged_ucredits, charged.charged_seconds) == (charge_for(A100_RATE, 90), 90)
    with tx() as s:
        assert key(api.get_hold(s, hold_id)) == (50_000, 90, 0)
        assert revenue_of(s, hold_id) == 50_000
        assert api.verify(s).ok
