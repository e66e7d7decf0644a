"""`gpucredit agent`: one per node; NVML samples become per-job-run GPU metrics.

Each tick samples every GPU unit (a whole GPU or a MIG instance,
:func:`accounting_bridge.nvml.sampler.sample_node`), reads which job run owns which unit
from the registry files the node Prolog wrote (``agent.spool_dir``, ``%n`` = the node
name), and charges the time since the previous tick to the owners
(:class:`~accounting_bridge.nvml.sampler.UsageAccumulator`). A unit nobody owns is
charged to nobody. Then it adds what changed to the ledger's ``gpu_usage``
(:func:`ledger.api.add_gpu_usage`): metrics, never charges. On a GPU node it sends them,
signed with MUNGE, to the controller's daemon (``agent.send_to``, channel.py), so the node
holds no ledger credentials; without ``send_to`` it writes the database itself (one host).

Why increments of cumulative integers: the accumulator keeps float totals per job
run and GPU type; the agent sends ``int(total) - already sent`` (rounded half-up
once, on the total, so a run's busy seconds never drift by a rounding per tick).
The database adds increments, so an agent restart loses at most one unsent
interval, never the stored totals; a failed write is retried whole next tick. A batch
sent whose answer was lost is first settled (its very credential resent: channel.py),
so it is never counted twice.
A finished run (its registry file gone) leaves memory once it is fully sent.

The first tick after start charges one nominal interval: the sample stands for the
interval before it, as every later sample does.
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import click
from sqlalchemy.orm import Session

from accounting_bridge.nvml.channel import MungeSender, NotSent, Unsure, parse_address
from accounting_bridge.nvml.nvml_fake import FakeGpu, FakeNvml
from accounting_bridge.nvml.sampler import GpuRegistry, GpuUsage, JobRunKey, UsageAccumulator, sample_node
from ledger.api import UsageDelta, add_gpu_usage

__all__ = ["Agent", "AgentTick", "agent_command", "fake_nvml_from_spec"]

log = logging.getLogger(__name__)

Sessions = Callable[[], AbstractContextManager[Session]]
# GPUs one --fake-nvml spec may describe: a node has a handful; more is a typo.
MAX_FAKE_GPUS = 64
_FAKE_PART = re.compile(r"^(?P<type>[A-Za-z0-9_.\-]+):(?P<count>\d+)(?:@(?P<util>\d+))?$")


@dataclass
class AgentTick:
    interval_seconds: float
    units: int = 0
    charged_units: int = 0
    job_runs: int = 0
    rows_written: int = 0
    finished_runs: int = 0
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "interval_seconds": round(self.interval_seconds, 3),
            "units": self.units,
            "charged_units": self.charged_units,
            "job_runs": self.job_runs,
            "rows_written": self.rows_written,
            "finished_runs": self.finished_runs,
            "problems": len(self.problems),
        }


def _run_name(key: JobRunKey) -> str:
    return f"{key.cluster}/{key.job_id}/{key.run}"


def _half_up(value: float) -> int:
    return int(value + 0.5)


def _totals(usage: GpuUsage) -> tuple[int, int, int, int]:
    return (
        _half_up(usage.allocated_gpu_seconds),
        _half_up(usage.busy_gpu_seconds),
        _half_up(usage.energy_joules),
        usage.peak_memory_bytes,
    )


class Agent:
    """Samples one node. No I/O until `tick`; NVML (initialised by the caller), clock, database injected."""

    def __init__(
        self,
        *,
        node: str,
        nvml: Any,
        registry: GpuRegistry,
        sessions: Sessions | None = None,
        sender: MungeSender | None = None,
        interval_seconds: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Writes through `sessions` (the database) or `sender` (MUNGE to the controller)."""
        if interval_seconds <= 0:
            raise ValueError(f"interval_seconds must be positive, got {interval_seconds}")
        if (sessions is None) == (sender is None):
            raise ValueError("an agent writes through sessions or a sender, one of them")
        self.node = node
        self.nvml = nvml
        self.registry = registry
        self.sessions = sessions
        self.sender = sender
        self.interval_seconds = interval_seconds
        self.monotonic = monotonic
        self.accumulator = UsageAccumulator()
        self._sent: dict[tuple[JobRunKey, str], tuple[int, int, int, int]] = {}
        # The totals a batch sent without an answer would bring `_sent` to (sender only).
        self._unsure: dict[tuple[JobRunKey, str], tuple[int, int, int, int]] | None = None
        self._last_tick: float | None = None

    def tick(self) -> AgentTick:
        """Sample, attribute, and send what changed. Database errors propagate (retry next tick)."""
        now = self.monotonic()
        interval = self.interval_seconds if self._last_tick is None else now - self._last_tick
        self._last_tick = now
        report = AgentTick(interval_seconds=interval)
        sample = sample_node(self.nvml)
        snapshot = self.registry.load()
        owners, conflicts = snapshot.owners()
        report.units = len(sample.units)
        report.charged_units = self.accumulator.add(sample, owners, interval)
        report.problems += [f"registry {e.path}: {e.reason}" for e in snapshot.errors]
        report.problems += [
            f"GPU unit {index} claimed by {', '.join(_run_name(k) for k in keys)}: charged to nobody"
            for index, keys in sorted(conflicts.items())
        ]
        report.problems += [f"GPU {f.gpu_index}: NVML error {f.code}: {f.message}" for f in sample.failures]
        live = {a.key for a in snapshot.assignments}
        report.job_runs = len(self.accumulator.usage)
        report.rows_written = self._send()
        for key in [k for k in self.accumulator.usage if k not in live]:
            self.accumulator.pop(key)
            for gres_key in [g for g in self._sent if g[0] == key]:
                del self._sent[gres_key]
            report.finished_runs += 1
        return report

    def _send(self) -> int:
        if self._unsure is not None and self.sender is not None:
            # Learn whether the last batch was written before sending its rows again.
            if self.sender.settle():  # NotSent: still unknown, the next tick asks again
                self._sent.update(self._unsure)
            self._unsure = None
        deltas: list[UsageDelta] = []
        totals: dict[tuple[JobRunKey, str], tuple[int, int, int, int]] = {}
        for key, by_gres in self.accumulator.usage.items():
            for gres, usage in by_gres.items():
                total = totals[(key, gres)] = _totals(usage)
                sent = self._sent.get((key, gres), (0, 0, 0, 0))
                if total == sent:
                    continue
                deltas.append(
                    UsageDelta(
                        cluster=key.cluster,
                        job_id=key.job_id,
                        run=key.run,
                        node=self.node,
                        gres=gres,
                        allocated_gpu_seconds=total[0] - sent[0],
                        busy_gpu_seconds=total[1] - sent[1],
                        energy_joules=total[2] - sent[2],
                        peak_memory_bytes=total[3],
                    )
                )
        if deltas and self.sender is not None:
            try:
                self.sender.send(deltas)
            except Unsure:
                self._unsure = totals
                raise
        elif deltas and self.sessions is not None:
            with self.sessions() as s:
                add_gpu_usage(s, deltas)
        self._sent.update(totals)  # only after the write committed
        return len(deltas)

    def run(self, *, ticks: int | None = None, stop: threading.Event | None = None) -> None:
        """Tick every interval (forever when `ticks` is None) until `stop` is set, then once
        more, so the GPU-seconds sampled since the last write are not lost; failures are
        logged and retried."""
        stop = stop or threading.Event()
        done = 0
        while ticks is None or done < ticks:
            started = self.monotonic()
            self._logged_tick()
            done += 1
            if ticks is not None and done >= ticks:
                return
            if stop.wait(max(0.0, self.interval_seconds - (self.monotonic() - started))):
                self._logged_tick()
                return

    def _logged_tick(self) -> None:
        from sqlalchemy.exc import SQLAlchemyError

        try:
            report = self.tick()
        except SQLAlchemyError as exc:  # the ledger is down: totals stay in memory, sent later
            log.error("agent %s: could not write gpu_usage: %s", self.node, exc)
        except (NotSent, Unsure) as exc:  # the controller is unreachable: sent later
            log.error("agent %s: GPU usage not sent: %s", self.node, exc)
        except self.nvml.NVMLError as exc:  # driver trouble; the next tick samples again
            log.error("agent %s: NVML: %s", self.node, exc)
        else:
            for problem in report.problems:
                log.warning("agent %s: %s", self.node, problem)
            log.debug("agent %s tick: %s", self.node, report.as_dict())


