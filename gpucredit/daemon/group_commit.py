"""Group commit: the daemon's holds and settles, applied in batches by one writer thread.

A commit costs a round trip and a WAL flush whatever it holds, so one transaction per
hook request caps the daemon at what the database commits per second. Requests queue
here; the writer takes everything waiting (at most `batch_max`) as one batch, locks
the batch's accounts in id order (so two lockers never wait on each other in a cycle),
and hands the batch to `fast`, which reads and writes all it can in a few multi-row
statements, refusing what must be refused before anything is written (so a refusal
costs its neighbours nothing). What `fast` leaves (repeats, limits, odd requests) runs
one request at a time, each in its own SAVEPOINT: a refusal or error of one rolls back
that request alone and is answered to it alone. Should `fast` itself fail, its whole
transaction is rolled back and the batch redone one request at a time. A lone request
never waits for company: the writer flushes as soon as the queue is empty (classic
group commit; batches grow only while the previous one is being written).

The writer and the socket thread share one interpreter. Once a batch is written its
replies are worded and sent on the socket thread (`deliver`), and the writer starts its
next batch only when they have been worded, or after `reply_wait` at most: started at
once, the next batch's lock and reads waited for the interpreter at each of their round
trips while ~30 replies were being worded, and it set off without the requests those
clients were about to send (measured: docs/admin-guide.md §8).

When the database fails under the batch (a restart, a killed connection, a failed
COMMIT) nothing of it commits and every request in it is answered `BatchFailed`,
which the daemon turns into the retryable `unavailable` the hooks already handle.
Every request is idempotent, so a retry after an ambiguous COMMIT is safe.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import DBAPIError, DisconnectionError, SQLAlchemyError
from sqlalchemy.orm import Session

from ledger.errors import LedgerError

log = logging.getLogger("gpucredit.daemon")

Work = Callable[[Session, dict[str, Any]], Any]
# Locks what a batch will touch, before its first request runs; what it returns (say,
# the rows it locked) is handed to `fast`.
Prepare = Callable[[Session, Sequence["Pending"]], Any]
# Answers what it can of a batch in a few statements: per request (result, None),
# (None, its own error), or None to leave it to `work`, which runs after it.
Fast = Callable[[Session, Sequence["Pending"], Any], Sequence["tuple[Any, BaseException | None] | None"]]

# Which account a request concerns, or None where it cannot tell (then the first writer).
Route = Callable[[str, dict[str, Any]], "str | None"]

DEFAULT_BATCH_MAX = 64
# At most this long the writer waits for the last batch's replies to be worded (above).
REPLY_WAIT_SECONDS = 0.005


def ping_when_idle(engine: Engine, idle_seconds: float = 1.0) -> None:
    """Ping a pooled connection on checkout only when it sat idle over `idle_seconds`
    (for an engine made with pool_pre_ping off). A busy writer checks its connection out
    for every batch, and an unconditional pre-ping costs each batch a round trip; a
    connection used a moment ago is as good as a ping. Should the database go away in
    that moment, the batch fails as any batch under an outage does (retryable) and the
    dead connection is discarded."""

    @event.listens_for(engine, "checkin")
    def _checked_in(dbapi_connection: Any, record: Any) -> None:
        record.info["gpucredit_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.pop("gpucredit_idle_since", None)
        if since is not None and time.monotonic() - since <= idle_seconds:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as error:
            raise DisconnectionError(f"ping failed: {error}") from error


class BatchFailed(Exception):
    """The database failed under the batch: nothing of it was committed; retry."""


class _StaleConnection(Exception):
    """The batch's first statement found its pooled connection dead: nothing was sent."""


class _FastPathFailed(Exception):
    """The batched path raised: its transaction is rolled back and the batch redone."""


class Pending:
    """One queued request, filled in by the writer: then `callback(result, error)` runs
    (through the committer's `deliver`, else in the writer's thread), or, without a
    callback, `done` is set for the waiting thread."""

    __slots__ = ("callback", "done", "error", "op", "request", "result")

    def __init__(
        self,
        op: str,
        request: dict[str, Any],
        callback: Callable[[Any, BaseException | None], None] | None = None,
    ) -> None:
        self.op = op
        self.request = request
        self.result: Any = None
        self.error: BaseException | None = None
        self.callback = callback
        self.done = threading.Event() if callback is None else None

    def finish(self) -> None:
        if self.callback is None:
            assert self.done is not None
            self.done.set()
            return
        try:
            self.callback(self.result, self.error)
        except Exception:  # the writer goes on to the next request whatever one reply does
            log.exception("answering a %s request failed", self.op)


