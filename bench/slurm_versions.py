"""bench.slurm_hooks per Slurm version: sbatch with gpucredit's job_submit.lua ÷ without,
and the PrologSlurmctld hook's p50/p99, in each chroot box (24.11, 26.05, 22.05-chroot).

Needs root and the chroot boxes' roots (`python -m slurmbox rootfs --slurm V`); brings
each box up, and down again when it was not up before. Run it under the box's lock:

    flock /tmp/gpucredit-box.lock .venv/bin/python -m bench.slurm_versions \\
        [--slurm 24.11 26.05] [--submissions 100] [--prolog-runs 100]

The method is bench.slurm_hooks's (the host's 22.05 box): one wrapper job_submit.lua
passes a job marked `--comment=bench-plain` straight back and hands every other job to
gpucredit's script, the two arms take turns submission by submission (ABBA), and the
check's own time inside slurmctld is read from its log. The timing loops run inside the
box, one python3 process in the root, so entering the box's namespaces is in no figure;
the hook runs as PrologSlurmctld runs it (its shim, no PATH, Slurm's variables) against a
running job. Prints, per version, the performance table's rows (bench.goals): PrologSlurmctld
p50 and p99 (goal 35 / 60 ms, must 50 / 100 ms) and sbatch's median with the check over
without it (goal 1.02, must 1.05).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time

from bench.goals import percentile, report
from bench.slurm_hooks import CHECKED, CHECKED_SCRIPT, PLAIN, WRAPPER
from slurm_hooks.admin import slurmconf
from slurmbox import versions
from slurmbox.chroot import ETC_DIR, LOG_DIR, ChrootBox

SBATCH = [
    "/usr/sbin/runuser", "-u", "alice", "--", "/usr/bin/sbatch", "--parsable", "--hold", "-A", "physics",
    "--gres=gpu:h100:1", "-t", "10", "-o", "/dev/null", "--wrap", "true",
]  # fmt: skip
CHECK_LINE = re.compile(r"gpucredit-bench: checked took ([0-9.]+) ms")

# Runs in the box's python3: the ABBA sbatch turns, or the hook's runs; JSON on stdout.
IN_BOX = r"""
import json, subprocess, sys, time
task = json.loads(sys.argv[1])
def timed(argv, env=None):
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{argv[-1]}: exit {done.returncode}: {done.stderr}")
    return time.perf_counter() - began, done.stdout.strip(), done.stderr
out = {"plain": [], "checked": [], "ids": [], "hook": []}
if task["kind"] == "sbatch":
    for comment in (task["plain"], task["checked"], task["checked"]):  # warm-ups
        _, job_id, said = timed(task["sbatch"] + ["--comment=" + comment])
        out["ids"].append(job_id)
    if "gpucredit:" not in said:
        sys.exit("gpucredit's check did not answer behind the bench wrapper: " + said)
    for turn in range(2 * task["pairs"]):
        arm = "checked" if turn % 4 in (1, 2) else "plain"
        seconds, job_id, _ = timed(task["sbatch"] + ["--comment=" + task[arm]])
        out[arm].append(seconds)
        out["ids"].append(job_id)
else:
    for restart in range(task["runs"]):
        env = dict(task["env"], SLURM_JOB_RESTART_COUNT=str(1000 + restart))
        out["hook"].append(timed(["/bin/sh", task["shim"]], env)[0])
print(json.dumps(out))
"""


def in_box(box: ChrootBox, task: dict[str, object]) -> dict[str, list[float]]:
    proc = box.run(["/usr/bin/python3", "-c", IN_BOX, json.dumps(task)], timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"Slurm {box.version.name}: {proc.stderr.strip()}")
    result: dict[str, list[float]] = json.loads(proc.stdout)
    return result


def ok(box: ChrootBox, argv: list[str], user: str | None = None) -> str:
    proc = box.run(argv, user=user)
    if proc.returncode != 0:
        raise SystemExit(f"Slurm {box.version.name}: {' '.join(argv)}: {proc.stderr.strip()}")
    return proc.stdout


def install_wrapper(box: ChrootBox) -> None:
    """bench.slurm_hooks's wrapper in front of gpucredit's script, inside the root; then
    past the mtime window of slurmctld's reload."""
    box.use_hooks("gpucredit")
    script = box.inside(f"{ETC_DIR}/job_submit.lua")
    box.inside(str(CHECKED_SCRIPT)).write_text(script.read_text())
    script.write_text(WRAPPER)
    time.sleep(max(0.0, script.stat().st_mtime + 1.1 - time.time()))


