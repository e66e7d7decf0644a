"""Ledger throughput on PostgreSQL: hold+settle cycles/s against pgbench's tpcb-like tps.

All run in this one invocation against the same server, so the ratios are meaningful
on whatever machine runs it. A cycle is one job's life in the ledger: a hold (limits,
credit check, earmarks) and its settle (charge, release of the rest). Accounts are
many, as on a real cluster, so clients contend on the server, not on one account's lock.

Two paths are measured:

- daemon (the real one): a `gpucredit daemon` process on a fresh database, driven by N
  client processes that speak the hooks' socket protocol with the hooks' own
  `DaemonClient`; the daemon applies their requests in batches (group commit).
  Prints cycles/s, p50/p99 latency per request and the ratio to pgbench.
- direct: N processes calling the ledger functions, one transaction per call.

    .venv/bin/python -m bench.ledger_throughput [--clients 64] [--workers 4] [--seconds 10]
        [--rounds 3] [--unweighted] [--profile]

The daemon runs with the CPU share its systemd unit gives it (CPUWeight=300, three times
a default service's, emulated with its session's autogroup); `--unweighted` runs it at a
default share. `--profile` also profiles the daemon's writer applying batches of holds
and settles (the same GroupCommitter code, in this process, without the socket).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.goals import percentile, report
from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade
from slurm_hooks.client import DaemonClient, DaemonUnreachable
from slurmbox.gpucredit_site import weigh_as_its_unit

ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
ACCOUNTS = 256
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _url(database: str) -> str:
    return make_url(ADMIN_URL).set(database=database).render_as_string(hide_password=False)


def _admin():  # type: ignore[no-untyped-def]
    return create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")


def setup(database: str) -> None:
    with _admin().connect() as c:
        c.execute(text(f'CREATE DATABASE "{database}"'))
    engine = make_engine(_url(database))
    upgrade(engine)
    factory = make_sessionmaker(engine)
    with factory() as s, s.begin():
        api.set_price(s, "h100", "3.60", effective_at=EPOCH)
        api.set_price(s, "a100", "2.00", effective_at=EPOCH)
        for i in range(ACCOUNTS):
            api.create_account(s, f"acct{i}")
    for i in range(ACCOUNTS):
        with factory() as s, s.begin():
            api.topup(s, f"acct{i}", "1000000", effective_at=EPOCH)
            api.grant(s, f"acct{i}", "5000", effective_at=EPOCH, expires_at=datetime(2027, 1, 1, tzinfo=UTC))
    engine.dispose()


def cycle(factory, account: str, job_id: int) -> None:  # type: ignore[no-untyped-def]
    with factory() as s, s.begin():
        hold = api.create_hold(
            s,
            api.HoldRequest(
                account, user="alice", job_id=job_id, gpus="h100:2,a100:1", seconds=7200, cluster="bench"
            ),
        )
    with factory() as s, s.begin():
        api.settle_hold(s, hold.id, 1800)


def worker(database: str, index: int, seconds: float, barrier, results) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(_url(database), pool_size=1)
    factory = make_sessionmaker(engine)
    cycle(factory, f"acct{index % ACCOUNTS}", 10**9 + index)  # warm caches and the connection
    barrier.wait()
    done = 0
    job_id = index * 10**7
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        job_id += 1
        cycle(factory, f"acct{job_id % ACCOUNTS}", job_id)
        done += 1
    results.put((done, time.perf_counter() - start))
    engine.dispose()


# -- the daemon path ----------------------------------------------------------------------------


@contextmanager
def daemon_process(
    database: str,
    workdir: Path,
    batch_max: int,
    writers: int,
    weighted: bool = True,
    url: str | None = None,
) -> Iterator[tuple[str, int]]:
    """A real `gpucredit daemon` on `database` (or on `url`: bench/ha_failover.py's HA
    cluster); yields its socket. Its Slurm is an sinfo script (the daemon reads partitions
    in the background), as in tests/daemon/test_daemon.py. `weighted`: with the CPU share
    its systemd unit gives it (`weigh_as_its_unit`)."""
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho 'gpu|gpu:h100:8,gpu:a100:8'\n")
    (bin_dir / "sinfo").chmod(0o755)
    socket_path = workdir / "daemon.sock"
    config = workdir / "gpucredit.toml"
    config.write_text(
        f'[database]\nurl = "{url or _url(database)}"\n'
        f'[daemon]\nsocket = "{socket_path}"\nmetrics_port = 0\n'
        f"batch_max = {batch_max}\nwriters = {writers}\n"
        f'[slurm]\ncluster = "bench"\nbin_dir = "{bin_dir}"\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "GPUCREDIT_DATABASE_URL"}
    env["GPUCREDIT_CONFIG"] = str(config)
    log_path = workdir / "daemon.log"
    with open(log_path, "wb") as log:
        # Its own session, as systemd starts a service: the kernel then schedules it as a
        # group of its own (autogroup; a cgroup under systemd), not as one more thread
        # among the 64 hook clients, which on a controller run under slurmctld's unit.
        process = subprocess.Popen(
            [sys.executable, "-m", "gpucredit", "daemon", "--release-interval", "0"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    if weighted:
        print(f"daemon  CPU share: {weigh_as_its_unit(process.pid)}")
    try:
        client = DaemonClient(str(socket_path), 5.0)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.call("ping")
                break
            except DaemonUnreachable:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"gpucredit daemon did not start:\n{log_path.read_text()}") from None
                time.sleep(0.1)
        yield str(socket_path), process.pid
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        batches = re.search(
            r"group commit: (\d+) requests in (\d+) batches(?:; writer ([\d.]+) ms CPU, ([\d.]+) ms wall)?",
            log_path.read_text(),
        )
        if batches:
            requests, count = int(batches.group(1)), int(batches.group(2))
            writer = f"; writer {batches.group(3)} ms CPU, {batches.group(4)} ms wall per request" * bool(
                batches.group(3)
            )
            print(
                f"daemon  {requests} requests in {count} batches ({requests / max(count, 1):.1f} per batch)"
                + writer
            )


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hook_requests(account: str, job_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The prolog's hold and the epilog's settle of one job, as the hooks send them."""
    start = EPOCH + timedelta(days=200, seconds=job_id % 86400)
    job = {"cluster": "bench", "job_id": job_id, "run": 0, "submit": _iso(start - timedelta(seconds=5))}
    hold = {
        **job,
        "account": account,
        "user": "alice",
        "partition": "gpu",
        "gpus": {"h100": 2, "a100": 1},
        "seconds": 7200,
        "nodes": 1,
        "start": _iso(start),
    }
    settle = {**job, "start": _iso(start), "end": _iso(start + timedelta(seconds=1800)), "account": account}
    return hold, settle


