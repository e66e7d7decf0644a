"""Ledger throughput on PostgreSQL: hold+settle cycles/s against pgbench's tpcb-like tps.

Both run in this one invocation against the same server, so the ratio is meaningful
on whatever machine runs it. A cycle is one job's life in the ledger: a hold (limits,
credit check, earmarks) and its settle (charge, release of the rest), two
transactions. Accounts are many, as on a real cluster, so workers contend on the
server, not on one account's lock.

    .venv/bin/python -m bench.ledger_throughput [--workers 4] [--seconds 15] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing as mp
import pstats
import re
import shutil
import subprocess
import time
import uuid
from datetime import UTC, datetime

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from ledger import api
from ledger.db import make_engine, make_sessionmaker
from ledger.schema import upgrade

ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
ACCOUNTS = 64
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
            s, account, user="alice", job_id=job_id, gpus="h100:2,a100:1", seconds=7200, cluster="bench"
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


def profile(database: str, cycles: int) -> str:
    engine = make_engine(_url(database), pool_size=1)
    factory = make_sessionmaker(engine)
    cycle(factory, "acct0", 2 * 10**9)
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(cycles):
        cycle(factory, f"acct{i % ACCOUNTS}", 3 * 10**9 + i)
    profiler.disable()
    engine.dispose()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
    stats.print_stats(25)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--profile", action="store_true", help="also profile one worker's cycles")
    args = parser.parse_args()
    database = f"gpucredit_bench_{uuid.uuid4().hex[:8]}"
    setup(database)
    try:
        rows = []
        for workers in args.workers:
            cycles = ledger_cycles_per_second(database, workers, args.seconds)
            tps = pgbench_tps(workers, int(args.seconds))
            rows.append((workers, cycles, tps))
        print(
            f"{'clients':>7}  {'ledger cycles/s':>15}  {'pgbench tps':>11}  {'ratio':>6}  (goal >= 0.50)"
        )
        for workers, cycles, tps in rows:
            print(f"{workers:>7}  {cycles:>15.0f}  {tps:>11.0f}  {cycles / tps:>6.3f}")
        if args.profile:
            print(profile(database, 300))
    finally:
        with _admin().connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
