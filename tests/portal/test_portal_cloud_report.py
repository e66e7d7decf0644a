"""/admin/cloud: the month's cloud report in the portal, and its CSV.

The page renders ledger.api.cloud_report, fed with the inputs accounting_bridge.cloud
gathers (here from a hand-written journal and config, through the same
`report_inputs` the CLI uses), so its table and its CSV are the CLI's to the character.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from accounting_bridge.cloud.report import ReportInputs, report_inputs
from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from portal.admin.cloud import set_cloud_source
from tests.support.cloud_report import (
    INSTANCE_PRICE_UCREDITS_PER_HOUR,
    JOURNAL_LINES,
    NOVEMBER_CSV,
    NOVEMBER_NOW,
    seed_november,
)
from tests.support.portal import logged_in, make_app

_ROW = re.compile(r'<tr data-partition="([^"]*)" data-account="([^"]*)"[^>]*>(.*?)</tr>', re.S)
_CELL = re.compile(r"<td[^>]*>(.*?)</td>", re.S)


def rows(html: str) -> list[list[str]]:
    return [[p, a, *_CELL.findall(body)[2:]] for p, a, body in _ROW.findall(html)]


@pytest.fixture
def inputs(tmp_path: Path) -> ReportInputs:
    (tmp_path / "cloud").mkdir()
    (tmp_path / "cloud" / "instances.jsonl").write_text("\n".join(JOURNAL_LINES) + "\n", encoding="utf-8")
    return report_inputs(
        {"partitions": {"cloud": {"site": "cloud"}}, "cloud": cloud_config(tmp_path / "cloud")}
    )


@pytest.fixture
def app(portal_db: str, monkeypatch: pytest.MonkeyPatch) -> Flask:
    from portal.auth import hash_password
    from tests.support.portal import PASSWORD

    engine = make_engine(portal_db)
    with make_sessionmaker(engine)() as s, s.begin():
        seed_november(s)
        api.add_member(s, "alice", "physics", role="manager")
        api.set_portal_user(s, "alice", password_hash=hash_password(PASSWORD))
        api.set_portal_user(s, "admin", password_hash=hash_password(PASSWORD), is_admin=True)
    engine.dispose()
    monkeypatch.setattr("portal.admin.cloud.utcnow", lambda: NOVEMBER_NOW)
    return make_app(portal_db)


@pytest.fixture
def admin(app: Flask, inputs: ReportInputs) -> FlaskClient:
    set_cloud_source(app, lambda: inputs)
    return logged_in(app.test_client(), "admin")


def test_the_page_shows_the_months_table(admin: FlaskClient) -> None:
    response = admin.get("/admin/cloud?month=2026-11")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert rows(html) == [line.split(",") for line in NOVEMBER_CSV.splitlines()[1:]]
    assert "credits at the configured instance prices (cloud.prices_ucredits_per_hour)" in html
    assert 'href="/admin/cloud.csv?month=2026-11"' in html


def test_the_page_shows_this_month_by_default(admin: FlaskClient) -> None:
    html = admin.get("/admin/cloud").get_data(as_text=True)
    assert 'name="month" type="month" required value="2026-11"' in html
    assert rows(html)[-1] == ["*", "*", "2400", "0.67", "24.00", "720", "0.72", "2040", "85.0%"]


def test_the_csv_is_the_clis_to_the_character(admin: FlaskClient) -> None:
    response = admin.get("/admin/cloud.csv?month=2026-11")
    assert response.status_code == 200
    assert response.mimetype == "text/csv"
    assert response.headers["Content-Disposition"] == 'attachment; filename="cloud-report-2026-11.csv"'
    assert response.get_data(as_text=True) == NOVEMBER_CSV


@pytest.mark.parametrize("path", ["/admin/cloud?month=2026-13", "/admin/cloud.csv?month=13-2026"])
def test_a_bad_month_is_refused_with_the_reason(admin: FlaskClient, path: str) -> None:
    response = admin.get(path)
    assert response.status_code == 422
    html = response.get_data(as_text=True)
    assert "month must be YYYY-MM (e.g. 2026-11)" in html
    assert rows(html) == []


@pytest.mark.parametrize("path", ["/admin/cloud?month=2026-11", "/admin/cloud.csv?month=2026-11"])
def test_anyone_but_an_admin_finds_no_such_page(app: Flask, inputs: ReportInputs, path: str) -> None:
    """The admin area's rule (portal/admin/blueprints.py): 404 for a non-admin, as if it
    did not exist; here an account's own manager, whose jobs are in the report."""
    set_cloud_source(app, lambda: inputs)
    assert logged_in(app.test_client(), "alice").get(path).status_code == 404
    visitor = app.test_client().get(path)
    assert visitor.status_code == 302
    assert visitor.headers["Location"].startswith("/login?next=/admin/cloud")


def test_without_the_journal_the_page_says_so_rather_than_bill_nothing(app: Flask) -> None:
    client = logged_in(app.test_client(), "admin")
    for path in ("/admin/cloud?month=2026-11", "/admin/cloud.csv?month=2026-11"):
        response = client.get(path)
        assert response.status_code == 503
        assert "This portal has no cloud instance journal" in response.get_data(as_text=True)


def cloud_config(state_dir: Path) -> dict[str, Any]:
    return {
        "region": "us-east-1",
        "image_id": "ami-12c6146b",
        "state_dir": str(state_dir),
        "nodes": {"cloud[1-2]": "h100"},
        "instance_types": {"h100": "p5.48xlarge"},
        "prices_ucredits_per_hour": {"p5.48xlarge": INSTANCE_PRICE_UCREDITS_PER_HOUR},
    }


def test_gpucredit_serve_hands_the_portal_the_journal(
    app: Flask, inputs: ReportInputs, tmp_path: Path
) -> None:
    """What `gpucredit serve` does to the app it serves (gpucredit/portal_serve.py): the
    page reads the configured journal, on each request."""
    from gpucredit.portal_serve import install_cloud_source

    app.config["GPUCREDIT"]["cloud"] = cloud_config(tmp_path / "cloud")
    app.config["GPUCREDIT"]["partitions"] = {"cloud": {"site": "cloud"}}
    assert install_cloud_source(app) is True
    client = logged_in(app.test_client(), "admin")
    assert client.get("/admin/cloud.csv?month=2026-11").get_data(as_text=True) == NOVEMBER_CSV
    with open(tmp_path / "cloud" / "instances.jsonl", "a", encoding="utf-8") as journal:
        journal.write("{not json\n")
    broken = client.get("/admin/cloud?month=2026-11")
    assert broken.status_code == 503
    assert "The cloud instance journal cannot be read" in broken.get_data(as_text=True)
    assert rows(broken.get_data(as_text=True)) == []


def test_gpucredit_serve_on_a_site_without_a_cloud_wires_nothing(app: Flask) -> None:
    from gpucredit.portal_serve import install_cloud_source

    assert install_cloud_source(app) is False
    app.config["GPUCREDIT"]["cloud"] = {"region": "us-east-1"}  # no image_id: unreadable
    assert install_cloud_source(app) is False
    client = logged_in(app.test_client(), "admin")
    assert client.get("/admin/cloud?month=2026-11").status_code == 503
