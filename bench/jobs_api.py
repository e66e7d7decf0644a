"""The jobs API on a Slurm box: a submission through POST /api/v1/jobs over alice's own
sbatch of the same job, and GET /api/v1/jobs with 1,000 jobs in one account.

Needs root and the box (`make slurm-up [SLURM=26.05]`); run it under the box's lock:

    flock /tmp/gpucredit-box.lock .venv/bin/python -m bench.jobs_api \\
        [--slurm 22.05|24.11|26.05] [--submissions 30] [--jobs 1000] [--reads 200]

The portal is the real app on the box's ledger, served in this process (Flask's test
client: no HTTP server in the figure), wired to Slurm as tests/slurm/test_slurm_jobs_api.py
wires it: on 22.05 the real submitter on a Unix socket, on 24.11 and 26.05 the box's
slurmrestd with a token the submitter (on a Unix socket too) signs for alice. The two
submit arms take turns (ABBA): the API arm is the whole path (the request's checks, the
submitter's peer check and its runuser checks or its token and slurmrestd's HTTP,
sbatch's work through job_submit.lua); the sbatch arm runs the very argv the submitter
builds for that spec (`portal.jobs.submitter.sbatch_argv`), the script on stdin; in a
chroot box it is timed inside the box, around sbatch alone (`date +%s%N` before and
after: two forks of `date` counted against sbatch). Every job is cancelled at the end.

The list is read from a fresh account holding `--jobs` held jobs (submitted by sbatch,
so nothing runs), the first page (50) and a state filter each timed `--reads` times.

Ends with the performance table's rows (bench.goals): submit through the API ÷ sbatch
(goal 2, must 3) and GET /api/v1/jobs p99 (goal 200 ms, must 400 ms).
"""

from __future__ import annotations

import argparse
import os
import pwd
import secrets
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from bench.goals import percentile, report
from ledger import api
from ledger.config import load_config
from ledger.store.db import make_engine, make_sessionmaker
from portal import create_app
from portal.jobs.backend import JobBackend, SubmitterBackend
from portal.jobs.rest import RestBackend
from portal.jobs.submitter import Submitter, sbatch_argv, sbatch_options, serve
from slurmbox import SlurmBox, versions
from slurmbox.chroot import JWT_KEY, ChrootBox

CONFIG = Path(os.environ.get("GPUCREDIT_CONFIG", "/etc/gpucredit/gpucredit.toml"))
USER = "alice"
SCRIPT = "#!/bin/sh\ntrue\n"


def _ok(argv: list[str], **kwargs: Any) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


