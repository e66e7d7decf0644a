"""job_submit's answer knows a cap set on a parent account (it caps the whole subtree,
issue 30): a job over it on its own is refused at sbatch, one over it only beside what
runs in sibling accounts is told it waits -- the same rule and words as the prolog's hold
(ledger.limits.rules.subtree_breach), read from the daemon's snapshot."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from ledger import api
from ledger.errors import LimitExceeded
from slurm_hooks.client import DaemonClient
from tests.daemon.test_daemon import submit
from tests.support.daemon import running, sinfo_runner
from tests.support.fakedaemon import sockdir as sockdir

START = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_parents_caps_are_told_at_sbatch_as_the_hold_would(db_url: str, tx, sockdir: Path) -> None:  # type: ignore[no-untyped-def]
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=START)
        api.create_account(s, "dept")
        for child in ("physics", "chem"):
            api.create_account(s, child, parent="dept")
            api.add_member(s, "alice", child)
            api.topup(s, child, "100", effective_at=START)
        api.set_limits(s, "dept", max_gpus=4)
        api.set_limits(s, "dept", user="alice", daily_cap="20")
        api.create_hold(s, api.HoldRequest("chem", user="bob", job_id=7, gpus={"h100": 3}, seconds=600))
    with running(db_url, sockdir, sinfo_runner()):
        client = DaemonClient(str(sockdir / "daemon.sock"), 5.0)
        assert submit(client, tres_per_node="gres:gpu:h100:5", time_limit=10) == {
            "decision": "reject",
            "message": "gpucredit: concurrent_gpus: 5 GPUs exceed the cap of 4 for account dept "
            "(with the accounts below it) (job: 5×h100 × 10 min)",
        }
        assert submit(client, tres_per_node="gres:gpu:h100:1", time_limit=400) == {
            "decision": "reject",
            "message": "gpucredit: daily_cap: 24.00 credits exceed the daily cap of 20.00 for user alice in "
            "account dept (with the accounts below it) (job: 1×h100 × 6 h 40 min)",
        }
        assert submit(client, tres_per_node="gres:gpu:h100:2", time_limit=10) == {
            "decision": "accept",
            "message": "gpucredit: ~1.20 credits (2×h100 × 10 min), 100.00 available in physics; it waits to "
            "start: concurrent_gpus: account dept (with the accounts below it): 5 concurrent GPUs would "
            "exceed the cap of 4 (3 in use + 2 requested)",
        }
        assert submit(client, tres_per_node="gres:gpu:h100:1", time_limit=10) == {
            "decision": "accept",
            "message": "gpucredit: ~0.60 credits (1×h100 × 10 min), 100.00 available in physics",
        }
    with tx() as s, pytest.raises(LimitExceeded) as refused:  # what the prolog's hold then says
        api.create_hold(s, api.HoldRequest("physics", user="alice", job_id=8, gpus={"h100": 2}, seconds=600))
    assert refused.value.message == (
        "account dept (with the accounts below it): 5 concurrent GPUs would exceed the cap of 4 "
        "(3 in use + 2 requested)"
    )
