"""GPU usage sampling on a node: pure logic over an NVML module object.

``nvml`` is the real ``pynvml`` module or a :class:`~accounting_bridge.nvml.nvml_fake.FakeNvml`;
nothing here imports either. One *tick* is:

1. :func:`sample_node` reads every GPU *unit* once. A unit is a whole GPU, or
   one MIG instance of a GPU in MIG mode (its parent is then not a unit).
   Units are numbered in enumeration order -- physical GPUs by NVML index,
   a MIG-mode GPU contributing its instances by MIG index -- which is the
   order Slurm's ``AutoDetect=nvml`` gives the node-local GPU indices.
   (Sites that write gres.conf by hand must keep /dev/nvidiaN in NVML order
   for this to hold.)
2. :class:`GpuRegistry` says which job run owns which unit index. The node
   Prolog writes one JSON file per job run,
   ``<spool>/<cluster>_<jobid>_<run>.json`` =
   ``{"cluster": "lab", "job_id": 42, "run": 0, "gpus": {"0": "a100", "2": "h100"}}``,
   and the Epilog removes it.
3. :meth:`UsageAccumulator.add` charges the tick's interval to the owners:
   per job run and GPU type, *allocated* GPU-seconds (interval), *busy*
   GPU-seconds (utilisation% / 100 × interval), peak memory in bytes, and
   energy in joules (delta of NVML's total-energy counter, mJ). A unit nobody
   owns is accumulated to nobody (``unattributed``, keyed by UUID), as is a
   unit claimed by two registry files at once (a stale file; reported in
   :class:`TickReport`, never charged twice).

What NVML cannot tell on MIG, and how it is counted here:

* ``nvmlDeviceGetUtilizationRates`` raises ``NVML_ERROR_NOT_SUPPORTED`` for a
  MIG instance and for a GPU in MIG mode. A MIG instance is counted *busy for
  the whole interval when at least one compute process runs on it*, else
  idle; those seconds also go to ``busy_estimated_gpu_seconds`` so reports
  can tell measured from estimated. Allocated seconds are exact either way.
* The energy counter exists only for the physical GPU
  (``NVML_ERROR_NOT_SUPPORTED`` on MIG handles). Instances get no energy; the
  parent's energy delta goes to ``unattributed`` under the parent's UUID.
* Memory (``nvmlDeviceGetMemoryInfo``) and processes work per instance.

Sampling is instantaneous: utilisation is NVML's own recent-window figure
at the tick, memory is the peak of the values seen at ticks, and a unit that
changes owner between ticks charges the whole interval (and its energy) to
the owner seen at the tick.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

__all__ = [
    "Assignment",
    "GpuRegistry",
    "GpuUsage",
    "JobRunKey",
    "NodeSample",
    "NvmlFailure",
    "ParentEnergy",
    "RegistryError",
    "RegistrySnapshot",
    "TickReport",
    "UnitSample",
    "UsageAccumulator",
    "import_pynvml",
    "sample_node",
    "tick",
]


class JobRunKey(NamedTuple):
    cluster: str
    job_id: int
    run: int


# --------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class UnitSample:
    """One GPU unit (whole GPU or MIG instance) at one instant."""

    unit_index: int  # node-local GPU index as Slurm numbers it
    uuid: str
    name: str
    gpu_index: int  # NVML index of the physical GPU
    mig_index: int | None  # MIG device index on that GPU, None for a whole GPU
    utilization_percent: int | None  # None: NVML_ERROR_NOT_SUPPORTED (MIG)
    memory_used_bytes: int
    memory_total_bytes: int
    energy_millijoules: int | None  # total-energy counter; None: not supported (MIG)
    process_count: int | None  # None: NVML would not say

    @property
    def is_mig(self) -> bool:
        return self.mig_index is not None


@dataclass(frozen=True)
class ParentEnergy:
    """The energy counter of a GPU in MIG mode (it is not a unit itself)."""

    gpu_index: int
    uuid: str
    energy_millijoules: int


@dataclass(frozen=True)
class NvmlFailure:
    gpu_index: int
    code: int
    message: str


@dataclass
class NodeSample:
    units: list[UnitSample] = field(default_factory=list)
    mig_parents: list[ParentEnergy] = field(default_factory=list)
    # A GPU that failed (GPU_IS_LOST, ...) is reported here; its units are
    # missing from `units`, and unit indices after it shift, so owners of
    # later units are not charged in that tick (see UsageAccumulator.add).
    failures: list[NvmlFailure] = field(default_factory=list)


def _optional(nvml: Any, call: Any, *args: Any, unsupported: Iterable[int]) -> Any:
    """Call an NVML function; None for the error codes that mean 'cannot tell'."""
    try:
        return call(*args)
    except nvml.NVMLError as exc:
        if exc.value in unsupported:
            return None
        raise


def _unit(nvml: Any, handle: Any, unit_index: int, gpu_index: int, mig_index: int | None) -> UnitSample:
    not_supported = (nvml.NVML_ERROR_NOT_SUPPORTED,)
    utilization = _optional(nvml, nvml.nvmlDeviceGetUtilizationRates, handle, unsupported=not_supported)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    energy = _optional(nvml, nvml.nvmlDeviceGetTotalEnergyConsumption, handle, unsupported=not_supported)
    processes = _optional(
        nvml,
        nvml.nvmlDeviceGetComputeRunningProcesses,
        handle,
        unsupported=(nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_NO_PERMISSION),
    )
    return UnitSample(
        unit_index=unit_index,
        uuid=nvml.nvmlDeviceGetUUID(handle),
        name=nvml.nvmlDeviceGetName(handle),
        gpu_index=gpu_index,
        mig_index=mig_index,
        utilization_percent=None if utilization is None else int(utilization.gpu),
        memory_used_bytes=int(memory.used),
        memory_total_bytes=int(memory.total),
        energy_millijoules=None if energy is None else int(energy),
        process_count=None if processes is None else len(processes),
    )


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    mode = _optional(nvml, nvml.nvmlDeviceGetMigMode, handle, unsupported=(nvml.NVML_ERROR_NOT_SUPPORTED,))
    return mode is not None and mode[0] == nvml.NVML_DEVICE_MIG_ENABLE


def sample_node(nvml: Any) -> NodeSample:
    """Read every GPU unit once. nvmlInit must have been called."""
    sample = NodeSample()
    unit_index = 0
    for gpu_index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu_index)
            if not _mig_enabled(nvml, handle):
                sample.units.append(_unit(nvml, handle, unit_index, gpu_index, None))
                unit_index += 1
                continue
            energy = _optional(
                nvml,
                nvml.nvmlDeviceGetTotalEnergyConsumption,
                handle,
                unsupported=(nvml.NVML_ERROR_NOT_SUPPORTED,),
            )
            if energy is not None:
                uuid = nvml.nvmlDeviceGetUUID(handle)
                sample.mig_parents.append(ParentEnergy(gpu_index, uuid, int(energy)))
            for mig_index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                mig_handle = _optional(
                    nvml,
                    nvml.nvmlDeviceGetMigDeviceHandleByIndex,
                    handle,
                    mig_index,
                    unsupported=(nvml.NVML_ERROR_NOT_FOUND,),  # empty slot
                )
                if mig_handle is None:
                    continue
                sample.units.append(_unit(nvml, mig_handle, unit_index, gpu_index, mig_index))
                unit_index += 1
        except nvml.NVMLError as exc:
            sample.failures.append(NvmlFailure(gpu_index, exc.value, str(exc)))
    return sample


def import_pynvml() -> ModuleType:
    """Import nvidia-ml-py's ``pynvml`` (ImportError when the extra is missing).

    When the deprecated ``pynvml`` *package* is installed next to nvidia-ml-py
    it adds an import hook that emits a FutureWarning on ``import pynvml``;
    the module we get is nvidia-ml-py's either way, so that warning is muted.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The pynvml package is deprecated")
        import pynvml
    return pynvml


