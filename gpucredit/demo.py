"""`make demo`: a small site on the embedded database, its balances and usage, then the portal.

Prices, two accounts, a top-up and a time-windowed grant each, a few settled jobs
(one that outruns its hold a little, one cancelled early), a refusal, and the
reports a PI would read. Runs in a second; re-runnable on a fresh file.

Then it serves the portal on that data (`gpucredit serve`: waitress on
127.0.0.1, port 8080 or `portal.port`) with two demo logins, a PI and an admin,
until Ctrl-C. `--no-serve` (or DEMO_SERVE=0) stops after the printout, for scripts.
"""

from __future__ import annotations

from datetime import timedelta

import click

from ledger import api
from ledger.cli_support import emit, engine_for, transaction
from ledger.config import load_config
from ledger.errors import LedgerError
from ledger.store.schema import upgrade
from ledger.timeutil import utcnow

# Demo logins only: the demo serves on loopback, and everyone reading this knows it.
DEMO_PASSWORD = "gpucredit-demo"
DEMO_LOGINS = (("alice", False), ("admin", True))  # alice is physics' manager (its PI)
MANAGERS = {"alice", "carol"}


@click.command()
@click.option(
    "--serve/--no-serve",
    default=True,
    envvar="DEMO_SERVE",
    show_default=True,
    help="Serve the portal on the demo data after the printout (env DEMO_SERVE=0: don't).",
)
@click.option("--host", default=None, help="Default: portal.host from the config (127.0.0.1).")
@click.option("--port", type=int, default=None, help="Default: portal.port from the config (8080).")
def main(serve: bool, host: str | None, port: int | None) -> None:
    """Build the demo site, print what a PI would read, then serve the portal on it."""
    build_site()
    if serve:
        serve_portal(host, port)


def build_site() -> None:
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
                api.add_member(s, user, account, role="manager" if user in MANAGERS else "member")
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
                s,
                api.HoldRequest(
                    account, user=user, job_id=job_id, gpus=gpus, seconds=limit, cluster="lab", at=at
                ),
            )
        with transaction() as s:
            api.settle_hold(s, hold.id, ran, at + timedelta(seconds=ran))
    click.echo("A job alice cannot afford within her daily cap is refused:")
    try:
        with transaction() as s:
            api.create_hold(
                s,
                api.HoldRequest(
                    "physics",
                    user="alice",
                    job_id=1003,
                    gpus="a100:4",
                    seconds=4 * 3600,
                    cluster="lab",
                    at=start + timedelta(hours=2, minutes=30),
                ),
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


def serve_portal(host: str | None, port: int | None) -> None:
    """Create the demo logins and serve the portal with `gpucredit serve`'s own code."""
    try:
        from portal.auth import hash_password
        from portal.cli import serve_command
    except ModuleNotFoundError as missing:
        raise click.ClickException(
            f"the portal needs {missing.name}: pip install -e '.[portal]' (or run with --no-serve)"
        ) from missing
    password_hash = hash_password(DEMO_PASSWORD)
    with transaction() as s:
        for user, is_admin in DEMO_LOGINS:
            api.set_portal_user(s, user, password_hash=password_hash, is_admin=is_admin)
    portal = load_config()["portal"]
    url = f"http://{host or portal['host']}:{port or portal['port']}/"
    click.echo(
        f"\nPortal: {url}\n"
        f"  log in as alice (PI of physics) or admin, password {DEMO_PASSWORD}\n"
        "  Ctrl-C stops it.\n"
    )
    serve_command.callback(host=host, port=port, threads=None)  # type: ignore[misc]  # waitress ends on Ctrl-C
    click.echo("portal stopped")


if __name__ == "__main__":
    main()
