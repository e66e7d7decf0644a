"""Group commit in the daemon: requests that arrive together commit as one batch, and each
client still gets its own answer, over the socket, with the hooks' own client.

A gate holds the writer in its current batch while the next requests queue up, one by
one in a known order, so the test knows exactly which requests share the next batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from gpucredit.daemon.server import Daemon
from ledger import api
from slurm_hooks.client import DaemonClient, DaemonRefused, DaemonUnreachable
from tests.support.daemon import running, sinfo_runner
from tests.support.fakedaemon import sockdir as sockdir

START = "2026-12-02T10:00:00Z"


def job(job_id: int, account: str, gpus: dict[str, int], seconds: int = 3600, **extra: Any) -> dict[str, Any]:
    return {
        "cluster": "lab",
        "job_id": job_id,
        "run": 0,
        "account": account,
        "user": "alice",
        "partition": None,
        "gpus": gpus,
        "seconds": seconds,
        "nodes": 1,
        "start": START,
        **extra,
    }


def settle(job_id: int, end: str) -> dict[str, Any]:
    return {"cluster": "lab", "job_id": job_id, "run": 0, "start": START, "end": end}


class Gate:
    """Stops the writer at the start of its next batch until `release`."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.armed = False
        prepare = daemon.batches.prepare
        assert prepare is not None

        def gated(s: Any, batch: Any) -> None:
            if self.armed:
                self.armed = False
                self.entered.set()
                assert self.opened.wait(30), "the test never opened the gate"
            prepare(s, batch)

        daemon.batches.prepare = gated

    def close(self) -> None:
        self.entered.clear()
        self.opened.clear()
        self.armed = True

    def open(self) -> None:
        self.opened.set()


class Calls:
    """Client calls made from threads, each queued before the next one starts."""

    def __init__(self, daemon: Daemon, socket_path: Path) -> None:
        self.daemon = daemon
        self.client = DaemonClient(str(socket_path), 60.0)
        self.threads: list[threading.Thread] = []
        self.answers: list[Any] = []

    def queue(self, op: str, request: dict[str, Any], gate: Gate | None = None) -> None:
        """Send one request from a thread; return once it waits in the queue (or, with
        `gate`, once the writer has taken it and stopped at the gate)."""
        index = len(self.answers)
        self.answers.append(None)
        waiting = self.daemon.batches.waiting()

        def call() -> None:
            try:
                self.answers[index] = self.client.call(op, **request)
            except (DaemonRefused, DaemonUnreachable) as error:
                self.answers[index] = error

        thread = threading.Thread(target=call)
        thread.start()
        self.threads.append(thread)
        if gate is not None:
            wait_for(gate.entered.is_set, f"{op} {request} never reached the writer")
        else:
            wait_for(lambda: self.daemon.batches.waiting() > waiting, f"{op} {request} never queued")

    def join(self) -> list[Any]:
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive()
        return self.answers


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30  # a bound on a slow machine, not a measurement
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


