"""gpucredit wired into a real Slurm 22.05 (the box): sbatch, the hooks, the daemon, sacct.

Each test gets its own Slurm account (alice is its member) and ledger account, so
tests do not share credit. Money is checked as a user is promised it
(`Books.check`): after `gpucredit bridge sacct`, each run's final charge is sacct's
ElapsedRaw x price to the micro-credit, with at most one adjustment linked to its
settle, and the account's balance is its credit less those charges. The hooks'
own figure can be a second off for a requeued run (docs/slurm-facts.md §11), so no
test compares a hook's charge with sacct directly.

Helpers for new tests: `Cluster.new_account`, `Cluster.run_job` (submit and wait),
`Cluster.rebuild_box` (the box down and up again, job ids from 1, ledger kept),
`Cluster.gpucredit` (the CLI against this ledger) and the `books` fixture.
"""

from __future__ import annotations

import time

import pytest

from ledger import api
from tests.support.cluster import PRICES, Books, Cluster, sacct_runs, submit

pytestmark = pytest.mark.slurm


# -- refusals at submit -------------------------------------------------------------------------


def test_no_credit_is_refused_at_submit_with_cost_available_and_top_up(cluster: Cluster) -> None:
    account = cluster.new_account(None)
    rc, _out, err = cluster.box.sbatch(
        ["-A", account, "--gres=gpu:h100:2", "-t", "2:00:00", "--wrap", "true"]
    )
    assert rc == 1
    assert err.splitlines()[0] == (
        f"sbatch: error: gpucredit: this job would cost ~14.40 credits (2×h100 × 2 h) but only 0.00 are "
        f"available in {account}. Ask your PI or an admin to add credit (gpucredit topup {account} AMOUNT)."
    )
    with cluster.tx() as s:
        assert api.list_holds(s, account) == []
        assert api.balance(s, account)["held"] == "0.00"


# -- holds, settles, prices -----------------------------------------------------------------------


def test_credit_for_exactly_one_job_runs_one_and_charges_slurm_elapsed(
    cluster: Cluster, books: Books
) -> None:
    account = cluster.new_account("0.12")  # 2×h100 for 1 min at 3.60/h
    first = submit(cluster.box, "-A", account, "--gres=gpu:h100:2", "-t", "1", "--wrap", "sleep 3")
    cluster.box.wait_state(first, "RUNNING", timeout=30)
    rc, out, err = cluster.box.sbatch(
        ["--parsable", "-A", account, "--gres=gpu:h100:2", "-t", "1", "--wrap", "sleep 3"]
    )
    if rc == 0:  # accepted at submit: the prolog must hold it, with the reason
        second = int(out.strip())
        cluster.box.wait_state(second, "PENDING", timeout=30)
        deadline = time.monotonic() + 20
        while "gpucredit:" not in cluster.box.scontrol_job(second).get("Comment", ""):
            assert time.monotonic() < deadline, cluster.box.scontrol_job(second)
            time.sleep(0.2)
        job = cluster.box.scontrol_job(second)
        assert job["Reason"] == "JobHeldAdmin"
        assert job["Comment"].startswith(f"gpucredit: account {account}: this job needs 0.12 credits")
        cluster.box.run(["scancel", str(second)], check=True)
    else:
        assert "gpucredit: this job would cost ~0.12 credits" in err
    cluster.box.wait_state(first, "COMPLETED", timeout=60)
    [[hold]] = books.check(account, {first: 2 * PRICES["h100"]}).values()
    [row] = sacct_runs(cluster.box, first, account)
    assert hold.charged_ucredits == 2 * 1000 * int(row["ElapsedRaw"]) > 0  # 0.001 credit/s per H100


def test_each_gpu_type_is_charged_at_its_own_price(cluster: Cluster, books: Books) -> None:
    account = cluster.new_account("10")
    mixed = submit(cluster.box, "-A", account, "--gres=gpu:a100:1,gpu:h100:1", "-t", "1", "--wrap", "sleep 2")
    a100 = submit(cluster.box, "-A", account, "--gres=gpu:a100:2", "-t", "1", "--wrap", "sleep 2")
    rates = {mixed: PRICES["a100"] + PRICES["h100"], a100: 2 * PRICES["a100"]}
    for job_id in rates:
        cluster.box.wait_state(job_id, "COMPLETED", timeout=60)
    holds = books.check(account, rates)
    assert {job: [h.rate_ucredits_per_hour for h in holds[job]] for job in rates} == {
        job: [rate] for job, rate in rates.items()
    }
    assert holds[mixed][0].gpus == "a100:1,h100:1"


