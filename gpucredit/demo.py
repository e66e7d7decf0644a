"""`make demo`: a small site on the embedded database, then its balances and usage.

Prices, two accounts, a top-up and a time-windowed grant each, a few settled jobs
(one that outruns its hold a little, one cancelled early), a refusal, and the
reports a PI would read. Runs in a second; re-runnable on a fresh file.
"""

from __future__ import annotations

from datetime import timedelta

import click

from ledger import api
from ledger.cli_support import emit, engine_for, transaction
from ledger.errors import LedgerError
from ledger.schema import upgrade
from ledger.timeutil import utcnow


def main() -> None:
    engine = engine_for()
    upgrade(engine)
    now = utcnow().replace(microsecond=0)
    start = now - timedelta(days=2)
    with transaction() as s:
        api.set_price(s, "a100", "2.00", effective_at=start - timedelta(days=30))
        api.set_price(s, "h100", "3.60", effective_at=start - timedelta(days=30))
        for account, users in (("physics", ("alice", "bob")), ("chemistry", ("carol",))):
            api.create_account(s, account)
            for user in users:
                api.add_member(s, user, account)
    with transaction() as s:
        api.topup(s, "physics", "100", effective_at=start, reference="invoice-2026-117")
        api.grant(s, "physics", "20", effective_at=start, expires_at=now + timedelta(days=5))
    with transaction() as s:
        api.topup(s, "chemistry", "40", effective_at=start, reference="invoice-2026-118")
        api.grant(
            s,
            "chemistry",
            "10",
            effective_at=start + timedelta(days=1),
            expires_at=now + timedelta(days=30),
            priority=5,
        )
    with transaction() as s:
        api.set_limits(s, "physics", user="alice", max_gpus=4, max_rate="0.005", daily_cap="30")

    jobs = [  # account, user, job id, gpus, time limit, ran, hours after start
        ("physics", "alice", 1001, "h100:2", 7200, 1800, 2),
        ("physics", "alice", 1002, "a100:2", 10800, 3600, 2),
        ("physics", "bob", 1004, "a100:1,h100:1", 3600, 3600, 20),
        ("chemistry", "carol", 1005, "a100:4", 14400, 5400, 26),
        ("chemistry", "carol", 1006, "h100:1", 3600, 600, 30),
    ]
    for account, user, job_id, gpus, limit, ran, hours in jobs:
        at = start + timedelta(hours=hours)
        with transaction() as s:
            hold = api.create_hold(
                s, account, user=user, job_id=job_id, gpus=gpus, seconds=limit, cluster="lab", at=at
            )
        with transaction() as s:
            api.settle_hold(s, hold.id, ran, at + timedelta(seconds=ran))
    click.echo("A job alice cannot afford within her daily cap is refused:")
    try:
        with transaction() as s:
            api.create_hold(
                s,
                "physics",
                user="alice",
                job_id=1003,
                gpus="a100:4",
                seconds=4 * 3600,
                cluster="lab",
                at=start + timedelta(hours=2, minutes=30),
            )
    except LedgerError as refusal:
        click.echo(f"  refused {refusal.code}: {refusal.message}\n")

    with transaction() as s:
        quote = api.quote(s, "physics", "h100:2", 7200)
    click.echo(
        f"What `sbatch --gres=gpu:h100:2 -t 2:00:00` costs physics now: {quote['cost']} credits "
        f"({quote['available']} available)\n"
    )
    for account in ("physics", "chemistry"):
        with transaction() as s:
            b = api.balance(s, account)
        click.echo(f"{account}: available {b['available']}, held {b['held']}")
        emit(b["grants"], "table", ["id", "source", "amount", "remaining", "expires_at"])
        click.echo()
    for by in ("gres", "user"):
        click.echo(f"Usage by {by}:")
        with transaction() as s:
            emit(api.usage_report(s, by=by), "table", [by, "charged", "gpu_seconds", "jobs"])
        click.echo()
    with transaction() as s:
        report = api.verify(s)
    click.echo(f"audit verify: {'ok' if report.ok else 'FAILED'} ({report.entries} journal entries)")
    click.echo(f"database: {engine.url}")


if __name__ == "__main__":
    main()
