"""The researcher's and PI's pages: exact figures of the seeded site, and nobody sees
an account, a job or a report that is not theirs."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import Session

from ledger import api
from ledger.jobs import jobruns
from ledger.money import format_credits, parse_credits
from ledger.store.db import make_engine, make_sessionmaker
from ledger.timeutil import format_time, parse_time, utcnow
from tests.support.html_page import Element, Page, cells, descendants
from tests.support.portal import LoginAs, Site, login, make_app


def get_page(client: FlaskClient, path: str, status: int = 200) -> Page:
    response = client.get(path)
    assert response.status_code == status, response.get_data(as_text=True)[:2000]
    return Page(response.get_data(as_text=True))


@contextmanager
def ledger(db_url: str) -> Iterator[Session]:
    engine = make_engine(db_url)
    try:
        with make_sessionmaker(engine)() as s, s.begin():
            yield s
    finally:
        engine.dispose()


def hold_of(db_url: str, job_id: int) -> int:
    with ledger(db_url) as s:
        return api.find_job_holds(s, "default", job_id)[0].id


def job_cells(page: Page, job_id: int) -> dict[str, str]:
    return cells(page, page.rows("data-job")[str(job_id)])


# --- home --------------------------------------------------------------------------------


def test_home_lists_my_accounts_with_role_credit_and_the_sbatch_flags(login_as: LoginAs) -> None:
    page = get_page(login_as("alice"), "/")
    assert set(page.rows("data-account")) == {"physics"}
    assert page.text("role-physics") == "manager"
    assert page.text("available-physics") == "100.00"
    assert page.text("sbatch-physics-a100") == "sbatch -A physics --gres=gpu:a100:1 job.sh"
    assert page.text("sbatch-physics-h100") == "sbatch -A physics --gres=gpu:h100:1 job.sh"
    assert [e.text for e in page.all(data_testid="price-h100")] == ["3.60"]
    assert [e.text for e in page.all(data_testid="price-a100")] == ["2.00"]


def test_the_header_links_to_the_pages_that_exist(login_as: LoginAs) -> None:
    page = get_page(login_as("alice"), "/")
    nav = [e for e in _nav_links(page) if e.tag == "a"]
    assert [(a.text, a.attrs["href"]) for a in nav][:6] == [
        ("Home", "/"),
        ("My jobs", "/my-jobs"),
        ("New job", "/my-jobs/new"),
        ("Jobs", "/jobs"),
        ("Usage", "/usage"),
        ("Quote", "/quote"),
    ]
    assert "Admin" not in [a.text for a in nav]


def _nav_links(page: Page) -> list[Element]:
    return descendants(page, next(e for e in page.elements if e.tag == "nav"))


def test_top_up_is_linked_once_the_payments_pages_exist(portal_db: str, site: Site) -> None:
    app = make_app(portal_db)
    client = app.test_client()
    login(client, "bob")
    page = get_page(client, "/accounts/physics")
    assert ("Top up", "/topup") in [(a.text, a.attrs["href"]) for a in _nav_links(page)]
    tabs = descendants(page, page.one(class_="pages-tabs"))
    assert ("Top up", "/accounts/physics/topup") in [(a.text, a.attrs["href"]) for a in tabs]
    assert client.get("/topup").headers["Location"] == "/accounts/physics/topup"
    del app.view_functions["payments.topup"]
    page = get_page(client, "/accounts/physics")
    assert "Top up" not in [a.text for a in page.elements if a.tag == "a"]
    get_page(client, "/topup", status=404)


def test_someone_in_no_account_is_told_whom_to_ask(login_as: LoginAs) -> None:
    page = get_page(login_as("dave"), "/")
    assert "Ask the PI" in page.text("no-accounts")
    assert page.rows("data-account") == {}
    assert "no-accounts" in {e.attrs.get("data-testid") for e in get_page(login_as("dave"), "/jobs").elements}


def test_the_jobs_and_usage_links_go_straight_to_my_only_account(login_as: LoginAs) -> None:
    client = login_as("bob")
    assert client.get("/jobs").headers["Location"] == "/accounts/physics/jobs"
    assert client.get("/usage").headers["Location"] == "/accounts/physics/usage"


def test_an_admin_chooses_among_all_accounts(login_as: LoginAs) -> None:
    page = get_page(login_as("admin"), "/jobs")
    assert [a.text for a in page.elements if a.tag == "a" and "/accounts/" in a.attrs.get("href", "")] == [
        "chemistry",
        "physics",
    ]


@pytest.mark.parametrize(
    "path", ["/", "/accounts/physics", "/accounts/physics/jobs", "/accounts/physics/usage.csv", "/quote"]
)
def test_pages_send_anonymous_visitors_to_the_login(client: FlaskClient, site: Site, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 302
    assert response.headers["Location"] == f"/login?next={path}"


def test_the_login_brings_a_visitor_back_to_the_page_and_query_they_asked_for(
    client: FlaskClient, site: Site
) -> None:
    response = client.get("/accounts/physics/jobs?page=2")
    assert response.headers["Location"] == "/login?next=/accounts/physics/jobs?page%3D2"


# --- dashboard ---------------------------------------------------------------------------


def test_the_dashboard_shows_credit_held_burn_rate_and_run_out(login_as: LoginAs) -> None:
    page = get_page(login_as("alice"), "/accounts/physics")
    assert page.text("available") == "100.00"
    assert page.text("held") == "14.40"
    assert page.text("debt") == "0.00"
    assert page.text("burn-rate") == "3.60"
    assert page.text("running-jobs") == "1 job on 1 GPU"
    # 100.00 credits at 3.60 an hour last 100,000 s.
    assert page.text("run-out-in") == "1 day 3 h 46 min"
    parse_time(page.text("run-out"))
    assert page.all(data_testid="low-balance") == []


def test_the_dashboard_lists_grants_with_their_windows(login_as: LoginAs, site: Site) -> None:
    page = get_page(login_as("alice"), "/accounts/physics")
    grants = [
        [e.text for e in descendants(page, row) if e.tag == "td"]
        for key, row in page.rows("data-testid").items()
        if key.startswith("grant-")
    ]
    start, expires = format_time(site.start), format_time(site.now + timedelta(days=5))
    assert sorted(grants) == [
        ["grant", "20.00", "14.40", start, expires, "10"],
        ["topup", "100.00", "100.00", start, "never", "10"],
    ]


def test_nothing_running_means_not_running_out(login_as: LoginAs) -> None:
    page = get_page(login_as("carol"), "/accounts/chemistry")
    assert page.text("available") == "39.00"
    assert page.text("burn-rate") == "0.00"
    assert page.text("run-out") == "not running out"


def test_the_balance_at_a_past_or_future_date(login_as: LoginAs, site: Site) -> None:
    client = login_as("alice")
    after_first_job = format_time(site.start + timedelta(hours=3))
    page = get_page(client, f"/accounts/physics?at={after_first_job}")
    assert page.text("at") == after_first_job
    assert (page.text("available-at"), page.text("held-at")) == ("116.40", "0.00")
    # After the promotion expires: only the top-up; the running job's hold is still held.
    later = (site.now + timedelta(days=6)).strftime("%Y-%m-%d")
    page = get_page(client, f"/accounts/physics?at={later}")
    assert page.text("at") == f"{later}T00:00:00Z"
    assert (page.text("available-at"), page.text("held-at")) == ("100.00", "14.40")


def test_a_malformed_date_is_refused_with_its_reason(login_as: LoginAs) -> None:
    page = get_page(login_as("alice"), "/accounts/physics?at=next+week", status=422)
    assert page.one(data_code="invalid_time").text == "at 'next week' is not an ISO 8601 time"


def test_the_low_balance_warning_at_or_below_the_threshold(portal_db: str, site: Site) -> None:
    client = make_app(portal_db, portal={"low_balance_credits": "100"}).test_client()
    login(client, "alice")
    warning = get_page(client, "/accounts/physics").text("low-balance")
    assert warning.startswith(
        "Low balance: 100.00 credits available, at or below the warning level of 100.00."
    )
    client = make_app(portal_db, portal={"low_balance_credits": "99.99"}).test_client()
    login(client, "alice")
    assert get_page(client, "/accounts/physics").all(data_testid="low-balance") == []


# --- jobs --------------------------------------------------------------------------------


def test_a_manager_sees_every_job_of_the_account(login_as: LoginAs) -> None:
    page = get_page(login_as("alice"), "/accounts/physics/jobs")
    assert list(page.rows("data-job")) == ["1003", "1002", "1001"]
    running = job_cells(page, 1003)
    assert (running["user"], running["state"], running["estimate"]) == ("alice", "running", "14.40")
    assert job_cells(page, 1002) == {"user": "bob", "state": "settled", "cost": "2.00", "estimate": ""}
    assert job_cells(page, 1001) == {"user": "alice", "state": "settled", "cost": "3.60", "estimate": ""}


def test_a_running_jobs_cost_so_far_is_the_ledgers_charge_for_its_seconds(
    login_as: LoginAs, portal_db: str
) -> None:
    page = get_page(login_as("alice"), f"/accounts/physics/jobs/{hold_of(portal_db, 1003)}")
    elapsed = int(page.text("elapsed"))
    assert 3600 <= elapsed <= 14400  # it started an hour before the site was seeded
    assert page.text("cost") == format_credits(api.charge_for(3_600_000, elapsed))
    assert page.text("estimate") == "14.40"
    assert page.text("rate") == "3.60"


def test_a_member_sees_only_their_own_jobs(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("bob")
    page = get_page(client, "/accounts/physics/jobs")
    assert list(page.rows("data-job")) == ["1002"]
    get_page(client, f"/accounts/physics/jobs/{hold_of(portal_db, 1001)}", status=404)
    assert get_page(client, f"/accounts/physics/jobs/{hold_of(portal_db, 1002)}").text("cost") == "2.00"


def test_jobs_filter_by_state(login_as: LoginAs) -> None:
    client = login_as("alice")
    assert list(get_page(client, "/accounts/physics/jobs?state=running").rows("data-job")) == ["1003"]
    assert list(get_page(client, "/accounts/physics/jobs?state=settled").rows("data-job")) == ["1002", "1001"]
    assert (
        get_page(client, "/accounts/physics/jobs?state=failed").text("no-jobs") == "No jobs in state failed."
    )
    get_page(client, "/accounts/physics/jobs?state=bogus", status=422)


def test_jobs_page_by_page(portal_db: str, site: Site) -> None:
    client = make_app(portal_db, portal={"page_size": 2}).test_client()
    login(client, "alice")
    page = get_page(client, "/accounts/physics/jobs")
    assert list(page.rows("data-job")) == ["1003", "1002"]
    older = get_page(client, page.one(data_testid="older").attrs["href"])
    assert list(older.rows("data-job")) == ["1001"]
    assert older.all(data_testid="older") == []


def test_a_finished_jobs_entries_show_its_hold_and_final_charge(login_as: LoginAs, portal_db: str) -> None:
    page = get_page(login_as("alice"), f"/accounts/physics/jobs/{hold_of(portal_db, 1001)}")
    assert page.text("state") == "settled"
    assert page.text("gpus") == "h100:2"
    assert page.text("elapsed") == "1800"
    assert page.text("cost") == "3.60"
    entries = [
        (row.attrs["data-kind"], *(e.text for e in descendants(page, row) if e.attrs.get("data-testid")))
        for row in page.rows("data-entry").values()
    ]
    assert entries == [
        ("hold", "credit held", "0.00", "14.40", ""),
        ("settle", "final charge", "3.60", "-14.40", ""),
    ]


def test_a_node_fail_refund_is_shown_as_such(login_as: LoginAs, portal_db: str, site: Site) -> None:
    hold_id = hold_of(portal_db, 1002)
    ran_from = site.start + timedelta(hours=5)
    with ledger(portal_db) as s:
        hold = api.get_hold(s, hold_id)
        settle_entry = api.hold_entries(s, hold_id)[-1]["id"]
        api.adjust_hold(s, hold_id, 0, reason="NODE_FAIL: refunded (policy.refund_node_fail)")
        jobruns.upsert_job_runs(
            s,
            [
                jobruns.JobRunRow(
                    "default",
                    1002,
                    0,
                    hold.submitted_at,
                    "1002",
                    "physics",
                    "bob",
                    None,
                    "NODE_FAIL",
                    ran_from,
                    ran_from + timedelta(hours=1),
                    3600,
                    "a100:1",
                    "n1",
                    hold_id,
                    "node_fail_refund",
                    0,
                    utcnow(),
                )
            ],
        )
    client = login_as("bob")
    assert job_cells(get_page(client, "/accounts/physics/jobs"), 1002) == {
        "user": "bob",
        "state": "node_fail (refunded)",
        "cost": "0.00",
        "estimate": "",
    }
    page = get_page(client, f"/accounts/physics/jobs/{hold_id}")
    assert page.text("state") == "node_fail (refunded: the node failed)"
    adjustment = [row for row in page.rows("data-entry").values() if row.attrs["data-kind"] == "adjust"]
    assert cells(page, adjustment[0]) == {
        "what": "NODE_FAIL refund",
        "charge": "-2.00",
        "held": "0.00",
        "links": f"entry {settle_entry}",
    }
    assert list(get_page(client, "/accounts/physics/jobs?state=node_fail").rows("data-job")) == ["1002"]


# --- usage -------------------------------------------------------------------------------


def test_usage_by_gpu_type_table_and_chart(login_as: LoginAs) -> None:
    page = get_page(login_as("alice"), "/accounts/physics/usage?by=gres")
    table = {key: cells(page, row) for key, row in page.rows("data-key").items()}
    assert table == {
        "a100": {"charged": "2.00", "gpu-seconds": "3600", "jobs": "1"},
        "h100": {"charged": "3.60", "gpu-seconds": "3600", "jobs": "1"},
    }
    chart = page.one(data_testid="usage-chart")
    assert chart.tag == "svg"
    bars = [e for e in page.elements if e.tag == "rect" and "data-value" in e.attrs]
    assert [(b.attrs["data-label"], b.attrs["data-value"], b.text) for b in bars] == [
        ("a100", "2.00", "a100: 2.00 credits"),
        ("h100", "3.60", "h100: 3.60 credits"),
    ]
    assert int(bars[1].attrs["height"]) > int(bars[0].attrs["height"]) > 0


def test_the_csv_has_the_tables_figures(login_as: LoginAs) -> None:
    client = login_as("alice")
    page = get_page(client, "/accounts/physics/usage?by=user&from=&to=")
    link = page.one(data_testid="csv").attrs["href"]
    response = client.get(link)
    assert response.status_code == 200
    assert response.mimetype == "text/csv"
    assert response.headers["Content-Disposition"] == 'attachment; filename="usage-physics-by-user.csv"'
    rows = list(csv.DictReader(io.StringIO(response.get_data(as_text=True))))
    assert rows == [
        {"user": "alice", "charged": "3.60", "gpu_seconds": "3600", "jobs": "1"},
        {"user": "bob", "charged": "2.00", "gpu_seconds": "3600", "jobs": "1"},
    ]
    table = {key: cells(page, row) for key, row in page.rows("data-key").items()}
    assert {r["user"]: r["charged"] for r in rows} == {k: v["charged"] for k, v in table.items()}


def test_usage_by_day_adds_up_and_a_range_excludes_what_is_outside(login_as: LoginAs, site: Site) -> None:
    client = login_as("alice")
    page = get_page(client, "/accounts/physics/usage")
    charged = [parse_credits(e.text) for e in page.all(data_testid="charged")]
    assert format_credits(sum(charged)) == "5.60"
    assert len([e for e in page.elements if e.tag == "rect"]) == len(charged)
    before = (site.start - timedelta(days=1)).strftime("%Y-%m-%d")
    page = get_page(client, f"/accounts/physics/usage?from=&to={before}")
    assert page.text("no-usage") == "Nothing was charged in this range."
    assert page.all(data_testid="usage-chart") == []


def test_a_member_sees_only_their_own_usage(login_as: LoginAs) -> None:
    page = get_page(login_as("bob"), "/accounts/physics/usage?by=gres")
    assert {key: cells(page, row)["charged"] for key, row in page.rows("data-key").items()} == {
        "a100": "2.00"
    }


def test_efficiency_where_an_agent_measured_and_where_none_did(login_as: LoginAs, portal_db: str) -> None:
    with ledger(portal_db) as s:
        api.add_gpu_usage(s, [api.UsageDelta("default", 1001, 0, "n1", "h100", 3600, 2700, 0, 0)])
    page = get_page(login_as("alice"), "/accounts/physics/efficiency")
    rows = {key: cells(page, row) for key, row in page.rows("data-run").items()}
    assert rows == {
        "default/1001/0": {"allocated": "3600", "measured": "3600", "busy": "2700", "efficiency": "0.750"},
        "default/1002/0": {"allocated": "3600", "no-nvml": "no NVML data"},
    }


# --- quote -------------------------------------------------------------------------------


def test_a_quote_with_its_sbatch_line(login_as: LoginAs) -> None:
    page = get_page(login_as("alice"), "/quote?account=physics&gres=h100&count=2&time=02:00:00&partition=")
    assert (page.text("cost"), page.text("available"), page.text("fits")) == ("14.40", "100.00", "yes")
    assert page.text("sbatch") == "sbatch -A physics --gres=gpu:h100:2 -t 2:00:00 job.sh"


def test_a_quote_that_does_not_fit_says_so(login_as: LoginAs) -> None:
    page = get_page(
        login_as("carol"), "/quote?account=chemistry&gres=h100&count=4&time=1-00:00:00&partition=gpu"
    )
    assert (page.text("cost"), page.text("available"), page.text("fits")) == ("345.60", "39.00", "no")
    assert page.text("sbatch") == "sbatch -A chemistry -p gpu --gres=gpu:h100:4 -t 1-00:00:00 job.sh"
    assert page.text("does-not-fit").startswith("This job would be refused at submission")


def test_a_quote_with_a_bad_spec_explains_it(login_as: LoginAs) -> None:
    client = login_as("alice")
    page = get_page(client, "/quote?account=physics&gres=h100&count=1&time=2h", status=422)
    assert page.text("quote-error") == "time limit '2h' is not [D-]HH:MM:SS"
    page = get_page(client, "/quote?account=physics&gres=v100&count=1&time=1:00:00", status=422)
    assert page.text("quote-error").startswith("no price for GPU type 'v100'")


# --- nobody sees another account -----------------------------------------------------------


def test_another_accounts_pages_answer_404_like_a_missing_one(login_as: LoginAs, portal_db: str) -> None:
    chemistry_hold = hold_of(portal_db, 2001)
    client = login_as("bob")
    for path in (
        "/accounts/chemistry",
        "/accounts/chemistry/jobs",
        f"/accounts/chemistry/jobs/{chemistry_hold}",
        f"/accounts/physics/jobs/{chemistry_hold}",
        "/accounts/chemistry/usage",
        "/accounts/chemistry/usage.csv",
        "/accounts/chemistry/efficiency",
        "/quote?account=chemistry&gres=a100&count=1&time=1:00:00",
        "/accounts/nosuch",
    ):
        get_page(client, path, status=404).one(data_code="not_found")
    assert get_page(client, "/accounts/chemistry", status=404).one(data_code="not_found").text == get_page(
        client, "/accounts/nosuch", status=404
    ).one(data_code="not_found").text.replace("nosuch", "chemistry")


def test_the_job_output_tail_is_shown_to_the_jobs_own_user_only(
    login_as: LoginAs, client: FlaskClient, portal_db: str, tmp_path
) -> None:
    import os
    import pwd

    from portal.auth import hash_password
    from tests.support.portal import PASSWORD

    me = pwd.getpwuid(os.getuid()).pw_name  # the job's user must own the file on this host
    output = tmp_path / "slurm-4242.out"
    output.write_text("".join(f"step {n}\n" for n in range(1, 61)))
    link = tmp_path / "link.out"
    link.symlink_to(output)
    with ledger(portal_db) as s:
        api.add_member(s, me, "physics")
        api.set_portal_user(s, me, password_hash=hash_password(PASSWORD))
        mine = api.create_hold(
            s,
            api.HoldRequest(
                "physics", user=me, job_id=4242, gpus="a100:1", seconds=600, output_path=str(output)
            ),
        )
        linked = api.create_hold(
            s,
            api.HoldRequest(
                "physics", user=me, job_id=4243, gpus="a100:1", seconds=600, output_path=str(link)
            ),
        )
    page = get_page(login_as(me), f"/accounts/physics/jobs/{mine.id}")
    assert page.text("output-tail") == " ".join(f"step {n}" for n in range(11, 61))  # the last 50 lines
    no_tail = client.get(f"/accounts/physics/jobs/{linked.id}").get_data(as_text=True)
    assert 'data-testid="output-tail"' not in no_tail  # never through a symlink
    manager_view = login_as("alice").get(f"/accounts/physics/jobs/{mine.id}").get_data(as_text=True)
    assert "step 60" not in manager_view  # the manager sees the job, not its output
