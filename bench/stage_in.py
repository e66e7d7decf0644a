"""A cloud node's stage-in (slurm_hooks/stage_in.py) against a plain copy of the same data:
what asking the daemon over MUNGE, switching to the job's user and reporting add.

A job's data (`--files` files of `--mib` MiB together, in a folder) are staged by the node
Prolog itself (`gpucredit hook prolog`, in process) through a receiver on 127.0.0.1 and
a munged of its own, onto the SQLite ledger, `--runs` times; then `cp -r` of the same
folder as root, as many times. Prints both medians and their ratio. Needs root (the uid
switch) and munged (`apt-get install munge`). `python -m bench.stage_in`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from accounting_bridge.nvml.munge import Munge
from accounting_bridge.nvml.receiver import UsageReceiver
from bench.goals import report
from ledger import api
from ledger.jobs.staging import job_data, keep_job_data
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade
from slurm_hooks.hooks import main as hook

USER = "nobody"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from tests.support.munged import munged

    work = Path(tempfile.mkdtemp(prefix="gpucredit-bench-stage-"))
    work.chmod(0o755)
    data = work / "data"
    data.mkdir(mode=0o755)
    for n in range(args.files):
        (data / f"part{n:03d}").write_bytes(os.urandom(args.mib * (1 << 20) // args.files))
        (data / f"part{n:03d}").chmod(0o644)
    engine = make_engine(f"sqlite:///{work / 'ledger.db'}")
    upgrade(engine)
    sessions = make_sessionmaker(engine)
    stop = threading.Event()
    staged, copied = [], []
    try:
        with munged(work / "munge") as socket_path:
            receiver = UsageReceiver(Munge(socket_path), sessions, cloud_partitions={"cloud"})
            receiver.serve("127.0.0.1", 0, stop)
            config = work / "gpucredit.toml"
            config.write_text(
                f'[slurm]\ncluster = "lab"\n[agent]\nspool_dir = "{work}/spool/%n"\n'
                f'send_to = ["127.0.0.1:{receiver.address[1]}"]\nmunge_socket = "{socket_path}"\n'
                f'[hooks]\nstage_dir = "{work}/stage/%n"\n'
            )
            now = datetime.now(UTC)
            with sessions() as s, s.begin():
                api.create_account(s, "physics")
                api.topup(s, "physics", "100", effective_at=now - timedelta(days=1))
                api.set_price(s, "h100", "3.60", effective_at=now - timedelta(days=1))
                hold = api.HoldRequest(
                    "physics", user=USER, job_id=0, gpus="h100:1", seconds=60, cluster="lab"
                )
                for job in range(1, args.runs + 1):
                    keep_job_data(s, "lab", job, USER, [str(data)], now)
                    api.create_hold(s, replace(hold, job_id=job, at=now, submitted_at=now))
            for job in range(1, args.runs + 1):
                env = {
                    "GPUCREDIT_CONFIG": str(config),
                    "SLURMD_NODENAME": "cloud1",
                    "SLURM_JOB_ID": str(job),
                    "SLURM_JOB_USER": USER,
                    "SLURM_JOB_PARTITION": "cloud",
                    "PATH": "/usr/bin:/bin",
                }
                began = time.perf_counter()
                hook(["prolog"], environ=env, runner=lambda argv: "", log=lambda line: None)
                staged.append(time.perf_counter() - began)
                hook(["epilog"], environ=env, runner=lambda argv: "", log=lambda line: None)
                target = work / "plain"
                began = time.perf_counter()
                subprocess.run(["cp", "-r", str(data), str(target)], check=True)
                copied.append(time.perf_counter() - began)
                shutil.rmtree(target)
            with sessions() as s:
                recorded = [job_data(s, "lab", [job])[job].staged for job in range(1, args.runs + 1)]
    finally:
        stop.set()
        engine.dispose()
        shutil.rmtree(work, ignore_errors=True)
    assert all(len(r) == 1 and r[0].error is None and r[0].files == args.files for r in recorded), recorded
    reported_ms = statistics.median(r[0].milliseconds for r in recorded)
    stage_s, copy_s = statistics.median(staged), statistics.median(copied)
    print(
        f"{args.files} files, {args.mib} MiB, {args.runs} runs: "
        f"Prolog stage-in median {stage_s * 1000:.0f} ms (the copy it reported: {reported_ms:.0f} ms), "
        f"cp -r {copy_s * 1000:.0f} ms; "
        f"{args.mib / stage_s:.0f} MiB/s staged"
    )
    report(
        "stage-in: Prolog time over a plain cp -r of the same data",
        stage_s / copy_s,
        goal=1.5,
        must=3.0,
        better="<=",
    )


if __name__ == "__main__":
    main()
