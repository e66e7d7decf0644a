"""The job pages (New job, My jobs, a job's page) on the seeded site, with the fake backend
standing in for Slurm: the quote and sbatch line of what was typed, what is submitted
(and that a refusal or bad input submits nothing), who sees and cancels which job (the
API's rule), and that every form needs its CSRF token."""

from __future__ import annotations

import os
import pwd
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from flask import Flask
from flask.testing import FlaskClient

from ledger import api
from ledger.jobs.retries import RetryPolicy
from ledger.store.db import make_engine, make_sessionmaker
from ledger.timeutil import format_time
from portal.auth import hash_password
from portal.jobs.backend import JobSpec
from tests.support.fake_jobs import FakeBackend, seeded_backend
from tests.support.html_page import Page, cells
from tests.support.portal import PASSWORD, LoginAs, Site, csrf_token

SCRIPT = "#!/bin/bash\npython train.py\n"
FORM = {
    "account": "physics",
    "script": SCRIPT.replace("\n", "\r\n"),  # as a browser sends a textarea
    "gres": "h100",
    "count": "2",
    "time_limit": "02:00:00",
    "name": "train",
    "cpus": "8",
    "memory": "64G",
    "max_cost": "25",
    "cloud": "yes",
}
SBATCH = (
    "sbatch -A physics --gres=gpu:h100:2 -t 02:00:00 -J train -c 8 --mem 64G"
    " --comment=gpucredit:max_cost=25,cloud=yes job.sh"
)
INSUFFICIENT = (
    "sbatch: error: gpucredit: this job would cost ~14.40 credits (2×h100 × 2 h) but only 0.00 "
    "are available in physics. Top up at https://portal/accounts/physics/topup\n"
    "sbatch: error: Batch job submission failed: Unspecified error\n"
)


@pytest.fixture
def fake(app: Flask, site: Site) -> FakeBackend:
    backend = seeded_backend(site.start)
    app.extensions["gpucredit.jobs_backend"] = backend
    app.config["GPUCREDIT"]["slurm"]["cluster"] = "default"  # the seeded holds' cluster
    return backend


def page(client: FlaskClient, path: str, status: int = 200) -> Page:
    response = client.get(path)
    assert response.status_code == status, response.get_data(as_text=True)[:2000]
    return Page(response.get_data(as_text=True))


def post(client: FlaskClient, path: str, data: dict[str, str], token_from: str = "/my-jobs/new") -> Any:
    return client.post(path, data={**data, "csrf_token": csrf_token(client, token_from)})


def test_new_job_shows_the_ledgers_quote_and_the_sbatch_line_of_what_was_typed(
    login_as: LoginAs, fake: FakeBackend
) -> None:
    client = login_as("bob")
    empty = page(client, "/my-jobs/new")
    # The defaults priced at once: 1×a100 for 1 h at 2.00 per GPU-hour.
    assert (empty.text("cost"), empty.text("sbatch")) == (
        "2.00",
        "sbatch -A physics --gres=gpu:a100:1 -t 01:00:00 job.sh",
    )
    query = "&".join(f"{key}={value}" for key, value in FORM.items() if key != "script")
    preview = page(client, f"/my-jobs/new/preview?{query}")
    # 2×h100 for 2 h at 3.60: 14.40; physics has 100 + 20 granted - 3.60 - 2.00 spent - 14.40 held.
    assert (preview.text("cost"), preview.text("available"), preview.text("fits")) == (
        "14.40",
        "100.00",
        "yes",
    )
    assert preview.text("sbatch") == SBATCH
    priced = post(client, "/my-jobs/new", {**FORM, "action": "quote"})
    assert priced.status_code == 200
    assert Page(priced.get_data(as_text=True)).text("sbatch") == SBATCH
    assert fake.submits == []  # pricing submits nothing


def test_the_sbatch_line_is_shell_quoted() -> None:
    from portal.jobs.spec import sbatch_line

    spec = JobSpec("physics", SCRIPT, "h100:1", "01:00:00")
    assert sbatch_line(spec, "my job.sh") == "sbatch -A physics --gres=gpu:h100:1 -t 01:00:00 'my job.sh'"


def test_a_submitted_job_goes_to_the_backend_as_the_user_once(login_as: LoginAs, fake: FakeBackend) -> None:
    client = login_as("bob")
    key = "0123456789abcdef0123456789abcdef"
    sent = post(client, "/my-jobs/new", {**FORM, "action": "submit", "request_key": key})
    assert (sent.status_code, sent.headers["Location"]) == (302, "/my-jobs/5001")
    assert fake.submits == [
        (
            "bob",
            JobSpec(
                "physics",
                SCRIPT,
                "h100:2",
                "02:00:00",
                name="train",
                cpus=8,
                memory="64G",
                max_cost="25",
                cloud="yes",
            ),
        )
    ]
    shown = page(client, "/my-jobs/5001")
    assert shown.one(role="status").text == (
        "Submitted job 5001. gpucredit: ~0.06 credits (1×h100 × 1 min), 100.00 available"
    )
    assert (shown.text("state"), shown.text("reason")) == ("queued", "waiting for GPUs")
    again = post(client, "/my-jobs/new", {**FORM, "action": "submit", "request_key": key})
    assert (again.status_code, again.headers["Location"]) == (302, "/my-jobs/5001")
    assert len(fake.submits) == 1  # a re-sent form returns the first job


