"""Slurm's power-saving programs and the leak sweep, each one act on a hostlist.

slurmctld runs `ResumeProgram HOSTLIST` to power nodes up, `SuspendProgram HOSTLIST`
to power idle ones down (after SuspendTime), and `ResumeFailProgram HOSTLIST` for nodes
that did not come up within ResumeTimeout (it has marked them DOWN and requeued their
jobs by then). Each exits 0 when everything it was asked is done, 1 otherwise, and says
one line per node on stdout.

    resume        a live instance of the node already: nothing (Slurm may ask twice);
                  else RunInstances, journalled. A launch the provider refuses or fails
                  (capacity, throttling, 5xx, unreachable: botocore's own retries of
                  `cloud.launch_attempts` spent) marks the node DOWN with the reason, so
                  slurmctld requeues its job at once (on-prem, or later) instead of after
                  ResumeTimeout; the job is never started there, so never charged.
    suspend       TerminateInstances of the nodes' live instances, retried with backoff
                  (`cloud.terminate_attempts`) while the API is unreachable or failing.
                  Past the last try it exits 1 and the instance stays on the provider's
                  list, where `reconcile` (a timer) finds it: never a leak.
    resume-fail   as suspend: an instance that boots after the timeout is a leak.
    reconcile     plan.plan_reconcile's verdicts, terminated and reported with their cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from accounting_bridge.cloud.config import CloudConfig, CloudConfigError
from accounting_bridge.cloud.journal import Journal
from accounting_bridge.cloud.plan import (
    InstanceRow,
    Termination,
    instance_rows,
    plan_reconcile,
    slurm_node_states,
)
from accounting_bridge.cloud.provider import Ec2Provider, Instance, ProviderError, retrying
from accounting_bridge.slurm.slurmcmd import Runner, SlurmCommandError
from slurmtext import parse_format_rows

__all__ = ["SINFO_NODE_STATES", "CloudPrograms", "ReconcileResult"]

SINFO_NODE_STATES = ("sinfo", "--all", "--noheader", "--Node", "--Format=NodeList:|,StateComplete:|")
REASON_PREFIX = "gpucredit cloud"

T = TypeVar("T")


@dataclass(frozen=True)
class ReconcileResult:
    terminated: list[Termination]
    rows: dict[str, InstanceRow]  # the ended instances' bill rows, by id
    failed: str | None  # the provider's error when the termination could not be made


class CloudPrograms:
    """No I/O until an act runs; every collaborator injectable."""

    def __init__(
        self,
        config: CloudConfig,
        provider: Ec2Provider,
        journal: Journal,
        slurm: Runner,
        *,
        clock: Callable[[], datetime],
        sleep: Callable[[float], None],
        say: Callable[[str], None],
    ) -> None:
        self.config = config
        self.provider = provider
        self.journal = journal
        self.slurm = slurm
        self.clock = clock
        self.sleep = sleep
        self.say = say

    def resume(self, nodes: Sequence[str]) -> int:
        try:
            running = {i.node: i for i in self.provider.instances(nodes) if i.live}
        except ProviderError as error:
            return self._launch_failed(list(nodes), error.code)
        failed: dict[str, list[str]] = {}
        for node in nodes:
            if node in running:
                self.say(f"{node}: {running[node].id} already {running[node].state}")
                continue
            try:
                instance = self.provider.launch(node)
            except CloudConfigError as error:
                self.say(f"{node}: not launched: {error}")
                failed.setdefault("config", []).append(node)
                continue
            except ProviderError as error:
                self.say(f"{node}: launch failed: {error}")
                failed.setdefault(error.code, []).append(node)
                continue
            self.journal.launched(instance)
            self.say(f"{node}: launched {instance.id} ({instance.instance_type}) in {instance.region}")
        codes = [self._launch_failed(down, code) for code, down in failed.items()]
        return 1 if codes else 0

    def _launch_failed(self, nodes: list[str], code: str) -> int:
        """DOWN with the reason: slurmctld requeues the nodes' jobs now."""
        argv = [
            "scontrol",
            "update",
            f"NodeName={','.join(nodes)}",
            "State=DOWN",
            f"Reason={REASON_PREFIX}: launch failed: {code}",
        ]
        try:
            self.slurm(argv)
        except SlurmCommandError as error:
            self.say(f"{','.join(nodes)}: could not mark DOWN (ResumeTimeout will): {error}")
        else:
            self.say(f"{','.join(nodes)}: DOWN ({code})")
        return 1

    def suspend(self, nodes: Sequence[str], by: str = "suspend") -> int:
        try:
            live = [i for i in self._retrying(lambda: self.provider.instances(nodes)) if i.live]
            self._retrying(lambda: self.provider.terminate(live))
        except ProviderError as error:
            self.say(
                f"{','.join(nodes)}: not terminated, {error}; `gpucredit cloud reconcile` ends what is left"
            )
            return 1
        at = self.clock()
        for instance in live:
            self.journal.terminated(instance, at, by)
            self.say(f"{instance.node}: terminated {instance.id}")
        for node in sorted(set(nodes) - {i.node for i in live}):
            self.say(f"{node}: no instance")
        return 0

    def resume_fail(self, nodes: Sequence[str]) -> int:
        return self.suspend(nodes, by="resume-fail")

    def rows(self) -> list[InstanceRow]:
        return instance_rows(
            self.provider.instances(), self.journal.entries(), self.config.price_of, self.clock()
        )

    def reconcile(self, *, dry_run: bool = False) -> ReconcileResult:
        states = slurm_node_states(
            parse_format_rows(self.slurm(list(SINFO_NODE_STATES)), ("NodeList", "StateComplete"))
        )
        plan = plan_reconcile(self._retrying(self.provider.instances), states)
        failed: str | None = None
        if plan and not dry_run:
            try:
                self._retrying(lambda: self.provider.terminate([t.instance for t in plan]))
            except ProviderError as error:
                failed = str(error)
            else:
                at = self.clock()
                for termination in plan:
                    self.journal.terminated(termination.instance, at, f"reconcile:{termination.reason}")
        ended: list[Instance] = [t.instance for t in plan]
        now = self.clock()
        rows = instance_rows(ended, self.journal.entries(), self.config.price_of, now)
        return ReconcileResult(plan, {row.id: row for row in rows if row.id in {i.id for i in ended}}, failed)

    def _retrying(self, call: Callable[[], T]) -> T:
        def note(attempt: int, error: ProviderError, wait: float) -> None:
            self.say(f"try {attempt} of {self.config.terminate_attempts}: {error}; again in {wait:g} s")

        return retrying(
            call,
            attempts=self.config.terminate_attempts,
            backoff_seconds=self.config.terminate_backoff_seconds,
            sleep=self.sleep,
            on_retry=note,
        )
