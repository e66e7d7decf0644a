"""Jain's fairness index of GPU-seconds against credit-derived shares on the Slurm box,
without and with `gpucredit fairshare sync`, measured side by side.

Two groups of three accounts, each group under a parent of its own, are funded 100,
200 and 400 credits (so each account is entitled to 1/7, 2/7 and 4/7 of its group's
GPUs when they are scarce). One group keeps Slurm's default shares (1 each: no sync),
the other gets the ledger's shares from a sync. The groups run at the same time, under
the same scheduler, clock and load, but never compete: the first group's jobs run on
node3's two A100s (partition cloud), the second's on node1's two (partition onprem,
`-w node1`). Separate partitions matter: a job that cannot start blocks lower-priority
jobs of its partition in Slurm's main loop, and backfill reserves whole nodes, so two
groups in one partition starve the lower-priority one. Every account queues more 1-GPU
jobs of --job-seconds than its group's GPUs could run in the --window, as held arrays
of five interleaved across the accounts (ties in the first minute, before Slurm has any
usage, favour none), released at once.

GPU-seconds per account come from sacct, clipped to the window. With x_i =
(GPU-seconds_i / the group's GPU-seconds) / (credit_i / the group's credit), Jain's
index J = (sum x)^2 / (n sum x^2) is 1 when every account got exactly its entitlement
and 1/n when one got everything. Slurm recomputes usage and priorities every
PriorityCalcPeriod (1 minute on the box) and Fair Tree gives each recomputation's
winner the free GPUs, so only a window of many minutes says anything.

Needs root and the box, under the box lock (the window plus about two minutes); the
box runs the pass-through hooks meanwhile (nothing is billed) and gets its hooks back.

    flock /tmp/slurmbox.lock .venv/bin/python -m bench.fairshare_fairness [--window 600] [--job-seconds 20]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from accounting_bridge.slurm.records import parse_parsable2, sacct_argv
from accounting_bridge.slurm.slurmcmd import SubprocessRunner
from accounting_bridge.sync.fairshare import FairsharePolicy, account_shares
from accounting_bridge.sync.fairshare_sync import apply_plan, plan_changes, read_associations, show_argv
from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade
from ledger.timeutil import utcnow
from slurmbox import SlurmBox, run
from slurmtext import parse_parsable

CREDIT = (100, 200, 400)
GPUS = 2  # each group's A100s
ARRAY = 5  # tasks per submitted array
PLACES = {"without": ["-p", "cloud"], "with": ["-p", "onprem", "-w", "node1"]}
CLUSTER = "lab"


def jain(x: list[float]) -> float:
    return sum(x) ** 2 / (len(x) * sum(v * v for v in x))


def sync(accounts: list[str], directory: Path) -> None:
    """The ledger's shares for `accounts` into Slurm, as `gpucredit fairshare sync` does."""
    engine = make_engine(f"sqlite:///{directory / 'ledger.db'}")
    upgrade(engine)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        for account, credit in zip(accounts, CREDIT, strict=True):
            api.create_account(s, account)
            api.add_member(s, "alice", account)
            api.topup(s, account, str(credit))
    now = utcnow()  # after the top-ups took effect
    policy = FairsharePolicy()
    with factory() as s, s.begin():
        inputs = api.fairness_inputs(
            s,
            now,
            funded_since=now - timedelta(days=policy.funded_days),
            spent_since=now - timedelta(days=policy.spent_days),
        )
    engine.dispose()
    runner = SubprocessRunner()
    current = read_associations(runner(show_argv(CLUSTER)))
    plan = plan_changes(account_shares(inputs, policy), current, CLUSTER)
    apply_plan(runner, plan)
    print("  shares set: " + ", ".join(f"{c.account}/{c.user or '-'}={c.new}" for c in plan.changes))


def sacctmgr(*args: str) -> None:
    run(["/usr/bin/sacctmgr", "--immediate", *args])


def my_jobs(accounts: list[str]) -> list[str]:
    out = run(["/usr/bin/squeue", "-h", "-r", "-o", "%i|%a"], check=False).stdout
    return [row["job"] for row in parse_parsable(out, ("job", "account")) if row["account"] in accounts]


