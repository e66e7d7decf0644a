"""Cloud partitions held back on the real Slurm box: with the box's own routing lines
(slurmbox/gpucredit_site.py ROUTING_TEXT: onprem, cloud and burst tagged, a 5 s wait), a
job allowed the cloud is given `onprem` at submit, waits there while on-premise is full,
then the daemon's burst pass adds the cloud partitions and it runs there, charged at the
cloud price to the micro-credit (docs/routing.md "Holding the cloud back"): in cloud
(node3), or in burst (cloud1, launched) when the box runs its cloud, and then the test
waits for cloud1 to be powered down again.

Run under the box lock: flock /tmp/gpucredit-box.lock pytest -m slurm tests/slurm/test_slurm_burst.py
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from job_submit.burst_mark import BurstMark
from ledger.money import format_credits
from slurmbox.box import LOG_DIR
from slurmbox.gpucredit_site import ROUTING_TEXT
from tests.support.cluster import PRICES, Books, Box, Cluster, sacct_runs, submit

pytestmark = pytest.mark.slurm

CLOUD_H100 = 5_400_000  # micro-credits per GPU-hour in cloud and burst
WAIT = 5  # ROUTING_TEXT's burst_after_seconds


@pytest.fixture(scope="module")
def bursting(cluster: Cluster) -> Iterator[Cluster]:
    """The module's cluster with the box's routing lines; the daemon restarted to read them."""
    assert f"burst_after_seconds = {WAIT}\n" in ROUTING_TEXT
    for partition in ("cloud", "burst"):
        cluster.gpucredit(
            "price", "set", "h100", "5.40", "--partition", partition, "--effective", "2026-01-01"
        )
    config = cluster.config_path.read_text()
    cluster.config_path.write_text(config + ROUTING_TEXT)
    cluster.stop_daemon()
    cluster.start_daemon()
    yield cluster
    cluster.config_path.write_text(config)
    cluster.stop_daemon()
    cluster.start_daemon()


def partitions_set(box: Box, job: int) -> list[tuple[str, datetime]]:
    """Every change of the job's partitions slurmctld logged: (the new list, when)."""
    log = box.inside(f"{LOG_DIR}/slurmctld.log").read_text(errors="replace")
    pattern = rf"^\[([0-9T:.-]+)\] _update_job: setting partition to (\S+) for JobId={job}$"
    return [(found[1], datetime.fromisoformat(found[0])) for found in re.findall(pattern, log, re.M)]


def test_a_job_allowed_the_cloud_waits_on_premise_then_bursts_at_the_cloud_price(
    bursting: Cluster, books: Books
) -> None:
    box = bursting.box
    account = bursting.new_account("10")
    # Held back: the partitions tagged cloud that this box has (burst only with its cloud on).
    has_burst = " Nodes=cloud1 " in box.run(["scontrol", "show", "partition", "-o"]).stdout
    later = ["burst", "cloud"] if has_burst else ["cloud"]
    filler = submit(
        box, "-A", account, "-p", "onprem", "-N", "2", "--gres=gpu:h100:2", "-t", "5", "--wrap", "sleep 300"
    )
    box.wait_state(filler, "RUNNING", timeout=30)
    try:
        allowed = "--comment=gpucredit:cloud=yes nightly"
        rc, out, told = box.sbatch(
            ["--parsable", "-A", account, "--gres=gpu:h100:1", "-t", "1", allowed, "--wrap", "sleep 2"]
        )
        assert rc == 0, told
        job = int(out.strip())
        assert told.startswith(
            "sbatch: gpucredit: ~0.09 credits at most (1×h100 × 1 min) in onprem (~0.06), or "
            + " or ".join(f"{name} (~0.09)" for name in later)
            + f" if it has not started within {WAIT} s; "
        ), told
        box.wait_state(job, "COMPLETED", timeout=120)
        [row] = sacct_runs(box, job, account)
    finally:
        box.run(["scancel", str(filler)])
    if row["Partition"] == "burst":  # leave cloud1 powered down, as the cloud tests expect it
        deadline = time.monotonic() + 180
        while box.run(["sinfo", "-h", "-n", "cloud1", "-o", "%T"]).stdout.strip() != "idle~":
            assert time.monotonic() < deadline, "cloud1 was not powered down"
            time.sleep(1)
    # The always-on cloud partition has the higher PriorityTier: node3 runs it, cloud1 stays down.
    assert row["Partition"] == "cloud", row
    # slurmctld logs when the pass changed the job's partitions (its clock, to the ms):
    # not before WAIT seconds after the submission (sacct's Submit, to the second, rounded down).
    assert partitions_set(box, job) == [
        (f"onprem,{','.join(later)}", added := partitions_set(box, job)[0][1])
    ]
    assert added >= datetime.fromisoformat(row["Submit"]) + timedelta(seconds=WAIT), (added, row)
    info = box.scontrol_job(job)
    mark = BurstMark.parse(info["AdminComment"])  # the partitions added, each with the job's cost there
    assert mark is not None and mark.sent and list(mark.costs) == later, info
    assert [format_credits(cost) for cost in mark.costs.values() if cost is not None] == ["0.09"] * len(later)
    assert info["Comment"].startswith(
        f"gpucredit: routed to onprem, then {','.join(later)} after {WAIT} s"
    ), info
    box.wait_state(filler, {"CANCELLED", "COMPLETED"}, timeout=60)
    # The job paid its partition's cloud price for its GPU-seconds, to the micro-credit.
    holds = books.check(account, {filler: 4 * PRICES["h100"], job: CLOUD_H100})
    assert [hold.partition for hold in holds[job]] == [row["Partition"]]
