"""What every gpucredit CLI command shares: the database session, output formats, errors.

Other packages' sub-groups import this (arrows point toward the ledger).
"""

from __future__ import annotations

import csv
import functools
import io
import json
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
    from ledger.db import make_engine

    url = url or load_config()["database"]["url"]
    if url not in _engines:
        _engines[url] = make_engine(url)
    return _engines[url]


@contextmanager
def transaction() -> Iterator[Any]:
    """One session and one transaction for a command: commit on success, roll back on error."""
    from ledger.db import make_sessionmaker

    with make_sessionmaker(engine_for())() as session, session.begin():
        yield session


def parse_time_option(value: str | None, field: str) -> datetime | None:
    return None if value is None else parse_time(value, field=field)


def ledger_command(func: F) -> F:
    """Turn ledger refusals into a one-line message and exit status: 2 bad input, 1 refused."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except LedgerError as error:
            click.echo(f"error: {error.code}: {error.message}", err=True)
            sys.exit(2 if isinstance(error, InvalidInput) else 1)

    return wrapper  # type: ignore[return-value]


def emit(data: Any, fmt: str, columns: list[str] | None = None) -> None:
    """Print one object or a list of rows as a table, JSON or CSV."""
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
        return
    rows = data if isinstance(data, list) else [data]
    if not rows:
        if fmt == "table":
            click.echo("(none)")
        return
    columns = columns or list(rows[0].keys())
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(cells)
        click.echo(out.getvalue(), nl=False)
        return
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for r in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)