def measure(box: ChrootBox, pairs: int, prolog_runs: int) -> dict[str, float]:
    ok(box, ["gpucredit", "topup", "physics", "100000"])
    log = box.inside(f"{LOG_DIR}/slurmctld.log")
    ids: list[str] = []
    try:
        install_wrapper(box)
        log_from = log.stat().st_size
        turns = in_box(
            box, {"kind": "sbatch", "sbatch": SBATCH, "pairs": pairs, "plain": PLAIN, "checked": CHECKED}
        )
        ids += map(str, turns["ids"])
        checks = [
            float(ms) for ms in CHECK_LINE.findall(log.read_bytes()[log_from:].decode(errors="replace"))
        ]
        if len(checks) != pairs + 2:
            raise SystemExit(f"found {len(checks)} timed checks in {log} for {pairs} checked submissions + 2")
        running = ok(
            box,
            ["sbatch", "--parsable", "-A", "physics", "--gres=gpu:a100:1", "-t", "10", "-o", "/dev/null",
             "--wrap", "sleep 600"],
            user="alice",
        ).strip()  # fmt: skip
        ids.append(running)
        deadline = time.monotonic() + 60
        while ok(box, ["squeue", "-h", "-j", running, "-o", "%T"]).strip() != "RUNNING":
            if time.monotonic() > deadline:
                raise SystemExit(f"Slurm {box.version.name}: job {running} did not start")
            time.sleep(0.5)
        env = {
            "SLURM_JOB_ID": running, "SLURM_JOBID": running, "SLURM_CLUSTER_NAME": "lab",
            "SLURM_JOB_ACCOUNT": "physics", "SLURM_JOB_USER": "alice", "SLURM_JOB_PARTITION": "onprem",
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld", "GPUCREDIT_CONFIG": "/etc/gpucredit/gpucredit.toml",
        }  # fmt: skip
        shim = f"{slurmconf.DEFAULT_HOOK_DIR}/{slurmconf.shim_name('prolog-slurmctld')}"
        hook = in_box(box, {"kind": "hook", "runs": prolog_runs, "env": env, "shim": shim})["hook"]
    finally:
        box.use_hooks("gpucredit")
        box.inside(str(CHECKED_SCRIPT)).unlink(missing_ok=True)
        if ids:
            box.run(["scancel", *ids])
    return {
        "plain_ms": statistics.median(turns["plain"]) * 1000,
        "checked_ms": statistics.median(turns["checked"]) * 1000,
        "check_ms": statistics.median(checks[2:]),
        "p50_ms": percentile(hook, 0.5) * 1000,
        "p99_ms": percentile(hook, 0.99) * 1000,
        "submissions": len(turns["plain"]),
        "prolog_runs": len(hook),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slurm", nargs="+", default=["24.11", "26.05"], help="chroot versions")
    parser.add_argument("--submissions", type=int, default=100, help="per arm, taking turns")
    parser.add_argument("--prolog-runs", type=int, default=100)
    args = parser.parse_args()
    for name in args.slurm:
        box = ChrootBox(versions.get(name))
        was_up = box.is_up()
        box.up()
        try:
            got = measure(box, args.submissions, args.prolog_runs)
        finally:
            if not was_up:
                box.down()
        label = name.removesuffix("-chroot")
        share = 1 + got["check_ms"] / got["plain_ms"]
        print(
            f"Slurm {label}: sbatch median over {got['submissions']:.0f} each, taking turns: without "
            f"gpucredit's check {got['plain_ms']:.1f} ms, with it {got['checked_ms']:.1f} ms; the check "
            f"inside slurmctld {got['check_ms']:.2f} ms (x{share:.3f} of sbatch "
            f"without it); PrologSlurmctld over {got['prolog_runs']:.0f} runs"
        )
        report(f"hooks {label}: PrologSlurmctld p50", got["p50_ms"], goal=35, must=50, better="<=", unit="ms")
        report(
            f"hooks {label}: PrologSlurmctld p99", got["p99_ms"], goal=60, must=100, better="<=", unit="ms"
        )
        report(
            f"hooks {label}: sbatch with job_submit.lua ÷ without",
            got["checked_ms"] / got["plain_ms"],
            goal=1.02,
            must=1.05,
            better="<=",
        )


if __name__ == "__main__":
    main()
