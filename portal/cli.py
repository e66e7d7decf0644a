"""The portal's commands: `gpucredit serve`, `gpucredit token ...`, `gpucredit passwd`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from ledger.cli_support import emit, format_option, ledger_command, parse_time_option, transaction

if TYPE_CHECKING:
    from flask import Flask


@click.command("serve")
@click.option("--host", default=None, help="Default: portal.host from the config (127.0.0.1).")
@click.option("--port", type=int, default=None, help="Default: portal.port from the config (8080).")
@click.option("--threads", type=int, default=None, help="Worker threads (default: portal.threads).")
def serve_command(host: str | None, port: int | None, threads: int | None) -> None:
    """Serve the portal and the JSON API (waitress), and /metrics on its own listener."""
    serve(host, port, threads)


def serve(
    host: str | None, port: int | None, threads: int | None, prepare: Callable[[Flask], object] | None = None
) -> None:
    """serve_command's work; `prepare(app)`, when given, runs once the app is made: how
    the CLI root hands the portal what it may not import itself (the cloud report's
    instance journal: gpucredit/portal_serve.py)."""
    import logging

    from waitress import serve

    from ledger.config import load_config
    from portal import create_app
    from portal.settings import PortalConfigError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = load_config()
    portal = config["portal"]
    host = host or portal.get("host", "127.0.0.1")
    port = port or int(portal.get("port", 8080))
    config["portal"] = {**portal, "host": host, "port": port}
    try:
        app = create_app({"GPUCREDIT": config})
    except PortalConfigError as error:  # a door left open: say which, start nothing
        click.echo(f"error: {error}", err=True)
        sys.exit(2)
    if prepare is not None:
        prepare(app)
    serve_metrics(app)
    click.echo(f"gpucredit portal on http://{host}:{port}/", err=True)
    # One process with threads: in-memory rate limits and the SQLite file stay exact,
    # and a slow client never ties up a worker process (waitress buffers it).
    try:
        serve(
            app,
            host=host,
            port=port,
            threads=threads or int(app.config["GPUCREDIT"]["portal"]["threads"]),
            ident="gpucredit",
        )
    except OSError as error:  # the address is taken or not ours: say so, not a traceback
        click.echo(f"error: cannot listen on {host}:{port}: {error.strerror}; try another --port", err=True)
        sys.exit(2)


def serve_metrics(app: Flask) -> None:
    """/metrics on `portal.metrics_host`:`portal.metrics_port` from a thread (never on the
    portal's own port: portal.ops). A port already taken is logged, not fatal: the
    portal matters more than its scrape, as the daemon's metrics do."""
    import logging
    import threading

    from waitress import create_server

    from portal.ops import metrics_app
    from portal.settings import portal_settings

    settings = portal_settings(app)
    host, port = str(settings["metrics_host"]), int(settings["metrics_port"])
    if not port:
        return
    log = logging.getLogger("gpucredit.portal")
    try:
        server = create_server(metrics_app(app), map={}, host=host, port=port, threads=2, ident="gpucredit")
    except OSError as error:
        log.warning("portal metrics not served on %s:%s: %s", host, port, error.strerror)
        return
    threading.Thread(target=server.run, name="gpucredit-metrics", daemon=True).start()
    log.info("portal metrics on http://%s:%s/metrics", host, port)


@click.group("token")
def token_group() -> None:
    """API tokens (Authorization: Bearer ...)."""


TOKEN_COLUMNS = ["id", "user", "role", "label", "created_at", "expires_at", "revoked_at"]


@token_group.command("create")
@click.argument("user")
@click.option("--role", type=click.Choice(["user", "admin", "service"]), default="user", show_default=True)
@click.option("--expires", default=None, metavar="TIME", help="Expiry (ISO 8601); default never.")
@click.option("--label", default=None, help="What the token is for.")
@ledger_command
def token_create(user: str, role: str, expires: str | None, label: str | None) -> None:
    """Make a token; its secret is printed once, on stdout."""
    from ledger import api

    with transaction() as s:
        info, secret = api.create_token(
            s, user, role, expires_at=parse_time_option(expires, "expires"), label=label
        )
    click.echo(secret)
    click.echo(f"token {info.id} for {user} ({role}); store it now: it is not shown again", err=True)


@token_group.command("list")
@click.option("--user", default=None)
@format_option
@ledger_command
def token_list(user: str | None, fmt: str) -> None:
    from ledger import api

    with transaction() as s:
        emit([t.as_dict() for t in api.list_tokens(s, user)], fmt, TOKEN_COLUMNS)


@token_group.command("revoke")
@click.argument("token_id", type=int)
@format_option
@ledger_command
def token_revoke(token_id: int, fmt: str) -> None:
    from ledger import api

    with transaction() as s:
        emit(api.revoke_token(s, token_id).as_dict(), fmt, TOKEN_COLUMNS)


@click.command("passwd")
@click.argument("user")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin (for scripts).")
@click.option("--admin/--no-admin", default=None, help="Make the user a portal admin, or not.")
@ledger_command
def passwd_command(user: str, password_stdin: bool, admin: bool | None) -> None:
    """Set a portal login's password (argon2); creates the login if needed."""
    from ledger import api
    from portal.auth import hash_password

    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if len(password) < 8:
        click.echo("error: invalid_password: a password needs at least 8 characters", err=True)
        sys.exit(2)
    with transaction() as s:
        result = api.set_portal_user(s, user, password_hash=hash_password(password), is_admin=admin)
    click.echo(f"portal login {user}: password set{' (admin)' if result['is_admin'] else ''}")


@click.group("export")
def export_group() -> None:
    """Files other systems read."""


@export_group.command("ood-balance")
@click.argument("path", type=click.Path(dir_okay=False, writable=True))
@ledger_command
def export_ood_balance(path: str) -> None:
    """Open OnDemand's balance file (OOD_BALANCE_PATH), replaced atomically."""
    from pathlib import Path

    from portal.ood import ood_document, write_atomically

    with transaction() as s:
        document = ood_document(s)
    write_atomically(Path(path), document)
    click.echo(f"{path}: {len(document['balances'])} balances", err=True)


COMMANDS = [serve_command, token_group, passwd_command, export_group]


@click.group("submitter")
def submitter_group() -> None:
    """The root service that runs a portal user's own sbatch/scancel (Slurm 22.05), or signs
    their tokens for slurmrestd (24.11 and later)."""


@submitter_group.command("serve")
@click.option("--socket", "socket_path", default="/run/gpucredit/submitter.sock", show_default=True)
@click.option(
    "--allow-uid", type=int, required=True, help="The portal's service uid: the only peer answered."
)
@click.option(
    "--min-uid", type=int, default=1000, show_default=True, help="Users below this uid are refused."
)
@click.option(
    "--max-uid", type=int, default=59999, show_default=True, help="Users above this uid are refused."
)
@click.option("--bin-dir", default=None, help="Slurm's commands (default: slurm.bin_dir from the config).")
@click.option(
    "--jwt-key",
    default=None,
    help="Sign users' tokens for slurmrestd with this key (Slurm 24.11 and later); root alone reads it.",
)
@click.option(
    "--slurm-user",
    default="slurm",
    show_default=True,
    help="slurm.conf's SlurmUser: never given a token, whatever its uid.",
)
def submitter_serve(
    socket_path: str,
    allow_uid: int,
    min_uid: int,
    max_uid: int,
    bin_dir: str | None,
    jwt_key: str | None,
    slurm_user: str,
) -> None:
    """Serve the submitter on a Unix socket (run as root; docs/admin-guide.md)."""
    import logging

    from ledger.config import load_config
    from portal.jobs.submitter import Submitter, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    bin_dir = bin_dir or str(load_config()["slurm"].get("bin_dir", "/usr/bin"))
    serve(
        socket_path,
        allow_uid,
        Submitter(min_uid=min_uid, max_uid=max_uid, bin_dir=bin_dir, jwt_key=jwt_key, slurm_user=slurm_user),
    )
