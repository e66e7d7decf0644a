"""The NVML agent's sampler on a real GPU, and a recording the fake is checked against.

Run on a node with an NVIDIA driver (stdlib + nvidia-ml-py; PyTorch optional, for load):

    python3 -m bench.nvml_device [--out DIR] [--load-seconds 8]

It samples every unit with the agent's own code (`accounting_bridge.nvml.sampler`), owns
GPU 0 by a job run through a real registry file, ticks once a second idle, under a
matrix-multiply load, and idle again, and checks what the agent would record:
allocated GPU-seconds exactly the sum of the intervals, busy seconds only under load,
energy and peak memory rising under load. It also writes `nvml_recording.json`:
what each NVML call the fake imitates returned on this GPU (result fields, error
codes), which `tests/bridge/test_nvml_sampler.py` compares with `FakeNvml` in CI, where no
GPU exists. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from accounting_bridge.nvml.sampler import (
    GpuRegistry,
    JobRunKey,
    UsageAccumulator,
    import_pynvml,
    sample_node,
    tick,
)

LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = a @ a
torch.cuda.synchronize()
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
"""


def _call(nvml: Any, name: str, *args: Any) -> dict[str, Any]:
    """One call's outcome as data: the result's fields, or the NVML error code."""
    if not hasattr(nvml, name):
        return {"missing": True}
    try:
        value = getattr(nvml, name)(*args)
    except nvml.NVMLError as exc:
        return {"error": type(exc).__name__, "code": exc.value}
    return {"result": _plain(value)}


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    fields = getattr(value, "_fields_", None)
    if fields is not None:
        return {"type": type(value).__name__, **{f[0]: _plain(getattr(value, f[0])) for f in fields}}
    if hasattr(value, "__dict__"):
        return {"type": type(value).__name__, **{k: _plain(v) for k, v in vars(value).items()}}
    return repr(value)


