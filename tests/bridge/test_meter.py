"""The meter (`gpucredit bridge meter`) and the ledger's batched charge, on both stores."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

import ledger.holds.usage
from accounting_bridge.meter.meter import CompactSqueue, Meter, cancel_argvs
from accounting_bridge.slurm.records import ParseError, SqueueJob, SqueueResult, squeue_compact_argv
from accounting_bridge.slurm.slurmcmd import FakeResponse, FakeRunner
from ledger import api
from ledger.books.journal import REVENUE
from ledger.errors import NotFound
from ledger.money import charge_for, format_credits
from ledger.store.tables import entries_t, postings_t

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
            s,
            api.HoldRequest(
                account, user="alice", job_id=job_id, gpus="a100:1", seconds=seconds, cluster="lab", at=T0
            ),
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


def cost_now(tx: Callable[[], Any], hold_id: int, at: datetime) -> int:
    """The run's cost so far as reports and daily caps count it: its posted charge and
    what it has accrued since (`api.accruals`)."""
    with tx() as s:
        accrued = {a.hold_id: a.ucredits for a in api.accruals(s, at)}
        return api.get_hold(s, hold_id).charged_ucredits + accrued.get(hold_id, 0)


def entry_kinds(tx: Callable[[], Any], hold_id: int) -> list[str]:
    with tx() as s:
        return list(
            s.execute(
                select(entries_t.c.kind).where(entries_t.c.hold_id == hold_id).order_by(entries_t.c.id)
            ).scalars()
        )


def test_cost_so_far_grows_per_tick_and_settle_matches_without_drift(tx) -> None:
    """The cost so far is read from the hold's rate and start; a tick posts nothing for a
    job within its hold, and the epilog's settle is the same rounding, once."""
    setup_account(tx)
    hold_id = hold(tx, 1001)
    clock = Clock(T0)
    meter = make_meter(tx, FakeSqueue([running(1001)]), clock)
    seen = []
    for elapsed in (31, 65, 89, 100, 151):
        clock.at(elapsed)
        report = meter.tick()
        assert report.errors == []
        assert cost_now(tx, hold_id, clock.now) == charge_for(A100_RATE, elapsed)
        seen.append((report.charged, report.accruing))
    assert seen == [(0, 1)] * 5
    assert [charge_for(A100_RATE, d) for d in (31, 65, 89, 100, 151)] == [
        17_222,
        36_111,
        49_444,
        55_556,
        83_889,
    ]
    assert entry_kinds(tx, hold_id) == ["hold"]  # no journal entry per job per tick
    with tx() as s:
        settled = api.settle_hold(s, hold_id, 163, at=T0 + timedelta(seconds=163))
    with tx() as s:
        assert revenue_of(s, hold_id) == settled.charged_ucredits == charge_for(A100_RATE, 163) == 90_556
        assert api.cost_so_far(api.get_hold(s, hold_id), T0 + timedelta(hours=1)) == 90_556
        assert api.balance(s, "physics", T0 + timedelta(hours=1))["available"] == "99.909444"
        assert api.verify(s).ok


def test_only_running_runs_accrue(tx) -> None:
    """Holds whose attempt squeue does not show running stop accruing where the meter last
    saw them (here: never, so nothing); the epilog or the bridge charges them."""
    setup_account(tx)
    charged, requeued, completing, gone = (hold(tx, j) for j in (2001, 2002, 2003, 2004))
    squeue = FakeSqueue([running(2001), running(2002, run=1), running(2003, state="COMPLETING")])
    clock = Clock(T0 + timedelta(seconds=45))
    report = make_meter(tx, squeue, clock).tick()
    assert (report.accruing, report.not_running, report.running_jobs) == (1, 3, 2)
    assert [cost_now(tx, h, clock.now) for h in (charged, requeued, completing, gone)] == [
        charge_for(A100_RATE, 45),
        0,
        0,
        0,
    ]


