"""Slurm's power-saving programs against a real EC2 API (moto's server), its faults
injected by the fault proxy in front of it (tests/cloud/conftest.py)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import timedelta

from accounting_bridge.cloud.provider import NODE_TAG
from accounting_bridge.slurm.slurmcmd import FakeResponse
from ledger.api import charge_for
from slurmbox.provider_faults import Fault, FaultProxy
from tests.support.cloud import PRICE_UCREDITS_PER_HOUR, Rig

SINFO = ("sinfo", "--all", "--noheader", "--Node", "--Format=NodeList:|,StateComplete:|")


def down_argv(nodes: str, code: str) -> tuple[str, ...]:
    return (
        "scontrol",
        "update",
        f"NodeName={nodes}",
        "State=DOWN",
        f"Reason=gpucredit cloud: launch failed: {code}",
    )


def test_resume_launches_one_tagged_instance_per_node_once(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    assert rig.programs.resume(["cloud1", "cloud2"]) == 0
    instances = rig.programs.provider.instances()
    assert sorted((i.node or "", i.instance_type, i.state) for i in instances) == [
        ("cloud1", "p5.48xlarge", "running"),
        ("cloud2", "p5.48xlarge", "running"),
    ]
    by_node = {i.node: i for i in instances}
    assert rig.said == [
        f"cloud1: launched {by_node['cloud1'].id} (p5.48xlarge) in us-east-1",
        f"cloud2: launched {by_node['cloud2'].id} (p5.48xlarge) in us-east-1",
    ]
    # Slurm may run ResumeProgram for a node again: no second instance.
    rig.said.clear()
    assert rig.programs.resume(["cloud1"]) == 0
    assert len(rig.programs.provider.instances()) == 2
    assert rig.said[0].startswith(f"cloud1: {by_node['cloud1'].id} already ")
    assert set(rig.programs.journal.entries()) == {by_node["cloud1"].id, by_node["cloud2"].id}


def test_instances_cost_from_launch_to_termination_in_micro_credits(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    assert rig.programs.resume(["cloud1"]) == 0
    (instance,) = rig.programs.provider.instances()
    rig.at(instance.launched_at + timedelta(seconds=1000))
    (row,) = rig.programs.rows()
    # 98.32 credits an hour for 1000 s: 27.311111 (rounded once, half up), never a float.
    assert row.cost_ucredits == charge_for(PRICE_UCREDITS_PER_HOUR, 1000) == 27_311_111
    assert (row.state, row.terminated_at) == ("running", None)

    assert rig.programs.suspend(["cloud1"]) == 0
    assert rig.said[-1] == f"cloud1: terminated {instance.id}"
    rig.at(instance.launched_at + timedelta(seconds=5000))  # later: the bill stops at the end
    (row,) = rig.programs.rows()
    assert row.as_dict() == {
        "id": instance.id,
        "node": "cloud1",
        "type": "p5.48xlarge",
        "region": "us-east-1",
        "state": "terminated",
        "launched_at": instance.launched_at.isoformat(),
        "terminated_at": (instance.launched_at + timedelta(seconds=1000)).isoformat(),
        "cost_ucredits": 27_311_111,
    }


def test_a_launch_refused_for_capacity_marks_the_node_down_with_the_reason(
    make_rig: Callable[..., Rig], proxy: FaultProxy
) -> None:
    rig = make_rig()
    proxy.add(Fault("RunInstances", status=500, code="InsufficientInstanceCapacity"))
    rig.slurm.add(down_argv("cloud1", "InsufficientInstanceCapacity"))
    assert rig.programs.resume(["cloud1"]) == 1
    assert rig.said == [
        "cloud1: launch failed: InsufficientInstanceCapacity: injected by gpucredit's fault proxy",
        "cloud1: DOWN (InsufficientInstanceCapacity)",
    ]
    assert rig.slurm.calls == [down_argv("cloud1", "InsufficientInstanceCapacity")]
    assert rig.programs.provider.instances() == []
    assert rig.programs.journal.entries() == {}


def test_throttling_and_5xx_fail_the_launch_once_botocore_retries_are_spent(
    make_rig: Callable[..., Rig], proxy: FaultProxy
) -> None:
    rig = make_rig()
    proxy.add(Fault("RunInstances", status=503, code="RequestLimitExceeded"))
    proxy.add(Fault("RunInstances", status=500, code="InternalError"))
    rig.slurm.add(down_argv("cloud1", "RequestLimitExceeded"))
    rig.slurm.add(down_argv("cloud2", "InternalError"))
    assert rig.programs.resume(["cloud1", "cloud2"]) == 1
    assert rig.slurm.calls == [
        down_argv("cloud1", "RequestLimitExceeded"),
        down_argv("cloud2", "InternalError"),
    ]
    assert rig.programs.provider.instances() == []


def test_one_throttled_call_is_retried_by_botocore_and_launches_once(
    make_rig: Callable[..., Rig], proxy: FaultProxy
) -> None:
    rig = make_rig(launch_attempts=2)
    proxy.add(Fault("RunInstances", status=503, code="RequestLimitExceeded"))
    assert rig.programs.resume(["cloud1"]) == 0
    assert proxy.actions.count("RunInstances") == 2
    assert [i.node for i in rig.programs.provider.instances()] == ["cloud1"]


def test_a_provider_that_cannot_list_fails_every_node_of_the_resume(
    make_rig: Callable[..., Rig], proxy: FaultProxy
) -> None:
    rig = make_rig()
    proxy.add(Fault("DescribeInstances", drop=True))
    rig.slurm.add(down_argv("cloud1,cloud2", "unreachable"))
    assert rig.programs.resume(["cloud1", "cloud2"]) == 1
    assert rig.slurm.calls == [down_argv("cloud1,cloud2", "unreachable")]


def test_suspend_retries_with_backoff_while_the_api_is_unreachable(
    make_rig: Callable[..., Rig], proxy: FaultProxy
) -> None:
    rig = make_rig()
    assert rig.programs.resume(["cloud1"]) == 0
    proxy.add(Fault("TerminateInstances", drop=True, times=2))
    proxy.add(Fault("TerminateInstances", status=503, code="RequestLimitExceeded"))
    assert rig.programs.suspend(["cloud1"]) == 0
    assert rig.waits == [1.0, 2.0, 4.0]
    assert [line.split(":")[0] for line in rig.said[1:4]] == ["try 1 of 4", "try 2 of 4", "try 3 of 4"]
    (instance,) = rig.programs.provider.instances()
    assert instance.state in ("shutting-down", "terminated")


def test_suspend_past_its_last_try_says_so_and_reconcile_ends_the_instance(
    make_rig: Callable[..., Rig], proxy: FaultProxy
) -> None:
    rig = make_rig()
    assert rig.programs.resume(["cloud1"]) == 0
    (instance,) = rig.programs.provider.instances()
    proxy.add(Fault(None, drop=True, times=4))  # every call of the suspend: no answer
    assert rig.programs.suspend(["cloud1"]) == 1
    assert rig.waits == [1.0, 2.0, 4.0]
    assert rig.said[-1].startswith("cloud1: not terminated, unreachable: ")
    assert rig.said[-1].endswith("; `gpucredit cloud reconcile` ends what is left")
    assert [i.state for i in rig.programs.provider.instances()] == ["running"]

    # Slurm powered the node down regardless; the sweep finds the instance it still runs.
    rig.slurm.add(SINFO, "cloud1|idle+cloud+powered_down|\n")
    rig.at(instance.launched_at + timedelta(seconds=3600))
    result = rig.programs.reconcile()
    assert [(t.instance.id, t.reason) for t in result.terminated] == [(instance.id, "node_powered_down")]
    assert result.failed is None
    assert result.rows[instance.id].cost_ucredits == PRICE_UCREDITS_PER_HOUR
    assert rig.programs.provider.instances()[0].state in ("shutting-down", "terminated")
    assert rig.programs.journal.entries()[instance.id].ended_by == "reconcile:node_powered_down"


def test_reconcile_ends_what_slurm_does_not_know_and_keeps_the_rest(
    make_rig: Callable[..., Rig], proxy: FaultProxy
) -> None:
    rig = make_rig(nodes={"cloud[1-4]": "h100"})
    assert rig.programs.resume(["cloud1", "cloud2", "cloud3"]) == 0
    by_node = {i.node: i for i in rig.programs.provider.instances()}
    # A launch the journal never saw (a crash between RunInstances and the write), for a
    # node Slurm no longer has: the provider still bills it.
    client = rig.programs.provider._ec2("us-east-1", 1)
    client.run_instances(
        ImageId="ami-12c6146b",
        InstanceType="p5.48xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [{"Key": NODE_TAG, "Value": "gone7"}, {"Key": "gpucredit:cluster", "Value": "lab"}],
            }
        ],
    )
    # Another cluster's instance: not ours to end.
    client.run_instances(
        ImageId="ami-12c6146b",
        InstanceType="p5.48xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": "gpucredit:cluster", "Value": "other"}]}
        ],
    )
    leaked = next(i for i in rig.programs.provider.instances() if i.node == "gone7")
    rig.slurm.add(
        SINFO,
        "cloud1|mixed+cloud|\ncloud2|idle+cloud+powering_up|\ncloud3|idle+cloud+powered_down|\n"
        "cloud4|idle+cloud+powered_down|\nnode1|idle|\n",
    )
    result = rig.programs.reconcile()
    assert sorted((t.instance.id, t.reason) for t in result.terminated) == sorted(
        [(by_node["cloud3"].id, "node_powered_down"), (leaked.id, "unknown_node")]
    )
    states = {i.id: i.state for i in rig.programs.provider.instances()}
    assert states[by_node["cloud1"].id] == states[by_node["cloud2"].id] == "running"
    assert states[leaked.id] in ("shutting-down", "terminated")
    assert len(states) == 4  # the other cluster's is not even listed


def test_reconcile_dry_run_terminates_nothing(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    assert rig.programs.resume(["cloud1"]) == 0
    rig.slurm.add(SINFO, "cloud1|idle+cloud+powered_down|\n")
    result = rig.programs.reconcile(dry_run=True)
    assert [t.reason for t in result.terminated] == ["node_powered_down"]
    assert [i.state for i in rig.programs.provider.instances()] == ["running"]


def test_resume_fail_terminates_an_instance_that_came_up_too_late(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    assert rig.programs.resume(["cloud1"]) == 0
    assert rig.programs.resume_fail(["cloud1", "cloud2"]) == 0
    (instance,) = rig.programs.provider.instances()
    assert rig.said[-2:] == [f"cloud1: terminated {instance.id}", "cloud2: no instance"]
    assert rig.programs.journal.entries()[instance.id].ended_by == "resume-fail"


def test_a_failed_down_marking_is_said_and_still_fails_the_resume(
    make_rig: Callable[..., Rig], proxy: FaultProxy
) -> None:
    rig = make_rig()
    proxy.add(Fault("RunInstances", status=500, code="InsufficientInstanceCapacity"))
    rig.slurm.add(
        down_argv("cloud1", "InsufficientInstanceCapacity"), FakeResponse(returncode=1, stderr="no")
    )
    assert rig.programs.resume(["cloud1"]) == 1
    assert rig.said[-1].startswith("cloud1: could not mark DOWN (ResumeTimeout will): ")


def test_user_data_names_the_node_the_instance_boots_as(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(user_data="#!/bin/sh\nexec slurmd -N @node@\n")
    assert rig.programs.resume(["cloud2"]) == 0
    (instance,) = rig.programs.provider.instances()
    client = rig.programs.provider._ec2("us-east-1", 1)
    answer = client.describe_instance_attribute(InstanceId=instance.id, Attribute="userData")
    assert base64.b64decode(answer["UserData"]["Value"]) == b"#!/bin/sh\nexec slurmd -N cloud2\n"


WEST_PRICE = 90_000_000  # p5.48xlarge in us-west-2 here: 90.00 credits an hour
WEST = {
    "nodes": "cloud2",
    "image_id": "ami-12c6146b",
    "prices_ucredits_per_hour": {"p5.48xlarge": WEST_PRICE},
}


def test_a_node_of_another_region_launches_ends_and_is_priced_there(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(regions={"us-west-2": WEST})
    assert rig.programs.resume(["cloud1", "cloud2"]) == 0
    by_node = {i.node: i for i in rig.programs.provider.instances()}
    assert {node: i.region for node, i in by_node.items()} == {"cloud1": "us-east-1", "cloud2": "us-west-2"}
    # The provider's own view, region by region: cloud2's instance is in us-west-2 alone.
    for region, node in (("us-east-1", "cloud1"), ("us-west-2", "cloud2")):
        listed = rig.programs.provider._ec2(region, 1).describe_instances()["Reservations"]
        assert [i["InstanceId"] for r in listed for i in r["Instances"]] == [by_node[node].id]
    assert rig.said[1] == f"cloud2: launched {by_node['cloud2'].id} (p5.48xlarge) in us-west-2"
    assert [i.region for i in rig.programs.provider.instances(["cloud2"])] == ["us-west-2"]

    rig.at(by_node["cloud2"].launched_at + timedelta(seconds=1000))
    assert rig.programs.suspend(["cloud1", "cloud2"]) == 0
    assert {i.node: i.state for i in rig.programs.provider.instances()} == {
        "cloud1": "terminated",
        "cloud2": "terminated",
    }
    rows = {row.node: row for row in rig.programs.rows()}
    assert (rows["cloud2"].region, rows["cloud2"].cost_ucredits) == (
        "us-west-2",
        charge_for(WEST_PRICE, 1000),
    )
    up = rig.now[0] - by_node["cloud1"].launched_at  # launched a moment before cloud2
    assert rows["cloud1"].cost_ucredits == charge_for(PRICE_UCREDITS_PER_HOUR, int(up.total_seconds()))
    assert rig.programs.journal.entries()[by_node["cloud2"].id].region == "us-west-2"


def test_reconcile_looks_in_every_region(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(regions={"us-west-2": WEST})
    assert rig.programs.resume(["cloud2"]) == 0
    rig.slurm.add(SINFO, "cloud1|idle+cloud+powered_down|\ncloud2|idle+cloud+powered_down|\n")
    result = rig.programs.reconcile()
    assert [(t.instance.node, t.instance.region, t.reason) for t in result.terminated] == [
        ("cloud2", "us-west-2", "node_powered_down")
    ]
    assert [i.state for i in rig.programs.provider.instances()] == ["terminated"]
