"""Fleet simulator: a month of a GPU fleet in simulated time, against the real ledger.

    .venv/bin/python -m bench.simulate [--config small|medium|full] [--store sqlite|postgres]
                                       [--seed N] [--policy reject|accept]
                                       [--mode full|lease] [--json]

Discrete-event, simulated time: nodes of several GPU types, accounts whose grants
start and expire, limits and caps, job arrivals, node and agent failures, ledger
outages, network partitions between the controller and the database, lost and
repeated epilogs, requeues and migrations. The daemon's hold and settle, the meter's
tick and the bridge's sacct rounds run for real on SQLite or PostgreSQL (bench/sim/).
It then checks the books against an independent recomputation from the simulated
sacct records and prints exactness, overspend against the bound, Jain's fairness
index, ledger operations per second and wall time. Exit status 1 when a check fails.

The database is a fresh one: a SQLite file in a temporary directory, or a database
created next to --pg-url (trust auth on 127.0.0.1 by default) and dropped at the end.
docs/simulator.md says what each figure means and gives the full-size figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.sim.books import check, render
from bench.sim.engine import Simulation
from bench.sim.workload import CONFIGS, Config, make_workload
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@contextmanager
def fresh_database(store: str, pg_url: str = DEFAULT_PG_URL) -> Iterator[str]:
    """A new, empty database URL for one simulation; removed afterwards."""
    if store == "sqlite":
        with tempfile.TemporaryDirectory(prefix="gpucredit-sim-") as directory:
            yield f"sqlite:///{Path(directory) / 'ledger.db'}"
        return
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    name = f"gpucredit_sim_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def simulate(
    config: Config,
    url: str,
    *,
    seed: int = 1,
    defect: str | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Run `config` against the (empty) database at `url`; return the report."""
    started = time.perf_counter()
    engine = make_engine(url)
    try:
        upgrade(engine)
        factory = make_sessionmaker(engine)
        workload = make_workload(config, seed)
        sim = Simulation(workload, factory, seed=seed, defect=defect, progress=progress)
        sim.run()
        report = check(sim, factory, time.perf_counter() - started)
    finally:
        engine.dispose()
    report["config"]["store"] = make_url(url).get_backend_name()
    report["config"]["seed"] = seed
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", choices=("reject", "accept"), default=None)
    parser.add_argument("--mode", choices=("full", "lease"), default=None, help="holds.mode")
    parser.add_argument("--jobs", type=int, default=None, help="override the configuration's job count")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    config = CONFIGS[args.config]
    if args.policy:
        config = config.with_(policy=args.policy)
    if args.mode:
        config = config.with_(mode=args.mode)
    if args.jobs is not None:
        if args.jobs < 1:
            parser.error("--jobs must be at least 1")
        config = config.with_(jobs=args.jobs)

    def progress(line: str) -> None:
        print(f"[simulate] {line}", file=sys.stderr, flush=True)

    with fresh_database(args.store, args.pg_url) as url:
        report = simulate(config, url, seed=args.seed, progress=None if args.quiet else progress)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