class GroupCommitter:
    """Queue `submit(op, request)` calls and apply them in batches, one transaction each."""

    def __init__(
        self,
        sessions: Callable[[], Session],
        work: dict[str, Work],
        *,
        batch_max: int = DEFAULT_BATCH_MAX,
        writers: int = 1,
        prepare: Prepare | None = None,
        fast: Fast | None = None,
        route: Route | None = None,
        reply_wait: float = REPLY_WAIT_SECONDS,
    ) -> None:
        if not isinstance(batch_max, int) or isinstance(batch_max, bool) or batch_max < 1:
            raise ValueError(f"daemon.batch_max must be a whole number >= 1, not {batch_max!r}")
        if not isinstance(writers, int) or isinstance(writers, bool) or not 1 <= writers <= 64:
            raise ValueError(f"daemon.writers must be a whole number 1..64, not {writers!r}")
        self.writers = writers
        self.sessions = sessions
        self.work = work
        self.batch_max = batch_max
        self.prepare = prepare
        self.fast = fast
        self.route = route
        self.reply_wait = reply_wait
        # One queue per writer: `route` sends one account's requests to one writer, so two
        # writers' batches lock different accounts and never wait on each other.
        self._queues: list[queue.SimpleQueue[Pending | None]] = [queue.SimpleQueue() for _ in range(writers)]
        self._writer_threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        # Sizes of the batches written, for metrics and the tests: (batches, requests),
        # and the writers' CPU and wall seconds on them (where a request's time goes).
        self.batches = 0
        self.requests = 0
        self.cpu_seconds = 0.0
        self.wall_seconds = 0.0
        self.fast_failures = 0  # batches whose batched path failed and went one by one
        # Runs the callbacks of a written batch (`submit_async`'s), given them all; None: the
        # writer runs them itself. The daemon hands them to its socket thread, so the writer
        # starts the next batch at once while the replies are worded and sent.
        self.deliver: Callable[[Callable[[], None]], None] | None = None

    def submit(self, op: str, request: dict[str, Any]) -> Any:
        """Apply one request in the next batch; return its result or raise its own error."""
        pending = Pending(op, request)
        self._enqueue(pending)
        assert pending.done is not None
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.result

    def submit_async(
        self, op: str, request: dict[str, Any], callback: Callable[[Any, BaseException | None], None]
    ) -> None:
        """Apply one request in the next batch; `callback(result, error)` gets its outcome,
        through `deliver` (the daemon's socket thread), else in the writer's thread (so it
        must be quick)."""
        self._enqueue(Pending(op, request, callback))

    def _enqueue(self, pending: Pending) -> None:
        if pending.op not in self.work:
            raise KeyError(pending.op)
        self._ensure_writer()
        key = None if self.route is None or self.writers == 1 else self.route(pending.op, pending.request)
        writer = 0 if key is None else zlib.crc32(key.encode()) % self.writers
        self._queues[writer].put(pending)

    def waiting(self) -> int:
        """Requests queued for the writers and not yet taken into a batch."""
        return sum(requests.qsize() for requests in self._queues)

    def stop(self) -> None:
        """Let the writers finish what is queued, then end them."""
        with self._start_lock:
            writers, self._writer_threads = self._writer_threads, []
        for n in range(len(writers)):
            self._queues[n].put(None)
        for writer in writers:
            writer.join(30)

    def _ensure_writer(self) -> None:
        if self._writer_threads:
            return
        with self._start_lock:
            if not self._writer_threads:
                for n in range(self.writers):
                    writer = threading.Thread(
                        target=self._write_forever,
                        args=(self._queues[n],),
                        name=f"group-commit-{n}",
                        daemon=True,
                    )
                    writer.start()
                    self._writer_threads.append(writer)

    def _write_forever(self, requests: queue.SimpleQueue[Pending | None]) -> None:
        worded = threading.Event()  # this writer's last batch's replies are worded
        worded.set()
        while True:
            first = requests.get()
            if first is None:
                return
            worded.wait(self.reply_wait)
            batch = [first]
            stopping = False
            while len(batch) < self.batch_max:
                try:
                    item = requests.get_nowait()
                except queue.Empty:
                    break  # flush now: nobody else is waiting
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            try:
                self.apply(batch)
            except Exception as error:  # never leave the queue without its writer
                log.exception("the writer failed on a batch of %d", len(batch))
                for pending in batch:
                    pending.result, pending.error = None, BatchFailed(repr(error))
            finally:
                self._finish(batch, worded)
            if stopping:
                return

    def _finish(self, batch: Sequence[Pending], worded: threading.Event) -> None:
        """Answer `batch`: waiting threads at once; callbacks through `deliver`, in one call
        that sets `worded` once it has run them all."""
        deliver = self.deliver
        handed: list[Pending] = []
        for pending in batch:
            if deliver is not None and pending.callback is not None:
                handed.append(pending)
            else:
                pending.finish()  # a waiting thread is woken by the writer, never handed over
        if deliver is not None and handed:
            worded.clear()

            def answer_all() -> None:
                try:
                    for pending in handed:
                        pending.finish()
                finally:
                    worded.set()

            deliver(answer_all)

    def apply(self, batch: Sequence[Pending]) -> None:
        """One transaction for `batch`; each request answered in its own Pending."""
        with self._start_lock:  # counted as it starts: the tests read it while one is held
            self.batches += 1
            self.requests += len(batch)
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            self._apply(batch)
        finally:
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            with self._start_lock:
                self.cpu_seconds += cpu
                self.wall_seconds += wall

    def _apply(self, batch: Sequence[Pending]) -> None:
        try:
            try:
                try:
                    self._write(batch, fast=self.fast is not None)
                except _StaleConnection as stale:
                    # What the skipped pre-ping would have caught (ping_when_idle): the
                    # database restarted since this connection was last used. The pool
                    # has dropped it; the batch goes once more on a fresh one.
                    log.warning("a pooled connection had died (%s); the batch goes again", stale.__cause__)
                    self._write(batch, fast=self.fast is not None)
            except _FastPathFailed:
                # Nothing of that transaction stayed; the requests go one by one in a new one.
                self.fast_failures += 1
                log.exception("the batched path failed; applying %d requests one at a time", len(batch))
                for pending in batch:
                    pending.result, pending.error = None, None
                self._write(batch, fast=False)
        except (SQLAlchemyError, _StaleConnection) as failure:
            error = failure.__cause__ if isinstance(failure, _StaleConnection) else failure
            log.error(
                "ledger database failed under a batch of %d; none of it committed: %s",
                len(batch),
                error.orig if isinstance(error, DBAPIError) and error.orig else error,
            )
            for pending in batch:
                pending.result = None
                pending.error = BatchFailed(str(error))

    def _write(self, batch: Sequence[Pending], *, fast: bool) -> None:
        with self.sessions() as s, s.begin():
            try:
                prepared = None if self.prepare is None else self.prepare(s, batch)
            except Exception as error:
                if _connection_lost(s, error):
                    raise _StaleConnection() from error
                raise
            left = list(batch)
            if fast:
                assert self.fast is not None
                try:  # no savepoint of its own: should it fail, the whole transaction goes
                    answers = list(self.fast(s, batch, prepared))
                    left = [pending for pending, answer in zip(batch, answers, strict=True) if answer is None]
                    for pending, answer in zip(batch, answers, strict=True):
                        if answer is not None:
                            pending.result, pending.error = answer
                except Exception as error:
                    raise _FastPathFailed() from error
            for pending in left:
                self._apply_one(s, pending)

    def _apply_one(self, s: Session, pending: Pending) -> None:
        try:
            with s.begin_nested():  # SAVEPOINT: a failure here undoes this request only
                pending.result = self.work[pending.op](s, pending.request)
        except Exception as error:  # answered to its own client; the batch goes on
            if isinstance(error, SQLAlchemyError) and not _still_usable(s):
                raise  # the connection is gone: the whole batch fails
            if not isinstance(error, (LedgerError, SQLAlchemyError, LookupError, TypeError, ValueError)):
                log.exception("%s request failed: %r", pending.op, pending.request)
            pending.error = error


def _connection_lost(s: Session, error: Exception) -> bool:
    """Whether `error` means the session's connection is dead; if so it is invalidated, so
    the pool never hands it out again. The pipelined reads (ledger.store.bulk.select_many) talk
    to psycopg directly, so their errors are the driver's, not SQLAlchemy's."""
    if isinstance(error, DBAPIError):
        return bool(error.connection_invalidated)
    try:
        connection = s.connection()
        driver = connection.connection.driver_connection
    except SQLAlchemyError:
        return False
    if not getattr(driver, "broken", False) and not getattr(driver, "closed", False):
        return False
    connection.invalidate(error)
    # One dead connection means the database went away (a restart): the others pooled with
    # it are dead too, and a checkout pings only idle ones. Drop them all, as SQLAlchemy
    # does itself on a disconnect it sees (this one came from the driver directly).
    connection.engine.pool.dispose()
    return True


def _still_usable(s: Session) -> bool:
    """Whether the batch's transaction survived a request's database error (its
    savepoint rolled back); a dropped connection or an aborted transaction did not."""
    try:
        s.connection().exec_driver_sql("SELECT 1")
    except SQLAlchemyError:
        return False
    return True
