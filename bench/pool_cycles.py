"""Hold+settle cycles/s for jobs drawing on one shared pool, against the flat case.

Both on one PostgreSQL server in this one run, so the ratio is meaningful on whatever
machine runs it. Flat: 64 funded top-level accounts. Pooled: 64 siblings with no credit
of their own under one parent whose pool is on, so every hold borrows from the parent
and every settle gives the rest back. Two paths, as bench/ledger_throughput.py measures:

- daemon (the real one): a `gpucredit daemon` driven by N hook clients (the prolog's
  hold and the epilog's settle over its socket), applied in batches (group commit);
- direct: N worker processes, one transaction per call (the ledger's own functions, as
  the CLI and the portal call them).

    .venv/bin/python -m bench.pool_cycles [--clients 32] [--workers 4] [--seconds 10]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.goals import report
from bench.ledger_throughput import daemon_process, hook_requests
from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade
from slurm_hooks.client import DaemonClient

ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
SIBLINGS = 64
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def _url(database: str) -> str:
    return make_url(ADMIN_URL).set(database=database).render_as_string(hide_password=False)


def setup(database: str, pooled: bool) -> None:
    with create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT").connect() as c:
        c.execute(text(f'CREATE DATABASE "{database}"'))
    engine = make_engine(_url(database))
    upgrade(engine)
    with make_sessionmaker(engine)() as s, s.begin():
        api.set_price(s, "h100", "3.60", effective_at=EPOCH)
        api.set_price(s, "a100", "2.00", effective_at=EPOCH)  # the hooks' requests ask for both
        api.create_account(s, "dept")
        api.topup(s, "dept", "100000000", effective_at=EPOCH)
        for i in range(SIBLINGS):
            api.create_account(s, f"kid{i}")
            if pooled:
                api.set_parent(s, f"kid{i}", "dept")
            else:
                api.topup(s, f"kid{i}", "1000000", effective_at=EPOCH)
        if pooled:
            api.set_pool(s, "dept", True, None, at=EPOCH)
    engine.dispose()


def cycle(factory, account: str, job_id: int) -> None:  # type: ignore[no-untyped-def]
    with factory() as s, s.begin():
        hold = api.create_hold(
            s, api.HoldRequest(account, user="alice", job_id=job_id, gpus="h100:2", seconds=7200, cluster="b")
        )
    with factory() as s, s.begin():
        api.settle_hold(s, hold.id, 1800)


def worker(database: str, index: int, seconds: float, barrier, results) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(_url(database), pool_size=1)
    factory = make_sessionmaker(engine)
    cycle(factory, f"kid{index % SIBLINGS}", 10**9 + index)  # warm the connection and caches
    barrier.wait()
    done, job_id = 0, index * 10**7
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        job_id += 1
        cycle(factory, f"kid{job_id % SIBLINGS}", job_id)
        done += 1
    results.put((done, time.perf_counter() - start))
    engine.dispose()


@contextmanager
def fresh_database(pooled: bool) -> Iterator[str]:
    """A database set up flat or pooled for one measurement; audited, then dropped."""
    database = f"bench_pool_{uuid.uuid4().hex[:8]}"
    setup(database, pooled)
    try:
        yield database
        engine = make_engine(_url(database))
        with make_sessionmaker(engine)() as s:
            assert api.verify(s).ok
        engine.dispose()
    finally:
        with create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT").connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


def run_processes(target: Any, count: int, args: tuple[Any, ...], seconds: float) -> list[Any]:
    """`count` processes of `target(*args, index, seconds, barrier, results)` started at one
    barrier; what each put on the queue."""
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(count), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, i, seconds, barrier, results)) for i in range(count)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return outcomes


def cycles_per_second(pooled: bool, workers: int, seconds: float) -> float:
    with fresh_database(pooled) as database:
        outcomes = run_processes(worker, workers, (database,), seconds)
    return sum(done for done, _ in outcomes) / max(elapsed for _, elapsed in outcomes)


def daemon_client(socket_path: str, index: int, seconds: float, barrier, results) -> None:  # type: ignore[no-untyped-def]
    client = DaemonClient(socket_path, 30.0)
    done = failed = 0
    job_id = (index + 1) * 10**7
    barrier.wait()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        job_id += 1
        hold, settle = hook_requests(f"kid{job_id % SIBLINGS}", job_id)
        try:
            client.call("hold", **hold)
            client.call("settle", **settle)
            done += 1
        except Exception as error:  # counted: the figure says how many failed
            failed += 1
            if failed <= 3:
                print(f"client {index}: {error}", file=sys.stderr, flush=True)
    results.put((done, failed, time.perf_counter() - start))


def daemon_cycles_per_second(pooled: bool, clients: int, seconds: float) -> tuple[float, int]:
    with (
        fresh_database(pooled) as database,
        tempfile.TemporaryDirectory(prefix="gc-bench-", dir="/tmp") as workdir,
        daemon_process(database, Path(workdir), 64, 1, weighted=False) as served,
    ):
        outcomes = run_processes(daemon_client, clients, (served[0],), seconds)
    rate = sum(done for done, _, _ in outcomes) / max(elapsed for _, _, elapsed in outcomes)
    return rate, sum(failed for _, failed, _ in outcomes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32, help="daemon clients (hook processes at once)")
    parser.add_argument("--workers", type=int, default=4, help="direct-to-ledger processes")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    flat, flat_failed = daemon_cycles_per_second(False, args.clients, args.seconds)
    pooled, pooled_failed = daemon_cycles_per_second(True, args.clients, args.seconds)
    print(
        f"daemon  {args.clients} clients: flat {flat:.0f} cycles/s ({flat_failed} failed); "
        f"{SIBLINGS} siblings on one pool {pooled:.0f} cycles/s ({pooled_failed} failed)"
    )
    direct_flat = cycles_per_second(False, args.workers, args.seconds)
    direct_pooled = cycles_per_second(True, args.workers, args.seconds)
    print(f"direct  {args.workers} processes: flat {direct_flat:.0f}; pooled {direct_pooled:.0f} cycles/s")
    report("pools: daemon pooled ÷ flat hold+settle cycles/s", pooled / flat, goal=0.8, must=0.5)
    report(
        "pools: direct pooled ÷ flat hold+settle cycles/s", direct_pooled / direct_flat, goal=0.8, must=0.25
    )


if __name__ == "__main__":
    main()
