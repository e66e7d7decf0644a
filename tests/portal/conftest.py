"""Portal fixtures: an app on a fresh database, the seeded site (tests/support/portal.py),
a logged-in client, and a real browser."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.support.portal import (
    CHROMIUM,
    CHROMIUM_ARGS,
    TIMEOUT_MS,
    LoginAs,
    Site,
    logged_in,
    make_app,
    seed_site,
)


@pytest.fixture
def portal_db(tmp_path: Path, sqlite_template: Path) -> Iterator[str]:
    """A fresh SQLite database for one portal test (API tests that must also run on
    PostgreSQL take the `db_url` fixture instead)."""
    from tests.support.services import new_database

    yield from new_database("sqlite", tmp_path, sqlite_template, None)


@pytest.fixture
def site(portal_db: str) -> Site:
    return seed_site(portal_db)


@pytest.fixture
def app(portal_db: str, site: Site) -> Flask:
    return make_app(portal_db)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def login_as(client: FlaskClient) -> LoginAs:
    return lambda user: logged_in(client, user)


@pytest.fixture(scope="module")
def playwright_api() -> Iterator[Any]:
    """Playwright driving Debian's Chromium (never a browser Playwright downloads);
    without them a browser test fails under CI and skips elsewhere."""
    from tests.support.services import require

    require(
        importlib.util.find_spec("playwright") is not None,
        "playwright",
        "pip install -e '.[dev]' (it drives Debian's chromium; never run 'playwright install')",
    )
    require(os.access(CHROMIUM, os.X_OK), f"Chromium at {CHROMIUM}", "apt-get install chromium")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as playwright:
        yield playwright


@pytest.fixture(scope="module")
def browser(playwright_api: Any) -> Iterator[Any]:
    chromium = playwright_api.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    yield chromium
    chromium.close()
