"""An acknowledged write survives a crash of the ledger's primary (issue 34).

The ledger is the HA box (tests/support/ha.py): Patroni, a primary and a synchronous
standby, reached through the cluster's multi-host URL. A real `gpucredit daemon` process
serves hook-like clients that hold and settle job runs over its socket, as
PrologSlurmctld and EpilogSlurmctld do (the hooks' own DaemonClient, its 2 s deadline);
beside them top-ups (with idempotency keys) go through the ledger's public API, and
Stripe's paid-checkout webhooks (signed, by event id) through the portal, which answers
503 while its database is unavailable, so Stripe sends the event again. Mid-stream, `make
ha-failover` crashes the primary (its Patroni, postmaster and backends killed at once)
and the standby takes over.

What the clients do with an answer that did not come (`unavailable`, or no reply in
time): four retry the same request until it is answered (every request is idempotent),
as an admin's `scontrol release` or the bridge would; two prolog-only clients (their
jobs run on, never settled here) give a hold up, as the prolog parks a job, and never
retry it.

Afterwards: every acknowledged write is there exactly once with what was acknowledged
(hold ids, charges, grant ids), the running jobs' holds still active; a parked hold is
there at most once and whole (active, holding the run); the
books are exact to the micro-credit (the ledger's balance); `gpucredit audit verify`
passes through the multi-host URL.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from ledger import api
from ledger.money import charge_for, format_credits, parse_credits
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade
from ledger.store.tables import grants_t, holds_t
from ledger.timeutil import parse_time
from slurm_hooks.client import DaemonClient, DaemonRefused, DaemonUnreachable
from tests.support.daemon import GPUCREDIT, DaemonProcess
from tests.support.fake_stripe import event, signature
from tests.support.fakedaemon import sockdir as sockdir
from tests.support.ha import HACluster
from tests.support.portal import make_app

A100 = 2_000_000  # micro-credits per GPU-hour
ACCOUNTS = ("alpha", "beta", "gamma")
CREDIT = "1000"  # plenty: no refusal for credit, so every run's fate is the failover's alone
CLIENTS = 6
# Prolog-only clients: they hold job after job (the jobs run on, never settled here) and
# give a hold up when it is not answered, as the prolog parks the job.
PARKING = {0, 1}
PARKING_PAUSE_S = 0.2  # between their holds: each holds 2.00 credits to the end
LIMIT_S = 3600
RAN_S = 600
TOPUP = "1.5"
PAYMENT = "2.25"
PAYMENTS = 12
CENTS_PER_CREDIT = 100
WEBHOOK = "/api/v1/payments/stripe/webhook"
WEBHOOK_SECRET = "whsec_ha_failover"  # a test's own, not a secret
AFTER_FAILOVER = 3  # each stream goes on until it has this many acknowledged writes after the crash
RETRY_PAUSE_S = 0.05  # a client's pause before retrying an unanswered request (its retry policy)
ARRIVAL_PAUSE_S = 0.02  # between one client's jobs: the load is a stream, not a spin


@dataclass
class Seen:
    """What the clients were told, per write."""

    holds: dict[int, tuple[int, str]] = field(default_factory=dict)  # job -> (hold id, account)
    settles: dict[int, str] = field(default_factory=dict)  # job -> charged
    parked: set[int] = field(default_factory=set)  # a hold given up unanswered
    topups: dict[str, tuple[int, str]] = field(default_factory=dict)  # key -> (grant id, account)
    paid: dict[int, tuple[int, str]] = field(default_factory=dict)  # payment id -> (grant id, account)
    unanswered: Counter[str] = field(default_factory=Counter)  # op -> tries with no usable answer
    after_crash: Counter[str] = field(default_factory=Counter)  # stream -> acknowledged after it
    errors: list[str] = field(default_factory=list)
    crashed: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def acknowledged(self, stream: str) -> None:
        if self.crashed.is_set():
            with self.lock:
                self.after_crash[stream] += 1


@contextmanager
def transaction(engine: Engine) -> Iterator[Session]:
    with make_sessionmaker(engine)() as s, s.begin():
        yield s


def hook_requests(job_id: int, account: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What PrologSlurmctld and EpilogSlurmctld send for one run."""
    start = parse_time("2026-11-30T08:00:00Z") + timedelta(seconds=job_id)
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    hold = {
        "cluster": "lab",
        "job_id": job_id,
        "run": 0,
        "account": account,
        "user": "alice",
        "partition": "onprem",
        "gpus": {"a100": 1},
        "seconds": LIMIT_S,
        "start": start.strftime(stamp),
        "submit": (start - timedelta(seconds=5)).strftime(stamp),
        "nodes": 1,
    }
    settle = {
        "cluster": "lab",
        "job_id": job_id,
        "run": 0,
        "start": hold["start"],
        "end": (start + timedelta(seconds=RAN_S)).strftime(stamp),
        "submit": hold["submit"],
    }
    return hold, settle