def test_a_job_that_stops_running_stops_accruing_where_last_seen(tx) -> None:
    setup_account(tx)
    hold_id = hold(tx, 2101)
    squeue = FakeSqueue([running(2101)])
    clock = Clock(T0 + timedelta(seconds=95))
    meter = make_meter(tx, squeue, clock)
    meter.tick()
    squeue.jobs = []  # its epilog is late, or lost
    clock.at(130)
    meter.tick()
    clock.at(400)
    assert cost_now(tx, hold_id, clock.now) == charge_for(A100_RATE, 90)  # the last tick that saw it
    squeue.jobs = [running(2101)]  # it was only out of sight (a slow squeue): it accrues again
    meter.tick()
    assert cost_now(tx, hold_id, clock.now) == charge_for(A100_RATE, 400)


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
    assert cost_now(tx, fresh, clock.now) == charge_for(A100_RATE, 661) == 367_222
    with tx() as s:
        # Only the running job's hold still earmarks credit: its 2.00, its cost so far
        # included until it is posted (the settle, or a day's end).
        assert api.balance(s, "physics", clock.now)["held"] == "2.00"


def test_a_lost_epilogs_hold_is_charged_to_the_last_second_seen_before_it_expires(tx) -> None:
    setup_account(tx)
    lost = hold(tx, 3101, seconds=60)
    squeue = FakeSqueue([running(3101)])
    clock = Clock(T0 + timedelta(seconds=45))
    meter = make_meter(tx, squeue, clock)
    meter.tick()
    squeue.jobs = []
    clock.at(75)
    meter.tick()
    clock.at(661)
    assert meter.tick().expired == [lost]
    with tx() as s:
        h = api.get_hold(s, lost)
    assert (h.state, h.charged_seconds, h.charged_ucredits) == ("expired", 30, charge_for(A100_RATE, 30))


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
    with caplog.at_level(logging.WARNING, logger="accounting_bridge.meter.meter"):
        report = meter.tick()
    assert runner.calls == []
    assert [(a.kind, a.argvs) for a in report.actions] == [("notify", ())]
    assert "job 4201" in caplog.text and "out of credit" in caplog.text and "not cancelled" in caplog.text


# --------------------------------------------------------------------------- scale


