"""What gpucredit adds to Slurm: sbatch wall time with and without its job_submit.lua,
and the PrologSlurmctld hook's latency, measured on the Slurm box in one run.

Needs root and the box with gpucredit on it (`make slurm-up`). Submissions are held
(`--hold`) so nothing runs, and are cancelled at the end.

    .venv/bin/python -m bench.slurm_hooks [--submissions 60] [--prolog-runs 100]

It also times job_submit.lua's check inside slurmctld (the script's own clock, logged),
the direct measure of what the ratio below estimates through sbatch's noise.

Ends with the performance table's rows (bench.goals): the PrologSlurmctld hook's p50
and p99 (goal 35 / 60 ms, must 50 / 100 ms) and sbatch's median with gpucredit's
job_submit.lua over without it (goal 1.02, must 1.05).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

from bench.goals import percentile, report
from slurmbox import SlurmBox, run
from slurmbox.box import ETC_DIR, LOG_DIR

GPUCREDIT = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "gpucredit")
CONFIG = os.environ.get("GPUCREDIT_CONFIG", "/etc/gpucredit/gpucredit.toml")
SBATCH = [
    "/usr/sbin/runuser",
    "-u",
    "alice",
    "--",
    "/usr/bin/sbatch",
    "--parsable",
    "--hold",
    "-A",
    "physics",
    "--gres=gpu:h100:1",
    "-t",
    "10",
    "--wrap",
    "true",
]


ROUNDS = 6


def sbatch_times(count: int) -> tuple[list[float], list[str]]:
    times, ids = [], []
    for _ in range(count):
        began = time.perf_counter()
        done = subprocess.run(SBATCH, capture_output=True, text=True, check=True)
        times.append(time.perf_counter() - began)
        ids.append(done.stdout.strip())
    return times, ids


def switch_script(box: SlurmBox, mode: str) -> list[str]:
    """Install `mode`'s hooks and make sure slurmctld runs its job_submit.lua, and only
    reloads it before the measured submissions. slurmctld reloads the script whenever its
    mtime is past the last load, and the install dates it up to 2 s ahead (so a rewrite
    within the second of the last load is not missed): every submission until then
    reloads it. Wait that out, then let one submission load it; the warm-ups show which
    script answered (gpucredit's quotes, on stderr)."""
    box.use_hooks(mode)
    script = Path(ETC_DIR) / "job_submit.lua"
    time.sleep(max(0.0, script.stat().st_mtime + 1.1 - time.time()))
    ids = []
    for _ in range(3):  # the first also warm slurmctld's and the daemon's caches
        done = subprocess.run(SBATCH, capture_output=True, text=True, check=True)
        ids.append(done.stdout.strip())
    if ("gpucredit:" in done.stderr) != (mode == "gpucredit"):
        raise SystemExit(f"slurmctld did not switch to the {mode} job_submit.lua: {done.stderr!r}")
    return ids


# Appended to the installed script: times its whole check (request, exchange, answer)
# with luasocket's clock and logs it to slurmctld's log, where check_times reads it.
TIMED_CHECK = """
local untimed_submit = slurm_job_submit
function slurm_job_submit(job_desc, part_list, submit_uid)
    local began = socket.gettime()
    local rc = untimed_submit(job_desc, part_list, submit_uid)
    slurm.log_info("gpucredit-bench: check took %.4f ms", (socket.gettime() - began) * 1000)
    return rc
end
"""


def check_times(count: int) -> tuple[list[float], list[str]]:
    """job_submit.lua's check as slurmctld runs it: the installed script with TIMED_CHECK
    appended (reinstalled unchanged by the caller's use_hooks)."""
    script = Path(ETC_DIR) / "job_submit.lua"
    text = script.read_text()
    end = text.rindex("return SUCCESS")
    script.write_text(text[:end] + TIMED_CHECK + text[end:])
    time.sleep(max(0.0, script.stat().st_mtime + 1.1 - time.time()))  # see switch_script
    log = LOG_DIR / "slurmctld.log"
    _, ids = sbatch_times(3)
    start = log.stat().st_size
    more = sbatch_times(count)[1]
    with log.open() as lines:
        lines.seek(start)
        logged = re.findall(r"gpucredit-bench: check took ([0-9.]+) ms", lines.read())
    times = [float(ms) / 1000 for ms in logged]
    if len(times) != count:
        raise SystemExit(f"found {len(times)} timed checks in {log} for {count} submissions")
    return times, ids + more


def prolog_times(shim: str, job_id: str, runs: int) -> list[float]:
    """The hook as PrologSlurmctld runs it: its shim (the settings it carries, then
    `gpucredit hook`), a fresh process, Slurm's environment and no PATH, against a running
    job (so its start time is parsed too)."""
    times = []
    for restart in range(runs):
        env = {
            "SLURM_JOB_ID": job_id,
            "SLURM_JOBID": job_id,
            "SLURM_CLUSTER_NAME": "lab",
            "SLURM_JOB_ACCOUNT": "physics",
            "SLURM_JOB_USER": "alice",
            "SLURM_JOB_PARTITION": "onprem",
            "SLURM_JOB_RESTART_COUNT": str(1000 + restart),
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld",
            "GPUCREDIT_CONFIG": CONFIG,
        }
        began = time.perf_counter()
        done = subprocess.run(["/bin/sh", shim], env=env, capture_output=True)
        times.append(time.perf_counter() - began)
        if done.returncode != 0:
            raise SystemExit(f"the prolog hook failed: {done.stderr.decode()}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=120, help=f"per script, in {ROUNDS} blocks")
    parser.add_argument("--prolog-runs", type=int, default=100)
    args = parser.parse_args()
    box = SlurmBox()
    if not box.is_up():
        raise SystemExit("the Slurm box is not up: make slurm-up")
    subprocess.run(
        [GPUCREDIT, "topup", "physics", "100000"],
        env={**os.environ, "GPUCREDIT_CONFIG": CONFIG},
        check=True,
        capture_output=True,
    )
    ids: list[str] = []
    try:
        # The two scripts take turns in short blocks, in ABBA order: one long block each
        # measured the machine's drift between them as much as the script (±10%).
        plain: list[float] = []
        with_gpucredit: list[float] = []
        per_block = max(1, args.submissions // ROUNDS)
        for turn in range(2 * ROUNDS):
            mode, into = (("passthrough", plain), ("gpucredit", with_gpucredit))[turn % 4 in (1, 2)]
            ids += switch_script(box, mode)
            times, more = sbatch_times(per_block)
            into += times
            ids += more
        ids += switch_script(box, "gpucredit")
        checks, more = check_times(args.submissions // 2)
        ids += more
        ids += switch_script(box, "gpucredit")  # the untimed script again
        running = box.submit(["-A", "physics", "--gres=gpu:a100:1", "-t", "10", "--wrap", "sleep 600"])
        ids.append(str(running))
        box.wait_state(running, "RUNNING", timeout=60)
        shim = str(Path(box.hook_dir) / "prolog_slurmctld.sh")
        prolog = prolog_times(shim, str(running), args.prolog_runs)
    finally:
        box.use_hooks("gpucredit")
        if ids:
            run(["/usr/bin/scancel", *ids], check=False)
    plain_ms, gc_ms = statistics.median(plain) * 1000, statistics.median(with_gpucredit) * 1000
    print(
        f"sbatch median over {len(plain)} each: without gpucredit {plain_ms:.1f} ms, "
        f"with gpucredit's job_submit {gc_ms:.1f} ms"
    )
    check_ms = statistics.median(checks) * 1000
    print(
        f"job_submit.lua's check inside slurmctld, median of {len(checks)}: {check_ms:.2f} ms "
        f"(x{1 + check_ms / plain_ms:.3f} of sbatch without it)"
    )
    print(f"prolog-slurmctld hook over {args.prolog_runs} runs (a new hold each)")
    py = [0.0] * 20
    for i in range(20):
        began = time.perf_counter()
        subprocess.run(["/usr/bin/python3", "-c", "pass"], check=True)
        py[i] = time.perf_counter() - began
    print(f"for scale: a bare `python3 -c pass` takes {statistics.median(py) * 1000:.1f} ms here")
    report(
        "hooks: PrologSlurmctld p50", percentile(prolog, 0.5) * 1000, goal=35, must=50, better="<=", unit="ms"
    )
    report(
        "hooks: PrologSlurmctld p99",
        percentile(prolog, 0.99) * 1000,
        goal=60,
        must=100,
        better="<=",
        unit="ms",
    )
    report("hooks: sbatch with job_submit.lua ÷ without", gc_ms / plain_ms, goal=1.02, must=1.05, better="<=")


if __name__ == "__main__":
    main()