def record_calls(nvml: Any) -> dict[str, Any]:
    """What the calls the sampler makes (and the fake imitates) return on GPU 0."""
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    count = nvml.nvmlDeviceGetCount()
    return {
        "driver": _call(nvml, "nvmlSystemGetDriverVersion"),
        "nvmlDeviceGetCount": {"result": count},
        "nvmlDeviceGetHandleByIndex(count)": _call(nvml, "nvmlDeviceGetHandleByIndex", count),
        "nvmlDeviceGetIndex": _call(nvml, "nvmlDeviceGetIndex", handle),
        "nvmlDeviceGetMinorNumber": _call(nvml, "nvmlDeviceGetMinorNumber", handle),
        "nvmlDeviceGetUUID": _call(nvml, "nvmlDeviceGetUUID", handle),
        "nvmlDeviceGetName": _call(nvml, "nvmlDeviceGetName", handle),
        "nvmlDeviceGetUtilizationRates": _call(nvml, "nvmlDeviceGetUtilizationRates", handle),
        "nvmlDeviceGetMemoryInfo": _call(nvml, "nvmlDeviceGetMemoryInfo", handle),
        "nvmlDeviceGetTotalEnergyConsumption": _call(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle),
        "nvmlDeviceGetComputeRunningProcesses": _call(nvml, "nvmlDeviceGetComputeRunningProcesses", handle),
        "nvmlDeviceGetMigMode": _call(nvml, "nvmlDeviceGetMigMode", handle),
        "nvmlDeviceGetMaxMigDeviceCount": _call(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle),
        "nvmlDeviceGetMigDeviceHandleByIndex(0)": _call(
            nvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, 0
        ),
        "nvmlDeviceIsMigDeviceHandle": _call(nvml, "nvmlDeviceIsMigDeviceHandle", handle),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--load-seconds", type=float, default=8.0)
    args = parser.parse_args(argv)
    nvml = import_pynvml()
    nvml.nvmlInit()
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(("ok    " if ok else "FAIL  ") + what, flush=True)
        if not ok:
            failures.append(what)

    first = sample_node(nvml)
    for unit in first.units:
        print(
            f"unit {unit.unit_index}: {unit.name} {unit.uuid} util={unit.utilization_percent}% "
            f"mem={unit.memory_used_bytes}/{unit.memory_total_bytes} energy_mJ={unit.energy_millijoules} "
            f"processes={unit.process_count} mig={unit.is_mig}"
        )
    check(bool(first.units) and not first.failures, "every GPU sampled without an NVML failure")

    spool = Path(tempfile.mkdtemp(prefix="gpucredit-agent-"))
    registry = GpuRegistry(spool)
    key = JobRunKey("device", 1, 0)
    registry.register(key, {0: "h200"})
    accumulator = UsageAccumulator()
    phases: dict[str, dict[str, float]] = {}

    def run_phase(name: str, seconds: float) -> None:
        before = accumulator.usage.get(key, {}).get("h200")
        start_alloc = before.allocated_gpu_seconds if before else 0.0
        start_busy = before.busy_gpu_seconds if before else 0.0
        start_energy = before.energy_joules if before else 0.0
        intervals = 0.0
        last = time.monotonic()
        end = last + seconds
        while time.monotonic() < end:
            time.sleep(1.0)
            now = time.monotonic()
            interval = round(now - last, 3)
            last = now
            intervals += interval
            report = tick(nvml, registry, accumulator, interval)
            if report.failures or report.conflicts or report.registry_errors:
                failures.append(f"{name}: tick reported {report}")
        usage = accumulator.usage[key]["h200"]
        phases[name] = {
            "intervals_s": round(intervals, 3),
            "allocated_gpu_s": round(usage.allocated_gpu_seconds - start_alloc, 3),
            "busy_gpu_s": round(usage.busy_gpu_seconds - start_busy, 3),
            "energy_j": round(usage.energy_joules - start_energy, 3),
            "peak_memory_bytes": usage.peak_memory_bytes,
        }
        print(f"{name}: {phases[name]}", flush=True)

    run_phase("idle", 3)
    load = subprocess.Popen(
        [sys.executable, "-c", LOAD, str(args.load_seconds)], stdout=subprocess.PIPE, text=True
    )
    assert load.stdout is not None
    check(load.stdout.readline().strip() == "ready", "the load started (PyTorch on the GPU)")
    time.sleep(1.0)  # NVML's utilisation is a recent-window figure
    during = record_calls(nvml)
    run_phase("load", args.load_seconds - 3)
    load.wait(timeout=120)
    run_phase("idle after", 3)

    for name, phase in phases.items():
        check(
            abs(phase["allocated_gpu_s"] - phase["intervals_s"]) < 1e-6,
            f"{name}: allocated GPU-seconds {phase['allocated_gpu_s']} = ticked {phase['intervals_s']}",
        )
    check(
        phases["load"]["busy_gpu_s"] > 0.5 * phases["load"]["intervals_s"],
        f"load: busy {phases['load']['busy_gpu_s']} s of {phases['load']['intervals_s']} s",
    )
    check(
        phases["idle"]["busy_gpu_s"] <= 0.1 * phases["idle"]["intervals_s"],
        f"idle: busy {phases['idle']['busy_gpu_s']} s of {phases['idle']['intervals_s']} s",
    )
    check(
        phases["load"]["energy_j"] > phases["idle"]["energy_j"],
        f"energy under load {phases['load']['energy_j']} J > idle {phases['idle']['energy_j']} J",
    )
    check(
        phases["load"]["peak_memory_bytes"] > first.units[0].memory_used_bytes,
        "peak memory under load above the idle reading",
    )
    recording = {"idle": record_calls(nvml), "under_load": during, "phases": phases, "failures": failures}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nvml_recording.json").write_text(json.dumps(recording, indent=2, sort_keys=True) + "\n")
    nvml.nvmlShutdown()
    print("all checks passed" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