def until_answered(seen: Seen, op: str, call: Callable[[], Any], *, give_up: bool = False) -> Any:
    """`call()` until it is answered; None if `give_up` and the first try was not."""
    deadline = time.monotonic() + 120  # a bound on a broken cluster, not a measurement
    while True:
        try:
            return call()
        except (DaemonUnreachable, SQLAlchemyError, WebhookNotAnswered) as error:
            why = (
                "db error"
                if isinstance(error, SQLAlchemyError)
                else "503"
                if isinstance(error, WebhookNotAnswered)
                else _why(error)
            )
            with seen.lock:
                seen.unanswered[f"{op} {why}"] += 1
            if give_up:
                return None
            assert time.monotonic() < deadline, f"{op} never answered"
            time.sleep(RETRY_PAUSE_S)


def _why(error: DaemonUnreachable) -> str:
    """`unavailable`: the daemon says nothing of it committed; `no reply`: unknown."""
    return "unavailable" if "unavailable:" in str(error) else "no reply"


def hook_client(index: int, socket_path: str, seen: Seen) -> None:
    client = DaemonClient(socket_path)  # the hooks' own 2 s deadline
    n = 0
    while not seen.stop.is_set():
        job_id = 10_000 * (index + 1) + n
        n += 1
        account = ACCOUNTS[job_id % len(ACCOUNTS)]
        hold, settle = hook_requests(job_id, account)
        try:
            held = until_answered(
                seen, "hold", partial(client.call, "hold", **hold), give_up=index in PARKING
            )
            if held is None:
                seen.parked.add(job_id)
                time.sleep(RETRY_PAUSE_S)
                continue
            seen.holds[job_id] = (int(held["id"]), account)
            if index in PARKING:
                time.sleep(PARKING_PAUSE_S)
                continue
            settled = until_answered(seen, "settle", partial(client.call, "settle", **settle))
            seen.settles[job_id] = str(settled["charged"])
            seen.acknowledged(f"client {index}")
        except DaemonRefused as refused:
            seen.errors.append(f"job {job_id}: {refused}")
        time.sleep(ARRIVAL_PAUSE_S)


def topup_once(engine: Engine, account: str, key: str) -> dict[str, Any]:
    with transaction(engine) as s:
        return api.topup(s, account, TOPUP, idempotency_key=key, reference=key)


class WebhookNotAnswered(Exception):
    """The portal answered a webhook 503 (its database unavailable): Stripe sends it again."""


def stripe_portal(url: str) -> Flask:
    """The portal on the cluster's URL, taking Stripe's webhooks."""
    return make_app(
        url,
        portal={"api_rate_limit": "100000 per minute"},  # Stripe's retries are not what is tested
        payments={
            "provider": "stripe",
            "currency": "usd",
            "unit_amount_cents": CENTS_PER_CREDIT,
            "stripe": {"secret_key": "sk_test_ha", "webhook_secret": WEBHOOK_SECRET},
        },
    )


