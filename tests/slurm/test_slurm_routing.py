"""Routing on the real Slurm box: a cost limit in the job's comment, on-premise GPUs busy.

The box's `onprem` partition is node1 and node2, `cloud` is node3 alone
(conf/slurm/slurm.conf.in), so on-premise GPUs can all be busy while the cloud's are
free, and every other e2e test keeps the two-node default partition it had. Cloud
H100s cost 5.40 an hour here, set with this module's own `gpucredit price set
--partition cloud` on its own ledger (tests/slurm/conftest.py's `cluster`).

Money is checked as there (`Books.check`: after `gpucredit bridge sacct`, each run's
charge is sacct's ElapsedRaw × the price of the partition it ran in).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from ledger import api
from tests.support.cluster import PRICES, Books, Cluster, sacct_runs, submit

pytestmark = pytest.mark.slurm

CLOUD_H100 = 5_400_000  # micro-credits per GPU-hour
ROUTING_CONFIG = '[partitions.onprem]\nsite = "onprem"\n[partitions.cloud]\nsite = "cloud"\n'


@pytest.fixture(scope="module")
def routed(cluster: Cluster) -> Iterator[Cluster]:
    """The module's cluster with its partitions tagged and a cloud price; the daemon
    restarted to read the tags. Checks the box has a cloud partition of its own."""
    nodes = {
        name: cluster.box.scontrol("show", "partition", name, "-o").split(" Nodes=", 1)[1].split()[0]
        for name in ("onprem", "cloud")
    }
    assert nodes == {"onprem": "node[1-2]", "cloud": "node3"}, (
        f"the box runs an older slurm.conf ({nodes}); restart it: make slurm-down slurm-up"
    )
    cluster.gpucredit("price", "set", "h100", "5.40", "--partition", "cloud", "--effective", "2026-01-01")
    config = cluster.config_path.read_text()
    cluster.config_path.write_text(config + ROUTING_CONFIG)
    cluster.stop_daemon()
    cluster.start_daemon()
    yield cluster
    cluster.config_path.write_text(config)


def sbatch(cluster: Cluster, account: str, comment: str, *args: str) -> tuple[int, str]:
    """sbatch --parsable as alice with a one-minute 1×h100 job: (job id, gpucredit's message)."""
    rc, out, err = cluster.box.sbatch(
        ["--parsable", "-A", account, "--gres=gpu:h100:1", "-t", "1", f"--comment={comment}", *args]
    )
    assert rc == 0, err
    return int(out.strip()), err.strip()


def test_with_on_premise_busy_a_job_allowed_cloud_runs_there_at_the_cloud_price(
    routed: Cluster, books: Books
) -> None:
    account = routed.new_account("10")
    box = routed.box
    # Every on-premise H100 (2 per node) taken by one job.
    filler = submit(
        box, "-A", account, "-p", "onprem", "-N", "2", "--gres=gpu:h100:2", "-t", "5", "--wrap", "sleep 300"
    )
    box.wait_state(filler, "RUNNING", timeout=30)

    waiting, told = sbatch(routed, account, "onprem only gpucredit:max_cost=1", "--wrap", "sleep 2")
    assert told.startswith(
        "sbatch: gpucredit: ~0.06 credits (1×h100 × 1 min) in onprem; not cloud (~0.09, cloud not allowed); "
        "limit 1.00 a run (your comment); "
    ), told
    clouded, told = sbatch(routed, account, "gpucredit:max_cost=1,cloud=yes", "--wrap", "sleep 2")
    assert told.startswith(
        "sbatch: gpucredit: ~0.09 credits at most (1×h100 × 1 min) in onprem (~0.06) or cloud (~0.09), "
        "where Slurm can start it first; limit 1.00 a run (your comment); "
    ), told
    assert told.endswith(f"available in {account}")

    box.wait_state(clouded, "COMPLETED", timeout=60)
    [row] = sacct_runs(box, clouded, account)
    assert (row["Partition"], row["NodeList"]) == ("cloud", "node3")
    assert box.scontrol_job(clouded)["Comment"].strip() == (
        "gpucredit: routed to onprem,cloud (limit 1.00 a run, cloud allowed): onprem ~0.06 allowed, "
        "cloud ~0.09 allowed"
    )
    # The prolog held it where it started: the hold names cloud and its price.
    [hold] = routed.holds(clouded, account)
    assert (hold.partition, hold.rate_ucredits_per_hour) == ("cloud", CLOUD_H100)

    # Meanwhile the job that may not go to the cloud waits on-premise for GPUs. Its
    # reason reads None until the scheduler has looked at it (seen on 26.05).
    deadline = time.monotonic() + 30
    squeue = ["squeue", "-h", "-j", str(waiting), "-o", "%T|%P|%r"]
    while True:
        state, partition, reason = box.run(squeue, check=True).stdout.strip().split("|")
        if reason != "None" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert (state, partition) == ("PENDING", "onprem") and reason in ("Resources", "Priority"), reason
    assert box.scontrol_job(waiting)["Comment"].strip() == (
        "gpucredit: routed to onprem (limit 1.00 a run): onprem ~0.06 allowed, cloud ~0.09 cloud not allowed"
        " | onprem only"
    )

    box.run(["scancel", str(filler)], check=True)
    box.wait_state(waiting, "COMPLETED", timeout=60)
    [row] = sacct_runs(box, waiting, account)
    assert row["Partition"] == "onprem"
    books.check(account, {filler: 4 * PRICES["h100"], clouded: CLOUD_H100, waiting: PRICES["h100"]})


def test_a_limit_below_any_possible_run_is_refused_with_the_figures(routed: Cluster) -> None:
    account = routed.new_account("10")
    rc, _out, err = routed.box.sbatch(
        [
            "-A",
            account,
            "--gres=gpu:h100:1",
            "-t",
            "1",
            "--comment=gpucredit:max_cost=0.05,cloud=yes",
            "--wrap",
            "true",
        ]
    )
    assert rc == 1
    assert err.splitlines()[0] == (
        "sbatch: error: gpucredit: this job would cost at least ~0.06 credits a run "
        "(1×h100 × 1 min in onprem) but its limit is 0.05 (your comment). Raise gpucredit:max_cost "
        "in --comment, or ask for fewer GPUs or less time"
    )
    with routed.tx() as s:
        assert api.list_holds(s, account) == []
