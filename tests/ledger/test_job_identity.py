"""A job that reuses an old job's id is reserved and settled as itself.

Slurm reuses job ids (a wiped StateSaveLocation, FirstJobId, the wrap at MaxJobId) and
resets SubmitTime on every requeue, so the prolog names an attempt by
(cluster, job_id, run, SubmitTime). These tests drive the daemon's hold and settle
(gpucredit/daemon/hook_service.py) on both stores, the way the hooks' requests reach them.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from gpucredit.daemon import hook_service as service
from ledger import api
from ledger.errors import Conflict, NotFound
from ledger.store.tables import entries_t

T0 = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
OLD_SUBMIT, NEW_SUBMIT = "2026-12-02T09:59:50Z", "2026-12-03T08:00:00Z"


@pytest.fixture
def ledger(tx):
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.topup(s, "physics", "100", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
    return tx


def hold_request(submit: str | None, *, start: str, seconds: int = 3600, run: int = 0) -> dict:
    return {
        "cluster": "lab",
        "job_id": 1,
        "run": run,
        "account": "physics",
        "user": "alice",
        "partition": "onprem",
        "gpus": {"h100": 1},
        "seconds": seconds,
        "start": start,
        "submit": submit,
    }


def settle_request(submit: str | None, *, end: str, run: int = 0) -> dict:
    return {"cluster": "lab", "job_id": 1, "run": run, "end": end, "submit": submit}


def test_a_new_job_with_an_old_id_is_held_and_settled_as_itself(ledger) -> None:
    with ledger() as s:
        old = service.hold(s, hold_request(OLD_SUBMIT, start="2026-12-02T10:00:00Z"), grace_seconds=600)
    with ledger() as s:
        service.settle(s, settle_request(OLD_SUBMIT, end="2026-12-02T10:30:00Z"))  # 1800 s: 1.80
    # The cluster is rebuilt; job ids restart; job 1 run 0 is a different job with a
    # different limit (a different request for the same (cluster, job_id, run)).
    with ledger() as s:
        new = service.hold(
            s, hold_request(NEW_SUBMIT, start="2026-12-03T08:00:05Z", seconds=7200), grace_seconds=600
        )
    assert new["id"] != old["id"]
    assert (new["state"], new["amount"], new["submitted_at"]) == ("active", "7.20", NEW_SUBMIT)
    with ledger() as s:
        settled = service.settle(s, settle_request(NEW_SUBMIT, end="2026-12-03T08:10:05Z"))  # 600 s: 0.60
    assert (settled["id"], settled["charged"], settled["state"]) == (new["id"], "0.60", "settled")
    with ledger() as s:
        holds = {h.id: h for h in api.find_job_holds(s, "lab", 1)}
        assert holds[old["id"]].charged_ucredits == 1_800_000
        assert holds[new["id"]].charged_ucredits == 600_000
        assert api.balance(s, "physics")["available"] == "97.60"


def test_a_repeated_prolog_or_epilog_of_one_attempt_changes_nothing(ledger) -> None:
    request = hold_request(NEW_SUBMIT, start="2026-12-03T08:00:05Z")
    with ledger() as s:
        first = service.hold(s, request, grace_seconds=600)
    with ledger() as s:
        assert service.hold(s, request, grace_seconds=600) == first
    with ledger() as s:
        settled = service.settle(s, settle_request(NEW_SUBMIT, end="2026-12-03T08:10:05Z"))
    with ledger() as s:
        entries = s.execute(select(func.count()).select_from(entries_t)).scalar_one()
        again = service.settle(s, settle_request(NEW_SUBMIT, end="2026-12-03T08:10:05Z"))
    assert again == settled
    with ledger() as s:
        assert s.execute(select(func.count()).select_from(entries_t)).scalar_one() == entries
    # The same attempt asking for something else is still a conflict, not a new hold.
    with ledger() as s, pytest.raises(Conflict) as refused:
        service.hold(s, dict(request, seconds=60), grace_seconds=600)
    assert refused.value.code == "idempotency_conflict"


def test_an_old_jobs_stale_active_hold_is_not_settled_for_the_new_job(ledger) -> None:
    """The old job 1 lost its epilog (its hold is still active, not yet expired) when
    the new job 1 ran: the new job's epilog settles the new job's hold, and the old one
    is left for the sweep to expire."""
    with ledger() as s:
        old = service.hold(s, hold_request(OLD_SUBMIT, start="2026-12-02T10:00:00Z"), grace_seconds=600)
    with ledger() as s:
        new = service.hold(s, hold_request(NEW_SUBMIT, start="2026-12-02T10:20:00Z"), grace_seconds=600)
    with ledger() as s:
        settled = service.settle(s, settle_request(NEW_SUBMIT, end="2026-12-02T10:30:00Z"))
    assert (settled["id"], settled["charged"]) == (new["id"], "0.60")
    with ledger() as s:
        assert api.get_hold(s, old["id"]).state == "active"


def test_a_new_job_without_a_hold_never_settles_an_old_jobs_stale_hold(ledger) -> None:
    """The old job 1 lost its epilog; the new job 1 ran with no hold of its own (refused,
    or admitted under policy accept). Its epilog finds nothing to settle: the old hold is
    left for the sweep, and the bridge charges the new run from sacct."""
    with ledger() as s:
        old = service.hold(s, hold_request(OLD_SUBMIT, start="2026-12-02T10:00:00Z"), grace_seconds=600)
    with ledger() as s, pytest.raises(NotFound):
        service.settle(s, settle_request(NEW_SUBMIT, end="2026-12-02T10:30:00Z"))
    with ledger() as s:
        stale = api.get_hold(s, old["id"])
        assert (stale.state, stale.charged_ucredits) == ("active", 0)


def test_the_epilog_after_a_requeue_settles_the_running_attempt_and_replays(ledger) -> None:
    """After `scontrol requeue` the epilog names the next run but still the ending run's
    SubmitTime (docs/slurm-facts.md §11); a repeat of it replays the settle."""
    with ledger() as s:
        first = service.hold(s, hold_request(NEW_SUBMIT, start="2026-12-03T08:00:05Z"), grace_seconds=600)
    request = settle_request(NEW_SUBMIT, end="2026-12-03T08:05:05Z", run=1)
    with ledger() as s:
        settled = service.settle(s, request)
    assert (settled["id"], settled["charged"]) == (first["id"], "0.30")
    with ledger() as s:
        assert service.settle(s, request) == settled


def test_holds_without_a_submit_time_keep_the_run_as_their_identity(ledger) -> None:
    """The CLI and the HTTP API know no SubmitTime: (cluster, job_id, run) names the run."""
    with ledger() as s:
        first = api.create_hold(
            s, api.HoldRequest("physics", user="alice", job_id=7, gpus={"h100": 1}, seconds=60, at=T0)
        )
    with ledger() as s:
        again = api.create_hold(
            s, api.HoldRequest("physics", user="alice", job_id=7, gpus={"h100": 1}, seconds=60, at=T0)
        )
    assert again.id == first.id and first.as_dict()["submitted_at"] is None
    with ledger() as s, pytest.raises(Conflict):
        api.create_hold(
            s, api.HoldRequest("physics", user="alice", job_id=7, gpus={"h100": 2}, seconds=60, at=T0)
        )
