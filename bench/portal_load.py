"""The portal's JSON API under load: `gpucredit serve` (one waitress process) on PostgreSQL.

N client threads, each on its own keep-alive HTTP/1.1 connection over loopback, send a
fixed number of requests of one kind, then the next kind:

- GET  /healthz                          the floor: waitress + Flask + the safety nets;
- GET  /api/v1/accounts/{acct}/balance   an admin token; a read of one account;
- POST /api/v1/holds                     a service token; one job each (distinct job ids),
                                         over many accounts, so one account's lock is
                                         not the only bound.

It prints requests/s, p50 and p99 latency for each, two ratios measured in this run
(balance against the floor, and holds through HTTP against the same create_hold called
in-process with as many threads: what the web layer costs), and the CPU each party
used while the holds ran -- the server process, PostgreSQL's backends, this client --
with one line on what bounds the rate.

Needs PostgreSQL at 127.0.0.1:5432 (a fresh database is created, migrated, seeded
through ledger.api, and dropped) and the portal extras.

    .venv/bin/python -m bench.portal_load [--clients 8] [--requests 2000] [--threads 8]
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade

ADMIN_URL = os.environ.get("GPUCREDIT_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
GPUCREDIT = str(Path(sys.executable).parent / "gpucredit")
ACCOUNTS = 64
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
GPUS, SECONDS = "h100:1", 3600  # 3.60 credits a hold
STARTUP_SECONDS = 90.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- the database -----------------------------------------------------------------


def _url(database: str) -> str:
    return make_url(ADMIN_URL).set(database=database).render_as_string(hide_password=False)


def _admin() -> Engine:
    return create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")


def seed(database: str) -> dict[str, str]:
    """A fresh, migrated database: prices, ACCOUNTS accounts each with one member and
    credit for every hold the run can make, and the two tokens the clients use."""
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
            api.add_member(s, f"user{i}", f"acct{i}")
            api.topup(s, f"acct{i}", "1000000", effective_at=EPOCH)
    with factory() as s, s.begin():
        tokens = {
            "admin": api.create_token(s, "bench-admin", "admin", label="bench")[1],
            "service": api.create_token(s, "bench-slurm", "service", label="bench")[1],
        }
    engine.dispose()
    return tokens


def drop(database: str) -> None:
    with _admin().connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


# --- the server -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_portal(database: str, workdir: Path, threads: int) -> tuple[subprocess.Popen[bytes], int]:
    """`gpucredit serve` on the bench database; returns once waitress says it serves."""
    port = _free_port()
    config = workdir / "gpucredit.toml"
    config.write_text(
        f'[database]\nurl = "{_url(database)}"\n\n'
        "[portal]\n"
        f'secret_key_file = "{workdir / "secret-key"}"\n'
        # The limiter still counts every request (its cost is measured); it never refuses.
        'api_rate_limit = "100000000 per minute"\n'
    )
    process = subprocess.Popen(
        [GPUCREDIT, "serve", "--host", "127.0.0.1", "--port", str(port), "--threads", str(threads)],
        env={**os.environ, "GPUCREDIT_CONFIG": str(config)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    ready = threading.Event()
    output: list[bytes] = []

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            if b"Serving on http://" in line:
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(STARTUP_SECONDS) or process.poll() is not None:
        process.kill()
        raise SystemExit("gpucredit serve did not start:\n" + b"".join(output).decode(errors="replace"))
    return process, port


def stop_portal(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --- CPU accounting (Linux /proc) ---------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def _postgres_cpu_seconds() -> float:
    """All processes named postgres: the backends serving the portal and the server's own."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    total += _cpu_seconds(int(entry.name))
            except OSError:
                continue
    return total