def end_jobs(accounts: list[str]) -> None:
    for job in my_jobs(accounts):
        run(["/usr/bin/scancel", job], check=False)
    deadline = time.monotonic() + 60
    while my_jobs(accounts) and time.monotonic() < deadline:
        time.sleep(1)


def workload(groups: dict[str, list[str]], window: int, job_seconds: int) -> dict[str, int]:
    """Queue the jobs (where they run -> that group's accounts), release them together,
    and return GPU-seconds per account in the window."""
    box = SlurmBox()
    arrays = []
    for _ in range(window * GPUS // job_seconds // ARRAY + 2):  # more than the GPUs can run
        for place, accounts in groups.items():
            for account in accounts:
                args = ["--hold", f"--array=0-{ARRAY - 1}", "-A", account, *PLACES[place], "-t", "2"]
                args += ["--gres=gpu:a100:1", "--wrap", f"sleep {job_seconds}"]
                arrays.append(str(box.submit(args)))
    every = [account for accounts in groups.values() for account in accounts]
    start = utcnow()
    run(["/usr/bin/scontrol", "release", ",".join(arrays)])
    time.sleep(window)  # the measurement itself: the workload runs this long
    end = utcnow()
    end_jobs(every)
    gpu_seconds = dict.fromkeys(every, 0)
    parsed = parse_parsable2(SubprocessRunner()(sacct_argv(start, end)))
    for job in parsed.runs:
        if job.account in gpu_seconds and job.start is not None:
            began, ended = max(job.start, start), min(job.end or end, end)
            gpu_seconds[job.account] += max(0, int((ended - began).total_seconds())) * job.gpu_count
    return gpu_seconds


def report(title: str, accounts: list[str], used: dict[str, int], window: int) -> float:
    total = sum(used[a] for a in accounts)
    x = [(used[a] / total) / (c / sum(CREDIT)) for a, c in zip(accounts, CREDIT, strict=True)]
    print(f"{title}:")
    for account, credit, value in zip(accounts, CREDIT, x, strict=True):
        print(
            f"  credit {credit:3d}: {used[account]:5d} GPU-s = {used[account] / total:5.1%} "
            f"of the group's GPU time, entitled to {credit / sum(CREDIT):5.1%} (x = {value:.2f})"
        )
    index = jain(x)
    print(f"  Jain's index {index:.3f} over {total} GPU-s in {window} s")
    return index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=600, help="seconds the workload runs")
    parser.add_argument("--job-seconds", type=int, default=20, help="length of each job")
    args = parser.parse_args()
    box = SlurmBox()
    if not box.is_up():
        raise SystemExit("the Slurm box is not up (make slurm-up)")
    prefix = f"fsj{os.getpid() % 1000}"
    groups = {"without": [f"{prefix}n{i}" for i in range(3)], "with": [f"{prefix}s{i}" for i in range(3)]}
    parents = {"without": f"{prefix}n", "with": f"{prefix}s"}
    hooks = box.status()["hooks"]
    box.use_hooks("passthrough")
    try:
        for place, accounts in groups.items():
            sacctmgr("add", "account", parents[place], "parent=root", "Description=bench", "Organization=lab")
            names = ",".join(accounts)
            sacctmgr(
                "add", "account", names, f"parent={parents[place]}", "Description=bench", "Organization=lab"
            )
            sacctmgr("add", "user", "alice", f"account={names}")
        with tempfile.TemporaryDirectory() as tmp:
            sync(groups["with"], Path(tmp))
        used = workload(groups, args.window, args.job_seconds)
    finally:
        every = [account for accounts in groups.values() for account in accounts]
        end_jobs(every)
        sacctmgr("delete", "account", f"name={','.join(every)}")
        sacctmgr("delete", "account", f"name={','.join(parents.values())}")
        box.use_hooks(str(hooks) if hooks else None)
    without = report("without the sync (Slurm's default shares; node3)", groups["without"], used, args.window)
    with_sync = report("with the sync (the ledger's shares; node1)", groups["with"], used, args.window)
    print(f"Jain's index: {without:.3f} without the sync, {with_sync:.3f} with it")


if __name__ == "__main__":
    main()