@pytest.fixture
def lock_counter(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    real = ledger.holds.usage.lock_account

    def counting(s: Any, name: str) -> Any:
        counts[name] += 1
        return real(s, name)

    monkeypatch.setattr(ledger.holds.usage, "lock_account", counting)
    yield counts


@pytest.mark.parametrize("workers", [1, 3])
def test_a_tick_locks_each_account_once(tx, lock_counter: Counter[str], workers: int) -> None:
    jobs = []
    for a, name in enumerate(("astro", "bio", "chem")):
        setup_account(tx, name)
        for j in range(6):
            hold(tx, 100 * (a + 1) + j, account=name, seconds=60)  # past its limit: charged
            jobs.append(running(100 * (a + 1) + j, account=name))
    lock_counter.clear()
    clock = Clock(T0 + timedelta(seconds=95))
    report = make_meter(tx, FakeSqueue(jobs), clock, workers=workers).tick()
    assert (report.charged, report.accounts, report.errors) == (18, 3, [])
    assert lock_counter == {"astro": 1, "bio": 1, "chem": 1}
    with tx() as s:
        assert {h.charged_ucredits for h in api.list_holds(s)} == {charge_for(A100_RATE, 90)}
        assert api.verify(s).ok


def test_lease_mode_is_accepted_and_its_interval_checked(tx) -> None:
    config = {
        "holds": {"mode": "lease", "lease_seconds": 900},
        "meter": {"interval_seconds": 30, "on_exhausted": "cancel"},
    }
    assert (
        Meter.from_config(config, sessions=tx, source=FakeSqueue(), runner=FakeRunner()).interval_seconds
        == 30
    )
    with pytest.raises(ValueError, match=r"half of holds\.lease_seconds"):
        Meter.from_config(config, sessions=tx, source=FakeSqueue(), runner=FakeRunner(), interval_seconds=451)


def attempt_hold(tx: Callable[[], Any], job_id: int, submitted_at: datetime | None, *, at: datetime) -> int:
    """The prolog's hold: it names the attempt by Slurm's SubmitTime (None: an older hook)."""
    with tx() as s:
        return api.create_hold(
            s,
            api.HoldRequest(
                "physics",
                user="alice",
                job_id=job_id,
                gpus="a100:1",
                seconds=3600,
                cluster="lab",
                at=at,
                submitted_at=submitted_at,
            ),
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

    assert (report.accruing, report.not_running, report.errors) == (1, 1, [])
    again = meter.tick()
    assert (again.accruing, again.charged, again.not_running) == (1, 0, 1)
    assert [cost_now(tx, h, clock.now) for h in (old, new)] == [0, charge_for(A100_RATE, 65)] == [0, 36_111]
    with tx() as s:
        assert (revenue_of(s, old), revenue_of(s, new)) == (0, 0)
        # 100 less the two holds' 2.00 each: a charge draws on its own hold's earmark.
        assert api.balance(s, "physics")["available"] == "96.00"
        assert api.verify(s).ok


def test_a_hold_without_a_submit_time_is_charged_unless_the_job_has_its_own(tx) -> None:
    """Holds from older hooks or the CLI carry no submit time: matched by run alone."""
    setup_account(tx)
    legacy = attempt_hold(tx, 7, None, at=T0)
    clock = Clock(T0 + timedelta(seconds=31))
    meter = make_meter(tx, FakeSqueue([running(7), running(8)]), clock)
    assert meter.tick().accruing == 1
    legacy_of_8 = attempt_hold(tx, 8, None, at=T0)
    own_of_8 = attempt_hold(tx, 8, running(8).submit, at=T0)
    clock.at(61)
    assert meter.tick().accruing == 2
    costs = [cost_now(tx, h, clock.now) for h in (legacy, legacy_of_8, own_of_8)]
    assert costs == [charge_for(A100_RATE, 61), 0, charge_for(A100_RATE, 61)]


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
                        api.HoldRequest(
                            name,
                            user="alice",
                            job_id=(1 if name == "one" else 2) * 1000 + j,
                            gpus="a100:1",
                            seconds=seconds,
                            cluster="lab",
                            at=T0,
                        ),
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


# --------------------------------------------------------------------------- reports agree


def test_reports_read_the_same_as_when_every_tick_was_posted(tx) -> None:
    """The figures a user sees for a workload that crosses midnight UTC, computed here from
    the prices and seconds alone. They are what the meter showed when it posted a charge
    per job per tick (each charge effective at start + the seconds charged): by day, user
    and GPU type, the balance's available credit, the job's cost so far, the final charge.

    Job A (alice, 1×a100 at 2.00/h) starts 22:59:59 and ends at 00:30:29, 5,430 s later;
    job B (bob, 1×a100 + 1×h100 at 2.00 + 4.00/h) starts 00:00:29 and runs on. Reports
    are read at R = 00:30:29, a tick: A's charge to 23:59:59 (3,600 s) is Dec 2's.
    """
    with tx() as s:
        api.set_price(s, "a100", "2.00", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.set_price(s, "h100", "4.00", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        for user in ("alice", "bob"):
            api.add_member(s, user, "physics")
        api.topup(s, "physics", "100", effective_at=datetime(2026, 11, 1, tzinfo=UTC))
    start_a = datetime(2026, 12, 2, 22, 59, 59, tzinfo=UTC)
    start_b = start_a + timedelta(seconds=3630)
    report_at = start_a + timedelta(seconds=5430)

    def job(job_id: int, user: str, start: datetime) -> SqueueJob:
        return dataclasses.replace(running(job_id, user=user, start=start), submit=None)

    with tx() as s:
        a = api.create_hold(
            s,
            api.HoldRequest(
                "physics", user="alice", job_id=1, gpus="a100:1", seconds=7200, cluster="lab", at=start_a
            ),
        ).id
    squeue = FakeSqueue([job(1, "alice", start_a)])
    clock = Clock(start_a)
    meter = make_meter(tx, squeue, clock)
    b = None
    for k in range(1, 182):
        clock.now = start_a + timedelta(seconds=30 * k)
        if clock.now == start_b:
            with tx() as s:
                b = api.create_hold(
                    s,
                    api.HoldRequest(
                        "physics",
                        user="bob",
                        job_id=2,
                        gpus="a100:1,h100:1",
                        seconds=3600,
                        cluster="lab",
                        at=start_b,
                    ),
                ).id
            squeue.jobs.append(job(2, "bob", start_b))
        if clock.now == report_at:
            with tx() as s:
                api.settle_hold(s, a, 5430, at=report_at)
            squeue.jobs = squeue.jobs[1:]
        assert meter.tick().errors == []
    assert b is not None

    rate_a, rate_b = 2_000_000, 6_000_000
    a_dec2, a_total = charge_for(rate_a, 3600), charge_for(rate_a, 5430)
    b_so_far = charge_for(rate_b, 1800)
    assert (a_dec2, a_total, b_so_far) == (2_000_000, 3_016_667, 3_000_000)
    with tx() as s:

        def usage(by: str) -> list[tuple[str, str, int, int]]:
            rows = api.usage_report(s, by=by, at=report_at)
            return [(r[by], r["charged"], r["gpu_seconds"], r["jobs"]) for r in rows]

        assert usage("day") == [
            ("2026-12-02", "2.00", 3600, 1),
            ("2026-12-03", format_credits(a_total - a_dec2 + b_so_far), 1830 + 3600, 2),
        ]
        assert usage("user") == [("alice", "3.016667", 5430, 1), ("bob", "3.00", 3600, 1)]
        # B's charge splits by GPUs × unit price: a100 1/3, h100 2/3.
        assert usage("gres") == [
            ("a100", format_credits(a_total + 1_000_000), 5430 + 1800, 2),
            ("h100", "2.00", 1800, 1),
        ]
        day2 = api.usage_report(
            s,
            by="user",
            start=datetime(2026, 12, 3, tzinfo=UTC),
            end=datetime(2026, 12, 4, tzinfo=UTC),
            at=report_at,
        )
        assert [(r["user"], r["charged"]) for r in day2] == [("alice", "1.016667"), ("bob", "3.00")]
        # Available: 100 less A's charge and B's whole hold (6.00); B's hold earmarks its
        # cost so far until posted (held 6.00 = 3.00 still held + 3.00 cost so far).
        balance = api.balance(s, "physics")
        assert balance["available"] == format_credits(100_000_000 - a_total - 6_000_000) == "90.983333"
        assert api.cost_so_far(api.get_hold(s, b), report_at) == b_so_far
        assert api.cost_so_far(api.get_hold(s, a), report_at) == a_total
        assert api.verify(s).ok
    with tx() as s:
        settled = api.settle_hold(s, b, 1815, at=start_b + timedelta(seconds=1815))
    assert settled.charged_ucredits == charge_for(rate_b, 1815) == 3_025_000
    with tx() as s:
        rows = api.usage_report(s, by="day", at=report_at + timedelta(hours=1))
        assert [(r["day"], r["charged"]) for r in rows] == [
            ("2026-12-02", "2.00"),
            ("2026-12-03", format_credits(a_total - a_dec2 + 3_025_000)),
        ]
        assert api.balance(s, "physics")["available"] == format_credits(100_000_000 - a_total - 3_025_000)
        assert api.verify(s).ok


def test_a_running_job_across_midnight_reads_the_same_before_and_after_its_day_end_charge(tx) -> None:
    """Cost so far is split at midnight UTC on read (seconds before it are the old day's),
    and the meter's day-end charge posts exactly that split: the report does not move."""
    setup_account(tx)
    start = datetime(2026, 12, 2, 23, 0, tzinfo=UTC)
    with tx() as s:
        hold_id = api.create_hold(
            s,
            api.HoldRequest(
                "physics", user="alice", job_id=1, gpus="a100:1", seconds=7200, cluster="lab", at=start
            ),
        ).id
    now = start + timedelta(seconds=5400)  # 00:30:00
    expected = [
        ("2026-12-02", format_credits(charge_for(A100_RATE, 3599)), 3599, 1),
        ("2026-12-03", format_credits(charge_for(A100_RATE, 5400) - charge_for(A100_RATE, 3599)), 1801, 1),
    ]
    assert [charge_for(A100_RATE, 3599), charge_for(A100_RATE, 5400)] == [1_999_444, 3_000_000]

    def by_day() -> list[tuple[str, str, int, int]]:
        with tx() as s:
            rows = api.usage_report(s, by="day", at=now)
        return [(r["day"], r["charged"], r["gpu_seconds"], r["jobs"]) for r in rows]

    assert by_day() == []  # no meter has seen it run: reports count posted charges only
    clock = Clock(start + timedelta(minutes=30))
    meter = make_meter(tx, FakeSqueue([running(1, start=start)]), clock)
    assert (meter.tick().charged, meter.tick().accruing) == (0, 1)  # 23:30: seen running
    assert by_day() == expected  # 00:30, before the meter's next tick
    clock.now = now
    report = meter.tick()
    assert (report.charged, report.errors) == (1, [])
    with tx() as s:
        h = api.get_hold(s, hold_id)
    assert (h.charged_seconds, h.charged_ucredits) == (3599, 1_999_444)  # the day's last second
    assert by_day() == expected


# --------------------------------------------------------------------------- squeue, compact


def test_the_meter_reads_squeue_compact_lines_and_only_new_ones_each_tick() -> None:
    argv = squeue_compact_argv()
    assert argv[:4] == ["squeue", "--all", "--noheader", "--states=RUNNING"]
    assert argv[4] == (
        "--Format=JobID:|,ArrayJobID:|,ArrayTaskID:|,HetJobID:|,HetJobOffset:|,RestartCnt:|,State:|,"
        "SubmitTime:|,StartTime:|,UserName:|,Account:|,Cluster:|"
    )
    lines = [
        "42|N/A|N/A|N/A|N/A|0|RUNNING|2026-12-02T09:59:55|2026-12-02T10:00:00|alice|physics|lab|",
        "7|6|0|N/A|N/A|1|RUNNING|2026-12-02T09:59:55|2026-12-02T10:00:00|bob|chem||",  # array task 6_0
        "9  |N/A |N/A |9 |1 |0 |RUNNING |Unknown |2026-12-02T10:00:00 |bob |chem |lab |",  # padded, het 9+1
        "x|1|",
    ]
    source = CompactSqueue(FakeRunner({tuple(argv): "\n".join(lines) + "\n"}), cluster="lab", tz=UTC)
    first = source.running_jobs()
    assert [(j.key, j.display_id, j.user, j.account, j.submit, j.start) for j in first.jobs] == [
        (("lab", 42, 0), "42", "alice", "physics", T0 - timedelta(seconds=5), T0),
        (("lab", 7, 1), "6_0", "bob", "chem", T0 - timedelta(seconds=5), T0),
        (("lab", 9, 0), "9+1", "bob", "chem", None, T0),
    ]
    assert [(e.line_no, e.reason[:21]) for e in first.errors] == [(4, "expected 12 '|'-ended")]
    new = "43|N/A|N/A|N/A|N/A|2|RUNNING|2026-12-02T09:59:55|2026-12-02T10:00:01|alice|physics|lab|"
    second = source.parse("\n".join([lines[1], new, lines[0]]))
    assert second.jobs[0] is first.jobs[1] and second.jobs[1] is first.jobs[0]  # not parsed again
    assert (second.jobs[2].key, second.jobs[2].start, second.errors) == (
        ("lab", 43, 2),
        T0 + timedelta(seconds=1),
        [],
    )