def _machine_busy_seconds() -> float:
    """CPU-seconds every core spent not idle (/proc/stat), so other load shows too."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / CLOCK_TICKS


@dataclass
class CpuUse:
    server: float
    postgres: float
    client: float
    machine: float

    @classmethod
    def now(cls, server_pid: int) -> CpuUse:
        return cls(
            _cpu_seconds(server_pid), _postgres_cpu_seconds(), time.process_time(), _machine_busy_seconds()
        )

    def __sub__(self, earlier: CpuUse) -> CpuUse:
        return CpuUse(
            self.server - earlier.server,
            self.postgres - earlier.postgres,
            self.client - earlier.client,
            self.machine - earlier.machine,
        )


# --- the load -----------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    requests: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    cpu: CpuUse | None = None

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds

    def percentile_ms(self, q: int) -> float:
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[q - 1] * 1000


Request = Callable[[int], tuple[str, str, bytes | None, dict[str, str]]]


def run_phase(port: int, phase: Phase, clients: int, make_request: Request, server_pid: int) -> Phase:
    """`phase.requests` requests from `clients` threads, each on one keep-alive connection."""
    counter = itertools.count()
    barrier = threading.Barrier(clients + 1)
    lock = threading.Lock()

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        latencies, statuses = [], Counter[int]()
        barrier.wait()
        while (n := next(counter)) < phase.requests:
            method, path, body, headers = make_request(n)
            began = time.perf_counter()
            try:
                connection.request(method, path, body=body, headers=headers)
                response = connection.getresponse()
                response.read()
                statuses[response.status] += 1
            except (OSError, http.client.HTTPException):
                statuses[0] += 1  # 0: no answer; reconnect and go on
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                continue
            latencies.append(time.perf_counter() - began)
        connection.close()
        with lock:
            phase.latencies.extend(latencies)
            phase.statuses.update(statuses)

    workers = [threading.Thread(target=client) for _ in range(clients)]
    for worker in workers:
        worker.start()
    before = CpuUse.now(server_pid)
    began = time.perf_counter()
    barrier.wait()
    for worker in workers:
        worker.join()
    phase.seconds = time.perf_counter() - began
    phase.cpu = CpuUse.now(server_pid) - before
    return phase


def direct_reserves_per_second(database: str, threads: int, requests: int, first_job_id: int) -> float:
    """The same holds through ledger.api in this process, as many threads: no HTTP, no Flask."""
    engine = make_engine(_url(database), pool_size=threads)
    factory = make_sessionmaker(engine)
    counter = itertools.count()
    barrier = threading.Barrier(threads + 1)

    def worker() -> None:
        barrier.wait()
        while (n := next(counter)) < requests:
            with factory() as s, s.begin():
                account, user = f"acct{n % ACCOUNTS}", f"user{n % ACCOUNTS}"
                api.keyed.create_hold(
                    s,
                    api.HoldRequest(account, user=user, job_id=first_job_id + n, gpus=GPUS, seconds=SECONDS),
                )

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    began = time.perf_counter()
    barrier.wait()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - began
    engine.dispose()
    return requests / seconds


def bound(cpu: CpuUse, seconds: float) -> str:
    """What the CPU measured over the phase says limits its rate."""
    cores = os.cpu_count() or 1
    server, machine = cpu.server / seconds, cpu.machine / seconds
    use = (
        f"cores used: server {server:.2f}, postgres {cpu.postgres / seconds:.2f}, "
        f"client {cpu.client / seconds:.2f}; machine {machine:.2f}/{cores} busy"
    )
    if server >= 0.85:
        return f"the one waitress process's CPU (Python runs one thread at a time) -- {use}"
    if machine >= 0.9 * cores:
        return f"the {cores} cores shared by server, PostgreSQL and client -- {use}"
    return f"waiting, not CPU: PostgreSQL round trips, commits, row locks -- {use}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8, help="client threads (connections)")
    parser.add_argument("--requests", type=int, default=2000, help="requests of each kind")
    parser.add_argument("--threads", type=int, default=8, help="waitress worker threads")
    args = parser.parse_args()

    database = f"gpucredit_portal_load_{uuid.uuid4().hex[:8]}"
    tokens = seed(database)
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    service = {"Authorization": f"Bearer {tokens['service']}", "Content-Type": "application/json"}

    def healthz(n: int) -> tuple[str, str, bytes | None, dict[str, str]]:
        return "GET", "/healthz", None, {}

    def balance(n: int) -> tuple[str, str, bytes | None, dict[str, str]]:
        return "GET", f"/api/v1/accounts/acct{n % ACCOUNTS}/balance", None, admin

    def hold(n: int) -> tuple[str, str, bytes | None, dict[str, str]]:
        account, user = f"acct{n % ACCOUNTS}", f"user{n % ACCOUNTS}"
        body = {"account": account, "user": user, "job_id": 10**6 + n, "gpus": GPUS, "seconds": SECONDS}
        return "POST", "/api/v1/holds", json.dumps(body).encode(), service

    try:
        with tempfile.TemporaryDirectory(prefix="gpucredit-bench-") as workdir:
            server, port = start_portal(database, Path(workdir), args.threads)
            try:
                warm = Phase("warm-up", 4 * args.clients)
                for request in (healthz, balance):
                    run_phase(port, warm, args.clients, request, server.pid)
                phases = [
                    run_phase(port, Phase(name, args.requests), args.clients, request, server.pid)
                    for name, request in (
                        ("GET /healthz", healthz),
                        ("GET /api/v1/accounts/{a}/balance", balance),
                        ("POST /api/v1/holds", hold),
                    )
                ]
            finally:
                stop_portal(server)
        direct = direct_reserves_per_second(database, args.clients, args.requests, 10**8)
    finally:
        drop(database)

    print(
        f"gpucredit serve (waitress, {args.threads} threads) on PostgreSQL; {args.clients} keep-alive "
        f"clients on loopback; {args.requests} requests each; {ACCOUNTS} accounts; {os.cpu_count()} cores"
    )
    print(f"{'request':<34} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}  statuses")
    for phase in phases:
        statuses = ", ".join(f"{code or 'no answer'}: {n}" for code, n in sorted(phase.statuses.items()))
        print(
            f"{phase.name:<34} {phase.rate:>8.0f} {phase.percentile_ms(50):>8.1f} "
            f"{phase.percentile_ms(99):>8.1f}  {statuses}"
        )
    floor, reads, holds = phases
    print(
        f"balance / healthz req/s:                 {reads.rate / floor.rate:.2f}  (ledger read, token check)"
    )
    print(
        f"holds via HTTP / ledger.api in-process:  {holds.rate / direct:.2f}  "
        f"({holds.rate:.0f} vs {direct:.0f} reserves/s, {args.clients} threads: what the web layer costs)"
    )
    print("what bounds each (postgres: every postgres process on this machine, other users' too):")
    for phase in phases:
        assert phase.cpu is not None
        print(f"  {phase.name:<32} {bound(phase.cpu, phase.seconds)}")
    failures = sum(n for phase in phases for code, n in phase.statuses.items() if not 200 <= code < 300)
    if failures:
        print(f"warning: {failures} requests were not answered 2xx (see statuses): not the API's rate")


if __name__ == "__main__":
    main()
