"""A scriptable stand-in for ``pynvml`` (nvidia-ml-py) for tests and GPU-less hosts.

:class:`FakeNvml` instances are used exactly like the ``pynvml`` module: the
same function names and parameter names (``nvmlInit``, ``nvmlDeviceGetCount``,
``nvmlDeviceGetHandleByIndex(index)``, ``nvmlDeviceGetUtilizationRates(handle)``,
``nvmlDeviceGetMigDeviceHandleByIndex(device, index)``, ...), the same
``NVML_*`` constants with the same values, the same error class
(``NVMLError``, whose constructor returns the per-code subclass such as
``NVMLError_NotSupported``, with ``.value`` and the same message) and
results with the same attribute names (``.gpu``/``.memory``,
``.total``/``.free``/``.used``, ``.pid``/``.usedGpuMemory``).

State is plain data you change between ticks: a list of :class:`FakeGpu`,
each with utilisation, memory, an energy counter (mJ), processes, and
optionally MIG mode with :class:`FakeMigDevice` instances at sparse indices.

Behaviour copied from NVML where it matters to the sampler:

* every call before ``nvmlInit`` (or after the last ``nvmlShutdown``) raises
  ``NVML_ERROR_UNINITIALIZED``; ``library_present=False`` makes ``nvmlInit``
  raise ``NVML_ERROR_LIBRARY_NOT_FOUND`` as pynvml does without a driver;
* an index past the device count raises ``NVML_ERROR_INVALID_ARGUMENT``;
* utilisation of a MIG device, and of a GPU in MIG mode, raises
  ``NVML_ERROR_NOT_SUPPORTED`` ("On MIG-enabled GPUs, querying device
  utilization rates is not currently supported");
* the energy counter of a MIG device raises ``NVML_ERROR_NOT_SUPPORTED``
  (the counter belongs to the physical board);
* ``nvmlDeviceGetMigMode`` on a GPU without MIG raises ``NVML_ERROR_NOT_SUPPORTED``;
* ``nvmlDeviceGetMaxMigDeviceCount`` is 0 unless MIG is enabled;
* ``nvmlDeviceGetMigDeviceHandleByIndex`` raises ``NVML_ERROR_NOT_FOUND`` for
  an empty slot below the maximum and ``NVML_ERROR_INVALID_ARGUMENT`` at or
  past it.

What MIG handles answer for ``nvmlDeviceGetMigMode``/``MaxMigDeviceCount``
was not checked against a real MIG GPU; the fake answers
``NVML_ERROR_INVALID_ARGUMENT``.
"""

from __future__ import annotations

import ctypes
import string
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "FakeGpu",
    "FakeMigDevice",
    "FakeNvml",
    "FakeProcess",
    "NVMLError",
    "c_nvmlMemory_t",
    "c_nvmlMemory_v2_t",
    "c_nvmlUtilization_t",
    "nvmlExceptionClass",
    "nvmlFriendlyObject",
]

# Values as in nvidia-ml-py's pynvml.py.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1
# gpuInstanceId/computeInstanceId of a process outside MIG (0xFFFFFFFF in NVML).
NVML_VALUE_NOT_AVAILABLE_uint = 0xFFFFFFFF


class NVMLError(Exception):
    """Same construction and message as pynvml.NVMLError: NVMLError(3) is an NVMLError_NotSupported."""

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}
    _errcode_to_string: ClassVar[dict[int, str]] = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(cls, value: int, *args: Any) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        # pynvml asks the library for codes missing from its table; without a
        # library it falls back to exactly this text.
        return self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return self.value == getattr(other, "value", None)

    __hash__ = None  # type: ignore[assignment]  # as in pynvml: __eq__ without __hash__


def _error_class_name(constant_name: str) -> str:
    # NVML_ERROR_ALREADY_INITIALIZED -> NVMLError_AlreadyInitialized, pynvml's rule
    words = string.capwords(constant_name.replace("NVML_ERROR_", ""), "_")
    return "NVMLError_" + words.replace("_", "")


def _make_error_classes() -> dict[str, type[NVMLError]]:
    classes: dict[str, type[NVMLError]] = {}
    for constant_name, value in sorted(globals().items()):
        if not constant_name.startswith("NVML_ERROR_"):
            continue

        def new(cls: type[NVMLError], *args: Any, _value: int = value) -> NVMLError:
            return NVMLError.__new__(cls, _value)

        name = _error_class_name(constant_name)
        error_class = type(name, (NVMLError,), {"__new__": new})
        error_class.__module__ = __name__
        NVMLError._valClassMapping[value] = error_class
        classes[name] = error_class
    return classes


