"""Sibling accounts racing one shared thing (a parent's pool, a parent's cap), each in its
own process with its own connection, started at one barrier: what each got, with no
sleep ordering them."""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Callable
from typing import Any

from ledger.errors import LedgerError
from ledger.store.db import make_engine, make_sessionmaker

BARRIER_TIMEOUT_S = 120  # a guard against a hung worker, never a measurement


def _worker(url: str, take: Callable[[Any, int], Any], worker: int, barrier: Any, results: Any) -> None:
    engine = make_engine(url, pool_size=1)
    try:
        barrier.wait(timeout=BARRIER_TIMEOUT_S)
        with make_sessionmaker(engine)() as s, s.begin():
            try:
                results.put((worker, "held", take(s, worker)))
            except LedgerError as error:
                results.put((worker, "refused", error.code))
    except BaseException:
        results.put((worker, "crashed", traceback.format_exc()))
    finally:
        engine.dispose()


def race(url: str, workers: int, take: Callable[[Any, int], Any]) -> list[tuple[str, Any]]:
    """Run `take(session, worker)` in `workers` processes at once, one transaction each;
    returns each one's ("held", its result) or ("refused", the ledger's code), by worker.
    `take` must be a module-level function (the processes are spawned)."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(workers)
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, take, w, barrier, results)) for w in range(workers)]
    for p in procs:
        p.start()
    reports = sorted(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    crashed = [report for _, kind, report in reports if kind == "crashed"]
    assert not crashed, crashed[0]
    return [(kind, value) for _, kind, value in reports]
