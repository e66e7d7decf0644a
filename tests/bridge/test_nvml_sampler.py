"""The NVML fake (checked against the real pynvml module) and the GPU sampler."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from accounting_bridge.nvml import nvml_fake
from accounting_bridge.nvml.nvml_fake import FakeGpu, FakeMigDevice, FakeNvml, FakeProcess
from accounting_bridge.nvml.sampler import (
    GpuRegistry,
    GpuUsage,
    JobRunKey,
    RegistryError,
    UsageAccumulator,
    import_pynvml,
    sample_node,
    tick,
)
from tests.support import FIXTURES

GiB = 2**30
JOB_A = JobRunKey("lab", 100, 0)
JOB_B = JobRunKey("lab", 101, 0)


@pytest.fixture(scope="module")
def pynvml() -> Any:
    return import_pynvml()  # nvidia-ml-py is a dev dependency; no driver is needed


# --------------------------------------------------------------------------- the fake vs pynvml

FUNCTIONS = [
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
]


def _parameters(function: Any) -> list[tuple[str, Any]]:
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_fake_functions_have_pynvml_names_and_parameters(pynvml: Any, name: str) -> None:
    assert _parameters(getattr(FakeNvml(), name)) == _parameters(getattr(pynvml, name))


def test_fake_constants_and_error_classes_match_pynvml(pynvml: Any) -> None:
    fake: Any = FakeNvml()  # stands in for a module: attributes are set per NVML name
    real_codes = {n: v for n, v in vars(pynvml).items() if n.startswith("NVML_ERROR_")}
    fake_codes = {n: v for n, v in vars(nvml_fake).items() if n.startswith("NVML_ERROR_")}
    assert fake_codes == real_codes
    for name in ("NVML_SUCCESS", "NVML_DEVICE_MIG_ENABLE", "NVML_DEVICE_MIG_DISABLE"):
        assert getattr(fake, name) == getattr(pynvml, name)
    for code in real_codes.values():
        real, mine = pynvml.NVMLError(code), fake.NVMLError(code)
        assert type(mine).__name__ == type(real).__name__
        assert (mine.value, str(mine), mine.args) == (real.value, str(real), real.args)
        assert getattr(fake, type(real).__name__) is type(mine)
        assert fake.nvmlExceptionClass(code) is type(mine)
    assert isinstance(fake.NVMLError_NotSupported(), fake.NVMLError)
    assert fake.NVMLError_NotSupported().value == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_fake_results_have_pynvml_field_names(pynvml: Any) -> None:
    def names(struct: Any) -> list[str]:
        return [name for name, _ in struct._fields_]

    assert list(vars(nvml_fake.c_nvmlUtilization_t())) == names(pynvml.c_nvmlUtilization_t)
    assert list(vars(nvml_fake.c_nvmlMemory_t())) == names(pynvml.c_nvmlMemory_t)
    assert list(vars(nvml_fake.c_nvmlMemory_v2_t())) == names(pynvml.c_nvmlMemory_v2_t)
    fake = FakeNvml([FakeGpu("GPU-0", processes=[FakeProcess(1, 0)])])
    fake.nvmlInit()
    (process,) = fake.nvmlDeviceGetComputeRunningProcesses(fake.nvmlDeviceGetHandleByIndex(0))
    assert list(vars(process)) == names(pynvml.c_nvmlProcessInfo_t)


def _code(call: Any, *args: Any) -> tuple[str, int]:
    """(error class name, code) of what the call raised."""
    try:
        call(*args)
    except Exception as exc:  # real and fake raise different NVMLError classes
        return type(exc).__name__, exc.value  # type: ignore[attr-defined]
    pytest.fail(f"{call} did not raise")


def test_fake_and_real_fail_alike_without_init_and_without_a_driver(pynvml: Any) -> None:
    fake = FakeNvml([FakeGpu("GPU-0")])
    # Called before nvmlInit, both raise Uninitialized (pynvml checked here for real).
    for name in ("nvmlDeviceGetCount", "nvmlShutdown"):
        assert _code(getattr(fake, name)) == _code(getattr(pynvml, name))
    assert _code(fake.nvmlDeviceGetCount) == ("NVMLError_Uninitialized", pynvml.NVML_ERROR_UNINITIALIZED)
    # This machine has no NVIDIA driver: pynvml.nvmlInit raises LibraryNotFound.
    real = _code(pynvml.nvmlInit)
    assert real == ("NVMLError_LibraryNotFound", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert _code(FakeNvml(library_present=False).nvmlInit) == real


# --------------------------------------------------------------------------- the fake vs a real GPU

RECORDING = FIXTURES / "nvml_h200_recording.json"
# Values that change from one reading to the next: compared by type, not value.
LIVE_FIELDS = {"used", "free", "gpu", "memory", "pid", "usedGpuMemory"}


def _shape(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _shape(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v, key) for v in value]
    return type(value).__name__ if key in LIVE_FIELDS or key.endswith("Consumption") else value


def test_fake_answers_every_sampled_call_like_a_recorded_h200() -> None:
    """bench/nvml_device.py recorded these on a real H200 (driver 580.159.04) under
    load; the fake set up as that GPU must answer each call alike: the same results
    and fields, the same NVML error for what the GPU cannot do."""
    from bench.nvml_device import record_calls

    real = json.loads(RECORDING.read_text())["under_load"]
    uuid, name = real["nvmlDeviceGetUUID"]["result"], real["nvmlDeviceGetName"]["result"]
    process = real["nvmlDeviceGetComputeRunningProcesses"]["result"][0]
    fake = FakeNvml(
        [
            FakeGpu(
                uuid,
                name=name,
                memory_total_bytes=real["nvmlDeviceGetMemoryInfo"]["result"]["total"],
                mig_capable=True,
                processes=[FakeProcess(process["pid"], process["usedGpuMemory"])],
            )
        ]
    )
    fake.nvmlInit()
    recorded = record_calls(fake)
    del real["driver"], recorded["driver"]  # informational; the sampler never asks
    real["nvmlDeviceGetTotalEnergyConsumption"]["result"] = 0  # a counter: its type is what matters
    recorded["nvmlDeviceGetTotalEnergyConsumption"]["result"] = 0
    assert _shape(recorded) == _shape(real)


def mig_node() -> FakeNvml:
    """GPU 0 in MIG mode with instances in slots 0 and 2; GPU 1 whole."""
    return FakeNvml(
        [
            FakeGpu(
                "GPU-mig",
                mig_capable=True,
                mig_enabled=True,
                energy_millijoules=1_000_000,
                mig_devices={
                    0: FakeMigDevice("MIG-a", name="NVIDIA A100-SXM4-80GB MIG 1g.10gb"),
                    2: FakeMigDevice(
                        "MIG-b", name="NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                        memory_total_bytes=40 * GiB, gpu_instance_id=2,
                    ),
                },
            ),
            FakeGpu("GPU-whole", name="NVIDIA H100 80GB HBM3"),
        ]
    )  # fmt: skip


def test_fake_raises_nvml_codes_for_unsupported_calls(pynvml: Any) -> None:
    fake = mig_node()
    fake.nvmlInit()
    mig_gpu, whole = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    instance = fake.nvmlDeviceGetMigDeviceHandleByIndex(mig_gpu, 0)
    not_supported = ("NVMLError_NotSupported", pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert _code(fake.nvmlDeviceGetUtilizationRates, instance) == not_supported
    assert _code(fake.nvmlDeviceGetUtilizationRates, mig_gpu) == not_supported
    assert _code(fake.nvmlDeviceGetTotalEnergyConsumption, instance) == not_supported
    assert _code(fake.nvmlDeviceGetMigMode, whole) == not_supported
    assert _code(fake.nvmlDeviceGetMigDeviceHandleByIndex, whole, 0) == not_supported
    assert _code(fake.nvmlDeviceGetMigDeviceHandleByIndex, mig_gpu, 1) == (
        "NVMLError_NotFound", pynvml.NVML_ERROR_NOT_FOUND,
    )  # fmt: skip
    assert _code(fake.nvmlDeviceGetMigDeviceHandleByIndex, mig_gpu, 7) == (
        "NVMLError_InvalidArgument", pynvml.NVML_ERROR_INVALID_ARGUMENT,
    )  # fmt: skip
    assert _code(fake.nvmlDeviceGetHandleByIndex, 2)[1] == pynvml.NVML_ERROR_INVALID_ARGUMENT
    # and what does work, with pynvml's attribute names
    assert fake.nvmlDeviceGetMigMode(mig_gpu) == [1, 1]
    assert fake.nvmlDeviceGetMaxMigDeviceCount(mig_gpu) == 7
    assert fake.nvmlDeviceGetMaxMigDeviceCount(whole) == 0
    assert fake.nvmlDeviceGetUUID(instance) == "MIG-a"
    assert fake.nvmlDeviceIsMigDeviceHandle(instance).value == 1
    assert fake.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(instance) == mig_gpu
    memory = fake.nvmlDeviceGetMemoryInfo(instance)
    assert (memory.total, memory.used, memory.free) == (10 * GiB, 0, 10 * GiB)
    rates = fake.nvmlDeviceGetUtilizationRates(whole)
    assert (rates.gpu, rates.memory) == (0, 0)
    fake.gpus[1].processes = [FakeProcess(4242, 3 * GiB)]
    (process,) = fake.nvmlDeviceGetComputeRunningProcesses(whole)
    assert isinstance(process, nvml_fake.nvmlFriendlyObject)
    assert process.__dict__ == {
        "pid": 4242, "usedGpuMemory": 3 * GiB,
        "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF,
    }  # fmt: skip
    fake.nvmlShutdown()
    assert _code(fake.nvmlDeviceGetCount)[0] == "NVMLError_Uninitialized"


# --------------------------------------------------------------------------- registry


def test_registry_writes_one_file_per_job_run(tmp_path: Path) -> None:
    registry = GpuRegistry(tmp_path / "spool")
    path = registry.register(JobRunKey("lab", 42, 1), {0: "a100", 2: "h100"})
    assert path == tmp_path / "spool" / "lab_42_1.json"
    assert json.loads(path.read_text()) == {
        "cluster": "lab", "job_id": 42, "run": 1, "gpus": {"0": "a100", "2": "h100"},
    }  # fmt: skip
    snapshot = registry.load()
    assert snapshot.errors == []
    assert [(a.key, a.gpus) for a in snapshot.assignments] == [
        (JobRunKey("lab", 42, 1), {0: "a100", 2: "h100"})
    ]
    assert registry.unregister(JobRunKey("lab", 42, 1)) is True
    assert registry.unregister(JobRunKey("lab", 42, 1)) is False
    assert registry.load().assignments == []
    assert list((tmp_path / "spool").iterdir()) == []  # no temporary files left behind


def test_registry_reports_bad_files_and_refuses_bad_keys(tmp_path: Path) -> None:
    registry = GpuRegistry(tmp_path)
    registry.register(JOB_A, {0: "a100"})
    (tmp_path / "broken_1_0.json").write_text("{not json")
    wrong_name = {"cluster": "lab", "job_id": 8, "run": 0, "gpus": {}}
    (tmp_path / "lab_7_0.json").write_text(json.dumps(wrong_name))
    bad_index = {"cluster": "lab", "job_id": 9, "run": 0, "gpus": {"x": "a100"}}
    (tmp_path / "lab_9_0.json").write_text(json.dumps(bad_index))
    snapshot = registry.load()
    assert [a.key for a in snapshot.assignments] == [JOB_A]
    assert [(Path(e.path).name, e.reason) for e in snapshot.errors] == [
        ("broken_1_0.json", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ("lab_7_0.json", "file name does not match its content ('lab', 8, 0)"),
        ("lab_9_0.json", "bad GPU index 'x'"),
    ]
    for bad in (JobRunKey("../etc", 1, 0), JobRunKey("lab", -1, 0), JobRunKey("", 1, 0)):
        with pytest.raises(ValueError):
            registry.register(bad, {0: "a100"})
    with pytest.raises(ValueError):
        registry.register(JOB_A, {0: ""})
    assert GpuRegistry(tmp_path / "missing").load().assignments == []


# --------------------------------------------------------------------------- sampling


def four_gpu_node() -> FakeNvml:
    """Like node1 on the box: GPUs 0-1 A100, 2-3 H100."""
    a100, h100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
    return FakeNvml(
        [FakeGpu("GPU-0", a100), FakeGpu("GPU-1", a100), FakeGpu("GPU-2", h100), FakeGpu("GPU-3", h100)]
    )


def test_two_jobs_on_one_node_get_their_own_busy_seconds(tmp_path: Path) -> None:
    nvml = four_gpu_node()
    nvml.nvmlInit()
    registry = GpuRegistry(tmp_path)
    registry.register(JOB_A, {0: "a100"})
    registry.register(JOB_B, {2: "h100"})
    accumulator = UsageAccumulator()
    gpu0, gpu1, gpu2, gpu3 = nvml.gpus

    gpu0.utilization_gpu_percent, gpu2.utilization_gpu_percent = 50, 100
    gpu0.memory_used_bytes, gpu2.memory_used_bytes = 2 * GiB, 30 * GiB
    gpu3.utilization_gpu_percent = 30  # busy, but no Slurm job owns it
    report = tick(nvml, registry, accumulator, 10.0)
    assert (report.units, report.charged_units, report.conflicts) == (4, 2, {})

    gpu0.utilization_gpu_percent, gpu2.utilization_gpu_percent = 20, 0
    gpu0.memory_used_bytes, gpu2.memory_used_bytes = 5 * GiB, 1 * GiB
    gpu0.add_energy(1500.0)
    gpu2.add_energy(3000.0)
    gpu1.add_energy(600.0)
    tick(nvml, registry, accumulator, 10.0)

    assert accumulator.usage == {
        JOB_A: {"a100": GpuUsage(20.0, 7.0, 0.0, 5 * GiB, 1500.0)},
        JOB_B: {"h100": GpuUsage(20.0, 10.0, 0.0, 30 * GiB, 3000.0)},
    }
    # Idle or foreign-busy GPUs with no job accumulate to nobody.
    assert accumulator.unattributed == {
        "GPU-1": GpuUsage(20.0, 0.0, 0.0, 0, 600.0),
        "GPU-3": GpuUsage(20.0, 6.0, 0.0, 0, 0.0),
    }
    assert accumulator.pop(JOB_A) == {"a100": GpuUsage(20.0, 7.0, 0.0, 5 * GiB, 1500.0)}
    assert JOB_A not in accumulator.usage


def test_an_idle_gpu_without_a_job_is_charged_to_nobody(tmp_path: Path) -> None:
    nvml = four_gpu_node()
    nvml.nvmlInit()
    accumulator = UsageAccumulator()
    report = tick(nvml, GpuRegistry(tmp_path), accumulator, 60.0)
    assert report.charged_units == 0
    assert accumulator.usage == {}
    assert accumulator.unattributed["GPU-1"] == GpuUsage(60.0, 0.0, 0.0, 0, 0.0)


def test_mig_instances_are_units_of_their_own(tmp_path: Path) -> None:
    nvml = mig_node()
    nvml.nvmlInit()
    sample = sample_node(nvml)
    units = [(u.unit_index, u.uuid, u.gpu_index, u.mig_index, u.utilization_percent) for u in sample.units]
    assert units == [
        (0, "MIG-a", 0, 0, None),  # utilisation: NVML_ERROR_NOT_SUPPORTED on MIG
        (1, "MIG-b", 0, 2, None),
        (2, "GPU-whole", 1, None, 0),
    ]
    assert [(p.uuid, p.energy_millijoules) for p in sample.mig_parents] == [("GPU-mig", 1_000_000)]

    registry = GpuRegistry(tmp_path)
    registry.register(JOB_A, {0: "1g.10gb"})
    registry.register(JOB_B, {1: "3g.40gb"})
    accumulator = UsageAccumulator()
    tick(nvml, registry, accumulator, 30.0)
    instance_a = nvml.gpus[0].mig_devices[0]
    instance_a.processes = [FakeProcess(1234, 2 * GiB)]
    instance_a.memory_used_bytes = 2 * GiB
    nvml.gpus[0].add_energy(900.0)
    tick(nvml, registry, accumulator, 30.0)

    # A's instance ran a process for one tick: busy is estimated from that.
    assert accumulator.usage == {
        JOB_A: {"1g.10gb": GpuUsage(60.0, 30.0, 30.0, 2 * GiB, 0.0)},
        JOB_B: {"3g.40gb": GpuUsage(60.0, 0.0, 0.0, 0, 0.0)},
    }
    # The board's energy cannot be split between instances.
    assert accumulator.unattributed["GPU-mig"] == GpuUsage(0.0, 0.0, 0.0, 0, 900.0)
    assert accumulator.unattributed["GPU-whole"] == GpuUsage(60.0, 0.0, 0.0, 0, 0.0)


def test_a_gpu_claimed_twice_is_reported_and_charged_to_nobody(tmp_path: Path) -> None:
    nvml = four_gpu_node()
    nvml.nvmlInit()
    registry = GpuRegistry(tmp_path)
    registry.register(JOB_A, {0: "a100", 1: "a100"})
    registry.register(JOB_B, {1: "a100"})  # e.g. a file an Epilog never removed
    accumulator = UsageAccumulator()
    report = tick(nvml, registry, accumulator, 10.0)
    assert report.conflicts == {1: [JOB_A, JOB_B]}
    assert accumulator.usage == {JOB_A: {"a100": GpuUsage(10.0, 0.0, 0.0, 0, 0.0)}}
    assert accumulator.unattributed["GPU-1"].allocated_gpu_seconds == 10.0


def test_a_lost_gpu_is_reported_and_later_units_are_not_misattributed(tmp_path: Path) -> None:
    nvml = four_gpu_node()
    nvml.nvmlInit()
    registry = GpuRegistry(tmp_path)
    registry.register(JOB_A, {0: "a100"})
    registry.register(JOB_B, {2: "h100"})
    nvml.gpus[1].lost = True
    accumulator = UsageAccumulator()
    report = tick(nvml, registry, accumulator, 10.0)
    assert [(f.gpu_index, f.code, f.message) for f in report.failures] == [
        (1, nvml_fake.NVML_ERROR_GPU_IS_LOST, "GPU is lost")
    ]
    assert set(accumulator.usage) == {JOB_A}  # GPU 2 now sits at unit 1: charge nobody


def test_energy_counter_reset_charges_nothing_for_that_tick() -> None:
    nvml = four_gpu_node()
    nvml.nvmlInit()
    owners = {0: (JOB_A, "a100")}
    accumulator = UsageAccumulator()
    nvml.gpus[0].energy_millijoules = 5_000_000
    accumulator.add(sample_node(nvml), owners, 1.0)
    nvml.gpus[0].energy_millijoules = 2_000  # driver reload
    accumulator.add(sample_node(nvml), owners, 1.0)
    nvml.gpus[0].energy_millijoules = 4_500
    accumulator.add(sample_node(nvml), owners, 1.0)
    assert accumulator.usage[JOB_A]["a100"].energy_joules == 2.5
    with pytest.raises(ValueError):
        accumulator.add(sample_node(nvml), owners, -1.0)


def test_registry_errors_reach_the_tick_report(tmp_path: Path) -> None:
    nvml = four_gpu_node()
    nvml.nvmlInit()
    (tmp_path / "lab_1_0.json").write_text("[]")
    report = tick(nvml, GpuRegistry(tmp_path), UsageAccumulator(), 1.0)
    assert report.registry_errors == [RegistryError(str(tmp_path / "lab_1_0.json"), "not a JSON object")]