_ERROR_CLASSES = _make_error_classes()
globals().update(_ERROR_CLASSES)


def nvmlExceptionClass(nvmlErrorCode: int) -> type[NVMLError]:
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError(f"nvmlErrorCode {nvmlErrorCode} is not valid")
    return NVMLError._valClassMapping[nvmlErrorCode]


# Result types with pynvml's names and attribute names.


@dataclass
class c_nvmlUtilization_t:
    gpu: int = 0
    memory: int = 0


@dataclass
class c_nvmlMemory_t:
    total: int = 0
    free: int = 0
    used: int = 0


@dataclass
class c_nvmlMemory_v2_t:
    version: int = 0
    total: int = 0
    reserved: int = 0
    free: int = 0
    used: int = 0


class nvmlFriendlyObject:
    """What pynvml returns for each running process."""

    def __init__(self, dictionary: dict[str, Any]) -> None:
        for key, value in dictionary.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return str(self.__dict__)


# Scriptable state.


@dataclass
class FakeProcess:
    pid: int
    used_gpu_memory_bytes: int | None = None


@dataclass
class FakeMigDevice:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    memory_total_bytes: int = 10 * 2**30
    memory_used_bytes: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    gpu_instance_id: int = 0
    compute_instance_id: int = 0


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total_bytes: int = 80 * 2**30
    memory_used_bytes: int = 0
    utilization_gpu_percent: int = 0
    utilization_memory_percent: int = 0
    energy_millijoules: int = 0
    energy_supported: bool = True
    processes: list[FakeProcess] = field(default_factory=list)
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_pending_enabled: bool | None = None  # None: same as mig_enabled
    max_mig_devices: int = 7
    mig_devices: dict[int, FakeMigDevice] = field(default_factory=dict)  # sparse, by MIG index
    minor_number: int | None = None  # None: the NVML index
    lost: bool = False  # every call on the GPU raises NVML_ERROR_GPU_IS_LOST

    def add_energy(self, joules: float) -> None:
        self.energy_millijoules += round(joules * 1000)


@dataclass(frozen=True)
class _Handle:
    gpu_index: int
    mig_index: int | None = None


def _public_constants() -> dict[str, Any]:
    names = {n: v for n, v in globals().items() if n.startswith("NVML_")}
    names.update(_ERROR_CLASSES)
    names.update(
        NVMLError=NVMLError,
        nvmlExceptionClass=staticmethod(nvmlExceptionClass),
        c_nvmlUtilization_t=c_nvmlUtilization_t,
        c_nvmlMemory_t=c_nvmlMemory_t,
        c_nvmlMemory_v2_t=c_nvmlMemory_v2_t,
        nvmlFriendlyObject=nvmlFriendlyObject,
    )
    return names


