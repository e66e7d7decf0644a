"""Lease mode (holds.mode = "lease", docs/design.md §4.5): holds of a window, renewed by the meter.

Figures: 1×a100 at 2.00 credits/h is 2,000,000 µc/h (555.5… µc/s), window 900 s, meter
interval 30 s. A window costs charge_for(2_000_000, 900) = 500,000 µc.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from accounting_bridge.meter.meter import Meter
from accounting_bridge.slurm.records import SqueueJob, SqueueResult
from accounting_bridge.slurm.slurmcmd import FakeRunner
from ledger import api
from ledger.errors import InvalidInput
from ledger.money import charge_for, format_credits
from ledger.store.tables import entries_t

T0 = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
RATE = 2_000_000
WINDOW = 900
INTERVAL = 30
CONFIG = {
    "holds": {"mode": "lease", "lease_seconds": WINDOW, "grace_seconds": 600},
    "meter": {"interval_seconds": INTERVAL, "on_exhausted": "cancel"},
}


def running(job_id: int) -> SqueueJob:
    return SqueueJob(
        cluster="lab",
        job_id=job_id,
        display_id=str(job_id),
        run=0,
        user="alice",
        account="physics",
        partition="gpu",
        state="RUNNING",
        submit=None,
        start=T0,
        end=None,
        time_limit_seconds=None,
        gpus={},
        requested_gpus={},
        nodes=(),
        node_count=0,
        name="",
        gpu_indices={},
    )


class FakeSqueue:
    def __init__(self, jobs: list[SqueueJob]) -> None:
        self.jobs = jobs

    def running_jobs(self) -> SqueueResult:
        return SqueueResult(jobs=list(self.jobs))


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def at(self, seconds: int) -> None:
        self.now = T0 + timedelta(seconds=seconds)


def setup_account(tx: Callable[[], Any], credits: str) -> None:
    with tx() as s:
        api.set_price(s, "a100", "2.00", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.add_member(s, "alice", "physics")
        api.topup(s, "physics", credits, effective_at=datetime(2026, 11, 1, tzinfo=UTC))


def take(
    tx: Callable[[], Any], job_id: int, *, lease: int | None = WINDOW, seconds: int = 3600
) -> api.HoldState:
    with tx() as s:
        return api.create_hold(
            s,
            api.HoldRequest(
                "physics",
                user="alice",
                job_id=job_id,
                gpus="a100:1",
                seconds=seconds,
                cluster="lab",
                at=T0,
                lease_seconds=lease,
            ),
        )


def meter(
    tx: Callable[[], Any], squeue: FakeSqueue, clock: Clock, runner: FakeRunner | None = None, **kw: Any
) -> Meter:
    """The meter as `gpucredit bridge meter` builds it for holds.mode = "lease", on a fake clock."""
    config = {**CONFIG, "meter": {**CONFIG["meter"], **kw}}
    built = Meter.from_config(config, sessions=tx, source=squeue, runner=runner or FakeRunner())
    built.clock = clock
    return built


def kinds(tx: Callable[[], Any], hold_id: int) -> list[str]:
    with tx() as s:
        return list(
            s.execute(
                select(entries_t.c.kind).where(entries_t.c.hold_id == hold_id).order_by(entries_t.c.id)
            ).scalars()
        )


def test_a_lease_holds_one_window_and_expires_at_the_time_limit(tx) -> None:
    setup_account(tx, "100")
    lease = take(tx, 1)
    full = take(tx, 2, lease=7200)  # a window past the time limit is a full hold
    assert (
        (lease.amount_ucredits, lease.lease_seconds) == (charge_for(RATE, WINDOW), WINDOW) == (500_000, 900)
    )
    assert (full.amount_ucredits, full.lease_seconds) == (charge_for(RATE, 3600), None) == (2_000_000, None)
    assert lease.expires_at == T0 + timedelta(seconds=3600 + 600)  # time limit + grace, not the window
    with tx() as s:
        assert api.balance(s, "physics")["available"] == "97.50"
        with pytest.raises(InvalidInput) as refused:
            api.create_hold(
                s,
                api.HoldRequest(
                    "physics", user="alice", job_id=3, gpus="a100:1", seconds=60, lease_seconds=0
                ),
            )
    assert refused.value.code == "invalid_lease"


def test_a_renewal_charges_the_time_run_and_reserves_the_next_window(tx) -> None:
    setup_account(tx, "100")
    hold_id = take(tx, 1).id
    clock = Clock()
    m = meter(tx, FakeSqueue([running(1)]), clock)
    clock.at(450)  # half a window left: not yet
    assert (m.tick().renewed, kinds(tx, hold_id)) == (0, ["hold"])
    clock.at(485)  # due 480: less than half a window left
    report = m.tick()
    assert (report.renewed, report.charged) == (1, 1)
    with tx() as s:
        h = api.get_hold(s, hold_id)
        assert (h.charged_seconds, h.charged_ucredits) == (480, charge_for(RATE, 480)) == (480, 266_667)
        assert h.amount_ucredits == charge_for(RATE, 480 + WINDOW) == 766_667
        assert api.balance(s, "physics")["available"] == format_credits(100_000_000 - 766_667) == "99.233333"
    assert kinds(tx, hold_id) == ["hold", "usage", "renew"]
    clock.at(935)  # the new window (to 1,380 s) has 450 s left at due 930: not yet
    assert m.tick().renewed == 0
    clock.at(965)  # due 960: renewed again, to 1,860 s
    assert m.tick().renewed == 1
    with tx() as s:
        assert api.get_hold(s, hold_id).amount_ucredits == charge_for(RATE, 960 + WINDOW) == 1_033_333
        settled = api.settle_hold(s, hold_id, 1000, at=T0 + timedelta(seconds=1000))
    assert settled.charged_ucredits == charge_for(RATE, 1000) == 555_556
    with tx() as s:
        b = api.balance(s, "physics")
        assert (b["available"], b["held"]) == ("99.444444", "0.00")
        assert api.verify(s).ok


def test_a_lease_is_never_extended_past_the_time_limit(tx) -> None:
    setup_account(tx, "100")
    hold_id = take(tx, 1, seconds=1200).id
    clock = Clock()
    clock.at(485)
    meter(tx, FakeSqueue([running(1)]), clock).tick()
    with tx() as s:
        assert api.get_hold(s, hold_id).amount_ucredits == charge_for(RATE, 1200)  # not 480 + 900


@pytest.mark.parametrize("action", ["cancel", "requeue-hold"])
def test_a_renewal_refused_for_credit_acts_on_the_job_with_the_reason(tx, action: str) -> None:
    setup_account(tx, "0.70")  # the first window (0.50) and 0.20 more
    hold_id = take(tx, 7).id
    reason = (
        "account physics is out of credit: renewing the lease of this run needs 0.266667 credits "
        "but 0.20 are available; top up to run GPU jobs"
    )
    verb, last = (
        ("cancelled", ("scancel", "7"))
        if action == "cancel"
        else (
            "requeued and held",
            ("scontrol", "requeuehold", "7"),
        )
    )
    expected = [("scontrol", "update", "jobid=7", f"comment=gpucredit: {verb}: {reason}"), last]
    runner = FakeRunner({argv: "" for argv in expected})
    clock = Clock()
    clock.at(485)
    report = meter(tx, FakeSqueue([running(7)]), clock, runner, on_exhausted=action).tick()
    assert runner.calls == expected
    assert [(e.hold_id, e.cause) for e in report.exhausted] == [(hold_id, "credit")]
    with tx() as s:
        h = api.get_hold(s, hold_id)
        # The time run is charged from the lease; the refused renewal changed nothing.
        assert (h.charged_ucredits, h.amount_ucredits, h.debt_ucredits) == (266_667, 500_000, 0)
        assert api.balance(s, "physics")["available"] == "0.20"
        assert api.verify(s).ok


def test_a_renewal_refused_by_the_daily_cap_names_the_cap(tx) -> None:
    setup_account(tx, "100")
    with tx() as s:
        api.set_limits(s, "physics", user="alice", daily_cap="0.60")
    take(tx, 8)  # 0.50 held: spent 0 + held 0 + 0.50 <= 0.60
    reason = (
        "user alice in account physics: 0.766667 credits today would exceed the daily cap of 0.60 "
        "(0.266667 spent + 0.233333 held + 0.266667 for this job)"
    )
    expected = [
        ("scontrol", "update", "jobid=8", f"comment=gpucredit: cancelled: {reason}"),
        ("scancel", "8"),
    ]
    runner = FakeRunner({argv: "" for argv in expected})
    clock = Clock()
    clock.at(485)
    report = meter(tx, FakeSqueue([running(8)]), clock, runner).tick()
    assert [(e.cause, e.reason) for e in report.exhausted] == [("daily_cap", reason)]
    assert runner.calls == expected


def settle_and_check(tx: Callable[[], Any], hold_id: int, seconds: int, available: str) -> None:
    with tx() as s:
        settled = api.settle_hold(s, hold_id, seconds, at=T0 + timedelta(seconds=seconds))
        assert settled.charged_ucredits == charge_for(RATE, seconds)
    with tx() as s:
        b = api.balance(s, "physics")
        assert (b["available"], b["held"], b["debt"]) == (available, "0.00", "0.00")
        assert api.list_holds(s, state="active") == []  # nothing stranded
        assert api.verify(s).ok


def test_switching_full_to_lease_mid_job_keeps_the_full_hold_whole(tx) -> None:
    """A hold taken in full mode stays full: the lease-mode meter never renews nor shrinks it."""
    setup_account(tx, "100")
    hold_id = take(tx, 1, lease=None).id  # holds.mode was "full" then
    clock = Clock()
    m = meter(tx, FakeSqueue([running(1)]), clock)  # the meter now runs with holds.mode = "lease"
    for t in (485, 935, 1385):
        clock.at(t)
        assert m.tick().renewed == 0
    with tx() as s:
        assert api.get_hold(s, hold_id).amount_ucredits == 2_000_000
    assert kinds(tx, hold_id) == ["hold"]
    settle_and_check(tx, hold_id, 1400, format_credits(100_000_000 - charge_for(RATE, 1400)))


def test_switching_lease_to_full_mid_job_still_renews_the_lease(tx) -> None:
    """A lease taken before the switch keeps being renewed by a meter started in full mode."""
    setup_account(tx, "100")
    hold_id = take(tx, 1).id
    clock = Clock()
    full_config = {**CONFIG, "holds": {**CONFIG["holds"], "mode": "full"}}
    built = Meter.from_config(full_config, sessions=tx, source=FakeSqueue([running(1)]), runner=FakeRunner())
    built.clock = clock
    for t in range(30, 1290, 30):
        clock.at(t + 5)
        built.tick()
    with tx() as s:
        h = api.get_hold(s, hold_id)
        assert h.amount_ucredits == charge_for(RATE, 960 + WINDOW)  # renewed at due 480 and 960
        assert h.charged_seconds == 960
    assert kinds(tx, hold_id) == ["hold", "usage", "renew", "usage", "renew"]
    settle_and_check(tx, hold_id, 1290, format_credits(100_000_000 - charge_for(RATE, 1290)))


def test_overspend_under_a_killed_meter_stays_within_the_bound(tx) -> None:
    """The account has exactly one window. The meter never ticks; the job runs 1,500 s.
    Its charge beyond what it held is debt, and the bound for an outage of 1,500 s covers it."""
    setup_account(tx, "0.50")
    hold_id = take(tx, 9).id
    with tx() as s:
        settled = api.settle_hold(s, hold_id, 1500, at=T0 + timedelta(seconds=1500))
    assert settled.charged_ucredits == charge_for(RATE, 1500) == 833_333
    overspend = settled.debt_ucredits
    assert overspend == 833_333 - 500_000 == 333_333
    bound = api.lease_overspend_bound(RATE, WINDOW, INTERVAL, outage_seconds=1500)
    assert bound == charge_for(RATE, 1500 + 30 - 450) + 1 == 600_001
    assert overspend <= bound
    assert api.lease_overspend_bound(RATE, WINDOW, INTERVAL) == 0  # nothing fails: none


def test_overspend_when_the_meter_dies_after_a_renewal_stays_within_the_bound(tx) -> None:
    setup_account(tx, str(format_credits(charge_for(RATE, 480 + WINDOW))))  # exactly what it will hold
    hold_id = take(tx, 9).id
    clock = Clock()
    clock.at(485)
    assert meter(tx, FakeSqueue([running(9)]), clock).tick().renewed == 1  # covers 1,380 s
    # The meter dies; the job runs to 2,000 s and the epilog settles it.
    with tx() as s:
        settled = api.settle_hold(s, hold_id, 2000, at=T0 + timedelta(seconds=2000))
    assert settled.debt_ucredits == charge_for(RATE, 2000) - charge_for(RATE, 1380) == 344_444
    outage = 2000 - 480
    assert api.lease_overspend_bound(RATE, WINDOW, INTERVAL, outage_seconds=outage) == 611_112
    assert settled.debt_ucredits <= api.lease_overspend_bound(RATE, WINDOW, INTERVAL, outage_seconds=outage)
