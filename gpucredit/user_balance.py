"""`gpucredit balance` for whoever runs it: the ledger's own command where this user has
a database (an admin on the controller), the portal's API where they have only the
portal (a researcher on a login node, authenticated by MUNGE or their token).

    database configured (GPUCREDIT_DATABASE_URL, or    the ledger's command, unchanged
    [database] url in a config this user may read;
    not an embedded file this user may not open
    where a portal is known: the Slurm box's)
    else a portal known (GPUCREDIT_URL, or [portal]    the API: GET /accounts, and each
    url in a config this user may read)                account's balance
    else                                               the ledger's command, unchanged
                                                       (its embedded database; or its
                                                       one line for a config this user
                                                       may not read)
"""

from __future__ import annotations

import os
import tomllib
import urllib.parse
from typing import Any

import click

from gpucredit.job_cli import call
from ledger.cli_support import emit

GRANT_COLUMNS = ["id", "source", "amount", "remaining", "effective_at", "expires_at", "priority"]
MAX_ACCOUNTS = 200  # one page of the API's list: a researcher is in a handful


def uses_portal() -> bool:
    """The decision table above."""
    if os.environ.get("GPUCREDIT_DATABASE_URL"):
        return False
    from ledger.config import config_path

    path = config_path()
    file: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                file = tomllib.load(handle)
        except PermissionError:  # the controller's config, not this user's: only GPUCREDIT_URL says
            return bool(os.environ.get("GPUCREDIT_URL"))
        except (OSError, tomllib.TOMLDecodeError):
            return False  # the ledger's command says what is wrong with it
    portal = bool(os.environ.get("GPUCREDIT_URL") or (file.get("portal") or {}).get("url"))
    database = str((file.get("database") or {}).get("url") or "")
    if database:
        return portal and _closed_file(database)
    return portal


def _closed_file(url: str) -> bool:
    """An embedded (SQLite) ledger this user may not open: root's, in its 0700 directory."""
    if not url.startswith("sqlite:///"):
        return False
    path = os.path.abspath(url.removeprefix("sqlite:///").split("?", 1)[0])
    if os.path.exists(path):
        return not os.access(path, os.R_OK | os.W_OK)
    return not os.access(os.path.dirname(path), os.W_OK | os.X_OK)  # unseen: it could not be made


def with_portal(admin: click.Command) -> click.Command:
    """A copy of the ledger's `balance` (`admin`, left as it is) that asks the portal
    when `uses_portal()`; same arguments, same output."""
    import copy

    ledger_callback = admin.callback
    assert ledger_callback is not None

    def callback(account: str | None, at: str | None, fmt: str) -> Any:
        if not uses_portal():
            return ledger_callback(account=account, at=at, fmt=fmt)
        return portal_balance(account, at, fmt)

    copied = copy.copy(admin)
    copied.callback = callback
    return copied


def portal_balance(account: str | None, at: str | None, fmt: str) -> None:
    query = f"?{urllib.parse.urlencode({'at': at})}" if at else ""
    if account is not None:
        result = call("GET", f"/accounts/{urllib.parse.quote(account, safe='')}/balance{query}")
        if fmt == "table":
            debt = f", debt {result['debt']}" if result.get("debt", "0.00") != "0.00" else ""
            click.echo(
                f"account {result['account']} at {result['at']}: available {result['available']}, "
                f"held {result['held']}{debt}"
            )
        emit(result if fmt == "json" else result["grants"], fmt, None if fmt == "json" else GRANT_COLUMNS)
        return
    page = call("GET", f"/accounts?limit={MAX_ACCOUNTS}")
    rows = []
    for item in page["items"]:
        found = call("GET", f"/accounts/{urllib.parse.quote(item['account'], safe='')}/balance{query}")
        rows.append({"account": item["account"], "available": found["available"], "held": found["held"]})
    if not rows:
        raise click.ClickException("no_account: you are a member of no account the portal knows")
    emit(rows, fmt, ["account", "available", "held"])
