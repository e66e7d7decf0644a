"""One database engine per app, and one transaction per unit of work in a request.

The ledger's functions never commit; views own `with transaction() as s:` exactly as
CLI commands do (ledger.cli_support), so a refusal rolls back everything it began.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import Flask, current_app
from sqlalchemy.orm import Session

from ledger.store.db import make_engine, make_sessionmaker


def init_app(app: Flask) -> None:
    engine = make_engine(app.config["GPUCREDIT"]["database"]["url"])
    app.extensions["gpucredit.engine"] = engine
    app.extensions["gpucredit.sessions"] = make_sessionmaker(engine)


@contextmanager
def transaction() -> Iterator[Session]:
    """A session in one transaction: committed when the block ends, rolled back on error."""
    sessions: Any = current_app.extensions["gpucredit.sessions"]
    with sessions() as s, s.begin():
        yield s


def engine() -> Any:
    return current_app.extensions["gpucredit.engine"]