@pytest.fixture
def served(db_url: str, tx, sockdir: Path) -> Iterator[tuple[Daemon, DaemonClient, Gate]]:  # type: ignore[no-untyped-def]
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        for account, amount in (("physics", "20"), ("chem", "10"), ("capped", "50"), ("bio", "10")):
            api.create_account(s, account)
            api.topup(s, account, amount, effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.set_limits(s, "capped", max_gpus=1)
    with running(db_url, sockdir, sinfo_runner()) as daemon:
        daemon.batches.writers = 1  # the gate holds the one writer (they start at the first request)
        yield daemon, DaemonClient(str(sockdir / "daemon.sock"), 60.0), Gate(daemon)


def figures(tx, account: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    with tx() as s:
        shown = api.balance(s, account)
    return shown["available"], shown["held"]


def test_a_lone_request_is_answered_in_a_batch_of_its_own(served) -> None:
    daemon, client, _gate = served
    held = client.call("hold", **job(1, "physics", {"h100": 2}))
    assert (held["amount"], held["state"]) == ("7.20", "active")
    assert (daemon.batches.batches, daemon.batches.requests) == (1, 1)
    assert client.call("settle", **settle(1, "2026-12-02T10:30:00Z"))["charged"] == "3.60"
    assert (daemon.batches.batches, daemon.batches.requests) == (2, 2)


def test_each_request_of_a_batch_gets_its_own_answer(served, tx, sockdir: Path) -> None:
    daemon, client, gate = served
    first = client.call("hold", **job(1, "physics", {"h100": 2}))  # 7.20
    assert client.call("hold", **job(4, "physics", {"h100": 1}))["amount"] == "3.60"
    assert figures(tx, "physics") == ("9.20", "10.80")
    assert client.call("hold", **job(9, "bio", {"h100": 1}))["amount"] == "3.60"

    gate.close()
    calls = Calls(daemon, sockdir / "daemon.sock")
    calls.queue("hold", job(90, "chem", {"h100": 1}), gate)  # the writer takes it and stops
    batches_before = daemon.batches.batches
    calls.queue("hold", job(2, "physics", {"h100": 1}))  # fits
    calls.queue("hold", job(3, "physics", {"h100": 2}, seconds=7200))  # 14.40: refused
    calls.queue("hold", job(1, "physics", {"h100": 2}))  # a repeat: the first answer
    calls.queue("hold", job(1, "physics", {"h100": 2}, seconds=7200))  # same run, other body
    calls.queue("settle", settle(4, "2026-12-02T10:30:00Z"))  # 1.80 of its 3.60
    calls.queue("hold", job(5, "chem", {"h100": 1}))
    calls.queue("hold", job(6, "capped", {"h100": 2}))  # over the account's 1 GPU
    calls.queue("hold", job(7, "capped", {"h100": 1}))
    calls.queue("hold", {k: v for k, v in job(8, "physics", {"h100": 1}).items() if k != "account"})
    calls.queue("hold", job(9, "bio", {"h100": 1}, seconds=7200))  # the run's only request here
    gate.open()
    lone, fits, short, repeat, conflict, settled, other, over, capped, malformed, changed = calls.join()

    assert daemon.batches.batches == batches_before + 1, "the ten requests did not share one batch"
    assert daemon.batches.fast_failures == 0, "the batched path failed: see the log"
    assert lone["amount"] == "3.60"
    assert (fits["amount"], fits["state"]) == ("3.60", "active")
    assert isinstance(short, DaemonRefused) and short.code == "insufficient_credits"
    # The settle in the batch returned 1.80 and job 2 took 3.60 before job 3 asked.
    assert short.message == (
        "account physics: this job needs 14.40 credits (h100:2 for 7200 s) but 7.40 are available"
    )
    assert (repeat["id"], repeat["amount"], repeat["state"]) == (first["id"], "7.20", "active")
    assert isinstance(conflict, DaemonRefused) and conflict.code == "idempotency_conflict"
    assert conflict.message == "job lab/1 run 0 already has a hold for a different request"
    assert (settled["state"], settled["charged"]) == ("settled", "1.80")
    assert other["amount"] == "3.60"
    assert isinstance(over, DaemonRefused) and over.code == "concurrent_gpus"
    assert (over.details["value"], over.details["cap"]) == (2, 1)
    assert (capped["amount"], capped["state"]) == ("3.60", "active")
    assert isinstance(malformed, DaemonRefused) and malformed.code == "bad_request"
    assert isinstance(changed, DaemonRefused) and changed.code == "idempotency_conflict"
    assert changed.message == "job lab/9 run 0 already has a hold for a different request"

    assert figures(tx, "physics") == ("7.40", "10.80")  # 20 - 7.20 - 3.60 held - 1.80 charged
    assert figures(tx, "chem") == ("2.80", "7.20")
    assert figures(tx, "capped") == ("46.40", "3.60")
    assert figures(tx, "bio") == ("6.40", "3.60")
    with tx() as s:
        assert api.verify(s).ok
        assert {h.job_id for h in api.list_holds(s)} == {1, 2, 4, 5, 7, 9, 90}
    # The refused and conflicting requests left nothing behind: a retry is judged afresh.
    assert client.call("settle", **settle(2, "2026-12-02T11:00:00Z"))["charged"] == "3.60"
    assert client.call("hold", **job(3, "physics", {"h100": 1}))["amount"] == "3.60"


def test_a_database_failure_under_a_batch_commits_none_of_it(pg_url: str, tx_pg, sockdir: Path) -> None:  # type: ignore[no-untyped-def]
    """The batch's connection is killed after its holds were written, before COMMIT:
    nothing of the batch stays, every client gets the retryable `unavailable` (the
    hooks' DaemonUnreachable), and the retries then succeed."""
    with tx_pg() as s:
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        for account in ("physics", "chem"):
            api.create_account(s, account)
            api.topup(s, account, "20", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
    with running(pg_url, sockdir, sinfo_runner()) as daemon:
        daemon.batches.writers = 1
        gate = Gate(daemon)
        fast = daemon.batches.fast
        assert fast is not None
        killed: list[int] = []

        def fast_then_killed(s: Any, batch: Any, locked: Any) -> Any:
            answers = fast(s, batch, locked)
            if len(batch) > 1 and not killed:
                pid = s.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
                with daemon.engine.connect() as other:
                    other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
                killed.append(pid)
            return answers

        daemon.batches.fast = fast_then_killed
        gate.close()
        calls = Calls(daemon, sockdir / "daemon.sock")
        calls.queue("hold", job(90, "chem", {"h100": 1}), gate)
        requests = [
            job(10, "physics", {"h100": 2}),
            job(11, "chem", {"h100": 1}),
            job(12, "physics", {"h100": 1}),
        ]
        for request in requests:
            calls.queue("hold", request)
        gate.open()
        answers = calls.join()
        assert killed, "the batch's connection was never killed"
        assert answers[0]["amount"] == "3.60"
        for answer in answers[1:]:
            assert isinstance(answer, DaemonUnreachable)
            assert str(answer).endswith("unavailable: the ledger database is unavailable")
        with tx_pg() as s:
            assert [h.job_id for h in api.list_holds(s)] == [90]
            assert api.balance(s, "physics")["available"] == "20.00"
            assert api.verify(s).ok
        client = DaemonClient(str(sockdir / "daemon.sock"), 60.0)
        assert [client.call("hold", **request)["amount"] for request in requests] == ["7.20", "3.60", "3.60"]
    with tx_pg() as s:
        assert api.balance(s, "physics")["available"] == "9.20"
        assert api.balance(s, "chem")["available"] == "12.80"


def test_a_connection_that_died_while_idle_costs_no_request(pg_url: str, tx_pg, sockdir: Path) -> None:  # type: ignore[no-untyped-def]
    """The writer skips the pool's ping on a connection used within the last second, so
    one killed in that second (a database restart) is found dead by the next batch's
    first statement: that batch goes again on a fresh connection instead of answering
    `unavailable` to every client in it."""
    with tx_pg() as s:
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.topup(s, "physics", "20", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
    with running(pg_url, sockdir, sinfo_runner()):
        client = DaemonClient(str(sockdir / "daemon.sock"), 60.0)
        assert client.call("hold", **job(10, "physics", {"h100": 1}))["amount"] == "3.60"
        killer = create_engine(pg_url)
        with killer.connect() as other:  # every connection of the daemon's pool dies
            killed = other.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        killer.dispose()
        assert killed >= 1
        assert client.call("hold", **job(11, "physics", {"h100": 2}))["amount"] == "7.20"
    with tx_pg() as s:
        assert api.balance(s, "physics")["available"] == "9.20"
        assert api.verify(s).ok


def test_a_batch_whose_batched_path_fails_is_redone_one_request_at_a_time(served, tx, sockdir: Path) -> None:
    """The batched path writes, then fails: none of what it wrote stays, and every
    request is applied once, on its own, with its own answer."""
    daemon, client, gate = served
    assert client.call("hold", **job(4, "physics", {"h100": 1}))["amount"] == "3.60"
    fast = daemon.batches.fast
    assert fast is not None

    def fast_then_broken(s: Any, batch: Any, locked: Any) -> Any:
        answers = fast(s, batch, locked)
        if len(batch) > 1:
            raise RuntimeError("a bug in the batched path")
        return answers

    daemon.batches.fast = fast_then_broken
    gate.close()
    calls = Calls(daemon, sockdir / "daemon.sock")
    calls.queue("hold", job(90, "chem", {"h100": 1}), gate)
    calls.queue("hold", job(2, "physics", {"h100": 1}))
    calls.queue("settle", settle(4, "2026-12-02T10:30:00Z"))
    calls.queue("hold", job(3, "physics", {"h100": 4}, seconds=7200))  # 28.80: refused
    gate.open()
    lone, fits, settled, short = calls.join()  # applied in the order they came
    assert (lone["amount"], fits["amount"], settled["charged"]) == ("3.60", "3.60", "1.80")
    assert isinstance(short, DaemonRefused) and short.code == "insufficient_credits"
    assert short.message == (
        "account physics: this job needs 28.80 credits (h100:4 for 7200 s) but 14.60 are available"
    )
    assert figures(tx, "physics") == ("14.60", "3.60")  # 20 - 3.60 held - 1.80 charged
    with tx() as s:
        assert sorted(h.job_id for h in api.list_holds(s)) == [2, 4, 90]
        assert api.verify(s).ok


def test_in_lease_mode_the_hooks_holds_cover_the_window(served, tx) -> None:
    """holds.mode = "lease": the batched path and the one-at-a-time path (an account with
    limits) both hold the window's cost, not the time limit's; a job shorter than the
    window is held in full."""
    daemon, client, _gate = served
    daemon.lease_seconds = 900  # as [holds] mode = "lease", lease_seconds = 900 sets it
    assert client.call("hold", **job(1, "physics", {"h100": 1}, seconds=7200))["amount"] == "0.90"
    assert client.call("hold", **job(2, "capped", {"h100": 1}, seconds=7200))["amount"] == "0.90"
    assert client.call("hold", **job(3, "physics", {"h100": 1}, seconds=600))["amount"] == "0.60"
    assert figures(tx, "physics") == ("18.50", "1.50")


def test_with_two_writers_one_accounts_requests_all_go_to_one_writer() -> None:
    """So two writers' batches never lock the same account (nor wait on each other)."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import sessionmaker

    from gpucredit.daemon.group_commit import GroupCommitter

    writers_of: dict[str, set[str]] = {}
    answered = threading.Semaphore(0)

    def work(s: Any, request: dict[str, Any]) -> dict[str, Any]:
        writers_of.setdefault(request["account"], set()).add(threading.current_thread().name)
        return {}

    committer = GroupCommitter(
        sessionmaker(create_engine("sqlite://")),
        {"hold": work},
        writers=2,
        route=lambda op, request: request.get("account"),
    )
    for i in range(100):
        committer.submit_async("hold", {"account": f"acct{i % 10}"}, lambda result, error: answered.release())
    for _ in range(100):
        assert answered.acquire(timeout=10)
    committer.stop()
    assert all(len(names) == 1 for names in writers_of.values()), writers_of
    assert len(set().union(*writers_of.values())) == 2, "every account went to the same writer"


def test_the_writer_takes_its_next_batch_once_the_last_ones_replies_are_worded() -> None:
    """It shares one interpreter with the socket thread that words them; meanwhile the
    requests that arrive join one batch. Should the wording never come, the writer goes
    on after `reply_wait`."""
    from sqlalchemy.orm import sessionmaker

    from gpucredit.daemon.group_commit import GroupCommitter

    handed: list[Callable[[], None]] = []
    answers: list[Any] = []
    committer = GroupCommitter(
        sessionmaker(create_engine("sqlite://")), {"hold": lambda s, request: request["n"]}, reply_wait=60
    )
    committer.deliver = handed.append  # a socket thread that has not run them yet
    committer.submit_async("hold", {"n": 1}, lambda result, error: answers.append(result))
    wait_for(lambda: len(handed) == 1, "the first batch was never handed over")
    committer.submit_async("hold", {"n": 2}, lambda result, error: answers.append(result))
    time.sleep(0.2)  # a writer that did not wait would have taken it by now (it can only pass late)
    assert committer.batches == 1, "the writer took a batch before the replies were worded"
    committer.submit_async("hold", {"n": 3}, lambda result, error: answers.append(result))
    handed[0]()  # the first batch's reply is worded: the writer goes on
    wait_for(lambda: len(handed) == 2, "the writer never went on")
    handed[1]()
    assert answers == [1, 2, 3]
    assert (committer.batches, committer.requests) == (2, 3)
    committer.stop()

    bounded = GroupCommitter(
        sessionmaker(create_engine("sqlite://")), {"hold": lambda s, request: request["n"]}, reply_wait=0.01
    )
    bounded.deliver = lambda answer_all: None  # replies never worded
    bounded.submit_async("hold", {"n": 1}, lambda result, error: None)
    waited: list[Any] = []  # a waiting thread, answered by the writer itself
    threading.Thread(target=lambda: waited.append(bounded.submit("hold", {"n": 2})), daemon=True).start()
    wait_for(lambda: waited == [2], "the writer waited for the wording past reply_wait")
    bounded.stop()
