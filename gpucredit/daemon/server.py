"""`gpucredit daemon`: the resident controller-side service behind job_submit.lua and the hooks.

Hooks must start fast, and importing SQLAlchemy and psycopg alone costs 0.5-1 s, so
hook processes are stdlib clients and this process owns the database. Wire format:
one JSON object per line each way; a reply is {"ok": true, "result": ...} or
{"ok": false, "error": {"code", "message", "details"}}. Code `unavailable` means the
ledger itself is down, and the hooks then follow policy.on_ledger_unreachable.
Every request is idempotent (holds by run, settles exactly once), so a client may
retry after a timeout.

No request runs a Slurm command: job_submit.lua gives the daemon 1 s inside slurmctld.
What a request needs from Slurm (partitions and their GPU types) a background thread
learns at start and every `daemon.slurm_refresh_seconds` (gpucredit.daemon.slurm_facts);
only background loops run other commands: the release loop (squeue, scontrol) and, with
`limits_sync.in_daemon`, the limits keeper (sacctmgr; gpucredit/daemon/limits_keeper.py).

One thread serves the socket (gpucredit.daemon.socket_loop): it answers quotes (`submit`)
itself from the snapshot, never waiting on a batch, and hands holds and settles to the
group commit (gpucredit.daemon.group_commit), which applies them in batches, one
transaction each, and answers each request on its own.

SIGTERM or SIGINT (systemd's stop) ends `serve` cleanly: the socket is removed.
Every thread `serve` starts is listed in gpucredit/daemon/__init__.py.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from accounting_bridge.slurm.records import parse_squeue_json
from accounting_bridge.slurm.slurmcmd import SlurmCommandError, SubprocessRunner
from gpucredit.daemon import hook_service as service
from gpucredit.daemon import metrics as daemon_metrics
from gpucredit.daemon.burst_keeper import BurstKeeper
from gpucredit.daemon.group_commit import BatchFailed, GroupCommitter, Pending, ping_when_idle
from gpucredit.daemon.limits_keeper import LimitsKeeper
from gpucredit.daemon.outage_keeper import OutageKeeper
from gpucredit.daemon.quote_memo import QuoteMemo
from gpucredit.daemon.retry_keeper import RetryKeeper
from gpucredit.daemon.slurm_facts import SlurmFacts
from gpucredit.daemon.socket_loop import Reply, SocketLoop
from job_submit import answer
from job_submit.request import InvalidRequest, JobRequest
from ledger.api import (
    LockedBatch,
    RoutingConfig,
    Snapshot,
    SnapshotKeeper,
    cloud_budget_breach,
    lock_batch,
    parse_share,
)
from ledger.errors import InsufficientCredits, LedgerError, LimitExceeded
from ledger.store.db import make_engine, make_sessionmaker
from ledger.timeutil import utcnow
from slurmtext import UNTYPED_GPU

log = logging.getLogger("gpucredit.daemon")
MAX_REQUEST_BYTES = 64 * 1024
LISTEN_BACKLOG = 128
FULL_SCAN_SECONDS = 60.0
RETRY_PASS_SECONDS = 5.0  # how late a failed job is requeued at most (then its backoff)


def top_up_hint(config: dict[str, Any]) -> str:
    """The end of a refusal for credit: `daemon.top_up_hint`, else the portal once
    `portal.url` is set, else the command an admin runs. "{account}" names the account."""
    configured = config.get("daemon", {}).get("top_up_hint")
    if configured:
        return str(configured)
    portal_url = config.get("portal", {}).get("url")
    if portal_url:
        return f"Top up at {portal_url} or ask your PI."
    return "Ask your PI or an admin to add credit (gpucredit topup {account} AMOUNT)."


class Daemon:
    def __init__(
        self,
        config: dict[str, Any],
        runner: Callable[..., str] | None = None,
        *,
        limits_clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.config = config
        if config["database"]["url"].startswith("sqlite"):
            self.engine = make_engine(config["database"]["url"])
        else:
            # Pinged only after a second idle: not a round trip per batch (group_commit).
            self.engine = make_engine(
                config["database"]["url"], pool_size=8, max_overflow=8, pool_pre_ping=False
            )
            ping_when_idle(self.engine)
        self.sessions = make_sessionmaker(self.engine)
        self.run = runner or SubprocessRunner(config["slurm"]["bin_dir"], timeout_seconds=10.0)
        self.grace_seconds = int(config["holds"]["grace_seconds"])
        # Lease mode: a hold covers this window of the time limit and the meter renews it.
        self.lease_seconds = (
            int(config["holds"]["lease_seconds"]) if config["holds"]["mode"] == "lease" else None
        )
        self.top_up_hint = top_up_hint(config)
        self.slurm_facts = SlurmFacts(self.run, float(config["daemon"]["slurm_refresh_seconds"]))
        # Routing and the credit warning (docs/routing.md); bad values stop the daemon at start.
        self.routing = RoutingConfig.from_config(config)
        warn_at = config["policy"].get("warn_at_used_share")
        self.warn_at_used_share = None if warn_at in (None, False) else parse_share(warn_at)
        self._lock = threading.Lock()
        # With cloud budgets the picture carries their accounts' cloud spend this month.
        self.snapshots = SnapshotKeeper(self.sessions, budget_scope=self.routing.budget_scope())
        self.quotes = QuoteMemo(self._work_out, lambda: self.slurm_facts.table, _encode)
        # Slurm's own GPU limits and blocks follow the ledger within seconds (docs/limits-sync.md).
        self.limits = (
            LimitsKeeper(self.sessions, self.run, config, clock=limits_clock)
            if config["limits_sync"]["in_daemon"]
            else None
        )
        # Cloud partitions held back at submit are added once a job has waited (burst_keeper.py).
        cloud = self.routing.cloud_partitions()
        self.burst = (
            BurstKeeper(self.run, self.routing.burst_after_seconds, cloud, budget=self._cloud_budget_breach)
            if self.routing.burst_after_seconds and cloud
            else None
        )
        # Jobs submitted with a retry policy are requeued on the failures it names (retry_keeper.py).
        self.retries = RetryKeeper(self.run, self.sessions, str(config["slurm"]["cluster"]))
        # Jobs held for credit or a limit: job id -> the hold requests of its parts (None
        # until squeue has been read), so a release round can tell, without Slurm, whether
        # anything may be released now (see release_loop).
        self.credit_held: dict[int, list[dict[str, Any]] | None] = {}
        self.batches = GroupCommitter(
            self.sessions,
            {
                "hold": lambda s, request: service.hold(
                    s, request, grace_seconds=self.grace_seconds, lease_seconds=self.lease_seconds
                ),
                "settle": service.settle,
                "hold_together": lambda s, request: service.hold_together(
                    s, request, grace_seconds=self.grace_seconds, lease_seconds=self.lease_seconds
                ),
            },
            batch_max=config["daemon"]["batch_max"],
            # SQLite has one writer whatever we do; PostgreSQL overlaps batches' round trips.
            writers=1 if self.engine.dialect.name == "sqlite" else config["daemon"]["writers"],
            prepare=_lock_batch_accounts,
            route=_account_of,
            fast=lambda s, batch, locked: service.apply_batch(
                s,
                [(p.op, p.request) for p in batch],
                grace_seconds=self.grace_seconds,
                lease_seconds=self.lease_seconds,
                locked=locked,
            ),
        )
        self.handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
            "ping": lambda request: {"pong": True},
            "submit": self._submit,
            "hold": lambda request: service.reply_result(self.batches.submit("hold", request)),
            "settle": lambda request: service.reply_result(self.batches.submit("settle", request)),
            "hold_together": lambda request: self.batches.submit("hold_together", request),
            # Node hooks of an older install announced GPU registrations; today's send
            # nothing (the agent reads the registry files), so these are only acknowledged.
            "job_started": lambda request: {},
            "job_ended": lambda request: {},
        }
        self.metrics = daemon_metrics.for_daemon(config, self.handlers)

    def _note_refused_hold(self, request: dict[str, Any], error: BaseException) -> None:
        if isinstance(error, (InsufficientCredits, LimitExceeded, BatchFailed, OperationalError, DBAPIError)):
            # The prolog will hold this job (for credit, a limit, or "ledger unreachable");
            # try its holds every release round, so it runs as soon as they would be
            # taken and the ledger answers, not at the next full scan.
            parts = request.get("parts") if request.get("op") == "hold_together" else [request]
            if not isinstance(parts, list):
                return
            for part in parts:
                job_id = part.get("job_id") if isinstance(part, dict) else None
                if isinstance(job_id, int) and not isinstance(job_id, bool):
                    with self._lock:
                        self.credit_held[job_id] = [p for p in parts if isinstance(p, dict)]

    def _submit(
        self,
        request: Mapping[str, Any],
        parsed: JobRequest | InvalidRequest | None = None,
        snapshot: Snapshot | None = None,
    ) -> Any:
        now = utcnow()
        if self.snapshots.stale(now):
            return _unavailable()
        decision = self._decide(snapshot or self.snapshots.current(), request, parsed, now)
        if decision["decision"] == "reject" and self.snapshots.refresh_if_changed():
            # Never refuse from a stale picture: a top-up or a new account made a moment
            # ago must count. Refusals are the rare path; one cheap query tells whether
            # anything changed at all.
            decision = self._decide(self.snapshots.current(), request, parsed, now)
        return decision

    def _decide(
        self,
        snapshot: Snapshot,
        request: Mapping[str, Any],
        parsed: JobRequest | InvalidRequest | None,
        now: datetime,
    ) -> dict[str, str]:
        return answer.submit(
            snapshot,
            request,
            parsed=parsed,
            now=now,
            top_up_hint=self.top_up_hint,
            partition_types=self.partition_types,
            routing=self.routing,
            warn_at_used_share=self.warn_at_used_share,
        )

    def _refill_quotes(self, snapshot: Snapshot) -> None:
        try:
            self.quotes.refill(snapshot)
        except Exception:  # the snapshot thread must go on: without it every quote goes stale
            log.exception("working the kept quotes out again failed")

    def _cloud_budget_breach(
        self, account: str, cost_ucredits: int, sent_ucredits: int
    ) -> LimitExceeded | None:
        """The burst pass's budget check: the month's cloud spend as of the picture (at
        most a refresh old), what the account's jobs sent before may still spend, and
        this job's cost there (burst_keeper.py)."""
        budget = self.routing.cloud_budget_of(account)
        if budget is None:
            return None
        spend = self.snapshots.current().cloud_spend(account)
        return cloud_budget_breach(spend, budget, cost_ucredits, sent_ucredits=sent_ucredits)

    def _work_out(self, line: bytes, snapshot: Snapshot) -> dict[str, Any] | None:
        """A kept line's reply from a new picture, for the quote memo (no refresh, no metrics)."""
        submit = _parsed_submit(line)
        if submit is None:
            return None
        fields, parsed = submit
        try:
            return {"ok": True, "result": self._decide(snapshot, fields, parsed, utcnow())}
        except Exception:  # the line's next submission takes the general path, and its refusal
            log.exception("working a kept quote out again failed")
            return None

    def partition_types(self, partition: str | None) -> list[str] | None:
        """GPU types `partition` offers, as last read from Slurm in the background;
        None until the first read has succeeded. Never runs a command."""
        return self.slurm_facts.gpu_types(partition)

    def handle(self, request: Any) -> dict[str, Any]:
        """Answer one request, waiting for its batch if it is a hold or a settle."""
        started = time.perf_counter()
        reply = self._answer(request)
        self._observe(request, started, reply)
        return reply

    def dispatch(self, line: bytes, reply: Reply) -> None:
        """Answer one request line from the socket loop's thread: holds and settles go to
        the group commit and are answered, back on this thread, when their batch is
        written; everything else (quotes above all) is answered here and now."""
        started = time.perf_counter()
        if len(line) <= _MEMO_LINE_BYTES and line.startswith(_SUBMIT_LINE):
            snapshot = self.snapshots.current()
            kept = self.quotes.get(line, snapshot)
            if kept is not None:
                reply.send(kept.encoded)
                self._observe(_SUBMIT, started, kept.reply)
                return
            submit = _parsed_submit(line)
            if submit is not None:
                facts = self.slurm_facts.table
                quote = self._quote(*submit, started, snapshot)
                encoded = _encode(quote)
                reply.send(encoded)
                if self.snapshots.current() is snapshot:  # else refused first, and refreshed
                    self.quotes.keep(line, snapshot, facts, quote, encoded)
                return
        try:
            request = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
            reply.send(_encode(_error("bad_request", "request is not JSON")))
            return
        op = request.get("op") if isinstance(request, dict) else None
        if not isinstance(op, str) or op not in self.batches.work:
            reply.send(_encode(self.handle(request)))
            return

        def answered(result: Any, error: BaseException | None) -> None:
            try:
                answer = (
                    self._refusal(op, error)
                    if error is not None
                    else {"ok": True, "result": service.reply_result(result)}
                )
                if op in ("hold", "hold_together") and error is not None:
                    self._note_refused_hold(request, error)
                self._observe(request, started, answer)
                line = _encode(answer)
            except Exception:  # the client must get an answer whatever fails here
                log.exception("answering a %s request failed", op)
                line = _encode(_error("unavailable", "the daemon failed on this request; see its log"))
            reply.send(line)

        self.batches.submit_async(op, request, answered)

    def _quote(
        self,
        request: Mapping[str, Any],
        parsed: JobRequest | InvalidRequest,
        started: float,
        snapshot: Snapshot,
    ) -> Any:
        """`handle` of a submit line already decoded and parsed, from `snapshot` (or, to
        refuse, a fresher one)."""
        try:
            reply = {"ok": True, "result": self._submit(request, parsed, snapshot)}
        except Exception as error:
            reply = self._refusal("submit", error)
        self._observe(request, started, reply)
        return reply

    def _observe(self, request: Any, started: float, reply: dict[str, Any]) -> None:
        if self.metrics is not None:
            operation = request.get("op") if isinstance(request, Mapping) else None
            self.metrics.observe(operation, time.perf_counter() - started, reply)

    def _answer(self, request: Any) -> dict[str, Any]:
        if not isinstance(request, dict) or not isinstance(request.get("op"), str):
            return _error("bad_request", "a request is a JSON object with an 'op'")
        handler = self.handlers.get(request["op"])
        if handler is None:
            return _error("unknown_op", f"unknown op {request['op']!r}")
        try:
            return {"ok": True, "result": handler(request)}
        except Exception as error:
            if request["op"] in ("hold", "hold_together"):
                self._note_refused_hold(request, error)
            return self._refusal(request["op"], error)

    def _refusal(self, op: str, error: BaseException) -> dict[str, Any]:
        if isinstance(error, LedgerError):
            return {"ok": False, "error": error.as_dict()}
        if isinstance(error, (OperationalError, DBAPIError)):
            log.error("ledger database unavailable: %s", error.orig if error.orig else error)
            return _unavailable()
        if isinstance(error, BatchFailed):  # logged once for the whole batch by the writer
            return _unavailable()
        if isinstance(error, (KeyError, TypeError, ValueError)):
            return _error("bad_request", f"malformed {op} request: {error!r}")
        # A bug, not an answer: the hooks treat it as an unreachable daemon (site policy).
        log.error("%s request failed", op, exc_info=error)
        return _error("unavailable", "the daemon failed on this request; see its log")

    def release_loop(self, stop: threading.Event, interval: float) -> None:
        """Release held jobs whose holds would be taken now (credit, every limit). A round
        reads `squeue --json` (every job: 22.05 filters nothing) only when a job this
        daemon saw refused would now be held, judged from its refused request and the
        ledger (no Slurm command), or every FULL_SCAN_SECONDS: jobs held while the daemon
        was down, jobs their owners changed while they waited, a new day's daily caps."""
        last_scan = -FULL_SCAN_SECONDS
        while not stop.is_set():
            full_scan = time.monotonic() - last_scan >= FULL_SCAN_SECONDS
            try:
                if full_scan or self._some_would_start():
                    self.release_startable()
                    if full_scan:
                        last_scan = time.monotonic()
            except (SlurmCommandError, SQLAlchemyError) as error:
                log.warning("releasing held jobs failed: %s", error)
            stop.wait(interval)

    def _some_would_start(self) -> bool:
        with self._lock:
            known = [parts for parts in self.credit_held.values() if parts]
            unknown = any(parts is None for parts in self.credit_held.values())
        seen: set[int] = set()
        for parts in known:
            if id(parts) in seen:  # a heterogeneous job's parts share one list
                continue
            seen.add(id(parts))
            if self._hold_refusal(parts) is None:
                return True
        return unknown

    def _hold_refusal(self, requests: Sequence[Mapping[str, Any]]) -> LedgerError | None:
        return service.hold_refusal(
            self.sessions, requests, grace_seconds=self.grace_seconds, lease_seconds=self.lease_seconds
        )

    def release_startable(self) -> list[str]:
        """One round: every job held for credit or a limit (squeue --json) whose holds
        would be taken now is released; returns the specs released. A job over a cap on
        its own stays held: its refusal never clears until the cap is raised."""
        result = parse_squeue_json(self.run(["squeue", "--json"]))
        for error in result.errors:
            log.warning("squeue --json: %s", error)
        held = service.held_jobs(result.jobs)
        waiting: dict[int, list[dict[str, Any]] | None] = {}
        released = []
        for spec, jobs in held.items():
            requests = [
                service.release_request(job, self._typed) for job in jobs if job.gpus or job.requested_gpus
            ]
            if requests and self._hold_refusal(requests) is None:
                service.release(self.run, spec)
                log.info("job %s: its holds would be taken now; released", spec)
                released.append(spec)
                continue
            for job in jobs:
                waiting[job.job_id] = requests
        with self._lock:
            self.credit_held = waiting
        return released

    def _typed(self, gpus: Mapping[str, int], partition: str | None) -> dict[str, int]:
        """Untyped GPUs priced as job_submit prices them: the dearest type the partition
        offers (Slurm picks the type only at allocation)."""
        untyped = gpus.get(UNTYPED_GPU, 0)
        if not untyped:
            return dict(gpus)
        prices = self.snapshots.current().prices
        offered = self.partition_types(partition) or prices.gpu_types()
        dearest = prices.dearest(offered, partition, utcnow()) or UNTYPED_GPU
        typed = {gpu: n for gpu, n in gpus.items() if gpu != UNTYPED_GPU}
        typed[dearest] = typed.get(dearest, 0) + untyped
        return typed

    def serve(
        self,
        socket_path: str,
        *,
        release_interval: float | None = 2.0,
        ready: threading.Event | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        # The hooks' outage price sheet and the spool's read-back (docs/outage.md);
        # bad outage settings stop the daemon here.
        outage = OutageKeeper.from_config(self.sessions, self.config)
        path = Path(socket_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket is born 0600: root / SlurmUser only
        try:
            listener.bind(str(path))
        finally:
            os.umask(old_umask)
        listener.listen(LISTEN_BACKLOG)
        loop = SocketLoop(
            listener,
            self.dispatch,
            max_line=MAX_REQUEST_BYTES,
            too_long=_encode(_error("bad_request", f"request longer than {MAX_REQUEST_BYTES} bytes")),
        )
        stop = stop or threading.Event()
        owner = self.config["daemon"].get("socket_user")
        if owner:
            import pwd

            entry = pwd.getpwnam(owner)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        if release_interval:
            threading.Thread(target=self.release_loop, args=(stop, release_interval), daemon=True).start()
        threading.Thread(target=self.slurm_facts.run, args=(stop,), daemon=True).start()
        if outage is not None:
            outage.start(stop)
        if self.limits is not None:
            threading.Thread(
                target=self.limits.run_forever, args=(stop, release_interval or 2.0), daemon=True
            ).start()
        if self.burst is not None:  # a quarter of the wait late at most, within 30 s
            every = min(max(release_interval or 2.0, self.routing.burst_after_seconds / 4), 30.0)
            threading.Thread(target=self.burst.run_forever, args=(stop, every), daemon=True).start()
        every = max(release_interval or 2.0, RETRY_PASS_SECONDS)
        threading.Thread(target=self.retries.run_forever, args=(stop, every), daemon=True).start()
        self.agents = _agent_receiver(
            self.config, self.sessions, owner, stop, self.routing.cloud_partitions()
        )
        port = daemon_metrics.metrics_port(self.config)
        stop_metrics = self.metrics.serve(port) if self.metrics is not None and port else (lambda: None)
        try:  # so the first quote does not wait on the database either
            self.snapshots.refresh()
        except SQLAlchemyError as error:
            log.warning("reading the ledger for job_submit failed at start: %s", error)
        threading.Thread(
            target=self.snapshots.run,
            args=(
                stop,
                lambda error: log.warning("refreshing the job_submit snapshot failed: %s", error),
                self._refill_quotes,
            ),
            daemon=True,
        ).start()

        previous_handlers = _stop_on_signals(stop)
        log.info("gpucredit daemon listening on %s", path)
        if ready is not None:
            ready.set()
        self.batches.deliver = loop.call_soon
        try:
            loop.run(stop)
        finally:
            self.batches.deliver = None  # the batches still written answer no socket
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            listener.close()
            self.batches.stop()
            done = self.batches
            log.info(
                "group commit: %d requests in %d batches; writer %.3f ms CPU, %.3f ms wall per request",
                done.requests,
                done.batches,
                1000 * done.cpu_seconds / max(done.requests, 1),
                1000 * done.wall_seconds / max(done.requests, 1),
            )
            stop_metrics()
            path.unlink(missing_ok=True)
            self.engine.dispose()
            log.info("gpucredit daemon stopped")


def _agent_receiver(
    config: dict[str, Any],
    sessions: Any,
    socket_user: str | None,
    stop: threading.Event,
    cloud_partitions: frozenset[str] = frozenset(),
) -> Any:
    """The GPU nodes' agents send their samples here, MUNGE-signed, when `daemon.agent_listen`
    (host:port) is set (accounting_bridge/nvml/receiver.py). A bad address stops the daemon
    at start; a port already taken, or no munged, is logged and the daemon serves Slurm."""
    listen = config["daemon"].get("agent_listen")
    if not listen:
        return None
    from accounting_bridge.nvml.channel import parse_address
    from accounting_bridge.nvml.munge import Munge, MungeUnavailable
    from accounting_bridge.nvml.receiver import UsageReceiver, allowed_uids

    try:
        host, port = parse_address(str(listen))
    except ValueError as error:
        raise ValueError(f"daemon.agent_listen: {error}") from None
    try:
        receiver = UsageReceiver(
            Munge(socket=config["daemon"].get("munge_socket")),
            sessions,
            allowed=allowed_uids(socket_user),
            cloud_partitions=cloud_partitions,
        )
        receiver.serve(host, port, stop)
    except (OSError, MungeUnavailable) as error:
        log.error("the agents' GPU usage is not taken on %s: %s", listen, error)
        return None
    return receiver


def _lock_batch_accounts(s: Any, batch: Sequence[Pending]) -> LockedBatch:
    """Lock the accounts of a batch's holds and settles in id order before any runs, and
    read its settles' holds under the locks; a malformed request locks nothing and is
    refused on its own turn. When every settle names its account (the epilog does), the
    accounts are locked without first reading who owns the jobs."""
    accounts: set[str] = set()
    jobs: set[tuple[str, int]] = set()
    new_runs: list[tuple[str, int]] = []  # one per hold: each takes a new hold id
    named = True
    for pending in batch:
        request = pending.request
        try:
            if pending.op == "hold_together":
                accounts |= service.part_accounts(request)
                continue
            if pending.op == "hold":
                accounts.add(str(request["account"]))
                new_runs.append((str(request["cluster"]), int(request["job_id"])))
            else:
                jobs.add((str(request["cluster"]), int(request["job_id"])))
                account = _account_of(pending.op, request)
                if account is None:
                    named = False
                else:
                    accounts.add(account)
        except (KeyError, TypeError, ValueError):
            continue
    return lock_batch(s, accounts, jobs, owners_named=named, new_runs=new_runs)


def _account_of(op: str, request: dict[str, Any]) -> str | None:
    """The account a hold is for, or the one the epilog names with its settle: where it
    is routed only (a settle charges its hold's own account, whatever a request says)."""
    account = request.get("account")
    return account if isinstance(account, str) else None


def _stop_on_signals(stop: threading.Event) -> dict[int, Any]:
    """SIGTERM (systemd's stop) and SIGINT set `stop`, so `serve` returns and removes
    its socket. Signal handlers can only be installed from the main thread; a daemon
    served from another thread (the tests) is stopped through `stop` alone."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, lambda _signum, _frame: stop.set())
    return previous


# How job_submit.lua begins every line: its quotes take the memo below, up to this
# length (a job's line is ~600 bytes; the memo then holds at most a few MB).
_SUBMIT_LINE = b'{"op":"submit",'
_MEMO_LINE_BYTES = 2048
_SUBMIT = MappingProxyType({"op": "submit"})  # what the metrics read of a request: its op


@functools.lru_cache(maxsize=1024)
def _parsed_submit(line: bytes) -> tuple[Mapping[str, Any], JobRequest | InvalidRequest] | None:
    """A submit line decoded and parsed, once per distinct line (None: take the general path).

    A site's submissions repeat a few shapes (same user, account, GRES, time limit), and
    inside slurmctld a quote's first work after an idle spell is mostly the CPU fetching
    what it touches: decoding and parsing were ~40% of it. Pure: the estimate itself runs
    on every submission, against the snapshot and the time of that submission.
    """
    try:
        fields = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(fields, dict) or fields.get("op") != "submit":
        return None
    try:
        parsed = answer.parse(fields)
    except Exception:  # the general path answers it, as it answers any malformed request
        return None
    return MappingProxyType(fields), parsed


def _encode(reply: dict[str, Any]) -> bytes:
    return json.dumps(reply, ensure_ascii=True).encode() + b"\n"


def _unavailable() -> dict[str, Any]:
    return _error("unavailable", "the ledger database is unavailable")


def _error(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": code, "message": message, "details": {}}}
