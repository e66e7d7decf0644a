"""Two controllers: two real `gpucredit daemon` processes on one PostgreSQL, both serving.

Many hook-like clients hold and settle job runs concurrently, spread over both daemons
(half list the primary first, half the backup); mid-run the primary is killed with
SIGKILL, in the middle of whatever it was doing, and the clients fail over. Afterwards
every admitted job has exactly one hold, settled exactly once, no account held more
than its credit at any moment (the per-account row lock serialises the two daemons),
the books are exact to the micro-credit, and `gpucredit audit verify` passes.

No Slurm box is needed: the clients send what PrologSlurmctld and EpilogSlurmctld send.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ledger import api
from ledger.money import charge_for, format_credits, parse_credits
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.tables import holds_t
from ledger.timeutil import parse_time
from slurm_hooks.client import DaemonClient, DaemonRefused, DaemonUnreachable
from tests.support.daemon import GPUCREDIT, DaemonProcess
from tests.support.fakedaemon import sockdir as sockdir

A100 = 2_000_000  # micro-credits per GPU-hour
ACCOUNTS = ("alpha", "beta", "gamma")
CREDIT = "9"  # 4 concurrent 1-hour a100 holds (2.00 each) fit, a fifth does not
CLIENTS = 12
JOBS_PER_CLIENT = 12
LIMIT_S = 3600
RAN_S = 600  # each run is settled for 600 s: 0.333333 credits


@dataclass
class Outcomes:
    """What the clients saw, per job id."""

    held: dict[int, str] = field(default_factory=dict)  # job -> account of an admitted hold
    refused: dict[int, str] = field(default_factory=dict)  # job -> refusal code
    settled: dict[int, str] = field(default_factory=dict)  # job -> charged, as the daemon said
    unreachable: list[str] = field(default_factory=list)  # must stay empty: one daemon is always up
    done: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def ledger(pg_url: str, tmp_path: Path, sockdir: Path) -> Iterator[tuple[str, Path]]:
    engine = make_engine(pg_url)
    with session(engine) as s:
        api.set_price(s, "a100", format_credits(A100), effective_at=parse_time("2026-01-01"))
        for name in ACCOUNTS:
            api.create_account(s, name)
            api.add_member(s, "alice", name)
            api.topup(s, name, CREDIT)
    engine.dispose()
    config = tmp_path / "gpucredit.toml"
    config.write_text(
        f'[database]\nurl = "{pg_url}"\n'
        f'[daemon]\nsocket = "{sockdir / "primary.sock"}"\nmetrics_port = 0\n'
        '[slurm]\ncluster = "lab"\nbin_dir = "/nonexistent"\n'
    )
    yield pg_url, config


@contextmanager
def session(engine) -> Iterator[Session]:  # type: ignore[no-untyped-def]
    with make_sessionmaker(engine)() as s, s.begin():
        yield s


def hook_requests(job_id: int, account: str) -> tuple[dict[str, object], dict[str, object]]:
    """The hold and settle requests of PrologSlurmctld and EpilogSlurmctld for one run."""
    start = parse_time("2026-11-30T08:00:00Z") + timedelta(seconds=job_id)
    submit = start - timedelta(seconds=5)
    hold = {
        "cluster": "lab",
        "job_id": job_id,
        "run": 0,
        "account": account,
        "user": "alice",
        "partition": "onprem",
        "gpus": {"a100": 1},
        "seconds": LIMIT_S,
        "start": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "submit": submit.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "nodes": 1,
    }
    settle = {
        "cluster": "lab",
        "job_id": job_id,
        "run": 0,
        "start": hold["start"],
        "end": (start + timedelta(seconds=RAN_S)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "submit": hold["submit"],
    }
    return hold, settle


def client_loop(index: int, sockets: list[str], outcomes: Outcomes) -> None:
    order = sockets if index % 2 == 0 else sockets[::-1]  # spread over both daemons
    client = DaemonClient(order, timeout=5.0)
    for n in range(JOBS_PER_CLIENT):
        job_id = 1000 + index * JOBS_PER_CLIENT + n
        account = ACCOUNTS[job_id % len(ACCOUNTS)]
        hold, settle = hook_requests(job_id, account)
        try:
            client.call("hold", **hold)
        except DaemonRefused as e:
            with outcomes.lock:
                outcomes.refused[job_id] = e.code
                outcomes.done += 1
            continue
        except DaemonUnreachable as e:
            outcomes.unreachable.append(f"hold {job_id}: {e}")
            continue
        with outcomes.lock:
            outcomes.held[job_id] = account
        try:
            result = client.call("settle", **settle)
        except DaemonUnreachable as e:
            outcomes.unreachable.append(f"settle {job_id}: {e}")
            continue
        with outcomes.lock:
            outcomes.settled[job_id] = str(result["charged"])
            outcomes.done += 1


def test_two_daemons_one_database_survive_killing_one_mid_run(
    ledger: tuple[str, Path], sockdir: Path, tmp_path: Path
) -> None:
    url, config = ledger
    primary = DaemonProcess(str(sockdir / "primary.sock"), tmp_path / "primary.log")
    backup = DaemonProcess(str(sockdir / "backup.sock"), tmp_path / "backup.log")
    outcomes = Outcomes()
    try:
        primary.start(config)
        backup.start(config)
        sockets = [primary.socket, backup.socket]
        threads = [
            threading.Thread(target=client_loop, args=(i, sockets, outcomes), daemon=True)
            for i in range(CLIENTS)
        ]
        for t in threads:
            t.start()
        total = CLIENTS * JOBS_PER_CLIENT
        deadline = time.monotonic() + 60
        while outcomes.done < total // 3:  # kill the primary a third of the way through
            assert time.monotonic() < deadline, (outcomes.done, outcomes.unreachable)
            time.sleep(0.01)
        primary.kill()
        killed_at = outcomes.done
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
    finally:
        primary.stop()
        backup.stop()

    assert outcomes.unreachable == []  # every request found a daemon within its deadline
    assert killed_at < total  # the kill really came mid-run
    jobs = range(1000, 1000 + total)
    assert set(outcomes.held) | set(outcomes.refused) == set(jobs)
    assert set(outcomes.refused.values()) <= {"insufficient_credits"}
    assert outcomes.refused  # credit ran out: the accounts' locks decided who got the last of it
    print(
        f"two daemons: {len(outcomes.held)} settled, {len(outcomes.refused)} refused, kill after {killed_at}"
    )
    expected_charge = charge_for(A100, RAN_S)  # 0.333333
    engine = make_engine(url)
    try:
        with session(engine) as s:
            per_job = Counter(
                s.execute(
                    select(holds_t.c.job_id, func.count())
                    .where(holds_t.c.cluster == "lab")
                    .group_by(holds_t.c.job_id)
                ).all()
            )
            holds = {
                h.job_id: h for h in (api.get_hold(s, i) for i in s.execute(select(holds_t.c.id)).scalars())
            }
            # Exactly one hold per admitted job, none for a refused one, each settled once.
            assert {job: n for (job, n), _ in per_job.items()} == dict.fromkeys(outcomes.held, 1)
            assert {job: (h.state, h.charged_ucredits) for job, h in holds.items()} == {
                job: ("settled", expected_charge) for job in outcomes.held
            }
            assert set(outcomes.settled.values()) == {format_credits(expected_charge)}
            for account in ACCOUNTS:
                runs = [job for job, owner in outcomes.held.items() if owner == account]
                balance = api.balance(s, account)
                expected = parse_credits(CREDIT) - len(runs) * expected_charge
                assert (balance["available"], balance["held"]) == (format_credits(expected), "0.00"), account
    finally:
        engine.dispose()
    verify = subprocess.run(
        [GPUCREDIT, "audit", "verify"],
        env={**os.environ, "GPUCREDIT_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def ask_both_at_once(sockets: list[str], op: str, request: dict[str, object]) -> list[dict[str, object]]:
    answers: list[dict[str, object]] = []

    def ask(path: str) -> None:
        answers.append(DaemonClient(path, 5).call(op, **request))

    calls = [threading.Thread(target=ask, args=(path,)) for path in sockets]
    for t in calls:
        t.start()
    for t in calls:
        t.join(10)
    return answers


def test_both_daemons_apply_one_run_once_when_asked_at_the_same_time(
    ledger: tuple[str, Path], sockdir: Path, tmp_path: Path
) -> None:
    """The same hold sent to both daemons at once (a client that timed out on one and
    retried on the other while the first was still working): one hold, both answers
    name it; the same for the settle."""
    url, config = ledger
    primary = DaemonProcess(str(sockdir / "primary.sock"), tmp_path / "primary.log")
    backup = DaemonProcess(str(sockdir / "backup.sock"), tmp_path / "backup.log")
    try:
        primary.start(config)
        backup.start(config)
        for job_id in range(1, 21):
            hold, settle = hook_requests(job_id, "alpha")
            for op, request in (("hold", hold), ("settle", settle)):
                answers = ask_both_at_once([primary.socket, backup.socket], op, request)
                assert len(answers) == 2 and answers[0]["id"] == answers[1]["id"], answers
    finally:
        primary.stop()
        backup.stop()
    engine = make_engine(url)
    try:
        with session(engine) as s:
            assert s.execute(select(func.count()).select_from(holds_t)).scalar() == 20
            balance = api.balance(s, "alpha")
            spent = 20 * charge_for(A100, RAN_S)
            assert balance["available"] == format_credits(parse_credits(CREDIT) - spent)
            assert balance["held"] == "0.00"
    finally:
        engine.dispose()
