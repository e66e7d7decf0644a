"""The daemon's group commit across a failover of its database (issue 34).

A real Daemon (served from a thread, on the HA box's multi-host URL) answers the hooks'
own client. A gate holds its writer while three holds queue up behind a first one, so
the test knows which requests share the next batch; the primary is crashed under that
batch, in one of two places:

- before its COMMIT (its rows written, nothing committed): every request of the batch
  is answered `unavailable`, never a success; and
- during its COMMIT: the standby's WAL receiver is stopped (SIGSTOP) so the primary's
  COMMIT waits for the synchronous standby, and the primary dies while it waits. The
  daemon cannot know whether it committed, and answers `unavailable`: the commit record
  had reached the standby's socket, so on the new leader the holds exist. The retry
  must find them (the same hold ids), not take a second hold.

Either way the clients retry the same requests (as a hook run again, or `scontrol
release`), the daemon reconnects to the new leader by itself (no restart), each run is
held exactly once, the books are exact and the audit passes; job_submit.lua's quotes are
answered from the daemon's snapshot all through the failover (it is trusted 30 s). The time from the crash to
the first hold answered on the new leader is measured and printed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.orm import Session

from gpucredit.daemon.server import Daemon
from ledger import api
from ledger.money import format_credits, parse_credits
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade
from ledger.store.tables import holds_t
from slurm_hooks.client import DaemonClient, DaemonRefused, DaemonUnreachable
from slurmbox import ha
from tests.support.daemon import NO_VAL, PARTITIONS, running, sinfo_runner
from tests.support.fakedaemon import sockdir as sockdir
from tests.support.ha import HACluster

START = "2026-12-02T10:00:00Z"
RETRY_PAUSE_S = 0.05  # the clients' pause before retrying an unanswered request


def job(job_id: int, account: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "cluster": "lab",
        "job_id": job_id,
        "run": 0,
        "account": account,
        "user": "alice",
        "partition": None,
        "gpus": {"h100": gpus},
        "seconds": 3600,
        "nodes": 1,
        "start": START,
    }


def settle(job_id: int) -> dict[str, Any]:
    return {"cluster": "lab", "job_id": job_id, "run": 0, "start": START, "end": "2026-12-02T10:30:00Z"}


@contextmanager
def transaction(engine: Engine) -> Iterator[Session]:
    with make_sessionmaker(engine)() as s, s.begin():
        yield s


def new_ledger(ha_cluster: HACluster) -> str:
    url = ha_cluster.new_database()
    engine = make_engine(url)
    upgrade(engine)
    with transaction(engine) as s:
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        for account in ("physics", "chem"):
            api.create_account(s, account)
            api.topup(s, account, "20", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
    engine.dispose()
    return url


class CutBatch:
    """Holds the writer at its next batch while requests queue behind it; the batch after
    that one is the one the crash cuts (`crash` runs in the writer, from `fast` or beside
    the COMMIT). Records the hold ids the cut batch wrote."""

    def __init__(self, daemon: Daemon, socket_path: Path) -> None:
        self.daemon = daemon
        self.client = DaemonClient(str(socket_path), 60.0)
        self.entered, self.opened = threading.Event(), threading.Event()
        self.armed = True
        self.written: list[int] = []
        self.threads: list[threading.Thread] = []
        self.answers: dict[int, Any] = {}
        prepare, fast = daemon.batches.prepare, daemon.batches.fast
        assert prepare is not None and fast is not None

        def gated(s: Session, batch: Any) -> Any:
            if self.armed:
                self.armed = False
                self.entered.set()
                assert self.opened.wait(30), "the test never opened the gate"
            return prepare(s, batch)

        def fast_then_noted(s: Session, batch: Any, locked: Any) -> Any:
            answers = fast(s, batch, locked)
            if len(batch) > 1 and not self.written:
                self.written = [
                    getattr(answer[0], "id", None) or answer[0]["id"]
                    for answer in answers
                    if answer and answer[0]
                ]
                self.cut(s)
            return answers

        daemon.batches.prepare = gated
        daemon.batches.fast = fast_then_noted
        self.cut: Callable[[Session], None] = lambda s: None

    def send(self, request: dict[str, Any], *, first: bool = False) -> None:
        waiting = self.daemon.batches.waiting()

        def call() -> None:
            try:
                self.answers[request["job_id"]] = self.client.call("hold", **request)
            except (DaemonRefused, DaemonUnreachable) as error:
                self.answers[request["job_id"]] = error

        thread = threading.Thread(target=call)
        thread.start()
        self.threads.append(thread)
        if first:
            wait_for(self.entered.is_set, "the first hold never reached the writer")
        else:
            wait_for(lambda: self.daemon.batches.waiting() > waiting, f"{request} never queued")

    def run(self, first: dict[str, Any], batch: list[dict[str, Any]]) -> dict[int, Any]:
        self.send(first, first=True)
        for request in batch:
            self.send(request)
        self.opened.set()
        for thread in self.threads:
            thread.join(120)
            assert not thread.is_alive()
        return self.answers


def retry_until_held(socket_path: Path, requests: list[dict[str, Any]], crashed_at: float) -> dict[str, Any]:
    """Each request again and again, as a hook run again would, until answered; the
    seconds from the crash to the first answered hold; how the unanswered tries went.
    Meanwhile job_submit.lua's quote is asked once a round: what sbatch meets meanwhile."""
    client = DaemonClient(str(socket_path))  # the hooks' 2 s deadline
    held: dict[int, dict[str, Any]] = {}
    tries = {"unavailable": 0, "no reply": 0}
    quotes: Counter[str] = Counter()
    slowest = 0.0
    first = None
    deadline = time.monotonic() + 120  # a bound on a broken cluster, not a measurement
    while len(held) < len(requests):
        try:
            quotes[submit(client)["decision"]] += 1
        except DaemonUnreachable as error:
            quotes[str(error)] += 1
        for request in requests:
            if request["job_id"] in held:
                continue
            asked = time.monotonic()
            try:
                held[request["job_id"]] = client.call("hold", **request)
                first = first if first is not None else time.monotonic() - crashed_at
            except DaemonUnreachable as error:
                tries["unavailable" if "unavailable:" in str(error) else "no reply"] += 1
            slowest = max(slowest, time.monotonic() - asked)
        assert time.monotonic() < deadline, f"no hold answered 120 s after the crash: {tries}"
        if len(held) < len(requests):
            time.sleep(RETRY_PAUSE_S)
    return {
        "held": held,
        "first_hold_after_seconds": first,
        "tries": tries,
        "slowest_answer_seconds": slowest,
        "quotes": quotes,
    }