@pytest.mark.parametrize(
    ("stderr", "status", "code", "message"),
    [
        (
            INSUFFICIENT,
            402,
            "insufficient_credits",
            "gpucredit: this job would cost ~14.40 credits (2×h100 × 2 h) but only 0.00 are available in "
            "physics. Top up at https://portal/accounts/physics/topup Batch job submission failed: "
            "Unspecified error",
        ),
        (
            "sbatch: error: gpucredit: concurrent_gpus: physics would use 9 GPUs, its cap is 8"
            " (job: 2×h100 × 2 h)\n",
            429,
            "concurrent_gpus",
            "gpucredit: concurrent_gpus: physics would use 9 GPUs, its cap is 8 (job: 2×h100 × 2 h)",
        ),
    ],
)
def test_a_refusal_shows_the_ledgers_code_and_sbatchs_words_and_submits_nothing(
    login_as: LoginAs, fake: FakeBackend, stderr: str, status: int, code: str, message: str
) -> None:
    client = login_as("bob")
    fake.refuse_with = stderr
    refused = post(client, "/my-jobs/new", {**FORM, "action": "submit"})
    assert refused.status_code == status
    shown = Page(refused.get_data(as_text=True))
    assert (shown.text("refusal-code"), shown.text("refusal-message")) == (code, message)
    assert shown.text("sbatch") == SBATCH  # the form comes back as typed, priced
    assert f">{SCRIPT}</textarea>" in refused.get_data(as_text=True)  # its lines end in LF again
    assert fake.submits == [] and len(fake.jobs_by_id) == 5


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"script": "python train.py"}, "script", "script: must start with a #! line (like #!/bin/bash)"),
        ({"time_limit": "soon"}, "time_limit", "time_limit: must be [D-]HH:MM:SS"),
        ({"time_limit": "00:00:00"}, "time_limit", "time_limit: must be more than zero"),
        ({"cpus": "eight"}, "cpus", "cpus: must be a whole number from 1 to 4096"),
        ({"cpus": "0"}, "cpus", "cpus: must be a whole number from 1 to 4096"),
        ({"memory": "lots"}, "memory", "memory: must be a number with an optional K, M, G or T (like 16G)"),
        ({"max_cost": "-5"}, "max_cost", "max_cost: must be credits, like 25 or 12.5"),
        ({"name": "my run"}, "name", "name: must be 1 to 64 letters, digits, '_', '.' or '-'"),
        ({"cloud": "maybe"}, "cloud", "cloud: must be yes or no"),
        ({"count": "x"}, "gpus", "gpus: must be TYPE:N, like h100:1"),
        ({"account": "chemistry"}, "account", "account: bob is not a member of account chemistry"),
        ({"retry_on": "exit:75"}, "retry.max", "retry.max: must be a whole number from 1 to 10"),
        (
            {"retry_max": "2", "retry_on": "oom"},
            "retry.on",
            "retry.on: 'oom' is not node_fail or exit:1..255",
        ),
        (
            {"retry_max": "2", "retry_on": "exit:75", "retry_backoff_seconds": "soon"},
            "retry.backoff_seconds",
            "retry.backoff_seconds: must be whole seconds from 0 to 3600",
        ),
    ],
)
def test_bad_input_names_the_field_and_submits_nothing(
    login_as: LoginAs, fake: FakeBackend, change: dict[str, str], field: str, message: str
) -> None:
    client = login_as("bob")
    answer = post(client, "/my-jobs/new", {**FORM, **change, "action": "submit"})
    assert answer.status_code == 422
    error = Page(answer.get_data(as_text=True)).one(data_testid="field-error")
    assert (error.attrs["data-field"], error.text) == (field, message)
    assert fake.submits == []


def test_an_unpriced_gpu_type_is_the_gpus_fields_fault(login_as: LoginAs, fake: FakeBackend) -> None:
    answer = login_as("bob").get("/my-jobs/new/preview?account=physics&gres=v100&count=1&time_limit=01:00:00")
    assert answer.status_code == 422
    assert Page(answer.get_data(as_text=True)).one(data_testid="field-error").attrs["data-field"] == "gpus"


