"""A department's credit shared on the real box: a group with no credit of its own runs
on its parent's pool (sbatch says so, the books are exact to sacct's seconds, what the
job did not spend is back with the parent), and a transfer from the parent lets a job
through that sbatch refused."""

from __future__ import annotations

import pytest

from ledger import api
from ledger.money import format_credits
from tests.support.cluster import PRICES, Cluster, sacct_runs

pytestmark = pytest.mark.slurm

H100_PER_SECOND = PRICES["h100"] // 3600  # 1000 micro-credits


def test_a_group_with_no_credit_runs_on_its_departments_pool(cluster: Cluster) -> None:
    dept = cluster.new_account("1")
    grp = cluster.new_account(None)
    with cluster.tx() as s:
        api.set_parent(s, grp, dept)
    cluster.gpucredit("account", "pool", dept, "on", "--child-cap", "0.5")
    rc, out, err = cluster.box.sbatch(
        ["--parsable", "-A", grp, "--gres=gpu:h100:1", "-t", "1", "--wrap", "sleep 2"]
    )
    assert rc == 0, err
    assert f"gpucredit: ~0.06 credits (1×h100 × 1 min), 0.00 in {grp} + 0.50 from {dept}'s pool" in err
    job = int(out.strip())
    cluster.box.wait_state(job, "COMPLETED", timeout=90)
    cluster.settled_holds(job, grp)  # sacct may have the end before the epilog settled
    [row] = sacct_runs(cluster.box, job, grp)
    charged = H100_PER_SECOND * int(row["ElapsedRaw"])
    with cluster.tx() as s:
        [hold] = api.find_job_holds(s, "lab", job)
        assert (hold.state, hold.charged_ucredits) == ("settled", charged)
        assert api.balance(s, grp)["available"] == "0.00"
        assert api.balance(s, dept)["available"] == format_credits(1_000_000 - charged)
        assert api.pool_uses(s) == {(dept, grp): charged}
        assert api.verify(s).ok


def test_a_transfer_from_the_department_lets_a_refused_job_through(cluster: Cluster) -> None:
    dept = cluster.new_account("1")
    grp = cluster.new_account(None)
    with cluster.tx() as s:
        api.set_parent(s, grp, dept)
    args = ["--parsable", "-A", grp, "--gres=gpu:h100:1", "-t", "1", "--wrap", "sleep 1"]
    rc, _out, err = cluster.box.sbatch(args)
    assert rc == 1
    assert "but only 0.00 are available in " + grp in err
    cluster.gpucredit("transfer", dept, grp, "0.10", "--idempotency-key", f"{grp}-q1")
    rc, out, err = cluster.box.sbatch(args)
    assert rc == 0, err
    job = int(out.strip())
    cluster.box.wait_state(job, "COMPLETED", timeout=90)
    cluster.settled_holds(job, grp)  # sacct may have the end before the epilog settled
    [row] = sacct_runs(cluster.box, job, grp)
    with cluster.tx() as s:
        assert api.balance(s, dept)["available"] == "0.90"
        left = 100_000 - H100_PER_SECOND * int(row["ElapsedRaw"])
        assert api.balance(s, grp)["available"] == format_credits(left)