def fake_nvml_from_spec(spec: str, node: str = "node") -> FakeNvml:
    """`TYPE:COUNT[@UTIL%][,...]`, e.g. `a100:2,h100:2@75`: GPUs in NVML order, for GPU-less hosts."""
    gpus: list[FakeGpu] = []
    for part in spec.split(","):
        match = _FAKE_PART.match(part.strip())
        if match is None:
            raise ValueError(f"bad fake GPU spec {part!r}: expected TYPE:COUNT[@UTIL%]")
        utilization = int(match["util"] or 0)
        if utilization > 100:
            raise ValueError(f"utilisation {utilization}% in {part!r} is over 100")
        for _ in range(int(match["count"])):
            gpus.append(
                FakeGpu(
                    uuid=f"GPU-fake-{node}-{len(gpus)}",
                    name=f"Fake {match['type'].upper()}",
                    utilization_gpu_percent=utilization,
                )
            )
    if not gpus or len(gpus) > MAX_FAKE_GPUS:
        raise ValueError(f"a fake node has 1..{MAX_FAKE_GPUS} GPUs, spec {spec!r} gives {len(gpus)}")
    return FakeNvml(gpus)


@click.command("agent")
@click.option("--node", default=None, help="This node's Slurm name (default: the short host name).")
@click.option(
    "--interval",
    "interval_seconds",
    type=click.FloatRange(min=0.1),
    default=None,
    metavar="S",
    help="Seconds between samples (default: agent.interval_seconds, 10).",
)
@click.option("--once", is_flag=True, help="Sample once (charging one interval), write, print, exit.")
@click.option(
    "--fake-nvml",
    "fake_spec",
    default=None,
    metavar="SPEC",
    help="Fake GPUs instead of NVML: TYPE:COUNT[@UTIL%][,...], e.g. a100:2,h100:2@75.",
)
def agent_command(
    node: str | None, interval_seconds: float | None, once: bool, fake_spec: str | None
) -> None:
    """Node GPU sampler: busy GPU-seconds per job run into the ledger's gpu_usage."""
    import json

    from ledger.config import load_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_config()
    node = node or socket.gethostname().split(".")[0]
    writes = _writer(config, node)
    if fake_spec is not None:
        try:
            nvml: Any = fake_nvml_from_spec(fake_spec, node)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--fake-nvml") from None
    else:
        from accounting_bridge.nvml.sampler import import_pynvml

        # Without the nvml extra this is ModuleNotFoundError: the CLI root says which
        # extra in one line and exits 78, which the unit does not restart.
        nvml = import_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise click.ClickException(f"NVML: {exc}") from None
    spool_dir = str(config["agent"]["spool_dir"]).replace("%n", node)
    agent = Agent(
        node=node,
        nvml=nvml,
        registry=GpuRegistry(spool_dir),
        **writes,
        interval_seconds=interval_seconds or float(config["agent"]["interval_seconds"]),
    )
    try:
        if once:
            try:
                report = agent.tick()
            except NotSent as exc:  # one line, like every other refusal; the loop logs it instead
                click.echo(f"error: GPU usage not sent: {exc}", err=True)
                sys.exit(1)
            except Unsure as exc:
                click.echo(f"error: GPU usage sent, but not confirmed (it may be written): {exc}", err=True)
                sys.exit(1)
            click.echo(json.dumps(report.as_dict()))
            for problem in report.problems:
                click.echo(f"warning: {problem}", err=True)
        else:
            stop = threading.Event()
            # systemd's stop (SIGTERM) and ^C: finish with a last write, shut NVML down.
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda _signum, _frame: stop.set())
            agent.run(stop=stop)
    finally:
        nvml.nvmlShutdown()


def _writer(config: dict[str, Any], node: str) -> dict[str, Any]:
    """How this agent writes: `sender` to the controllers of `agent.send_to` (MUNGE), or
    `sessions` of the database when the config names one (database.url: one host)."""
    send_to = config["agent"].get("send_to")
    if isinstance(send_to, str):
        send_to = [send_to]
    if send_to:
        from accounting_bridge.nvml.munge import Munge, MungeUnavailable

        try:
            addresses = [parse_address(str(address)) for address in send_to]
        except ValueError as exc:
            raise click.UsageError(f"agent.send_to: {exc}") from None
        try:
            munge = Munge(socket=config["agent"].get("munge_socket"))
        except MungeUnavailable as exc:
            raise click.ClickException(str(exc)) from None
        return {"sender": MungeSender(munge, addresses, node)}
    from ledger.cli_support import transaction
    from ledger.config import default_sqlite_url

    if config["database"]["url"] == default_sqlite_url():
        raise click.UsageError(
            "set agent.send_to to the controller's daemon (host:port of its daemon.agent_listen; "
            "GPU nodes hold no ledger credentials), or database.url on a single host"
        )
    return {"sessions": transaction}