def submit(client: DaemonClient) -> dict[str, Any]:
    """What job_submit.lua asks for `sbatch -A chem --gres=gpu:h100:1 -t 60`."""
    return client.call(
        "submit",
        user_name="alice",
        user_id=1001,
        default_account="chem",
        partitions=PARTITIONS,
        time_limit=60,
        num_tasks=NO_VAL,
        min_nodes=NO_VAL,
        tres_per_node="gres:gpu:h100:1",
    )


def check_books(url: str, jobs: dict[int, tuple[str, int]]) -> None:
    """One hold per run, settled once; the accounts exact; the audit passes."""
    engine = make_engine(url)
    with transaction(engine) as s:
        rows = s.execute(select(holds_t.c.job_id, func.count()).group_by(holds_t.c.job_id))
        per_job = {job_id: count for job_id, count in rows}
        assert per_job == dict.fromkeys(jobs, 1)
    with transaction(engine) as s:
        for account in ("physics", "chem"):
            # 20 credits less each run's 30 minutes: 1.80 per h100.
            charged = sum(
                parse_credits("1.80") * gpus for job_id, (owner, gpus) in jobs.items() if owner == account
            )
            expected = format_credits(parse_credits("20") - charged)
            balance = api.balance(s, account)
            assert (balance["available"], balance["held"]) == (expected, "0.00"), account
        assert api.verify(s).ok
    engine.dispose()


def report(what: str, retried: dict[str, Any]) -> None:
    print(
        f"{what}: first hold on the new leader {retried['first_hold_after_seconds']:.2f} s after the crash; "
        f"unanswered tries {retried['tries']}; slowest answer {retried['slowest_answer_seconds']:.2f} s; "
        f"job_submit's quotes meanwhile {dict(retried['quotes'])}"
    )


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60  # a bound on a slow machine, not a measurement
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_batch_cut_off_before_its_commit_is_answered_unavailable(
    ha_cluster: HACluster, sockdir: Path
) -> None:
    url = new_ledger(ha_cluster)
    socket_path = sockdir / "daemon.sock"
    first = job(90, "chem")
    batch = [job(10, "physics", 2), job(11, "chem"), job(12, "physics")]
    crash: dict[str, Any] = {}
    with running(url, sockdir, sinfo_runner()) as daemon:
        assert daemon.slurm_facts.learned.wait(10), "the daemon never read the partitions"
        daemon.batches.writers = 1
        cut = CutBatch(daemon, socket_path)

        def crash_now(s: Session) -> None:
            crash["at"] = time.monotonic()
            crash.update(ha_cluster.crash_leader())

        cut.cut = crash_now
        answers = cut.run(first, batch)
        assert crash, "the batch was never cut"
        assert answers[90]["amount"] == "3.60"  # committed before the crash: it must survive
        for request in batch:  # the cut batch: never a success it did not commit
            answer = answers[request["job_id"]]
            assert isinstance(answer, DaemonUnreachable), answer
            assert str(answer).endswith("unavailable: the ledger database is unavailable")
        retried = retry_until_held(socket_path, batch, crash["at"])
        # sbatch went on meanwhile: job_submit.lua quoted from the daemon's snapshot.
        assert set(retried["quotes"]) == {"accept"}, retried["quotes"]
        assert [retried["held"][r["job_id"]]["amount"] for r in batch] == ["7.20", "3.60", "3.60"]
        client = DaemonClient(str(socket_path), 10.0)
        assert client.call("hold", **first)["id"] == answers[90]["id"]  # the acknowledged hold, found again
        for job_id in (90, 10, 11, 12):
            assert client.call("settle", **settle(job_id))["charged"] == ("3.60" if job_id == 10 else "1.80")
    report("cut before COMMIT", retried)
    check_books(url, {90: ("chem", 1), 10: ("physics", 2), 11: ("chem", 1), 12: ("physics", 1)})


