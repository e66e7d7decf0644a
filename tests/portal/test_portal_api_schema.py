"""The API against its own OpenAPI document: schemathesis generates requests for every
operation the document lists (valid ones, and ones that break the schema) on a seeded
SQLite site with an admin token, and fails on any 5xx, any response the document does
not describe (status, content type, body), and any invalid request that is accepted.

A request the document allows may still be refused for what it means (an unpriced GPU
type, a grant that ends before it starts, a hold beyond the credit: 422 or 402, as the
document says), so schemathesis's "valid data is accepted" check does not apply.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from flask import Flask
from hypothesis import HealthCheck, settings

from tests.support.fake_jobs import FakeBackend
from tests.support.portal import bearer, make_app, seed_site
from tests.support.services import new_database

# The document needs no database: it is read from an app that never opens its store
# (collection stays cheap); the requests go to the seeded app below.
schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", make_app("sqlite:///:memory:"))


class Seeded:
    def __init__(self, app: Flask, admin_token: str) -> None:
        self.app = app
        self.headers = bearer(admin_token)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Seeded]:
    databases = new_database("sqlite", tmp_path_factory.mktemp("schema"), sqlite_template, None)
    db_url = next(databases)
    site = seed_site(db_url)
    # Thousands of requests a minute: the per-token rate limit is tested elsewhere.
    app = make_app(db_url, portal={"api_rate_limit": "1000000 per minute"})
    app.extensions["gpucredit.jobs_backend"] = FakeBackend()  # the jobs API without Slurm
    yield Seeded(app, site.tokens["admin"])
    app.extensions["gpucredit.engine"].dispose()


@schema.parametrize()
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_its_document_says(case: schemathesis.Case, seeded: Seeded) -> None:
    # A case for a bearer-token operation carries a made-up token, replaced by the admin's
    # here; a negative case may leave the header out instead, and must then be refused
    # (401) as sent, not given the admin's token (which made such a case "accepted").
    headers = seeded.headers if "Authorization" in (case.headers or {}) else {}
    case.call_and_validate(
        app=seeded.app, headers=headers, excluded_checks=[schemathesis.checks.positive_data_acceptance]
    )