def test_the_live_quote_prices_only_the_viewers_accounts(login_as: LoginAs, fake: FakeBackend) -> None:
    answer = login_as("bob").get(
        "/my-jobs/new/preview?account=chemistry&gres=a100&count=1&time_limit=01:00:00"
    )
    assert answer.status_code == 422
    shown = Page(answer.get_data(as_text=True))
    error = shown.one(data_testid="field-error")
    assert (error.attrs["data-field"], error.text) == (
        "account",
        "account: bob is not a member of account chemistry",
    )
    assert not shown.all(data_testid="available")  # chemistry's balance is not bob's to read


def test_every_job_form_needs_its_csrf_token(login_as: LoginAs, fake: FakeBackend) -> None:
    client = login_as("bob")
    for path, data in (
        ("/my-jobs/new", {**FORM, "action": "submit"}),
        ("/my-jobs/1004/cancel", {}),
    ):
        answer = client.post(path, data=data)
        assert answer.status_code == 400, path
        assert Page(answer.get_data(as_text=True)).one(data_code="csrf").text == (
            "the form expired or came from another site; reload and retry"
        )
    assert (fake.submits, fake.cancels) == ([], [])


def rows(shown: Page, table: str) -> dict[int, dict[str, str]]:
    body = shown.one(data_testid=table)
    found = [e for e in shown.elements[body.index : body.end] if e.tag == "tr" and "data-job" in e.attrs]
    return {int(row.attrs["data-job"]): cells(shown, row) for row in found}


def cancel_buttons(shown: Page) -> set[int]:
    return {
        int(e.attrs["data-testid"].removeprefix("cancel-"))
        for e in shown.elements
        if e.attrs.get("data-testid", "").startswith("cancel-")
    }


def test_my_jobs_shows_queued_reasons_running_costs_and_finished_costs(
    login_as: LoginAs, fake: FakeBackend
) -> None:
    bob = page(login_as("bob"), "/my-jobs")
    assert rows(bob, "queued") == {
        1004: {"user": "bob", "reason": "waiting for GPUs", "cancel-1004": "Cancel"}
    }
    assert rows(bob, "running") == {}
    # 1×a100 at 2.00 per GPU-hour, settled for 3600 s.
    assert rows(bob, "finished") == {1002: {"user": "bob", "state": "completed", "cost": "2.00"}}
    assert cancel_buttons(bob) == {1004}


def test_a_manager_sees_the_accounts_jobs_and_may_cancel_each_live_one(
    login_as: LoginAs, fake: FakeBackend
) -> None:
    alice = page(login_as("alice"), "/my-jobs")
    assert set(rows(alice, "queued")) == {1004}
    running = rows(alice, "running")[1003]
    # 1×h100 at 3.60 per GPU-hour, started an hour before the site was seeded: ~3.60 so far.
    assert re.fullmatch(r"3\.6[0-9]*", running["cost"]), running
    assert running["estimate"] == "14.40"  # its 4 h limit
    assert {job: row["cost"] for job, row in rows(alice, "finished").items()} == {1002: "2.00", 1001: "3.60"}
    assert cancel_buttons(alice) == {1003, 1004}  # bob's queued 1004 too: alice manages physics


@pytest.mark.parametrize(
    ("viewer", "job_id", "sees", "cancel"),
    [
        ("bob", 1004, 200, 302),  # a member, their own job
        ("bob", 1003, 404, 404),  # a member, another member's job: it does not exist for them
        ("carol", 1004, 404, 404),  # another account's job
        ("alice", 1004, 200, 302),  # the manager of bob's account: scancel as bob
        ("admin", 1004, 200, 302),  # an admin, any job: scancel as its user
        ("alice", 1003, 200, 302),  # the manager's own running job
    ],
)
def test_who_sees_and_cancels_which_job(
    login_as: LoginAs, fake: FakeBackend, viewer: str, job_id: int, sees: int, cancel: int
) -> None:
    client = login_as(viewer)
    page(client, f"/my-jobs/{job_id}", sees)
    answer = post(client, f"/my-jobs/{job_id}/cancel", {}, token_from="/my-jobs")
    assert answer.status_code == cancel, answer.get_data(as_text=True)[:500]
    owner = {1003: "alice", 1004: "bob"}[job_id]
    assert fake.cancels == ([(owner, job_id)] if cancel == 302 else [])


def test_cancel_goes_back_to_where_the_button_was(login_as: LoginAs, fake: FakeBackend) -> None:
    client = login_as("bob")
    answer = post(client, "/my-jobs/1004/cancel", {"back": "job"}, token_from="/my-jobs/1004")
    assert (answer.status_code, answer.headers["Location"]) == (302, "/my-jobs/1004")
    shown = page(client, "/my-jobs/1004")
    assert shown.one(role="status").text == "Job 1004 cancelled; it is now cancelled."
    assert shown.text("state") == "cancelled"
    assert cancel_buttons(shown) == set() and not shown.all(http_equiv="refresh")