def _iso(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def daemon_client(socket_path: str, index: int, seconds: float, phase: int, barrier, results) -> None:  # type: ignore[no-untyped-def]
    client = DaemonClient(socket_path, 30.0)
    latencies: list[float] = []
    done = failed = 0
    job_id = (index + 1) * 10**7 + phase * 10**6  # each phase's jobs are new ones
    barrier.wait()
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        job_id += 1
        hold, settle = hook_requests(f"acct{job_id % ACCOUNTS}", job_id)
        try:
            for op, request in (("hold", hold), ("settle", settle)):
                began = time.perf_counter()
                client.call(op, **request)
                latencies.append(time.perf_counter() - began)
            done += 1
        except Exception as error:  # counted, never fatal: the figure says how many failed
            failed += 1
            if failed <= 3:
                print(f"client {index}: {error}", file=sys.stderr, flush=True)
    results.put((done, failed, time.perf_counter() - start, latencies))


def daemon_phase(
    socket_path: str, clients: int, seconds: float, phase: int
) -> tuple[float, int, list[float]]:
    """`clients` hook processes against the daemon for `seconds`: (cycles/s, failed
    requests, each request's latency in seconds)."""
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(clients), ctx.Queue()
    procs = [
        ctx.Process(target=daemon_client, args=(socket_path, i, seconds, phase, barrier, results))
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    elapsed = max(e for _, _, e, _ in outcomes)
    latencies = [x for *_, lat in outcomes for x in lat]
    return sum(d for d, *_ in outcomes) / elapsed, sum(f for _, f, *_ in outcomes), latencies


# -- the direct path ----------------------------------------------------------------------------


def ledger_cycles_per_second(database: str, workers: int, seconds: float) -> float:
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(database, i, seconds, barrier, results)) for i in range(workers)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return sum(done for done, _ in outcomes) / max(elapsed for _, elapsed in outcomes)


def pgbench_tps(clients: int, seconds: int) -> float:
    if shutil.which("pgbench") is None:
        raise SystemExit("pgbench not found: apt-get install postgresql-contrib (or postgresql-client)")
    database = f"pgbench_{uuid.uuid4().hex[:8]}"
    with _admin().connect() as c:
        c.execute(text(f'CREATE DATABASE "{database}"'))
    try:
        base = ["pgbench", "-h", "127.0.0.1", "-p", "5432", "-U", "postgres"]
        subprocess.run([*base, "-i", "-q", "-s", "10", database], check=True, capture_output=True)
        out = subprocess.run(
            [*base, "-n", "-c", str(clients), "-j", "2", "-T", str(seconds), database],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        match = re.search(r"tps = ([0-9.]+)", out)
        if not match:
            raise SystemExit(f"cannot read pgbench's tps:\n{out}")
        return float(match.group(1))
    finally:
        with _admin().connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


def profile(database: str, cycles: int, batch: int) -> str:
    """The daemon's writer applying `cycles` holds then settles in batches of `batch`,
    profiled in this process (cProfile sees one thread; the writer is one)."""
    from gpucredit.daemon.group_commit import Pending
    from gpucredit.daemon.server import Daemon
    from ledger.config import load_config

    config = load_config(Path("/dev/null"))
    config["database"]["url"] = _url(database)
    daemon = Daemon(config, runner=lambda *_a, **_k: "")
    jobs = [hook_requests(f"acct{i % ACCOUNTS}", 3 * 10**9 + i) for i in range(cycles + batch)]
    warm = jobs[:batch]
    daemon.batches.apply([Pending("hold", h) for h, _ in warm])
    daemon.batches.apply([Pending("settle", s) for _, s in warm])
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    for first in range(batch, cycles + batch, batch):
        chunk = jobs[first : first + batch]
        for op, index in (("hold", 0), ("settle", 1)):
            pendings = [Pending(op, job[index]) for job in chunk]
            daemon.batches.apply(pendings)
            assert all(p.error is None for p in pendings), [p.error for p in pendings if p.error][:1]
    profiler.disable()
    elapsed = time.perf_counter() - started
    daemon.engine.dispose()
    out = io.StringIO()
    print(
        f"writer: {cycles} cycles in batches of {batch}: {1000 * elapsed / cycles:.2f} ms per cycle "
        "(profiled, so slower than unprofiled)",
        file=out,
    )
    stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
    stats.print_stats(30)
    stats.sort_stats("tottime").print_stats(20)
    return out.getvalue()


def audit(database: str) -> str:
    """`gpucredit audit verify` on what the daemon wrote: every chain, projection and
    checkpoint recomputed from the journal (a faster path must leave it verifiable)."""
    engine = make_engine(_url(database))
    try:
        with make_sessionmaker(engine)() as s:
            verified = api.verify(s)
    finally:
        engine.dispose()
    if not verified.ok:
        raise SystemExit(f"audit verify FAILED after the daemon run: {verified.problems[:5]}")
    return f"audit verify: ok ({verified.accounts} accounts, {verified.entries} entries)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 64 hook processes at once: a burst of job starts and ends on a busy controller.
    parser.add_argument("--clients", type=int, default=64, help="daemon clients (hook processes at once)")
    parser.add_argument("--workers", type=int, default=4, help="direct-to-ledger processes")
    parser.add_argument("--seconds", type=float, default=10.0, help="per phase")
    parser.add_argument("--rounds", type=int, default=3, help="daemon phases, each between two pgbench ones")
    parser.add_argument("--batch-max", type=int, default=64, help="the daemon's daemon.batch_max")
    parser.add_argument("--writers", type=int, default=1, help="the daemon's daemon.writers")
    parser.add_argument(
        "--unweighted",
        action="store_true",
        help="run the daemon at a default CPU share, not its systemd unit's CPUWeight=300",
    )
    parser.add_argument("--no-direct", action="store_true", help="skip the direct-to-ledger figure")
    parser.add_argument("--profile", action="store_true", help="also profile the daemon's writer")
    args = parser.parse_args()
    database = f"gpucredit_bench_{uuid.uuid4().hex[:8]}"
    setup(database)
    try:
        # pgbench and the daemon take turns (pgbench, daemon, pgbench, ...), and each daemon
        # phase is compared with the mean of the pgbench phases either side of it: this
        # machine's speed drifts by 10-30% within a minute, which one pgbench run before and
        # one after a long daemon run measured as much as the daemon. The ratio is the
        # median of the rounds'; all are printed.
        tps = [pgbench_tps(args.clients, int(args.seconds))]
        weighted = not args.unweighted
        cycles: list[float] = []
        latencies: list[float] = []
        failed = 0
        with (
            tempfile.TemporaryDirectory(prefix="gc-bench-", dir="/tmp") as workdir,
            daemon_process(database, Path(workdir), args.batch_max, args.writers, weighted) as served,
        ):
            socket_path, pid = served
            daemon_cpu = 0.0
            for phase in range(args.rounds):
                cpu_before = cpu_seconds(pid)
                rate, phase_failed, phase_latencies = daemon_phase(
                    socket_path, args.clients, args.seconds, phase
                )
                daemon_cpu += cpu_seconds(pid) - cpu_before
                cycles.append(rate)
                latencies += phase_latencies
                failed += phase_failed
                tps.append(pgbench_tps(args.clients, int(args.seconds)))
        ratios = [rate / ((tps[i] + tps[i + 1]) / 2) for i, rate in enumerate(cycles)]
        ratio = statistics.median(ratios)
        print(
            f"daemon  {args.clients} clients, {args.writers} writer(s): "
            f"{statistics.median(cycles):.0f} hold+settle cycles/s (median of {len(cycles)} phases of "
            f"{args.seconds:g} s), request p50 {1000 * percentile(latencies, 0.5):.1f} ms "
            f"p99 {1000 * percentile(latencies, 0.99):.1f} ms, {failed} failed; daemon CPU "
            f"{1000 * daemon_cpu / max(sum(cycles) * args.seconds, 1):.2f} ms per cycle"
        )
        for i, rate in enumerate(cycles):
            print(
                f"  round {i + 1}: pgbench {tps[i]:.0f} tps, daemon {rate:.0f} cycles/s, "
                f"pgbench {tps[i + 1]:.0f} tps: ratio {ratios[i]:.3f}"
            )
        print(
            f"pgbench tpcb-like {statistics.median(tps):.0f} tps ({args.clients} clients, median of "
            f"{len(tps)} phases); ratio {ratio:.3f} (median of the rounds')"
        )
        print(audit(database))
        if not args.no_direct:
            direct = ledger_cycles_per_second(database, args.workers, args.seconds)
            direct_tps = pgbench_tps(args.workers, int(args.seconds))
            print(
                f"direct  {args.workers} processes: {direct:.0f} cycles/s; pgbench {direct_tps:.0f} tps "
                f"({args.workers} clients); ratio {direct / direct_tps:.3f}"
            )
        if args.profile:
            print(profile(database, 512, min(args.batch_max, args.clients)))
        report("ledger: daemon hold+settle cycles/s ÷ pgbench tps", ratio, goal=1.0, must=0.5)
    finally:
        with _admin().connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
