"""The box's boot stand-in (slurmbox/cloud_boot.py): a node's slurmd follows its
instance at the provider (moto's server), after the boot delay."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from accounting_bridge.cloud.provider import Instance
from slurmbox.cloud_boot import CloudBoot, plan_boot
from tests.support.cloud import Rig

T0 = datetime(2026, 12, 3, 20, 0, tzinfo=UTC)


def instance(node: str | None, state: str = "running", seconds: int = 0) -> Instance:
    return Instance(
        f"i-{node}-{state}", node, "p5.48xlarge", "us-east-1", state, T0 + timedelta(seconds=seconds)
    )


def test_the_decision_table() -> None:
    plan = plan_boot(
        [
            instance("cloud1"),  # booted: start
            instance("cloud2", seconds=25),  # still booting: wait
            instance("cloud3", state="terminated"),  # ended, slurmd up: stop
            instance("cloud4"),  # booted, slurmd up already: nothing
            instance(None),  # not a node's
        ],
        running=["cloud3", "cloud4", "cloud5"],  # cloud5: no instance at all: stop
        now=T0 + timedelta(seconds=30),
        boot_delay_seconds=10,
    )
    assert (plan.start, plan.stop) == (["cloud1"], ["cloud3", "cloud5"])


def test_slurmd_follows_the_instance_at_the_provider(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    events: list[str] = []

    def start(node: str) -> str:
        events.append(f"start {node}")
        return f"slurmd-{node}"

    boot: CloudBoot[str] = CloudBoot(
        instances=rig.programs.provider.instances,
        start=start,
        stop=lambda handle: events.append(f"stop {handle}"),
        clock=lambda: rig.now[0],
        boot_delay_seconds=5,
    )
    assert rig.programs.resume(["cloud1"]) == 0
    (launched,) = rig.programs.provider.instances()
    rig.at(launched.launched_at + timedelta(seconds=4))
    boot.tick()
    assert events == []  # still booting
    rig.at(launched.launched_at + timedelta(seconds=5))
    boot.tick()
    boot.tick()
    assert events == ["start cloud1"]
    assert rig.programs.suspend(["cloud1"]) == 0
    boot.tick()
    assert events == ["start cloud1", "stop slurmd-cloud1"]
    assert boot.running() == {}