class Bench:
    """The box's ledger, a fresh account with alice in it, the portal and its way to Slurm."""

    def __init__(self, workdir: Path, box: SlurmBox | ChrootBox) -> None:
        self.box = box
        config = load_config(box.inside(str(CONFIG)) if isinstance(box, ChrootBox) else CONFIG)
        url = str(config["database"]["url"])
        if isinstance(box, ChrootBox) and url.startswith("sqlite:////"):  # its embedded ledger, from here
            config["database"]["url"] = f"sqlite:///{box.inside(url.removeprefix('sqlite:///'))}"
        self.engine = make_engine(config["database"]["url"])
        self.account = f"benchjobs{secrets.token_hex(3)}"
        box.run(["sacctmgr", "-i", "add", "account", self.account, "cluster=lab"], check=True)
        box.run(["sacctmgr", "-i", "add", "user", USER, f"account={self.account}"], check=True)
        with make_sessionmaker(self.engine)() as s, s.begin():
            api.create_account(s, self.account)
            api.add_member(s, USER, self.account)
            api.topup(s, self.account, "100000")
            token = api.create_token(s, USER, "user")[1]
        self.headers = {"Authorization": f"Bearer {token}"}
        self.stop = threading.Event()
        config["portal"].update({"rate_limit_storage": "memory://", "api_rate_limit": "100000 per minute"})
        app = create_app({"GPUCREDIT": config, "SECRET_KEY": secrets.token_hex(16)})
        app.extensions["gpucredit.jobs_backend"] = self._backend(box, workdir)
        self.app = app
        self.client = app.test_client()
        self.jobs: list[str] = []

    def _backend(self, box: SlurmBox | ChrootBox, workdir: Path) -> JobBackend:
        if isinstance(box, ChrootBox):  # the submitter signs alice's tokens, as a site runs it
            if box.rest_url is None:
                raise SystemExit(f"the Slurm {box.version.name} box's root has no slurmrestd")
            signer = self._submitter(workdir, Submitter(jwt_key=str(box.inside(JWT_KEY))))
            return RestBackend(box.rest_url, None, box.client_dir(), passwd=box.passwd, signer=signer)
        return SubmitterBackend(self._submitter(workdir, Submitter(bin_dir="/usr/bin")), "/usr/bin")

    def _submitter(self, workdir: Path, submitter: Submitter) -> str:
        """The root submitter on a Unix socket in this process, for this uid; its path."""
        socket_path = str(workdir / "submitter.sock")
        ready = threading.Event()
        threading.Thread(
            target=serve,
            args=(socket_path, os.getuid(), submitter),
            kwargs={"ready": ready, "stop": self.stop},
            daemon=True,
        ).start()
        if not ready.wait(10):
            raise SystemExit("the submitter did not start")
        return socket_path

    def spec(self) -> dict[str, Any]:
        return {"account": self.account, "script": SCRIPT, "gpus": "h100:1", "time_limit": "00:01:00"}

    def api_submit(self) -> float:
        key = {"Idempotency-Key": secrets.token_hex(8)}
        began = time.perf_counter()
        answer = self.client.post("/api/v1/jobs", json=self.spec(), headers={**self.headers, **key})
        seconds = time.perf_counter() - began
        if answer.status_code != 201:
            raise SystemExit(f"POST /api/v1/jobs: {answer.status_code} {answer.get_json()}")
        self.jobs.append(str(answer.get_json()["job_id"]))
        return seconds

    def sbatch_submit(self) -> float:
        if isinstance(self.box, ChrootBox):  # timed inside the box, around sbatch alone
            home = self.box.passwd(USER)[1]
            timed = (
                'a=$(date +%s%N); id=$(sbatch --parsable "$@") || exit 1; '
                'b=$(date +%s%N); echo "$id $((b - a))"'
            )
            argv = ["sh", "-c", timed, "sh", "--export=ALL", *sbatch_options(self.spec()), "-D", home]
            job_id, nanoseconds = self.box.run(argv, user=USER, input=SCRIPT, check=True).stdout.split()
            self.jobs.append(job_id.split(";")[0])
            return int(nanoseconds) / 1e9
        argv = sbatch_argv(self.spec(), pwd.getpwnam(USER), sbatch="/usr/bin/sbatch")
        began = time.perf_counter()
        job_id = _ok(argv, input=SCRIPT, cwd="/")
        seconds = time.perf_counter() - began
        self.jobs.append(job_id.strip().split(";")[0])
        return seconds

    def fill(self, count: int) -> None:
        """`count` held jobs in the account (sbatch --hold: listed, never started)."""
        argv = ["sbatch", "--parsable", "--hold", "-A", self.account, "--gres=gpu:h100:1", "-t", "1"]
        argv += ["-o", "/dev/null", "-D", "/tmp", "--wrap", "true"]
        for _ in range(count):
            self.jobs.append(self.box.run(argv, user=USER, check=True).stdout.strip().split(";")[0])

    def read(self, path: str) -> tuple[float, dict[str, Any]]:
        began = time.perf_counter()
        answer = self.client.get(path, headers=self.headers)
        seconds = time.perf_counter() - began
        if answer.status_code != 200:
            raise SystemExit(f"GET {path}: {answer.status_code} {answer.get_json()}")
        body: dict[str, Any] = answer.get_json()
        return seconds, body

    def cancel_all(self) -> None:
        for start in range(0, len(self.jobs), 500):
            self.box.run(["scancel", *self.jobs[start : start + 500]], timeout=60)

    def close(self) -> None:
        self.cancel_all()
        self.stop.set()
        self.app.extensions["gpucredit.engine"].dispose()
        self.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=30, help="per arm, taking turns")
    parser.add_argument("--jobs", type=int, default=1000, help="held jobs in the listed account")
    parser.add_argument("--reads", type=int, default=200, help="timed reads of each list")
    parser.add_argument("--slurm", default=versions.HOST, choices=sorted(versions.VERSIONS), help="the box")
    args = parser.parse_args()
    version = versions.get(args.slurm)
    box = ChrootBox(version) if version.chroot else SlurmBox()
    was_up = box.is_up()
    box.up()
    workdir = Path(f"/run/gpucredit-bench-{os.getpid()}")
    workdir.mkdir(mode=0o700)
    bench = Bench(workdir, box)
    try:
        bench.api_submit(), bench.sbatch_submit()  # warm-ups
        arms: dict[str, list[float]] = {"api": [], "sbatch": []}
        for turn in range(2 * args.submissions):
            if turn % 4 in (1, 2):
                arms["api"].append(bench.api_submit())
            else:
                arms["sbatch"].append(bench.sbatch_submit())
        bench.cancel_all()
        began = time.monotonic()
        bench.fill(args.jobs)
        filled = time.monotonic() - began
        first = f"/api/v1/jobs?account={bench.account}"
        queued = f"{first}&state=queued"
        page = bench.read(first)[1]
        listed = len(bench.read(f"{queued}&limit=200")[1]["items"])
        reads: dict[str, list[float]] = {first: [], queued: []}
        for _ in range(args.reads):
            for path, times in reads.items():
                times.append(bench.read(path)[0])
    finally:
        bench.close()
        workdir.joinpath("submitter.sock").unlink(missing_ok=True)
        workdir.rmdir()
        if not was_up:
            box.down()
    api_ms, sbatch_ms = (statistics.median(arms[arm]) * 1000 for arm in ("api", "sbatch"))
    print(
        f"submit median over {len(arms['api'])} each, taking turns: POST /api/v1/jobs {api_ms:.1f} ms, "
        f"the same sbatch as alice {sbatch_ms:.1f} ms (Slurm {version.name})"
    )
    print(
        f"{args.jobs} held jobs in {bench.account} submitted in {filled:.1f} s; the first page has "
        f"{len(page['items'])} items (a next cursor: {page['next_cursor'] is not None}), "
        f"the queued filter's first 200 has {listed}"
    )
    for path, times in reads.items():
        print(
            f"GET {path.replace(bench.account, 'ACCOUNT')}: p50 {percentile(times, 0.5) * 1000:.1f} ms, "
            f"p99 {percentile(times, 0.99) * 1000:.1f} ms over {len(times)} reads"
        )
    suffix = f", Slurm {version.name}" if version.chroot else ""
    report(f"jobs: submit through the API ÷ sbatch{suffix}", api_ms / sbatch_ms, goal=2, must=3, better="<=")
    report(
        f"jobs: GET /api/v1/jobs p99, {args.jobs:,} jobs in the account{suffix}",
        percentile(reads[first], 0.99) * 1000,
        goal=200,
        must=400,
        better="<=",
        unit="ms",
    )


if __name__ == "__main__":
    main()