class FakeNvml:
    """Use an instance wherever code expects the ``pynvml`` module."""

    def __init__(self, gpus: list[FakeGpu] | None = None, *, library_present: bool = True) -> None:
        self.gpus: list[FakeGpu] = list(gpus or [])
        self.library_present = library_present
        self._init_count = 0
        self.calls: list[str] = []

    # -- helpers

    def _require_init(self, function: str) -> None:
        self.calls.append(function)
        if self._init_count == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: object, *, mig_ok: bool) -> tuple[FakeGpu, FakeMigDevice | None]:
        if not isinstance(handle, _Handle) or not 0 <= handle.gpu_index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.gpu_index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if handle.mig_index is None:
            return gpu, None
        if not mig_ok:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        device = gpu.mig_devices.get(handle.mig_index) if gpu.mig_enabled else None
        if device is None:  # the instance was destroyed: handle no longer valid
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu, device

    @staticmethod
    def _processes(processes: list[FakeProcess], gi: int, ci: int) -> list[nvmlFriendlyObject]:
        return [
            nvmlFriendlyObject(
                {
                    "pid": p.pid,
                    "usedGpuMemory": p.used_gpu_memory_bytes,
                    "gpuInstanceId": gi,
                    "computeInstanceId": ci,
                }
            )
            for p in processes
        ]

    # -- init

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.calls.append("nvmlInitWithFlags")
        if not self.library_present:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self._init_count += 1

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        self._require_init("nvmlShutdown")
        self._init_count -= 1

    # -- devices

    def nvmlDeviceGetCount(self) -> int:
        self._require_init("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._require_init("nvmlDeviceGetHandleByIndex")
        if not isinstance(index, int) or not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        self._require_init("nvmlDeviceGetIndex")
        self._gpu(handle, mig_ok=False)
        return handle.gpu_index

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        self._require_init("nvmlDeviceGetMinorNumber")
        gpu, _ = self._gpu(handle, mig_ok=False)
        return handle.gpu_index if gpu.minor_number is None else gpu.minor_number

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._require_init("nvmlDeviceGetUUID")
        gpu, device = self._gpu(handle, mig_ok=True)
        return device.uuid if device is not None else gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._require_init("nvmlDeviceGetName")
        gpu, device = self._gpu(handle, mig_ok=True)
        return device.name if device is not None else gpu.name

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> c_nvmlUtilization_t:
        self._require_init("nvmlDeviceGetUtilizationRates")
        gpu, device = self._gpu(handle, mig_ok=True)
        if device is not None or gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return c_nvmlUtilization_t(gpu.utilization_gpu_percent, gpu.utilization_memory_percent)

    def nvmlDeviceGetMemoryInfo(
        self, handle: _Handle, version: int | None = None
    ) -> c_nvmlMemory_t | c_nvmlMemory_v2_t:
        self._require_init("nvmlDeviceGetMemoryInfo")
        gpu, device = self._gpu(handle, mig_ok=True)
        total = device.memory_total_bytes if device is not None else gpu.memory_total_bytes
        used = device.memory_used_bytes if device is not None else gpu.memory_used_bytes
        if version:
            return c_nvmlMemory_v2_t(version, total, 0, total - used, used)
        return c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        self._require_init("nvmlDeviceGetTotalEnergyConsumption")
        gpu, device = self._gpu(handle, mig_ok=True)
        if device is not None or not gpu.energy_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.energy_millijoules

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[nvmlFriendlyObject]:
        self._require_init("nvmlDeviceGetComputeRunningProcesses")
        gpu, device = self._gpu(handle, mig_ok=True)
        if device is not None:
            return self._processes(device.processes, device.gpu_instance_id, device.compute_instance_id)
        if gpu.mig_enabled:
            return [
                process
                for instance in gpu.mig_devices.values()
                for process in self._processes(
                    instance.processes, instance.gpu_instance_id, instance.compute_instance_id
                )
            ]
        none = NVML_VALUE_NOT_AVAILABLE_uint
        return self._processes(gpu.processes, none, none)

    # -- MIG

    def nvmlDeviceGetMigMode(self, device: _Handle) -> list[int]:
        self._require_init("nvmlDeviceGetMigMode")
        gpu, _ = self._gpu(device, mig_ok=False)
        if not gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        pending = gpu.mig_enabled if gpu.mig_pending_enabled is None else gpu.mig_pending_enabled
        return [int(gpu.mig_enabled), int(pending)]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: _Handle) -> int:
        self._require_init("nvmlDeviceGetMaxMigDeviceCount")
        gpu, _ = self._gpu(device, mig_ok=False)
        return gpu.max_mig_devices if gpu.mig_capable and gpu.mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: _Handle, index: int) -> _Handle:
        self._require_init("nvmlDeviceGetMigDeviceHandleByIndex")
        gpu, _ = self._gpu(device, mig_ok=False)
        if not gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not gpu.mig_enabled:
            # What an H200 with MIG off answers (recorded: tests/fixtures/nvml_h200_recording.json).
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        if not isinstance(index, int) or not 0 <= index < gpu.max_mig_devices:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if index not in gpu.mig_devices:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _Handle(device.gpu_index, index)

    def nvmlDeviceIsMigDeviceHandle(self, device: _Handle) -> ctypes.c_uint:
        """pynvml returns the ctypes out-parameter itself, not its value (so does this)."""
        self._require_init("nvmlDeviceIsMigDeviceHandle")
        self._gpu(device, mig_ok=True)
        return ctypes.c_uint(int(device.mig_index is not None))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: _Handle) -> _Handle:
        self._require_init("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        _, device = self._gpu(migDevice, mig_ok=True)
        if device is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(migDevice.gpu_index)


for _name, _value in _public_constants().items():
    setattr(FakeNvml, _name, _value)
del _name, _value
