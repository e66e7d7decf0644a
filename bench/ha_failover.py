"""The ledger's database fails over under the daemon benchmark's load (issue 34).

The HA box (`make ha-up`: Patroni, a primary and a synchronous standby; slurmbox/ha.py)
serves a fresh database; a real `gpucredit daemon` on its multi-host URL is driven by N
client processes speaking the hooks' protocol with the hooks' own client (its 2 s
deadline), each holding and settling one job after another, as in
bench/ledger_throughput.py. After `--before` seconds the leader is crashed (`make
ha-failover`'s SIGKILL of its Patroni, postmaster and backends); the clients go on for `--after`
seconds more, retrying every unanswered request (`unavailable`, or no reply in time) with
the same request every 50 ms, as a hook run again would.

Prints, from one run:

- acknowledged writes lost: holds and settles the daemon answered that the new leader does
  not have (must be 0), and runs held twice (must be 0);
- the time from the crash to the first committed batch on the new leader (the first hold
  answered, of those asked after the crash), and Patroni's own promotion time;
- the prolog's (a hold request's) latency, p50 and p99, before the crash and in the
  failover window (from the crash to one second after the first committed batch: each
  try is answered, `unavailable` until the new leader takes writes), and how long a run
  first asked between the crash and the first committed batch waited for its hold,
  retrying.

    .venv/bin/python -m bench.ha_failover [--clients 64] [--before 10] [--after 20]

Needs root and Debian's patroni and etcd-server; starts the HA box if it is not up and
leaves it as it found it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select, text

from bench.goals import percentile, report
from bench.ledger_throughput import daemon_process, hook_requests
from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade
from ledger.store.tables import holds_t
from slurm_hooks.client import DaemonClient, DaemonRefused, DaemonUnreachable
from slurmbox import ha

ACCOUNTS = 64
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
RETRY_PAUSE_S = 0.05

# One try: (op, job_id, sent, answered, outcome, hold id or None); times are CLOCK_MONOTONIC,
# which every process of the host shares.
Try = tuple[str, int, float, float, str, int | None]


def setup() -> str:
    """A fresh database on the cluster, migrated, with prices and funded accounts; its URL."""
    name = f"gpucredit_ha_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(ha.database_url("postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    url = ha.database_url(name)
    engine = make_engine(url)
    upgrade(engine)
    with make_sessionmaker(engine)() as s, s.begin():
        api.set_price(s, "h100", "3.60", effective_at=EPOCH)
        api.set_price(s, "a100", "2.00", effective_at=EPOCH)
        for i in range(ACCOUNTS):
            api.create_account(s, f"acct{i}")
            api.topup(s, f"acct{i}", "1000000", effective_at=EPOCH)
    engine.dispose()
    return url


def client(socket_path: str, index: int, until: float, results: Any) -> None:
    """Hold and settle job after job until `until`, each request retried until answered."""
    hooks = DaemonClient(socket_path)  # the hooks' own 2 s deadline
    tries: list[Try] = []
    job_id = (index + 1) * 10**6
    while time.monotonic() < until:
        job_id += 1
        hold, settle = hook_requests(f"acct{job_id % ACCOUNTS}", job_id)
        for op, request in (("hold", hold), ("settle", settle)):
            while True:
                sent = time.monotonic()
                try:
                    answer = hooks.call(op, **request)
                    tries.append((op, job_id, sent, time.monotonic(), "ok", int(answer["id"])))
                    break
                except DaemonUnreachable as error:
                    outcome = "unavailable" if "unavailable:" in str(error) else "no reply"
                    tries.append((op, job_id, sent, time.monotonic(), outcome, None))
                except DaemonRefused as error:
                    tries.append((op, job_id, sent, time.monotonic(), error.code, None))
                    break
                time.sleep(RETRY_PAUSE_S)
    results.put(tries)


def lost_writes(url: str, tries: list[Try]) -> tuple[int, int, int]:
    """(acknowledged holds or settles the database lacks, runs held twice, holds in all)."""
    acked_holds = {
        job: hold_id for op, job, *_, outcome, hold_id in tries if op == "hold" and outcome == "ok"
    }
    acked_settles = {job for op, job, *_, outcome, _ in tries if op == "settle" and outcome == "ok"}
    engine = make_engine(url)
    with make_sessionmaker(engine)() as s:
        rows = s.execute(select(holds_t.c.id, holds_t.c.job_id, holds_t.c.state)).all()
        twice = s.execute(
            select(func.count()).select_from(
                select(holds_t.c.job_id).group_by(holds_t.c.job_id).having(func.count() > 1).subquery()
            )
        ).scalar_one()
        verified = api.verify(s)
    engine.dispose()
    if not verified.ok:
        raise SystemExit(f"audit verify FAILED after the failover: {verified.problems[:5]}")
    by_job = {row.job_id: row for row in rows}
    lost = sum(1 for job, hold_id in acked_holds.items() if job not in by_job or by_job[job].id != hold_id)
    lost += sum(1 for job in acked_settles if job not in by_job or by_job[job].state != "settled")
    return lost, int(twice), len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64, help="hook processes at once")
    parser.add_argument("--before", type=float, default=10.0, help="seconds of load before the crash")
    parser.add_argument("--after", type=float, default=20.0, help="seconds of load after the crash")
    args = parser.parse_args()
    missing = ha.installed()
    if missing:
        raise SystemExit(f"bench.ha_failover needs: apt-get install {' '.join(missing)}")
    was_up = ha.status()["leader"] is not None
    print(f"ha-up: {ha.up()['seconds']} s")
    try:
        run(args)
    finally:
        if not was_up:
            ha.down(wipe=True)


def run(args: argparse.Namespace) -> None:
    url = setup()
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    with (
        tempfile.TemporaryDirectory(prefix="gc-bench-", dir="/tmp") as workdir,
        daemon_process("", Path(workdir), 64, 1, url=url) as served,
    ):
        socket_path, _pid = served
        started = time.monotonic()
        until = started + args.before + args.after
        procs = [
            ctx.Process(target=client, args=(socket_path, i, until, results)) for i in range(args.clients)
        ]
        for p in procs:
            p.start()
        time.sleep(
            max(0.0, started + args.before - time.monotonic())
        )  # the load's length, not a wait on anything
        crash = ha.failover(wait=True)
        crashed_at = time.monotonic() - crash["read_write_after_seconds"]
        tries = [t for _ in procs for t in results.get(timeout=args.after + 180)]
        for p in procs:
            p.join()
    summarize(url, tries, started, crashed_at, crash)


def summarize(url: str, tries: list[Try], started: float, crashed_at: float, crash: dict[str, Any]) -> None:
    holds = [t for t in tries if t[0] == "hold"]
    committed = [
        answered for _op, _job, sent, answered, outcome, _ in tries if outcome == "ok" and sent >= crashed_at
    ]
    first_commit = min(committed) - crashed_at if committed else float("nan")
    window_end = crashed_at + first_commit + 1.0
    before = [
        answered - sent for _, _, sent, answered, outcome, _ in holds if started + 2 <= sent < crashed_at
    ]
    during = [answered - sent for _, _, sent, answered, _, _ in holds if crashed_at <= sent < window_end]
    first_try: dict[int, float] = {}
    held_at: dict[int, float] = {}
    for _, job, sent, answered, outcome, _ in holds:
        first_try.setdefault(job, sent)
        if outcome == "ok":
            held_at[job] = answered
    recovered_at = crashed_at + first_commit
    waited = [
        held_at[job] - sent
        for job, sent in first_try.items()
        if crashed_at <= sent < recovered_at and job in held_at
    ]
    outcomes = Counter(outcome for *_, outcome, _ in tries)
    lost, twice, rows = lost_writes(url, tries)
    print(
        f"ha failover: crashed {crash['crashed']}; {crash['standby']} read-write (Patroni) after "
        f"{crash['read_write_after_seconds']:.2f} s; first committed batch {first_commit:.2f} s "
        "after the crash"
    )
    print(
        f"ha failover: tries {dict(outcomes)}; {rows} holds; acknowledged writes lost {lost}; "
        f"runs held twice {twice}"
    )
    print(
        f"ha failover: prolog before the crash p50 {1000 * percentile(before, 0.5):.1f} / p99 "
        f"{1000 * percentile(before, 0.99):.1f} ms ({len(before)} holds); in the window p50 "
        f"{1000 * percentile(during, 0.5):.1f} / p99 {1000 * percentile(during, 0.99):.1f} ms "
        f"({len(during)} tries, "
        "answered `unavailable` until the new leader); a run first asked before the new leader "
        f"held after p50 "
        f"{percentile(waited, 0.5):.2f} / max {max(waited, default=float('nan')):.2f} s of retrying"
    )
    report("ha failover: acknowledged writes lost", lost + twice, goal=0, must=0, better="<=")
    report(
        "ha failover: crash to first committed batch", first_commit, goal=10, must=30, better="<=", unit="s"
    )
    ratio = percentile(during, 0.99) / percentile(before, 0.99)
    report("ha failover: prolog p99 in the window ÷ before", ratio, goal=1, must=10, better="<=")


if __name__ == "__main__":
    main()
