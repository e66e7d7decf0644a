"""The jobs API (portal/api/jobs.py) on the seeded site, with a fake backend standing in
for Slurm (the real one is tests/slurm/test_slurm_jobs_api.py): what is checked before
anything is submitted, refusals with sbatch's words, who sees which job, the cost from
the ledger."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from portal.jobs.backend import JobSpec
from portal.jobs.submitter import CONTAINER_WORDS
from tests.support.fake_jobs import FakeBackend, seeded_backend
from tests.support.portal import Site, bearer


@pytest.fixture
def fake(app: Flask, site: Site) -> FakeBackend:
    backend = seeded_backend(site.start)
    app.extensions["gpucredit.jobs_backend"] = backend
    app.config["GPUCREDIT"]["slurm"]["cluster"] = "default"  # the seeded holds' cluster
    return backend


BODY = {"account": "physics", "script": "#!/bin/bash\nsleep 1\n", "gpus": "h100:1", "time_limit": "00:01:00"}


def post(client: FlaskClient, site: Site, user: str, body: dict[str, Any], key: str | None = None) -> Any:
    headers = bearer(site.tokens[user]) | ({"Idempotency-Key": key} if key else {})
    return client.post("/api/v1/jobs", json=body, headers=headers)


def test_a_job_is_submitted_as_the_tokens_user_with_its_quote(
    client: FlaskClient, site: Site, fake: FakeBackend
) -> None:
    answer = post(client, site, "bob", {**BODY, "name": "train", "environment": {"EPOCHS": "3"}}, key="k1")
    assert answer.status_code == 201, answer.get_json()
    body = answer.get_json()
    assert (body["job_id"], body["state"]) == (5001, "queued")
    assert body["message"] == "gpucredit: ~0.06 credits (1×h100 × 1 min), 100.00 available"
    assert (body["quote"]["cost"], body["quote"]["affordable"]) == ("0.06", True)
    [(user, spec)] = fake.submits
    assert user == "bob"
    assert spec == JobSpec(
        "physics", BODY["script"], "h100:1", "00:01:00", name="train", environment={"EPOCHS": "3"}
    )
    again = post(client, site, "bob", {**BODY, "name": "train", "environment": {"EPOCHS": "3"}}, key="k1")
    assert (again.status_code, again.get_json()) == (201, body)
    assert len(fake.submits) == 1  # a repeat submits nothing
    other = post(client, site, "bob", BODY, key="k1")
    assert (other.status_code, other.get_json()["error"]["code"]) == (409, "idempotency_conflict")
    assert len(fake.submits) == 1


@pytest.mark.parametrize(
    ("user", "change", "field", "message"),
    [
        ("bob", {"script": "sleep 1\n"}, "script", "script: must start with a #! line (like #!/bin/bash)"),
        ("bob", {"script": "#!/bin/sh\n" + "x" * 262144}, "script", "script: is over 262144 bytes"),
        ("bob", {"time_limit": "soon"}, "time_limit", "time_limit: must be [D-]HH:MM:SS"),
        ("carol", {}, "account", "account: carol is not a member of account physics"),
        (
            "bob",
            {"environment": {"LD_PRELOAD": "/tmp/x.so"}},
            "environment",
            "environment: LD_PRELOAD may not be set",
        ),
        ("bob", {"working_dir": "data"}, "working_dir", "working_dir: must be an absolute path"),
        ("bob", {"container": "bundles/x"}, "container", f"container: {CONTAINER_WORDS}"),
        (
            "bob",
            {"memory": "16G\n"},
            "memory",
            "memory: must be a number with an optional K, M, G or T (like 16G)",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_is_submitted(
    client: FlaskClient,
    site: Site,
    fake: FakeBackend,
    user: str,
    change: dict[str, Any],
    field: str,
    message: str,
) -> None:
    answer = post(client, site, user, {**BODY, **change})
    assert answer.status_code == 422, answer.get_json()
    error = answer.get_json()["error"]
    assert (error["code"], error["message"], error["details"]["field"]) == ("invalid_input", message, field)
    assert fake.submits == []


def test_an_unpriced_gpu_type_is_refused_on_the_gpus_field(
    client: FlaskClient, site: Site, fake: FakeBackend
) -> None:
    answer = post(client, site, "bob", {**BODY, "gpus": "v100:1"})
    assert answer.status_code == 422
    assert answer.get_json()["error"]["details"]["field"] == "gpus"
    assert fake.submits == []


def test_a_missing_time_limit_is_refused(client: FlaskClient, site: Site, fake: FakeBackend) -> None:
    body = {k: v for k, v in BODY.items() if k != "time_limit"}
    answer = post(client, site, "bob", body)
    assert answer.status_code == 422
    assert "time_limit" in answer.get_json()["error"]["message"]
    assert fake.submits == []


@pytest.mark.parametrize(
    ("stderr", "status", "code"),
    [
        (
            "sbatch: error: gpucredit: this job would cost ~0.06 credits (1×h100 × 1 min) but only 0.00 "
            "are available in physics. Top up at https://portal/accounts/physics/topup\n"
            "sbatch: error: Batch job submission failed: Unspecified error\n",
            402,
            "insufficient_credits",
        ),
        (
            "sbatch: error: gpucredit: concurrent_gpus: physics would use 9 GPUs, its cap is 8 (job: 1×h100 "
            "× 1 min)\n",
            429,
            "concurrent_gpus",
        ),
    ],
)
def test_sbatchs_refusal_comes_back_with_the_ledgers_code_and_its_words(
    client: FlaskClient, site: Site, fake: FakeBackend, stderr: str, status: int, code: str
) -> None:
    fake.refuse_with = stderr
    answer = post(client, site, "bob", BODY, key="refused")
    assert answer.status_code == status
    error = answer.get_json()["error"]
    first = stderr.splitlines()[0].removeprefix("sbatch: error: ")
    assert error["code"] == code and error["message"].startswith(first)
    fake.refuse_with = None  # a refusal keeps no result under the key: a retry submits
    assert post(client, site, "bob", BODY, key="refused").status_code == 201


def ids(client: FlaskClient, site: Site, user: str, query: str = "") -> list[int]:
    answer = client.get(f"/api/v1/jobs{query}", headers=bearer(site.tokens[user]))
    assert answer.status_code == 200, answer.get_json()
    return [job["job_id"] for job in answer.get_json()["items"]]


def test_members_see_their_own_jobs_managers_their_accounts_admins_all(
    client: FlaskClient, site: Site, fake: FakeBackend
) -> None:
    assert ids(client, site, "bob") == [1004, 1002]
    assert ids(client, site, "alice") == [1004, 1003, 1002, 1001]
    assert ids(client, site, "admin") == [2001, 1004, 1003, 1002, 1001]
    assert ids(client, site, "alice", "?state=queued") == [1004]
    assert ids(client, site, "alice", "?limit=2") == [1004, 1003]
    page = client.get("/api/v1/jobs?limit=2", headers=bearer(site.tokens["alice"])).get_json()
    assert page["next_cursor"] == "1003"
    assert ids(client, site, "alice", "?limit=2&cursor=1003") == [1002, 1001]
    missing = client.get("/api/v1/jobs?account=chemistry", headers=bearer(site.tokens["bob"]))
    assert missing.status_code == 404
    for user, job in (("bob", 1001), ("carol", 1002), ("alice", 2001)):
        shown = client.get(f"/api/v1/jobs/{job}", headers=bearer(site.tokens[user]))
        assert shown.status_code == 404, (user, job)


def test_a_job_shows_its_state_reason_and_the_ledgers_cost(
    client: FlaskClient, site: Site, fake: FakeBackend
) -> None:
    done = client.get("/api/v1/jobs/1001", headers=bearer(site.tokens["alice"])).get_json()
    # h100 at 3.60 per GPU-hour, 2 GPUs, settled for 1800 s: 3.60 credits.
    assert (done["state"], done["cost"], done["gpus"], done["time_limit"]) == (
        "completed",
        "3.60",
        "h100:2",
        "02:00:00",
    )
    assert [(a["run"], a["state"], a["charged"], a["refunded"]) for a in done["attempts"]] == [
        (0, "settled", "3.60", False)
    ]
    queued = client.get("/api/v1/jobs/1004", headers=bearer(site.tokens["bob"])).get_json()
    assert (queued["state"], queued["reason"], queued["cost"], queued["attempts"]) == (
        "queued",
        "waiting for GPUs",
        "0.00",
        [],
    )


def test_a_manager_cancels_a_members_job_as_its_user_but_may_not_read_its_output(
    client: FlaskClient, site: Site, fake: FakeBackend, caplog: pytest.LogCaptureFixture
) -> None:
    output = client.get(
        "/api/v1/jobs/1004/output", headers=bearer(site.tokens["alice"])
    )  # alice manages physics
    assert (output.status_code, output.get_json()["error"]["code"]) == (403, "forbidden")
    with caplog.at_level("INFO", logger="gpucredit.portal.jobs"):
        cancelled = client.delete("/api/v1/jobs/1004", headers=bearer(site.tokens["alice"]))
    assert cancelled.status_code == 200
    assert (cancelled.get_json()["state"], cancelled.get_json()["cost"]) == ("cancelled", "0.00")
    assert fake.cancels == [("bob", 1004)]  # scancel as bob, whose job it is
    assert "job 1004 of bob in physics cancelled by alice (manager)" in caplog.text
    again = client.delete("/api/v1/jobs/1004", headers=bearer(site.tokens["alice"]))
    assert (again.status_code, fake.cancels) == (200, [("bob", 1004)])  # ended: nothing to cancel
    own = client.get("/api/v1/jobs/1004/output?lines=5", headers=bearer(site.tokens["bob"]))
    assert (own.status_code, own.get_json()) == (200, {"job_id": 1004, "lines": []})


def test_an_admin_cancels_any_job_and_a_member_only_their_own(
    client: FlaskClient, site: Site, fake: FakeBackend
) -> None:
    hidden = client.delete("/api/v1/jobs/1003", headers=bearer(site.tokens["bob"]))  # alice's, in physics
    assert (hidden.status_code, fake.cancels) == (404, [])  # another member's job does not exist for bob
    other = client.delete("/api/v1/jobs/1004", headers=bearer(site.tokens["carol"]))  # carol is in chemistry
    assert (other.status_code, fake.cancels) == (404, [])
    cancelled = client.delete("/api/v1/jobs/1003", headers=bearer(site.tokens["admin"]))
    assert cancelled.status_code == 200
    assert fake.cancels == [("alice", 1003)]


def test_a_service_token_may_not_submit(client: FlaskClient, site: Site, fake: FakeBackend) -> None:
    assert post(client, site, "service", BODY).status_code == 403
    assert fake.submits == []


def test_the_running_jobs_cost_grows_from_the_ledger(
    client: FlaskClient, site: Site, fake: FakeBackend
) -> None:
    running = client.get("/api/v1/jobs/1003", headers=bearer(site.tokens["alice"])).get_json()
    assert running["state"] == "running"
    assert running["estimated_total"] == "14.40"  # 1×h100 at 3.60 for its 4 h limit
    assert running["attempts"][0]["state"] == "running" and running["attempts"][0]["ended_at"] is None


def test_a_retry_policy_is_kept_with_the_job_which_is_submitted_requeueable(
    client: FlaskClient, site: Site, fake: FakeBackend
) -> None:
    retry = {"max": 2, "on": ["exit:75", "node_fail", "exit:1"], "backoff_seconds": 30}
    answer = post(client, site, "bob", {**BODY, "retry": retry})
    assert answer.status_code == 201, answer.get_json()
    job_id = answer.get_json()["job_id"]
    assert answer.get_json()["retry"] == retry
    [(_, spec)] = fake.submits
    assert spec.as_request()["requeue"] == "yes"  # sbatch --requeue: Slurm requeues only such a job
    shown = client.get(f"/api/v1/jobs/{job_id}", headers=bearer(site.tokens["bob"])).get_json()
    assert shown["retry"] == {**retry, "done": 0, "retries": []}
    listed = client.get("/api/v1/jobs?account=physics", headers=bearer(site.tokens["bob"])).get_json()
    assert [job["retry"] for job in listed["items"] if job["job_id"] == job_id] == [shown["retry"]]
    plain = post(client, site, "bob", BODY).get_json()
    assert "requeue" not in fake.submits[-1][1].as_request()
    assert (
        client.get(f"/api/v1/jobs/{plain['job_id']}", headers=bearer(site.tokens["bob"])).get_json()["retry"]
        is None
    )


@pytest.mark.parametrize(
    ("retry", "field"),
    [
        ({"max": 0, "on": ["exit:75"]}, "retry.max"),
        ({"max": 11, "on": ["exit:75"]}, "retry.max"),
        ({"max": 1, "on": []}, "retry.on"),
        ({"max": 1, "on": ["exit:256"]}, "retry.on"),  # past the schema's pattern: the ledger's rule
        ({"max": 1, "on": ["timeout"]}, "retry.on[0]"),
        ({"max": 1, "on": ["node_fails"]}, "retry.on[0]"),
        ({"max": 1, "on": [f"exit:{n}" for n in range(1, 256)]}, "retry.on"),  # nothing submitted, no 500
        ({"max": 1, "on": ["exit:75"], "backoff_seconds": 3601}, "retry.backoff_seconds"),
        ({"max": 1, "on": ["exit:75"], "forever": True}, "retry.forever"),
        ("twice", "retry"),
    ],
)
def test_a_bad_retry_policy_is_refused_naming_its_field_and_nothing_is_submitted(
    client: FlaskClient, site: Site, fake: FakeBackend, retry: Any, field: str
) -> None:
    """The schema's words (the ledger's own, for callers past the schema: tests/ledger/test_retries.py)."""
    answer = post(client, site, "bob", {**BODY, "retry": retry})
    assert answer.status_code == 422, answer.get_json()
    error = answer.get_json()["error"]
    assert (error["code"], error["details"]["field"]) == ("invalid_input", field), error
    assert error["message"].startswith(f"{field}: "), error
    assert fake.submits == []


def test_data_to_stage_is_kept_with_the_job_and_shown_with_its_stage_ins(
    client: FlaskClient, site: Site, fake: FakeBackend
) -> None:
    paths = ["/home/bob/set.tar", "/home/bob/cfg.yaml"]
    answer = post(client, site, "bob", {**BODY, "data": paths, "region": "us-west-2"} | {"cloud": "yes"})
    assert answer.status_code == 422  # the seeded site has no partition in any region
    assert answer.get_json()["error"]["details"] == {"field": "region"}
    answer = post(client, site, "bob", {**BODY, "data": paths})
    assert answer.status_code == 201, answer.get_json()
    assert answer.get_json()["data"] == paths
    [(_, spec)] = fake.submits
    assert spec.data == tuple(paths)
    shown = client.get(f"/api/v1/jobs/{answer.get_json()['job_id']}", headers=bearer(site.tokens["bob"]))
    assert shown.get_json()["data"] == {"paths": paths, "staged": []}
    for bad, field in (([], "data"), (["set.tar"], "data"), ("/home/bob/set.tar", "data")):
        refused = post(client, site, "bob", {**BODY, "data": bad})
        assert (refused.status_code, refused.get_json()["error"]["details"]["field"]) == (422, field)
    assert len(fake.submits) == 1
