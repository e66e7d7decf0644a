"""The GPU nodes' channel (accounting_bridge/nvml/channel.py, receiver.py): how many agents
one controller's receiver takes, and how long a node's send waits.

`--nodes` senders (threads, each a node) send batches of `--rows` usage rows, one MUNGE
credential each, over TCP to one receiver writing PostgreSQL, as fast as answered, for
`--seconds`. A real node sends one batch every agent.interval_seconds (10 s), so N
batches/s serve 10 N nodes. Needs munged (a private one is started) and PostgreSQL
(GPUCREDIT_TEST_PG_URL). `python -m bench.agent_channel`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

from accounting_bridge.nvml.channel import MungeSender
from accounting_bridge.nvml.munge import Munge
from accounting_bridge.nvml.receiver import UsageReceiver
from bench.goals import percentile, report
from ledger.api import UsageDelta
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade

PG = os.environ.get("GPUCREDIT_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rows", type=int, default=8, help="rows per batch (runs x GPU types on a node)")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

    from tests.support.munged import munged

    folder = Path(tempfile.mkdtemp(prefix="gpucredit-bench-munge-"))
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    name = f"gpucredit_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    upgrade(engine)
    stop = threading.Event()
    try:
        with munged(folder) as socket_path:
            receiver = UsageReceiver(Munge(socket_path), make_sessionmaker(engine))
            receiver.serve("127.0.0.1", 0, stop)
            address = ("127.0.0.1", int(receiver.address[1]))
            waits: list[float] = []
            lock = threading.Lock()
            deadline = time.monotonic() + args.seconds

            def node(index: int) -> None:
                sender = MungeSender(Munge(socket_path), [address], f"gpu{index}")
                mine = []
                job = 0
                while time.monotonic() < deadline:
                    job += 1
                    job_id = index * 1_000_000 + job
                    rows = [
                        UsageDelta("lab", job_id, 0, f"gpu{index}", f"g{r}", 10, 5, 100, 2**30)
                        for r in range(args.rows)
                    ]
                    began = time.perf_counter()
                    sender.send(rows)
                    mine.append(time.perf_counter() - began)
                with lock:
                    waits.extend(mine)

            threads = [threading.Thread(target=node, args=(i,)) for i in range(args.nodes)]
            began = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.monotonic() - began
    finally:
        stop.set()
        engine.dispose()
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        shutil.rmtree(folder, ignore_errors=True)
    rate = len(waits) / elapsed
    p50, p99 = percentile(waits, 0.5) * 1000, percentile(waits, 0.99) * 1000
    print(
        f"{args.nodes} senders, {args.rows} rows a batch: {len(waits)} batches in {elapsed:.1f} s = "
        f"{rate:.0f} batches/s ({rate * args.rows:.0f} rows/s); send p50 {p50:.1f} ms, p99 {p99:.1f} ms; "
        f"at one batch per node every 10 s: {rate * 10:,.0f} nodes"
    )
    report("agents: GPU nodes one receiver serves at a batch per 10 s", rate * 10, goal=10_000, must=1_000)


if __name__ == "__main__":
    main()
