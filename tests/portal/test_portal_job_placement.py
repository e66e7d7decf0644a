"""The New job page's quote of a routed job (ledger.api.route_quote): where it may run,
each partition's cost and verdict as sbatch will word them, and the quote at the dearest
allowed place, before anything is submitted (docs/routing.md).

The seeded site, with onprem and cloud tagged, an h100 hour at 3.60 on-premise and 5.40
in the cloud, and the cloud held back 600 s.
"""

from __future__ import annotations

import pytest
from flask import Flask

from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from tests.support.fake_jobs import FakeBackend, seeded_backend
from tests.support.html_page import Page, cells
from tests.support.portal import LoginAs, Site

JOB = "account=physics&gres=h100&count=2&time_limit=02:00:00"


@pytest.fixture
def routed(app: Flask, site: Site, portal_db: str) -> FakeBackend:
    app.config["GPUCREDIT"]["partitions"] = {"onprem": {"site": "onprem"}, "cloud": {"site": "cloud"}}
    app.config["GPUCREDIT"]["routing"] = {"accounts": {}, "burst_after_seconds": 600}
    engine = make_engine(portal_db)
    with make_sessionmaker(engine)() as s, s.begin():
        api.set_price(s, "h100", "5.40", partition="cloud", effective_at=site.start)
    engine.dispose()
    backend = seeded_backend(site.start)
    app.extensions["gpucredit.jobs_backend"] = backend
    return backend


def preview(login_as: LoginAs, query: str) -> Page:
    answer = login_as("bob").get(f"/my-jobs/new/preview?{JOB}&{query}")
    assert answer.status_code == 200, answer.get_data(as_text=True)[:2000]
    return Page(answer.get_data(as_text=True))


def placement(shown: Page) -> dict[str, tuple[str, str]]:
    rows = {name: cells(shown, row) for name, row in shown.rows("data-partition").items()}
    return {name: (row["partition-cost"], row["verdict"]) for name, row in rows.items()}


def test_a_job_allowed_the_cloud_is_quoted_at_the_dearest_place_it_may_run(
    login_as: LoginAs, routed: FakeBackend
) -> None:
    shown = preview(login_as, "max_cost=25&cloud=yes")
    # 2×h100 for 2 h: 14.40 on-premise, 21.60 in the cloud (added once it has waited 600 s).
    assert placement(shown) == {
        "onprem": ("14.40", "allowed"),
        "cloud": ("21.60", "allowed, once it has waited 600 s"),
    }
    assert (shown.text("cost"), shown.text("fits")) == ("21.60", "yes")
    assert routed.submits == []


def test_each_partition_left_out_says_why_and_none_left_is_a_refusal(
    login_as: LoginAs, routed: FakeBackend
) -> None:
    over = preview(login_as, "max_cost=20&cloud=yes")
    assert placement(over) == {"onprem": ("14.40", "allowed"), "cloud": ("21.60", "over the limit")}
    assert over.text("cost") == "14.40"
    not_allowed = preview(login_as, "max_cost=25&cloud=no")
    assert placement(not_allowed)["cloud"] == ("21.60", "cloud not allowed")
    refused = preview(login_as, "max_cost=10&cloud=yes")
    assert refused.text("fits") == "no"
    assert refused.text("does-not-fit") == (
        "This job would be refused at submission: no partition is allowed (over the limit)."
    )


def test_a_job_without_a_limit_or_the_cloud_keeps_the_plain_quote(
    login_as: LoginAs, routed: FakeBackend
) -> None:
    shown = preview(login_as, "")
    assert shown.all(data_testid="placement") == []
    assert (shown.text("cost"), shown.text("fits")) == ("14.40", "yes")


def test_a_region_keeps_the_cloud_to_its_partitions_and_an_unknown_one_is_the_fields_error(
    app: Flask, login_as: LoginAs, routed: FakeBackend
) -> None:
    app.config["GPUCREDIT"]["partitions"]["cloud"]["region"] = "us-west-2"
    app.extensions.pop("gpucredit.routing", None)
    form = login_as("bob").get("/my-jobs/new").get_data(as_text=True)
    assert '<option value="us-west-2">us-west-2</option>' in form
    assert placement(preview(login_as, "cloud=yes&region=us-west-2"))["cloud"] == (
        "21.60",
        "allowed, once it has waited 600 s",
    )
    answer = login_as("bob").get(f"/my-jobs/new/preview?{JOB}&cloud=yes&region=eu-west-1")
    assert "no cloud partition is in region eu-west-1 (regions: us-west-2)" in answer.get_data(as_text=True)
