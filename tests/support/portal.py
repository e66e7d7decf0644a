"""Portal test helpers: an app on a database, a seeded site, logins and tokens; the
fixtures built on them (`site`, `app`, `client`, `login_as`, `browser`) are in
tests/portal/conftest.py.

`seed_site` (the `site` fixture) seeds the same small site for every portal test (prices, two accounts with a
manager and members each, an admin, top-ups, a promotion, two finished jobs and a
running one), so tests assert exact figures a user would read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy.orm import Session

from ledger import api
from ledger.config import load_config
from ledger.store.db import make_engine, make_sessionmaker
from ledger.timeutil import utcnow

PASSWORD = "correct horse battery"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def portal_config(db_url: str, **portal: Any) -> dict[str, Any]:
    config = load_config(Path("/dev/null"))
    config["database"]["url"] = db_url
    config["portal"].update({"rate_limit_storage": "memory://", **portal})
    return config


def make_app(
    db_url: str,
    *,
    portal: dict[str, Any] | None = None,
    payments: dict[str, Any] | None = None,
    **flask: Any,
) -> Flask:
    from portal import create_app

    config = portal_config(db_url, **(portal or {}))
    if payments is not None:
        config["payments"] = payments
    return create_app({"GPUCREDIT": config, "SECRET_KEY": "test", **flask})


@dataclass
class Site:
    """What `site` seeded, for assertions."""

    now: datetime
    start: datetime
    tokens: dict[str, str]  # "alice", "bob", "carol", "admin", "service" -> secret


@contextmanager
def _tx(db_url: str) -> Iterator[Session]:
    engine = make_engine(db_url)
    try:
        with make_sessionmaker(engine)() as s, s.begin():
            yield s
    finally:
        engine.dispose()


def seed_site(db_url: str) -> Site:
    from portal.auth import hash_password

    now = utcnow().replace(microsecond=0)
    start = now - timedelta(days=2)
    password_hash = hash_password(PASSWORD)
    with _tx(db_url) as s:
        api.set_price(s, "a100", "2.00", effective_at=start - timedelta(days=30))
        api.set_price(s, "h100", "3.60", effective_at=start - timedelta(days=30))
        for account, people in (
            ("physics", {"alice": "manager", "bob": "member"}),
            ("chemistry", {"carol": "manager"}),
        ):
            api.create_account(s, account)
            for user, role in people.items():
                api.add_member(s, user, account, role=role)
        for user in ("alice", "bob", "carol", "dave"):
            api.set_portal_user(s, user, password_hash=password_hash)
        api.set_portal_user(s, "admin", password_hash=password_hash, is_admin=True)
    with _tx(db_url) as s:
        api.topup(s, "physics", "100", effective_at=start, reference="invoice-1")
        api.grant(s, "physics", "20", effective_at=start, expires_at=now + timedelta(days=5))
    with _tx(db_url) as s:
        api.topup(s, "chemistry", "40", effective_at=start, reference="invoice-2")
    jobs = [  # account, user, job, gpus, limit s, ran s (None: still running), hours after start
        ("physics", "alice", 1001, "h100:2", 7200, 1800, 2),
        ("physics", "bob", 1002, "a100:1", 3600, 3600, 5),
        ("chemistry", "carol", 2001, "a100:2", 7200, 900, 6),
        ("physics", "alice", 1003, "h100:1", 14400, None, 47),
    ]
    for account, user, job_id, gpus, limit, ran, hours in jobs:
        at = start + timedelta(hours=hours)
        with _tx(db_url) as s:
            hold = api.create_hold(
                s, api.HoldRequest(account, user=user, job_id=job_id, gpus=gpus, seconds=limit, at=at)
            ).as_dict()
        if ran is not None:
            with _tx(db_url) as s:
                api.settle_hold(s, hold["id"], ran, at=at + timedelta(seconds=ran))
    tokens = {}
    with _tx(db_url) as s:
        for user, role in (
            ("alice", "user"),
            ("bob", "user"),
            ("carol", "user"),
            ("admin", "admin"),
            ("slurm", "service"),
        ):
            tokens["service" if role == "service" else user] = api.create_token(s, user, role)[1]
    return Site(now=now, start=start, tokens=tokens)


def csrf_token(client: FlaskClient, path: str = "/login") -> str:
    page = client.get(path)
    match = _CSRF.search(page.get_data(as_text=True))
    assert match, f"no CSRF token on {path} ({page.status_code})"
    return match.group(1)


def login(client: FlaskClient, user: str, password: str = PASSWORD) -> Any:
    token = csrf_token(client)
    return client.post("/login", data={"username": user, "password": password, "csrf_token": token})


LoginAs = Callable[[str], FlaskClient]  # the `login_as` fixture


def logged_in(client: FlaskClient, user: str) -> FlaskClient:
    """`client` with `user` logged in (the seeded PASSWORD); the one login helper of the
    portal's tests (a real browser's and a real server's log in over their own transport)."""
    response = login(client, user)
    assert response.status_code == 302, response.get_data(as_text=True)
    return client


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    """A secret file as an admin makes one (the portal refuses one others can read)."""
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


# --- a real browser -----------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
# How Chromium runs on these machines: no sandbox as root, no GPU, and nothing that
# phones home (the network is closed; Playwright gives it a new, empty profile).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 30_000  # the longest any page state may take to appear on 2 busy cores


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}