def paid_once(client: FlaskClient, payment_id: int, account: str, n: int) -> dict[str, Any]:
    """Stripe delivering checkout.session.completed for payment `payment_id` (a retry is
    the same event, signed anew)."""
    session = {
        "id": f"cs_test_ha_{n}",
        "object": "checkout.session",
        "client_reference_id": str(payment_id),
        "metadata": {"payment_id": str(payment_id), "account": account},
        "amount_total": int(parse_credits(PAYMENT) * CENTS_PER_CREDIT // 1_000_000),
        "currency": "usd",
        "status": "complete",
        "payment_status": "paid",
    }
    payload = event("checkout.session.completed", session, event_id=f"evt_ha_{n}")
    response = client.post(
        WEBHOOK,
        data=payload,
        headers={"Stripe-Signature": signature(payload, WEBHOOK_SECRET), "Content-Type": "application/json"},
    )
    if response.status_code == 503:
        raise WebhookNotAnswered(response.get_json()["error"]["code"])
    assert response.status_code == 200, response.get_json()
    reply: dict[str, Any] = response.get_json()
    return reply


def topup_stream(engine: Engine, seen: Seen) -> None:
    n = 0
    while not seen.stop.is_set():
        key, account = f"ha-topup-{n}", ACCOUNTS[n % len(ACCOUNTS)]
        n += 1
        result = until_answered(seen, "topup", partial(topup_once, engine, account, key))
        seen.topups[key] = (int(result["grant"]["id"]), account)
        seen.acknowledged("topups")
        time.sleep(ARRIVAL_PAUSE_S * 5)


def payment_stream(portal: Flask, payments: list[tuple[int, str]], seen: Seen) -> None:
    """Stripe's webhooks through the portal: each paid once, by its event id, across the crash."""
    client = portal.test_client()
    for n, (payment_id, account) in enumerate(payments):
        result = until_answered(seen, "paid", partial(paid_once, client, payment_id, account, n))
        seen.paid[payment_id] = (int(result["payment"]["grant_id"]), account)
        seen.acknowledged("payments")
        while n >= PAYMENTS // 3 and not seen.crashed.is_set() and not seen.stop.is_set():
            time.sleep(ARRIVAL_PAUSE_S * 5)  # a third paid before the crash, the rest after


def test_acknowledged_writes_survive_a_failover(ha_cluster: HACluster, sockdir: Path, tmp_path: Path) -> None:
    url = ha_cluster.new_database()
    engine = make_engine(url)
    upgrade(engine)
    with transaction(engine) as s:
        api.set_price(s, "a100", format_credits(A100), effective_at=parse_time("2026-01-01"))
        for name in ACCOUNTS:
            api.create_account(s, name)
            api.add_member(s, "alice", name)
            api.topup(s, name, CREDIT)
        payments = []
        for n in range(PAYMENTS):  # checkouts opened, not yet paid: Stripe's webhook will say
            account = ACCOUNTS[n % len(ACCOUNTS)]
            payment = api.open_payment(s, account, PAYMENT, provider="stripe", requested_by="alice")
            api.set_external_id(s, payment["id"], f"cs_test_ha_{n}")
            payments.append((payment["id"], account))
    config = tmp_path / "gpucredit.toml"
    config.write_text(
        f'[database]\nurl = "{url}"\n'
        f'[daemon]\nsocket = "{sockdir / "daemon.sock"}"\nmetrics_port = 0\n'
        '[slurm]\ncluster = "lab"\nbin_dir = "/nonexistent"\n'
    )
    daemon = DaemonProcess(str(sockdir / "daemon.sock"), tmp_path / "daemon.log")
    seen = Seen()
    streams = [
        threading.Thread(target=hook_client, args=(i, daemon.socket, seen), daemon=True)
        for i in range(CLIENTS)
    ]
    streams.append(threading.Thread(target=topup_stream, args=(engine, seen), daemon=True))
    portal = stripe_portal(url)
    streams.append(threading.Thread(target=payment_stream, args=(portal, payments, seen), daemon=True))
    try:
        daemon.start(config)
        for stream in streams:
            stream.start()
        wait_for(lambda: len(seen.settles) >= 30 and len(seen.topups) >= 3, "the streams never got going")
        before = (len(seen.settles), len(seen.topups), len(seen.paid))
        seen.crashed.set()
        report = ha_cluster.failover()  # blocks until the standby takes writes
        names = [f"client {i}" for i in range(CLIENTS) if i not in PARKING] + ["topups"]
        wait_for(
            lambda: all(seen.after_crash[n] >= AFTER_FAILOVER for n in names) and len(seen.paid) == PAYMENTS,
            "the streams did not go on after the failover",
        )
        seen.stop.set()
        for stream in streams:
            stream.join(150)
        assert not any(stream.is_alive() for stream in streams)
        assert daemon.proc is not None and daemon.proc.poll() is None  # it lived through it: no restart
    finally:
        seen.stop.set()
        daemon.stop()
        portal.extensions["gpucredit.engine"].dispose()
    print(
        f"failover: read-write on {report['leader']} {report['read_write_after_seconds']} s after the crash; "
        f"before it {before[0]} runs, {before[1]} top-ups, {before[2]} payments; in all "
        f"{len(seen.settles)} runs settled, {len(seen.holds) - len(seen.settles)} held on, "
        f"{len(seen.parked)} parked, {len(seen.topups)} top-ups, "
        f"{len(seen.paid)} payments; unanswered tries {dict(seen.unanswered)}"
    )
    assert seen.errors == []
    assert sum(n for op, n in seen.unanswered.items() if op.startswith("hold")) > 0  # mid-stream
    assert seen.parked  # the prolog-only clients gave holds up in the window
    check_books(engine, seen)
    engine.dispose()
    verify = subprocess.run(
        [GPUCREDIT, "audit", "verify"],
        env={**os.environ, "GPUCREDIT_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.startswith("ok"), verify.stdout


def check_books(engine: Engine, seen: Seen) -> None:
    charge = charge_for(A100, RAN_S)
    full = charge_for(A100, LIMIT_S)
    with transaction(engine) as s:
        holds = {
            row.job_id: row
            for row in s.execute(
                select(holds_t.c.id, holds_t.c.job_id, holds_t.c.state, holds_t.c.charged_ucredits)
            )
        }
        per_job = Counter(s.execute(select(holds_t.c.job_id)).scalars())
        assert {job for job, n in per_job.items() if n > 1} == set()  # no run held twice
        # Every acknowledged hold is there, under the id it was acknowledged with; settled
        # once for what the settle acknowledged, else still active (a prolog-only client's).
        for job, (hold_id, _account) in seen.holds.items():
            assert holds[job].id == hold_id, job
            settled = ("settled", charge) if job in seen.settles else ("active", 0)
            assert (holds[job].state, holds[job].charged_ucredits) == settled, job
        assert set(seen.settles.values()) == {format_credits(charge)}
        # A parked hold (never acknowledged) is either absent or whole: active, holding the run.
        assert set(holds) - set(seen.holds) <= seen.parked
        stray = {job: holds[job] for job in seen.parked if job in holds}
        assert all(h.state == "active" for h in stray.values()), stray
        # Top-ups and payments: each acknowledged one once, under its acknowledged grant.
        refs = Counter(
            s.execute(select(grants_t.c.reference).where(grants_t.c.reference.like("ha-topup-%"))).scalars()
        )
        assert refs == dict.fromkeys(seen.topups, 1)
        for payment_id, (grant_id, _account) in seen.paid.items():
            assert api.get_payment(s, payment_id)["grant_id"] == grant_id
        assert s.execute(
            select(func.count()).select_from(grants_t).where(grants_t.c.source == "topup")
        ).scalar() == (len(ACCOUNTS) + len(seen.topups) + len(seen.paid))
        # The books, per account, to the micro-credit.
        for account in ACCOUNTS:
            runs = sum(
                1 for job, (_hold, owner) in seen.holds.items() if owner == account and job in seen.settles
            )
            running = sum(1 for _hold, owner in seen.holds.values() if owner == account) - runs
            parked = running + sum(1 for job in stray if ACCOUNTS[job % len(ACCOUNTS)] == account)
            topups = sum(1 for _grant, owner in seen.topups.values() if owner == account)
            paid = sum(1 for _grant, owner in seen.paid.values() if owner == account)
            expected = (
                parse_credits(CREDIT)
                + topups * parse_credits(TOPUP)
                + paid * parse_credits(PAYMENT)
                - runs * charge
                - parked * full
            )
            balance = api.balance(s, account)
            assert (balance["available"], balance["held"]) == (
                format_credits(expected),
                format_credits(parked * full),
            ), account


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 120  # a bound on a slow machine, not a measurement
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