# --------------------------------------------------------------------------- registry


_CLUSTER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_FILE_RE = re.compile(r"(?P<cluster>.+)_(?P<job_id>\d+)_(?P<run>\d+)\.json")


@dataclass(frozen=True)
class Assignment:
    key: JobRunKey
    gpus: dict[int, str] = field(hash=False)  # unit index -> GPU type


@dataclass(frozen=True)
class RegistryError:
    path: str
    reason: str


@dataclass
class RegistrySnapshot:
    assignments: list[Assignment] = field(default_factory=list)
    errors: list[RegistryError] = field(default_factory=list)

    def owners(self) -> tuple[dict[int, tuple[JobRunKey, str]], dict[int, list[JobRunKey]]]:
        """(unit index -> (job run, GPU type), unit index -> job runs claiming it twice+)."""
        claims: dict[int, list[tuple[JobRunKey, str]]] = {}
        for assignment in self.assignments:
            for index, gpu_type in assignment.gpus.items():
                claims.setdefault(index, []).append((assignment.key, gpu_type))
        owners = {index: found[0] for index, found in claims.items() if len(found) == 1}
        conflicts = {
            index: sorted(key for key, _ in found) for index, found in claims.items() if len(found) > 1
        }
        return owners, conflicts


def _validate_key(key: JobRunKey) -> None:
    if not isinstance(key.cluster, str) or not _CLUSTER_RE.fullmatch(key.cluster):
        raise ValueError(f"bad cluster name {key.cluster!r}")
    for name in ("job_id", "run"):
        value = getattr(key, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"bad {name} {value!r}")


