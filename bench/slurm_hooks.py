"""What gpucredit adds to Slurm: sbatch wall time with and without its job_submit.lua,
and the PrologSlurmctld hook's latency, measured on the Slurm box in one run.

Needs root and the box with gpucredit on it (`make slurm-up`). Submissions are held
(`--hold`) so nothing runs, and are cancelled at the end.

    .venv/bin/python -m bench.slurm_hooks [--submissions 200] [--new-lines 40] [--prolog-runs 100]

The two arms take turns submission by submission (ABBA), under one script: a bench
wrapper installed as job_submit.lua hands a job marked `--comment=bench-plain` straight
back (what a pass-through script does) and every other job to gpucredit's script,
timing that check with the script's own clock. Taking turns in blocks under two
scripts (a reload between blocks) measured this machine's drift from block to block as
much as the script: two runs of `make bench` on the same code read x0.94 and x1.19. The
check's own time, inside slurmctld, is the direct measure of what the ratio estimates.
The arms repeat one line, as a user's submissions of one kind do, so the daemon answers
them from its quote memo; the check for lines it has not seen yet is timed too.

Ends with the performance table's rows (bench.goals): the PrologSlurmctld hook's p50
and p99 (goal 35 / 60 ms, must 50 / 100 ms) and sbatch's median with gpucredit's
job_submit.lua over without it (goal 1.02, must 1.05).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
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
LOG = LOG_DIR / "slurmctld.log"
PLAIN, CHECKED = "bench-plain", "bench-check"  # the two arms' comments, of one length

# The installed gpucredit script, moved aside while the wrapper below stands in for it.
CHECKED_SCRIPT = Path(ETC_DIR) / "job_submit.gpucredit-bench.lua"
WRAPPER = f"""
-- bench.slurm_hooks: a job marked {PLAIN} is passed through; every other job gets
-- gpucredit's check. Both arms are timed with luasocket's clock and logged, so each pays
-- the same log line.
dofile("{CHECKED_SCRIPT}")
local checked = slurm_job_submit
local socket = require("socket")
function slurm_job_submit(job_desc, part_list, submit_uid)
    local began = socket.gettime()
    local arm, rc = "plain", slurm.SUCCESS
    if job_desc.comment ~= "{PLAIN}" then
        arm, rc = "checked", checked(job_desc, part_list, submit_uid)
    end
    slurm.log_info("gpucredit-bench: %s took %.4f ms", arm, (socket.gettime() - began) * 1000)
    return rc
end
return slurm.SUCCESS
"""


def install_wrapper(box: SlurmBox) -> None:
    """gpucredit's script as `gpucredit slurm install` writes it, behind the wrapper; wait
    out the mtime window of slurmctld's reload (it reloads the script whenever its mtime is
    past the last load, and the install dates it up to 2 s ahead) and let one submission
    load it."""
    box.use_hooks("gpucredit")
    script = Path(ETC_DIR) / "job_submit.lua"
    CHECKED_SCRIPT.write_text(script.read_text())
    script.write_text(WRAPPER)
    time.sleep(max(0.0, script.stat().st_mtime + 1.1 - time.time()))


def sbatch(comment: str) -> tuple[float, str, str]:
    began = time.perf_counter()
    done = subprocess.run([*SBATCH, f"--comment={comment}"], capture_output=True, text=True, check=True)
    return time.perf_counter() - began, done.stdout.strip(), done.stderr


def sbatch_turns(pairs: int, ids: list[str]) -> tuple[list[float], list[float], list[float]]:
    """sbatch times without and with the check, in ABBA order submission by submission,
    and the check's own times from slurmctld's log; the job ids go into `ids`."""
    for comment in (PLAIN, CHECKED, CHECKED):  # warm-ups; the last proves the check answers
        _, job_id, stderr = sbatch(comment)
        ids.append(job_id)
    if "gpucredit:" not in stderr:
        raise SystemExit(f"gpucredit's check did not answer behind the bench wrapper: {stderr!r}")
    start = LOG.stat().st_size
    plain: list[float] = []
    checked: list[float] = []
    for turn in range(2 * pairs):
        comment, into = ((PLAIN, plain), (CHECKED, checked))[turn % 4 in (1, 2)]
        seconds, job_id, _ = sbatch(comment)
        into.append(seconds)
        ids.append(job_id)
    return plain, checked, logged_checks(start, pairs, "checked submissions")


def first_seen_checks(count: int, ids: list[str]) -> list[float]:
    """The check's own times for lines the daemon has not seen (a new comment each, of the
    arms' length): its quote memo and its parse memo both miss, as for a site's first
    submission of a kind."""
    start = LOG.stat().st_size
    run_mark = f"{secrets.randbelow(256):02x}"  # so a second run's lines are new too
    for number in range(count):
        _, job_id, _ = sbatch(f"bench-{run_mark}{number:03d}")
        ids.append(job_id)
    return logged_checks(start, count, "new lines")


def logged_checks(start: int, expected: int, what: str) -> list[float]:
    """The check times the wrapper logged past offset `start` of slurmctld's log, in seconds."""
    with LOG.open() as lines:
        lines.seek(start)
        logged = re.findall(r"gpucredit-bench: checked took ([0-9.]+) ms", lines.read())
    if len(logged) != expected:
        raise SystemExit(f"found {len(logged)} timed checks in {LOG} for {expected} {what}")
    return [float(ms) / 1000 for ms in logged]


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
    parser.add_argument("--submissions", type=int, default=200, help="per arm, taking turns")
    parser.add_argument("--new-lines", type=int, default=40, help="submissions of lines not seen before")
    parser.add_argument("--prolog-runs", type=int, default=100)
    args = parser.parse_args()
    if not 1 <= args.new_lines <= 999:
        parser.error("--new-lines is 1 to 999 (each line's comment is as long as the arms')")
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
        install_wrapper(box)
        plain, with_gpucredit, checks = sbatch_turns(args.submissions, ids)
        first_seen = first_seen_checks(args.new_lines, ids)
        running = box.submit(["-A", "physics", "--gres=gpu:a100:1", "-t", "10", "--wrap", "sleep 600"])
        ids.append(str(running))
        box.wait_state(running, "RUNNING", timeout=60)
        shim = str(Path(box.hook_dir) / "prolog_slurmctld.sh")
        prolog = prolog_times(shim, str(running), args.prolog_runs)
    finally:
        box.use_hooks("gpucredit")  # gpucredit's script again, without the wrapper
        CHECKED_SCRIPT.unlink(missing_ok=True)
        if ids:
            run(["/usr/bin/scancel", *ids], check=False)
    plain_ms, gc_ms = statistics.median(plain) * 1000, statistics.median(with_gpucredit) * 1000
    print(
        f"sbatch median over {len(plain)} each, taking turns: without gpucredit's check {plain_ms:.1f} ms, "
        f"with it {gc_ms:.1f} ms"
    )
    check_ms = statistics.median(checks) * 1000
    print(
        f"job_submit.lua's check inside slurmctld, median of {len(checks)}: {check_ms:.2f} ms "
        f"(x{1 + check_ms / plain_ms:.3f} of sbatch without it)"
    )
    first_ms = statistics.median(first_seen) * 1000
    print(
        f"the check for a line the daemon has not seen yet, median of {len(first_seen)}: {first_ms:.2f} ms "
        f"(x{1 + first_ms / plain_ms:.3f} of sbatch without it; a line seen before is answered from the "
        "daemon's quote memo)"
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
