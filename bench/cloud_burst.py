"""A cloud-allowed job's way from submission to its start on a powered-down node, on the
host's Slurm box with its cloud (slurmbox/box_cloud.py: cloud1 in partition burst, moto's
EC2 server as the provider), split into Slurm's decision, the provider call and the boot;
then the share of the instance's hours that were billed to the job.

Needs root and the box with its cloud; run it under the box's lock:

    GPUCREDIT_BOX_CLOUD=1 make slurm-up
    flock /tmp/gpucredit-box.lock .venv/bin/python -m bench.cloud_burst [--runs 3] [--job-seconds 20]

Each run waits for cloud1 powered down (idle~), submits `-p burst` as alice, and times:

    decision   submission -> slurmctld runs ResumeProgram (a wrapper around the box's
               shim stamps its start and its end; the shim itself is unchanged)
    provider   ResumeProgram's run: `gpucredit cloud resume` (its start-up, boto3,
               RunInstances at moto on 127.0.0.1: no network, so an AWS call adds more)
    boot       ResumeProgram's end -> slurmctld logs "Node cloud1 now responding" (the box's
               boot delay, its boot poll, slurmd's start and registration)
    configure  that -> the job RUNNING (slurmctld ends a job's CONFIGURING in a periodic
               check, "job_time_limit: Configuration for JobId=N complete")

After the job ends the node idles SuspendTime seconds and is ended; the instance's
launch-to-end time is what the provider bills, the job's elapsed time what users were
charged for. The share is the second over the first (boot and idle are the site's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from bench.goals import report
from slurm_hooks.admin import slurmconf
from slurmbox import SlurmBox, box_cloud
from slurmbox.box import LOG_DIR

T = TypeVar("T")
GPUCREDIT = str(Path(__file__).resolve().parent.parent / ".venv" / "bin" / "gpucredit")
CONFIG = os.environ.get("GPUCREDIT_CONFIG", "/etc/gpucredit/gpucredit.toml")  # the box's site
STAMPS = Path("/run/gpucredit-box/bench-resume.stamps")
LOG = LOG_DIR / "slurmctld.log"
SHIM = Path(slurmconf.DEFAULT_HOOK_DIR) / slurmconf.cloud_shim_name("resume")
REAL_SHIM = SHIM.with_name("cloud_resume.bench-real.sh")
WRAPPER = f"""#!/bin/sh
# bench.cloud_burst: stamps ResumeProgram's start and end around the box's own shim.
echo "start $(/usr/bin/date +%s.%N)" >> {STAMPS}
{REAL_SHIM} "$@"
rc=$?
echo "end $(/usr/bin/date +%s.%N)" >> {STAMPS}
exit $rc
"""


def slurm(*argv: str, user: str | None = None) -> str:
    command = ["/usr/sbin/runuser", "-u", user, "--", *argv] if user else list(argv)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd="/tmp")
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout.strip()


def wait(what: str, check: Callable[[], T], timeout: float, every: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not after {timeout} s")
        time.sleep(every)


def node_state() -> str:
    return slurm("sinfo", "-h", "-n", "cloud1", "-o", "%T")


def gpucredit(*args: str, config: str = CONFIG) -> str:
    env = {**os.environ, "GPUCREDIT_CONFIG": config, **box_cloud.CREDENTIALS}
    done = subprocess.run([GPUCREDIT, *args], env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SystemExit(f"gpucredit {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def instances() -> list[dict[str, object]]:
    listed = json.loads(gpucredit("cloud", "instances", "--format", "json", config=str(box_cloud.CONFIG)))
    return [row for row in listed if row["node"] == "cloud1"]


def one_run(job_seconds: int) -> dict[str, float]:
    wait("cloud1 powered down", lambda: node_state() == "idle~", box_cloud.RESUME_TIMEOUT_SECONDS + 120, 0.5)
    before = {row["id"] for row in instances()}
    STAMPS.unlink(missing_ok=True)
    submitted = time.time()
    job = slurm(
        "sbatch", "--parsable", "-A", "physics", "-p", box_cloud.PARTITION, "--gres=gpu:h100:1", "-t", "5",
        "-o", "/dev/null", "--wrap", f"sleep {job_seconds}",
        user="alice",
    )  # fmt: skip
    state = lambda: slurm("squeue", "-h", "-j", job, "-o", "%T")  # noqa: E731
    wait("the job running", lambda: state() == "RUNNING", box_cloud.RESUME_TIMEOUT_SECONDS + 60)
    started = time.time()
    stamps = dict(line.split() for line in STAMPS.read_text().splitlines())
    responding = [
        datetime.fromisoformat(stamp).timestamp()
        for stamp in re.findall(r"^\[([0-9T:.-]+)\] Node cloud1 now responding$", LOG.read_text(), re.M)
    ]
    node_up = max(responding)
    wait("the job done", lambda: state() == "", job_seconds + 60, 0.5)
    [launched] = wait(
        "the instance ended",
        lambda: [r for r in instances() if r["id"] not in before and r["terminated_at"]],
        box_cloud.SUSPEND_TIME_SECONDS + 120,
        1.0,
    )
    elapsed = int(slurm("sacct", "-n", "-X", "-P", "-j", job, "-o", "ElapsedRaw").splitlines()[0])
    billed = datetime.fromisoformat(str(launched["terminated_at"])) - datetime.fromisoformat(
        str(launched["launched_at"])
    )
    return {
        "decision": float(stamps["start"]) - submitted,
        "provider": float(stamps["end"]) - float(stamps["start"]),
        "boot": node_up - float(stamps["end"]),
        "configure": started - node_up,
        "total": started - submitted,
        "elapsed": elapsed,
        "instance": billed.total_seconds(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--job-seconds", type=int, default=20)
    args = parser.parse_args()
    box = SlurmBox()
    if not box.is_up() or " Nodes=cloud1 " not in slurm("scontrol", "show", "partition", "burst", "-o"):
        raise SystemExit("the Slurm box runs no cloud: GPUCREDIT_BOX_CLOUD=1 make slurm-down slurm-up")
    gpucredit("topup", "physics", "1000")
    REAL_SHIM.write_text(SHIM.read_text())
    REAL_SHIM.chmod(0o755)
    SHIM.write_text(WRAPPER)
    runs = []
    try:
        for _ in range(args.runs):
            runs.append(one_run(args.job_seconds))
    finally:
        SHIM.write_text(REAL_SHIM.read_text())
        REAL_SHIM.unlink()
        STAMPS.unlink(missing_ok=True)
    for i, run in enumerate(runs, 1):
        print(
            f"run {i}: submit -> start {run['total']:.2f} s = decision {run['decision']:.2f} + provider "
            f"{run['provider']:.2f} + boot {run['boot']:.2f} (boot delay {box_cloud.BOOT_DELAY_SECONDS} s) "
            f"+ configure {run['configure']:.2f}; "
            f"job {run['elapsed']:.0f} s of the instance's {run['instance']:.0f} s"
        )
    median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    share = sum(run["elapsed"] for run in runs) / sum(run["instance"] for run in runs)
    print(
        f"median over {len(runs)}: submit -> start {median['total']:.2f} s: Slurm's decision "
        f"{median['decision']:.2f} s, the provider call {median['provider']:.2f} s, the boot "
        f"{median['boot']:.2f} s against a boot delay of {box_cloud.BOOT_DELAY_SECONDS} s, Slurm's "
        f"configure check {median['configure']:.2f} s; "
        f"{share:.1%} of the instance-hours billed to jobs (SuspendTime {box_cloud.SUSPEND_TIME_SECONDS} s)"
    )
    report(
        "cloud: submit -> start beyond the boot delay",
        median["total"] - box_cloud.BOOT_DELAY_SECONDS,
        goal=10,
        must=30,
        better="<=",
        unit="s",
    )


if __name__ == "__main__":
    main()