def test_scancel_running_settles_what_ran_and_cancelled_pending_leaves_nothing(
    cluster: Cluster, books: Books
) -> None:
    account = cluster.new_account("10")
    running = submit(cluster.box, "-A", account, "--gres=gpu:h100:1", "-t", "2", "--wrap", "sleep 60")
    cluster.box.wait_state(running, "RUNNING", timeout=30)
    time.sleep(3)
    cluster.box.run(["scancel", str(running)], check=True)
    cluster.box.wait_state(running, "CANCELLED", timeout=60)
    pending = submit(cluster.box, "-A", account, "--hold", "--gres=gpu:h100:1", "-t", "1", "--wrap", "true")
    cluster.box.run(["scancel", str(pending)], check=True)
    cluster.box.wait_state(pending, "CANCELLED", timeout=30)
    [[hold]] = books.check(account, {running: PRICES["h100"]}).values()
    assert hold.charged_ucredits > 0
    assert cluster.holds(pending, account) == []


def test_requeue_holds_and_settles_each_run_once(cluster: Cluster, books: Books) -> None:
    account = cluster.new_account("10")
    job = submit(cluster.box, "-A", account, "--gres=gpu:a100:1", "-t", "2", "--wrap", "sleep 6")
    cluster.box.wait_state(job, "RUNNING", timeout=30)
    time.sleep(2)
    cluster.box.run(["scontrol", "requeue", str(job)], check=True)
    cluster.box.wait_state(job, "COMPLETED", timeout=120)
    rows = sacct_runs(cluster.box, job, account)
    assert [r["State"].split()[0] for r in rows] == ["REQUEUED", "COMPLETED"]
    # The epilog of the requeued run may charge a second more than sacct (docs/slurm-facts.md
    # §11); the promise is the books after the bridge: each run charged once, as sacct says.
    holds = books.check(account, {job: PRICES["a100"]})[job]
    assert [h.run for h in holds] == [0, 1]
    assert all(h.charged_ucredits > 0 for h in holds)


def test_a_new_job_with_an_old_jobs_id_is_held_settled_and_reconciled_as_itself(
    cluster: Cluster, books: Books
) -> None:
    """`make slurm-down` + `make slurm-up` with the ledger kept: job ids restart at 1, so
    the new job 1 reuses the id of a job the ledger already settled (here for another
    account, so the old prolog refused it as "a different request" and held it for good).
    It runs, is charged once as itself, and reconciling it leaves the old job alone."""
    cluster.rebuild_box()
    old_account = cluster.new_account("10")
    old = cluster.run_job(old_account, "--gres=gpu:h100:1", "-t", "2", "--wrap", "sleep 3")
    [old_hold] = books.check(old_account, {old: PRICES["h100"]})[old]
    cluster.rebuild_box(as_if_killed=True)  # and the start after a kill wipes the old state
    new_account = cluster.new_account("10")
    new = cluster.run_job(new_account, "--gres=gpu:h100:1", "-t", "3", "--wrap", "sleep 2")
    assert new == old  # the id really was reused
    # It ran at its first start: no prolog refusal (a REQUEUED row) before the job ran.
    assert [r["State"].split()[0] for r in sacct_runs(cluster.box, new, new_account)] == ["COMPLETED"]
    [new_hold] = books.check(new_account, {new: PRICES["h100"]})[new]
    assert new_hold.run == 0
    assert new_hold.id != old_hold.id and new_hold.submitted_at > old_hold.submitted_at
    assert cluster.holds(old, old_account) == [old_hold]  # untouched by the new job's records


