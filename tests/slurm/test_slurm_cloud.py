"""Cloud nodes on the real Slurm box: Slurm's power saving launches `cloud1` through
`gpucredit cloud resume` at the provider (moto's EC2 server, slurmbox/box_cloud.py), its
slurmd "boots", the job runs there at the cloud partition's price, and the instance is
terminated once the node has been idle SuspendTime seconds; an instance the provider
ends under a running job (a spot interruption) fails its node, and that start is refunded.

The box runs its cloud when started with GPUCREDIT_BOX_CLOUD=1 (`GPUCREDIT_BOX_CLOUD=1
make slurm-up`); without it these tests skip and say so. On-premise H100s are filled by
one job, so a job that may run in `onprem` or `burst` can only start in `burst`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import datetime

import boto3
import pytest
from click.testing import CliRunner

from gpucredit.cli import _build
from ledger.api import charge_for
from slurmbox import box_cloud
from slurmbox.gpucredit_site import ROUTING_TEXT
from slurmbox.provider_faults import Fault, FaultProxy
from tests.support.cluster import PRICES, Books, Cluster, Gate, sacct_runs, submit

pytestmark = pytest.mark.slurm

CLOUD_H100 = 4_800_000  # micro-credits per GPU-hour in partition burst (us-west-2)


@pytest.fixture(scope="module")
def clouded(cluster: Cluster) -> Iterator[Cluster]:
    partitions = cluster.box.run(["scontrol", "show", "partition", box_cloud.PARTITION, "-o"]).stdout
    if " Nodes=cloud1 " not in partitions:
        why = "the box runs no cloud: GPUCREDIT_BOX_CLOUD=1 make slurm-down slurm-up"
        pytest.fail(why, pytrace=False) if os.environ.get("CI") else pytest.skip(why)
    cluster.gpucredit("price", "set", "h100", "4.80", "--partition", box_cloud.PARTITION)  # us-west-2
    cluster.gpucredit("price", "set", "h100", "5.40", "--partition", "cloud")  # node3, us-east-1
    # The box's partition tags and regions, for the job that names its region.
    config = cluster.config_path.read_text()
    cluster.config_path.write_text(config + ROUTING_TEXT)
    cluster.stop_daemon()
    cluster.start_daemon()
    yield cluster
    cluster.config_path.write_text(config)
    cluster.stop_daemon()
    cluster.start_daemon()


def cloud_cli(*args: str) -> str:
    env = {"GPUCREDIT_CONFIG": str(box_cloud.CONFIG), **box_cloud.CREDENTIALS}
    result = CliRunner().invoke(_build(), ["cloud", *args], env=env)
    assert result.exit_code == 0, result.output
    return result.output


def cloud1_instances() -> list[dict[str, object]]:
    return [row for row in json.loads(cloud_cli("instances", "--format", "json")) if row["node"] == "cloud1"]


def wait_for(what: str, check, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout} s")
        time.sleep(0.5)


def billed_launch_to_end(row: dict[str, object]) -> int:
    """What the provider bills an ended instance: its type's price in its region (cloud1's,
    us-west-2) for launch to end."""
    span = datetime.fromisoformat(str(row["terminated_at"])) - datetime.fromisoformat(str(row["launched_at"]))
    assert row["region"] == box_cloud.REGION
    return charge_for(box_cloud.REGION_PRICE_UCREDITS_PER_HOUR, int(span.total_seconds()))


def node_state(cluster: Cluster) -> str:
    return cluster.box.run(["sinfo", "-h", "-n", "cloud1", "-o", "%T"], check=True).stdout.strip()


def cloud1_ready(cluster: Cluster) -> None:
    """Wait for cloud1 powered down and free to launch again. A node a failed launch left
    DOWN is resumed once it is powered down (down~ -> idle~); resumed before that, Slurm
    powers it up again and it times out DOWN once more."""

    def ready() -> bool:
        state = node_state(cluster)
        if state == "down~":
            cluster.box.run(["scontrol", "update", "NodeName=cloud1", "State=RESUME"])
        return state == "idle~"

    wait_for("cloud1 powered down and free", ready, box_cloud.RESUME_TIMEOUT_SECONDS + 120)


def fill_on_premise(cluster: Cluster, account: str) -> int:
    filler = submit(
        cluster.box,
        "-A",
        account,
        "-p",
        "onprem",
        "-N",
        "2",
        "--gres=gpu:h100:2",
        "-t",
        "5",
        "--wrap",
        "sleep 300",
    )
    cluster.box.wait_state(filler, "RUNNING", timeout=30)
    return filler


def test_on_premise_full_a_job_bursts_to_a_launched_instance_which_ends_when_idle(
    clouded: Cluster, books: Books
) -> None:
    box = clouded.box
    account = clouded.new_account("10")
    before = {row["id"] for row in cloud1_instances()}
    filler = fill_on_premise(clouded, account)
    job = submit(
        box,
        "-A",
        account,
        "-p",
        f"onprem,{box_cloud.PARTITION}",
        "--gres=gpu:h100:1",
        "-t",
        "1",
        "--wrap",
        "sleep 3",
    )
    box.wait_state(job, "COMPLETED", timeout=box_cloud.RESUME_TIMEOUT_SECONDS + 60)
    [row] = sacct_runs(box, job, account)
    assert (row["Partition"], row["NodeList"]) == (box_cloud.PARTITION, "cloud1")
    [launched] = [r for r in cloud1_instances() if r["id"] not in before]
    assert launched["type"] == "p5.48xlarge"

    # Idle SuspendTime seconds: Slurm runs `gpucredit cloud suspend`, the instance ends.
    ended = wait_for(
        "the instance terminated",
        lambda: [r for r in cloud1_instances() if r["id"] == launched["id"] and r["terminated_at"]],
        box_cloud.SUSPEND_TIME_SECONDS + 120,
    )[0]
    assert ended["cost_ucredits"] == billed_launch_to_end(ended)
    wait_for("cloud1 powered down", lambda: node_state(clouded).endswith("~") or None, 60)

    box.run(["scancel", str(filler)], check=True)
    box.wait_state(filler, {"CANCELLED", "COMPLETED"}, timeout=60)
    # The job paid the cloud partition's price for its GPU-seconds, to the micro-credit.
    books.check(account, {filler: 4 * PRICES["h100"], job: CLOUD_H100})


def test_a_launch_the_provider_refuses_sends_the_job_back_charged_nothing_for_it(
    clouded: Cluster, books: Books
) -> None:
    box = clouded.box
    payer = clouded.new_account("10")  # the on-premise filler's
    account = clouded.new_account("10")  # the job's
    config = box_cloud.CONFIG.read_text()
    proxy = FaultProxy(box_cloud.ENDPOINT)
    proxy.start()
    proxy.add(Fault("RunInstances", status=500, code="InsufficientInstanceCapacity", times=1000))
    box_cloud.CONFIG.write_text(config.replace(box_cloud.ENDPOINT, proxy.url))
    try:
        filler = fill_on_premise(clouded, payer)
        job = submit(
            box,
            "-A",
            account,
            "-p",
            f"onprem,{box_cloud.PARTITION}",
            "--gres=gpu:h100:1",
            "-t",
            "1",
            "--wrap",
            "sleep 1",
        )
        reason = wait_for(
            "cloud1 DOWN with the provider's reason",
            lambda: (
                "launch failed" in (r := box.run(["sinfo", "-h", "-n", "cloud1", "-o", "%E"]).stdout) and r
            ),
            box_cloud.RESUME_TIMEOUT_SECONDS + 30,
        )
        assert reason.strip() == "gpucredit cloud: launch failed: InsufficientInstanceCapacity"
        assert "RunInstances" in proxy.actions
        box.run(["scancel", str(filler)], check=True)
        box.wait_state(job, "COMPLETED", timeout=120)
    finally:
        box_cloud.CONFIG.write_text(config)
        proxy.stop()
        box.run(["scontrol", "update", "NodeName=cloud1", "State=RESUME"])
    rows = sacct_runs(box, job, account)
    # Slurm had allocated cloud1 (the prolog held the job there) before the launch failed:
    # that start ends NODE_FAIL and is requeued; the job then runs on-premise.
    # (sacct names the failed start's partition as the pending job's list: burst,onprem.)
    assert (rows[0]["NodeList"], rows[0]["State"].split()[0]) == ("cloud1", "NODE_FAIL")
    assert [(r["Partition"], r["State"].split()[0]) for r in rows][1:] == [("onprem", "COMPLETED")]
    clouded.settled_holds(job, account, runs=2)
    books.check(payer, {filler: 4 * PRICES["h100"]})  # and the bridge has read the job's runs
    holds = sorted(clouded.holds(job, account), key=lambda h: h.run)
    assert [(h.partition, h.state, h.charged_ucredits) for h in holds] == [
        (box_cloud.PARTITION, "settled", 0),  # the failed start: charged nothing
        ("onprem", "settled", charge_for(PRICES["h100"], int(rows[1]["ElapsedRaw"]))),
    ]


def test_an_instance_the_provider_ends_under_a_job_fails_the_node_and_its_start_is_refunded(
    clouded: Cluster, books: Books
) -> None:
    """A spot interruption: the provider terminates the instance while the job runs. Its
    slurmd goes silent, Slurm marks cloud1 DOWN and the job NODE_FAIL and requeues it;
    the cloud start is refunded whole and the requeued run, on-premise, is charged alone."""
    box = clouded.box
    payer = clouded.new_account("10")  # the on-premise filler's
    account = clouded.new_account("10")  # the job's
    cloud1_ready(clouded)
    before = {row["id"] for row in cloud1_instances()}
    filler = fill_on_premise(clouded, payer)
    gate = Gate(box)
    job = submit(
        box,
        "-A",
        account,
        "-p",
        f"onprem,{box_cloud.PARTITION}",
        "--gres=gpu:h100:1",
        "-t",
        "2",
        "--wrap",
        gate.wrap,
    )
    try:
        box.wait_state(job, "RUNNING", timeout=box_cloud.RESUME_TIMEOUT_SECONDS + 60)
        [launched] = [r for r in cloud1_instances() if r["id"] not in before]
        ec2 = boto3.client(
            "ec2",
            endpoint_url=box_cloud.ENDPOINT,
            region_name=box_cloud.REGION,
            aws_access_key_id=box_cloud.CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=box_cloud.CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        ec2.terminate_instances(InstanceIds=[str(launched["id"])])  # the provider's doing, not Slurm's
        wait_for(
            "the job requeued after cloud1 failed",
            lambda: box.scontrol_job(job).get("Restarts", "0") != "0",
            120,
        )
        box.run(["scancel", str(filler)], check=True)
        box.wait_state(job, "RUNNING", timeout=120)  # the requeued run, on-premise now
        gate.open()
        box.wait_state(job, "COMPLETED", timeout=120)
    finally:
        gate.open()
        box.run(["scontrol", "update", "NodeName=cloud1", "State=POWER_DOWN_FORCE"])
    rows = sacct_runs(box, job, account)
    assert (rows[0]["NodeList"], rows[0]["State"].split()[0]) == ("cloud1", "NODE_FAIL")
    assert [(r["Partition"], r["State"].split()[0]) for r in rows][1:] == [("onprem", "COMPLETED")]
    clouded.settled_holds(job, account, runs=2)
    books.check(payer, {filler: 4 * PRICES["h100"]})  # and the bridge has read the job's runs
    holds = sorted(clouded.holds(job, account), key=lambda h: h.run)
    assert [(h.partition, h.state, h.charged_ucredits) for h in holds] == [
        (box_cloud.PARTITION, "settled", 0),  # the interrupted start: refunded whole
        ("onprem", "settled", charge_for(PRICES["h100"], int(rows[1]["ElapsedRaw"]))),
    ]
    wait_for("cloud1 powered down again", lambda: node_state(clouded).endswith("~") or None, 120)
    # The provider billed the instance from its launch to its end, and the books say so.
    [ended] = [r for r in cloud1_instances() if r["id"] == launched["id"]]
    assert ended["cost_ucredits"] == billed_launch_to_end(ended)


def test_a_job_that_names_a_region_bursts_there_at_that_partitions_price(
    clouded: Cluster, books: Books
) -> None:
    """node3 (partition `cloud`, us-east-1) is free and Slurm prefers it, but the job wants
    us-west-2: it waits on-premise, bursts to `burst` alone, and cloud1 is launched there."""
    box = clouded.box
    payer = clouded.new_account("10")
    account = clouded.new_account("10")
    cloud1_ready(clouded)
    before = {row["id"] for row in cloud1_instances()}
    filler = fill_on_premise(clouded, payer)
    job = submit(
        box,
        "-A",
        account,
        "--gres=gpu:h100:1",
        "-t",
        "1",
        f"--comment=gpucredit:cloud=yes,region={box_cloud.REGION}",
        "--wrap",
        "sleep 3",
    )
    assert box.scontrol_job(job)["Comment"].strip() == (
        "gpucredit: routed to onprem, then burst after 5 s (cloud allowed, region us-west-2): "
        "onprem ~0.06 allowed, burst ~0.08 allowed, cloud ~0.09 in us-east-1, not us-west-2"
    )
    box.wait_state(job, "COMPLETED", timeout=box_cloud.RESUME_TIMEOUT_SECONDS + 60)
    [row] = sacct_runs(box, job, account)
    assert (row["Partition"], row["NodeList"]) == (box_cloud.PARTITION, "cloud1")
    [launched] = [r for r in cloud1_instances() if r["id"] not in before]
    assert (launched["region"], launched["type"]) == (box_cloud.REGION, "p5.48xlarge")
    box.run(["scancel", str(filler)], check=True)
    box.wait_state(filler, {"CANCELLED", "COMPLETED"}, timeout=60)
    books.check(payer, {filler: 4 * PRICES["h100"]})
    books.check(account, {job: CLOUD_H100})  # 4.80 an h100-hour in burst, not cloud's 5.40