def _validate_gpus(gpus: Mapping[Any, Any]) -> dict[int, str]:
    result: dict[int, str] = {}
    for raw_index, gpu_type in gpus.items():
        index = raw_index
        if isinstance(raw_index, str) and raw_index.isascii() and raw_index.isdigit():
            index = int(raw_index)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"bad GPU index {raw_index!r}")
        if not isinstance(gpu_type, str) or not gpu_type:
            raise ValueError(f"bad GPU type {gpu_type!r} for index {raw_index!r}")
        if index in result:
            raise ValueError(f"GPU index {index} listed twice")
        result[index] = gpu_type
    return result


class GpuRegistry:
    """Job run -> node-local GPU indices, one JSON file per job run in a spool dir."""

    def __init__(self, spool_dir: str | os.PathLike[str]) -> None:
        self.spool_dir = Path(spool_dir)  # no I/O until used

    def path_for(self, key: JobRunKey) -> Path:
        _validate_key(key)
        return self.spool_dir / f"{key.cluster}_{key.job_id}_{key.run}.json"

    def register(self, key: JobRunKey, gpus: Mapping[int, str]) -> Path:
        """Write (atomically) which unit indices this job run owns on this node."""
        path = self.path_for(key)
        document = {
            "cluster": key.cluster,
            "job_id": key.job_id,
            "run": key.run,
            "gpus": {str(index): gpu_type for index, gpu_type in sorted(_validate_gpus(gpus).items())},
        }
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=self.spool_dir)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(document, handle, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return path

    def unregister(self, key: JobRunKey) -> bool:
        """Remove the job run's file; False when there was none."""
        try:
            self.path_for(key).unlink()
        except FileNotFoundError:
            return False
        return True

    def load(self) -> RegistrySnapshot:
        """Every job run's assignment; unreadable or inconsistent files are reported."""
        snapshot = RegistrySnapshot()
        if not self.spool_dir.is_dir():
            return snapshot
        for path in sorted(self.spool_dir.glob("*.json")):
            try:
                snapshot.assignments.append(self._read(path))
            except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
                snapshot.errors.append(RegistryError(str(path), str(exc)))
        return snapshot

    @staticmethod
    def _read(path: Path) -> Assignment:
        document = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        missing = {"cluster", "job_id", "run", "gpus"} - document.keys()
        if missing:
            raise ValueError(f"missing {sorted(missing)}")
        key = JobRunKey(document["cluster"], document["job_id"], document["run"])
        _validate_key(key)
        if path.name != f"{key.cluster}_{key.job_id}_{key.run}.json":
            raise ValueError(f"file name does not match its content {tuple(key)}")
        if not isinstance(document["gpus"], dict):
            raise ValueError("'gpus' is not an object")
        return Assignment(key, _validate_gpus(document["gpus"]))


# --------------------------------------------------------------------------- accumulation


@dataclass
class GpuUsage:
    allocated_gpu_seconds: float = 0.0
    busy_gpu_seconds: float = 0.0
    busy_estimated_gpu_seconds: float = 0.0  # part of busy from the MIG process proxy
    peak_memory_bytes: int = 0
    energy_joules: float = 0.0


@dataclass
class TickReport:
    units: int = 0
    charged_units: int = 0
    conflicts: dict[int, list[JobRunKey]] = field(default_factory=dict)
    registry_errors: list[RegistryError] = field(default_factory=list)
    failures: list[NvmlFailure] = field(default_factory=list)


class UsageAccumulator:
    """Sums ticks into per-job-run, per-GPU-type usage."""

    def __init__(self) -> None:
        self.usage: dict[JobRunKey, dict[str, GpuUsage]] = {}
        self.unattributed: dict[str, GpuUsage] = {}  # by unit / parent UUID
        self._last_energy_millijoules: dict[str, int] = {}

    def _energy_joules(self, uuid: str, counter: int | None) -> float:
        if counter is None:
            return 0.0
        previous = self._last_energy_millijoules.get(uuid)
        self._last_energy_millijoules[uuid] = counter
        if previous is None or counter < previous:  # first sight, or counter reset
            return 0.0
        return (counter - previous) / 1000

    def add(
        self,
        sample: NodeSample,
        owners: Mapping[int, tuple[JobRunKey, str]],
        interval_seconds: float,
    ) -> int:
        """Charge one tick; returns how many units were charged to a job run."""
        if interval_seconds < 0:
            raise ValueError(f"negative interval {interval_seconds}")
        # After a failed GPU, unit indices no longer line up with Slurm's: charge nobody past it.
        first_failed = min((f.gpu_index for f in sample.failures), default=None)
        charged = 0
        for unit in sample.units:
            energy = self._energy_joules(unit.uuid, unit.energy_millijoules)
            if unit.utilization_percent is not None:
                busy = interval_seconds * unit.utilization_percent / 100
                estimated = 0.0
            elif unit.process_count:
                busy = estimated = interval_seconds
            else:
                busy = estimated = 0.0
            trusted = first_failed is None or unit.gpu_index < first_failed
            owner = owners.get(unit.unit_index) if trusted else None
            if owner is None:
                usage = self.unattributed.setdefault(unit.uuid, GpuUsage())
            else:
                key, gpu_type = owner
                usage = self.usage.setdefault(key, {}).setdefault(gpu_type, GpuUsage())
                charged += 1
            usage.allocated_gpu_seconds += interval_seconds
            usage.busy_gpu_seconds += busy
            usage.busy_estimated_gpu_seconds += estimated
            usage.peak_memory_bytes = max(usage.peak_memory_bytes, unit.memory_used_bytes)
            usage.energy_joules += energy
        for parent in sample.mig_parents:
            usage = self.unattributed.setdefault(parent.uuid, GpuUsage())
            usage.energy_joules += self._energy_joules(parent.uuid, parent.energy_millijoules)
        return charged

    def pop(self, key: JobRunKey) -> dict[str, GpuUsage]:
        """Take a finished job run's usage out of the accumulator."""
        return self.usage.pop(key, {})


def tick(
    nvml: Any, registry: GpuRegistry, accumulator: UsageAccumulator, interval_seconds: float
) -> TickReport:
    """Sample the node, read the registry, charge the interval."""
    sample = sample_node(nvml)
    snapshot = registry.load()
    owners, conflicts = snapshot.owners()
    charged = accumulator.add(sample, owners, interval_seconds)
    return TickReport(
        units=len(sample.units),
        charged_units=charged,
        conflicts=conflicts,
        registry_errors=snapshot.errors,
        failures=sample.failures,
    )