def test_a_batch_whose_commit_was_in_flight_is_held_once(ha_cluster: HACluster, sockdir: Path) -> None:
    ha_cluster.recover()  # the node the last test crashed is the synchronous standby again
    url = new_ledger(ha_cluster)
    socket_path = sockdir / "daemon.sock"
    first = job(90, "chem")
    batch = [job(20, "physics", 2), job(21, "chem"), job(22, "physics")]
    leader_port = ha_cluster.leader_port()
    standby = next(node for node in ha.NODES if node.pg_port != leader_port)
    crash: dict[str, Any] = {}
    with running(url, sockdir, sinfo_runner()) as daemon:
        assert daemon.slurm_facts.learned.wait(10), "the daemon never read the partitions"
        daemon.batches.writers = 1
        cut = CutBatch(daemon, socket_path)

        def stop_the_standby(s: Session) -> None:
            # Its WAL receiver stopped, the primary's COMMIT of this batch waits for it
            # (synchronous_commit = on); a watcher crashes the primary while it waits.
            crash["receiver"] = wal_receiver_pid(standby.pg_port)
            os.kill(crash["receiver"], signal.SIGSTOP)
            threading.Thread(
                target=crash_in_commit, args=(ha_cluster, leader_port, crash), daemon=True
            ).start()

        cut.cut = stop_the_standby
        answers = cut.run(first, batch)
        assert "at" in crash, crash.get("error", "the batch was never cut")
        assert answers[90]["amount"] == "3.60"
        for request in batch:
            answer = answers[request["job_id"]]
            assert isinstance(answer, DaemonUnreachable), answer
            assert str(answer).endswith("unavailable: the ledger database is unavailable")
        retried = retry_until_held(socket_path, batch, crash["at"])
        ids = [retried["held"][r["job_id"]]["id"] for r in batch]
        # The COMMIT had reached the standby: the retry found those holds, and took no second.
        assert sorted(ids) == sorted(cut.written)
        client = DaemonClient(str(socket_path), 10.0)
        assert client.call("hold", **first)["id"] == answers[90]["id"]
        for job_id in (90, 20, 21, 22):
            assert client.call("settle", **settle(job_id))["charged"] == ("3.60" if job_id == 20 else "1.80")
    report("cut during COMMIT", retried)
    check_books(url, {90: ("chem", 1), 20: ("physics", 2), 21: ("chem", 1), 22: ("physics", 1)})


def wal_receiver_pid(port: int) -> int:
    engine = create_engine(
        f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", isolation_level="AUTOCOMMIT"
    )
    found: list[int] = []
    with engine.connect() as c:

        def streaming() -> bool:
            found[:] = c.execute(
                text("SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'")
            ).scalars()
            return bool(found)

        wait_for(streaming, "the standby has no WAL receiver streaming")
    engine.dispose()
    return found[0]


def crash_in_commit(ha_cluster: HACluster, leader_port: int, crash: dict[str, Any]) -> None:
    """Once a backend of the leader waits for the synchronous standby (its COMMIT written
    and flushed there) and the WAL sender has sent the standby everything flushed (into
    the stopped receiver's socket), crash the leader, then let the receiver go on: the
    standby then has the COMMIT the daemon never heard back about."""
    try:
        engine = create_engine(
            f"postgresql+psycopg://postgres@127.0.0.1:{leader_port}/postgres", isolation_level="AUTOCOMMIT"
        )
        with engine.connect() as c:
            waiting = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
            wait_for(lambda: c.execute(waiting).scalar_one() > 0, "no COMMIT waited for the standby")
            flushed = c.execute(text("SELECT pg_current_wal_flush_lsn()")).scalar_one()
            sent = text("SELECT count(*) FROM pg_stat_replication WHERE sent_lsn >= CAST(:lsn AS pg_lsn)")
            wait_for(lambda: c.execute(sent, {"lsn": flushed}).scalar_one() > 0, "the COMMIT was never sent")
        engine.dispose()
        crash["at"] = time.monotonic()
        crash.update(ha_cluster.crash_leader())
    except BaseException as error:
        crash["error"] = repr(error)
        raise
    finally:
        os.kill(crash["receiver"], signal.SIGCONT)