def test_a_job_submitted_with_retries_shows_its_policy_and_is_requeueable(
    login_as: LoginAs, fake: FakeBackend
) -> None:
    client = login_as("bob")
    retry = {"retry_max": "2", "retry_on": "exit:75, exit:1", "retry_backoff_seconds": "30"}
    preview = page(client, "/my-jobs/new/preview?" + urlencode({**FORM, **retry}))
    assert preview.text("sbatch").endswith(" --requeue --comment=gpucredit:max_cost=25,cloud=yes job.sh")
    sent = post(client, "/my-jobs/new", {**FORM, **retry, "action": "submit"})
    assert (sent.status_code, sent.headers["Location"]) == (302, "/my-jobs/5001")
    [(_, spec)] = fake.submits
    assert spec.retry == RetryPolicy(2, ("exit:75", "exit:1"), 30)
    assert page(client, "/my-jobs/5001").text("retry") == (
        "Retried on exit:75, exit:1, up to 2 times (the first after 30 s, each later one twice as long): "
        "0 so far."
    )


def test_a_jobs_page_shows_its_timeline_attempts_and_the_ledgers_cost(
    login_as: LoginAs, fake: FakeBackend, site: Site
) -> None:
    done = page(login_as("alice"), "/my-jobs/1001")
    assert (done.text("state"), done.text("cost"), done.text("gpus")) == ("completed", "3.60", "h100:2")
    assert done.text("submitted") == f"Submitted: {format_time(site.start)}"
    assert (done.text("started"), done.text("ended")) == ("Started: not yet", "Ended: not yet")
    run = cells(done, done.rows("data-run")["0"])
    assert run == {"attempt-state": "settled", "charged": "3.60", "refunded": "no"}
    assert not done.all(http_equiv="refresh")  # a finished job's page stays still
    queued = page(login_as("bob"), "/my-jobs/1004")
    assert (queued.text("state"), queued.text("reason"), queued.text("cost")) == (
        "queued",
        "waiting for GPUs",
        "0.00",
    )
    assert queued.text("no-attempts").startswith("No attempt has started")
    assert queued.one(http_equiv="refresh").attrs["content"] == "15"
    assert cancel_buttons(queued) == {1004}


def test_the_output_tail_is_the_jobs_own_users_and_never_through_a_symlink(
    app: Flask, login_as: LoginAs, fake: FakeBackend, portal_db: str, tmp_path: Path, site: Site
) -> None:
    from tests.support.fake_jobs import slurm_job

    me = pwd.getpwuid(os.getuid()).pw_name  # the job's user must own the file on this host
    output = tmp_path / "slurm-4242.out"
    output.write_text("".join(f"step {n}\n" for n in range(1, 61)))
    link = tmp_path / "link.out"
    link.symlink_to(output)
    engine = make_engine(portal_db)
    with make_sessionmaker(engine)() as s, s.begin():
        api.add_member(s, me, "physics")
        api.set_portal_user(s, me, password_hash=hash_password(PASSWORD))
        for job_id, path in ((4242, output), (4243, link)):
            api.create_hold(
                s,
                api.HoldRequest(
                    "physics", user=me, job_id=job_id, gpus="a100:1", seconds=600, output_path=str(path)
                ),
            )
            fake.jobs_by_id[job_id] = slurm_job(site.start, job_id, "physics", me, "running")
    engine.dispose()
    mine = page(login_as(me), "/my-jobs/4242")
    assert mine.text("output-tail") == " ".join(f"step {n}" for n in range(11, 61))  # the last 50 lines
    assert mine.one(http_equiv="refresh").attrs["content"] == "15"
    assert page(login_as(me), "/my-jobs/4243").text("no-output") == "No output to show yet."
    manager = page(login_as("alice"), "/my-jobs/4242")
    assert not manager.all(data_testid="output-tail") and not manager.all(data_testid="no-output")


def test_the_pages_are_in_the_header_and_keep_scripts_in_files(login_as: LoginAs, fake: FakeBackend) -> None:
    client = login_as("bob")
    answer = client.get("/my-jobs/new")
    nav = Page(answer.get_data(as_text=True))
    hrefs = {e.text: e.attrs["href"] for e in nav.elements if e.tag == "a"}
    assert (hrefs["My jobs"], hrefs["New job"]) == ("/my-jobs", "/my-jobs/new")
    scripts = [e.attrs for e in nav.elements if e.tag == "script"]
    assert scripts == [{"src": "/static/job_form.js", "defer": ""}]  # nothing inline for the CSP to refuse
    assert "script-src 'self'" in answer.headers["Content-Security-Policy"]
    script = client.get("/static/job_form.js")
    assert script.status_code == 200
    script.close()