def test_prolog_refusal_holds_the_job_and_a_top_up_releases_it(cluster: Cluster, books: Books) -> None:
    account = cluster.new_account("0.06")  # one 1×h100 job of 1 min
    # Both are quoted while nothing is held, so job_submit accepts both; the
    # prolog's authoritative hold then admits only one.
    jobs = [
        submit(cluster.box, "-A", account, "--hold", "--gres=gpu:h100:1", "-t", "1", "--wrap", "sleep 2")
        for _ in range(2)
    ]
    cluster.box.run(["scontrol", "release", *map(str, jobs)], check=True)
    deadline = time.monotonic() + 60
    while True:
        comments = {j: cluster.box.scontrol_job(j).get("Comment", "") for j in jobs}
        refused = [j for j, c in comments.items() if c.startswith("gpucredit:")]
        if refused:
            break
        assert time.monotonic() < deadline, comments
        time.sleep(0.2)
    [held] = refused
    [ran] = [j for j in jobs if j != held]
    cluster.box.wait_state(held, "PENDING", timeout=30)  # the refused start is requeued first
    info = cluster.box.scontrol_job(held)
    assert (info["JobState"], info["Reason"], info["Priority"]) == ("PENDING", "JobHeldAdmin", "0")
    squeue = cluster.box.run(["squeue", "-h", "-j", str(held), "-o", "%T|%r|%k"], check=True).stdout.strip()
    assert squeue.startswith("PENDING|JobHeldAdmin|gpucredit: account ")
    cluster.box.wait_state(ran, "COMPLETED", timeout=60)
    cluster.topup(account, "1")
    cluster.box.wait_state(held, "COMPLETED", timeout=90)
    holds = books.check(account, {ran: PRICES["h100"], held: PRICES["h100"]})
    assert [h.run for h in holds[held]] == [1]  # the refused start was run 0
    assert [h.run for h in holds[ran]] == [0]


# -- the ledger side down ---------------------------------------------------------------------


def test_ledger_down_follows_each_policy(cluster: Cluster) -> None:
    account = cluster.new_account("10")
    parked = submit(cluster.box, "-A", account, "--hold", "--gres=gpu:a100:1", "-t", "1", "--wrap", "true")
    cluster.stop_daemon()
    try:
        rc, _out, err = cluster.box.sbatch(["-A", account, "--gres=gpu:a100:1", "-t", "1", "--wrap", "true"])
        assert rc == 1
        assert "gpucredit: credit check unavailable (ledger unreachable); job refused by site policy" in err
        cluster.box.run(["scontrol", "release", str(parked)], check=True)
        deadline = time.monotonic() + 60
        while "ledger unreachable" not in cluster.box.scontrol_job(parked).get("Comment", ""):
            assert time.monotonic() < deadline, cluster.box.scontrol_job(parked)
            time.sleep(0.2)
        assert cluster.box.scontrol_job(parked)["Reason"] == "JobHeldAdmin"
        cluster.box.run(["scancel", str(parked)], check=True)

        cluster.write_config("accept")
        job = submit(cluster.box, "-A", account, "--gres=gpu:a100:1", "-t", "1", "--wrap", "sleep 1")
        cluster.box.wait_state(job, "COMPLETED", timeout=60)
        assert cluster.holds(job, account) == []  # ran unreserved: the bridge charges it from sacct
    finally:
        cluster.write_config("reject")
        cluster.start_daemon()


# -- multi-node jobs and arrays -------------------------------------------------------------------


def test_two_node_job_is_charged_for_the_gpus_on_both_nodes(cluster: Cluster, books: Books) -> None:
    account = cluster.new_account("10")
    job = submit(
        cluster.box, "-A", account, "-N", "2", "--gres=gpu:h100:1", "-t", "1", "--wrap", "srun sleep 2"
    )
    cluster.box.wait_state(job, "COMPLETED", timeout=60)
    [row] = sacct_runs(cluster.box, job, account)
    assert "gres/gpu:h100=2" in row["AllocTRES"]
    [[hold]] = books.check(account, {job: 2 * PRICES["h100"]}).values()
    assert hold.gpus == "h100:2"


def test_array_is_estimated_per_task_and_each_task_settles(cluster: Cluster, books: Books) -> None:
    account = cluster.new_account("10")
    rc, out, err = cluster.box.sbatch(
        ["--parsable", "-A", account, "--array=0-2", "--gres=gpu:a100:1", "-t", "1", "--wrap", "sleep 1"]
    )
    assert rc == 0, err
    # 1×a100 for 60 s is 0.033333 (rounded once per task), three times.
    assert err.strip() == (
        f"sbatch: gpucredit: ~0.099999 credits (1×a100 × 1 min, × 3 tasks), 10.00 available in {account}"
    )
    array_id = int(out.strip().split(";")[0])
    tasks = [f"{array_id}_{task}" for task in range(3)]
    for task in tasks:
        cluster.box.wait_state(task, "COMPLETED", timeout=90)
    holds = books.check(account, {task: PRICES["a100"] for task in tasks})
    assert len({h.job_id for task in tasks for h in holds[task]}) == 3  # one hold per task, by raw id
