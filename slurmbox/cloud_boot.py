"""The box's stand-in for a cloud instance booting: the provider runs an instance, so its
node's slurmd starts; the provider ends it, so the slurmd stops.

On a real site the instance boots the image and its user_data starts `slurmd -N NODE`
there. On one host (docs/slurm-facts.md §8: several slurmd, each `-N` its node, each
its own Port=) the box runs `CloudBoot` as one more supervised daemon: every tick it
lists this cluster's instances at the provider (moto's server, the same API) and starts
the node's slurmd once an instance has been running `boot_delay_seconds` (a GPU
instance's boot, shortened), and stops it once no live instance has that node. So
Slurm sees what it sees on a site: a node powered up by ResumeProgram that registers
some seconds later, and a node whose instance ended (suspended, or a spot interruption)
gone silent.

`plan_boot` is the decision, pure; `CloudBoot.tick` the I/O around it, every
collaborator injectable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from accounting_bridge.cloud.provider import Instance

__all__ = ["BootPlan", "CloudBoot", "plan_boot"]

H = TypeVar("H")  # a started slurmd: a Popen on the box, anything in the tests


@dataclass(frozen=True)
class BootPlan:
    start: list[str]  # nodes whose instance has booted, with no slurmd yet
    stop: list[str]  # nodes with a slurmd and no live instance


def plan_boot(
    instances: Iterable[Instance], running: Iterable[str], now: datetime, boot_delay_seconds: float
) -> BootPlan:
    """| a live instance for the node          | its slurmd | act   |
    |--------------------------------------|------------|-------|
    | launched boot_delay_seconds ago      | none       | start |
    | launched less long ago               | none       | wait  |
    | none (ended, or never launched)      | running    | stop  |
    """
    booted: set[str] = set()
    live: set[str] = set()
    for instance in instances:
        if instance.node is None or not instance.live:
            continue
        live.add(instance.node)
        if instance.launched_at + timedelta(seconds=boot_delay_seconds) <= now:
            booted.add(instance.node)
    up = set(running)
    return BootPlan(sorted(booted - up), sorted(up - live))


@dataclass
class CloudBoot(Generic[H]):
    instances: Callable[[], list[Instance]]
    start: Callable[[str], H]  # the node's slurmd, started
    stop: Callable[[H], None]
    clock: Callable[[], datetime]
    boot_delay_seconds: float
    slurmd: dict[str, H] = field(default_factory=dict)

    def tick(self) -> BootPlan:
        plan = plan_boot(self.instances(), self.slurmd, self.clock(), self.boot_delay_seconds)
        for node in plan.stop:
            self.stop(self.slurmd.pop(node))
        for node in plan.start:
            self.slurmd[node] = self.start(node)
        return plan

    def running(self) -> Mapping[str, H]:
        return dict(self.slurmd)
