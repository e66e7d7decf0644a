"""The slurmrestd backend (portal/jobs/rest.py) against slurmrestd's recorded answers
(tests/support/fake_slurmrestd.py): the token each request carries, the job description,
the REST API version per Slurm, a refusal worded from the ledger's quote, cancels Slurm
did not do. The real slurmrestd is tests/slurm/test_slurm_jobs_api.py on 24.11 and 26.05."""

from __future__ import annotations

import base64
import json
import os
import pwd
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from ledger import api
from ledger.errors import InvalidInput
from ledger.jobs.retries import RetryPolicy
from portal.auth import Forbidden
from portal.jobs.backend import JobSpec, SlurmUnavailable, Submitted
from portal.jobs.rest import RefusedBySlurm, RestBackend, job_description, memory_mib
from portal.jobs.service import backend_of
from portal.jobs.submitter import Submitter, serve, user_token
from portal.store import transaction
from tests.support.fake_slurmrestd import FakeSlurmrestd, recorded, serving, token_user
from tests.support.portal import Site, bearer

KEY = b"0123456789abcdef0123456789abcdef"
USERS = {"alice": (1001, "/home/alice"), "root": (0, "/root"), "slurm": (64030, "/nonexistent")}
SPEC = JobSpec("physics", "#!/bin/sh\nsleep 1\n", "h100:1", "00:01:30")


def passwd(user: str) -> tuple[int, str]:
    return USERS[user]


@pytest.fixture(params=["24.11", "26.05"])
def slurmrestd(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[FakeSlurmrestd, RestBackend]]:
    key = tmp_path / "jwt_hs256.key"
    key.write_bytes(KEY)
    with serving(FakeSlurmrestd(request.param, KEY)) as fake:
        yield fake, RestBackend(fake.url, str(key), passwd=passwd)


def test_a_token_names_its_user_for_a_minute_and_is_signed_with_the_key() -> None:
    token = user_token(KEY, "alice", 1_000_000)
    assert token_user(token, KEY, 1_000_059) == "alice"
    assert token_user(token, KEY, 1_000_060) is None  # expired
    assert token_user(token, b"another key", 1_000_000) is None
    header, payload, _ = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims == {"iat": 1_000_000, "exp": 1_000_060, "sun": "alice"}
    assert json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4))) == {
        "alg": "HS256",
        "typ": "JWT",
    }


def test_the_job_description_is_what_sbatch_would_be_given() -> None:
    spec = JobSpec(
        "physics",
        "#!/bin/sh\nsleep 1\n",
        "h100:2",
        "1-00:00:01",
        name="train",
        cpus=4,
        memory="1500K",
        environment={"EPOCHS": "3"},
        max_cost="12.5",
        cloud="yes",
        container="/srv/bundles/alice",
        retry=RetryPolicy(max_retries=2, on=("exit:75",), backoff_seconds=30),
    )
    assert job_description(spec, "alice", "/home/alice/") == {
        "script": "#!/bin/sh\nsleep 1\n",
        "account": "physics",
        "tres_per_node": "gres/gpu:h100:2",
        "time_limit": {"set": True, "infinite": False, "number": 1441},  # minutes, rounded up as sbatch does
        "current_working_directory": "/home/alice/",
        "standard_output": "/home/alice/slurm-%j.out",
        "environment": ["EPOCHS=3", "HOME=/home/alice/", "PATH=/usr/local/bin:/usr/bin:/bin", "USER=alice"],
        "name": "train",
        "cpus_per_task": 4,
        "memory_per_node": {"set": True, "infinite": False, "number": 2},
        "container": "/srv/bundles/alice",
        "requeue": True,
        "comment": "gpucredit:max_cost=12.5,cloud=yes",
    }
    assert [memory_mib(m) for m in ("16G", "16", "1T", "1K")] == [16384, 16, 1048576, 1]


def test_a_submit_goes_to_the_newest_rest_version_as_the_user(
    slurmrestd: tuple[FakeSlurmrestd, RestBackend],
) -> None:
    fake, backend = slurmrestd
    submitted = backend.submit("alice", SPEC)
    answer = recorded(fake.version, "submit")["body"]
    assert submitted == Submitted(answer["job_id"], answer["job_submit_user_msg"])
    newest = {"24.11": "v0.0.42", "26.05": "v0.0.45"}[fake.version]
    [(_, _, _, _), (method, path, user, body)] = fake.requests  # the OpenAPI document, then the submit
    assert (method, path, user) == ("POST", f"/slurm/{newest}/job/submit", "alice")
    assert body == {"job": job_description(SPEC, "alice", "/home/alice")}
    backend.submit("alice", SPEC)
    assert len(fake.requests) == 3  # the version is asked once


@pytest.fixture
def signer(tmp_path: Path) -> Iterator[str]:
    """The root submitter with the key (`--jwt-key`), answering this process's uid: the
    portal's backend asks it for each token and never reads the key."""
    key = tmp_path / "jwt_hs256.key"
    key.write_bytes(KEY)
    path = str(tmp_path / "submitter.sock")
    ready, stop = threading.Event(), threading.Event()
    submitter = Submitter(jwt_key=str(key), run=lambda *a, **k: pytest.fail("ran a command"))  # type: ignore[arg-type]
    thread = threading.Thread(
        target=serve, args=(path, os.getuid(), submitter), kwargs={"ready": ready, "stop": stop}, daemon=True
    )
    thread.start()
    assert ready.wait(5)
    yield path
    stop.set()
    thread.join(5)


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_with_the_submitter_signing_the_portal_acts_as_the_user_without_the_key(
    version: str, signer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("portal.jobs.submitter.pwd.getpwnam", lambda user: pwd_entry(user))
    with serving(FakeSlurmrestd(version, KEY)) as fake:
        backend = RestBackend(fake.url, None, passwd=passwd, signer=signer)
        submitted = backend.submit("alice", SPEC)
        assert submitted.job_id == recorded(version, "submit")["body"]["job_id"]
        assert [user for (_, _, user, _) in fake.requests] == ["alice", "alice"]  # each token checked
        dead = RestBackend(fake.url, None, passwd=passwd, signer=signer + ".gone")
        with pytest.raises(SlurmUnavailable, match=r"the submitter at .*\.gone did not answer"):
            dead.submit("alice", SPEC)
    with pytest.raises(ValueError, match="one of them"):
        RestBackend("http://127.0.0.1:1", "/etc/slurm/jwt_hs256.key", signer=signer)


def pwd_entry(user: str) -> pwd.struct_passwd:
    uid, home = USERS[user]
    return pwd.struct_passwd((user, "x", uid, uid, user, home, "/bin/sh"))


def test_a_refused_submit_carries_slurmrestds_words(slurmrestd: tuple[FakeSlurmrestd, RestBackend]) -> None:
    fake, backend = slurmrestd
    fake.submit_answer = "submit_refused"
    with pytest.raises(RefusedBySlurm) as refused:
        backend.submit("alice", SPEC)
    assert (refused.value.code, refused.value.message) == (
        "slurm_refused",
        "Batch job submission failed (Unspecified error)",
    )


@pytest.mark.parametrize(
    ("number", "words"),
    [
        (1001, "Unable to contact slurm controller (connect failure)"),
        (5004, "Socket timed out on send/recv operation"),  # it may even be queued
        (11, "Resource temporarily unavailable"),
    ],
)
def test_a_submit_slurmctld_never_decided_is_unavailable_not_refused(
    slurmrestd: tuple[FakeSlurmrestd, RestBackend], number: int, words: str
) -> None:
    """Only job_submit's refusal (-1) and slurmctld's own (ESLURM_*, 2000s) are the job's
    fault; anything else is Slurm unavailable, not a 422 a client would not retry. The
    shape is the recorded refusal's."""
    fake, backend = slurmrestd
    error = {"description": "Batch job submission failed", "error_number": number, "error": words}
    error["source"] = "slurm_submit_batch_job()"
    fake.submit_answer = {"status": 500, "body": {"errors": [error]}}
    with pytest.raises(SlurmUnavailable, match=re.escape(words)):
        backend.submit("alice", SPEC)


def test_root_and_unknown_users_get_no_token(slurmrestd: tuple[FakeSlurmrestd, RestBackend]) -> None:
    fake, backend = slurmrestd
    for user, words in (
        ("root", "root is a system user (uid outside 1000-59999)"),
        ("slurm", "slurm is a system user (uid outside 1000-59999)"),  # Debian's SlurmUser
        ("mallory", "mallory is not a user"),
        ("alice\n", "alice\n is not a user"),
    ):
        with pytest.raises(InvalidInput) as refused:
            backend.submit(user, SPEC)
        assert refused.value.message.startswith(words)
        with pytest.raises(InvalidInput):
            backend.cancel(user, 7)
    assert fake.requests == []


def test_a_cancel_slurm_refused_is_forbidden_and_one_of_a_job_gone_is_done(
    slurmrestd: tuple[FakeSlurmrestd, RestBackend],
) -> None:
    fake, backend = slurmrestd
    fake.cancel_answers = {2: "cancel_not_yours", 999999: "cancel_unknown"}
    backend.cancel("alice", 1)
    backend.cancel("alice", 999999)
    with pytest.raises(Forbidden) as refused:
        backend.cancel("alice", 2)
    assert refused.value.message == "Slurm refused to cancel job 2 as alice: access/permission denied"


def test_a_token_signed_with_another_key_is_refused_by_slurmrestd(
    slurmrestd: tuple[FakeSlurmrestd, RestBackend], tmp_path: Path
) -> None:
    fake, _ = slurmrestd
    wrong = tmp_path / "wrong.key"
    wrong.write_bytes(b"not the cluster's key")
    backend = RestBackend(fake.url, str(wrong), passwd=passwd)
    with pytest.raises(SlurmUnavailable, match="slurmrestd GET /openapi/v3: HTTP 401"):
        backend.submit("alice", SPEC)


@pytest.fixture
def rest_app(app: Flask, tmp_path: Path) -> Iterator[FakeSlurmrestd]:
    key = tmp_path / "jwt_hs256.key"
    key.write_bytes(KEY)
    with serving(FakeSlurmrestd("26.05", KEY, submit_answer="submit_refused")) as fake:
        app.extensions["gpucredit.jobs_backend"] = RestBackend(
            fake.url, str(key), passwd=lambda user: (1001, f"/home/{user}")
        )
        yield fake


def test_a_refusal_through_slurmrestd_is_worded_from_the_ledgers_quote(
    client: FlaskClient, site: Site, rest_app: FakeSlurmrestd
) -> None:
    body = {**SPEC.as_request(), "script": SPEC.script, "time_limit": "00:01:00"}
    over = client.post("/api/v1/jobs", json={**body, "max_cost": "0.01"}, headers=bearer(site.tokens["bob"]))
    assert over.status_code == 422, over.get_json()
    error = over.get_json()["error"]
    assert error["code"] == "refused"
    assert error["message"] == (
        "gpucredit: the job's cheapest run would cost 0.06 credits in the default partition, over its limit "
        "of 0.01 a run: raise max_cost, or ask for fewer GPUs or less time"
    )
    slurms = "Batch job submission failed (Unspecified error)"
    assert error["details"] == {"slurmrestd": slurms, "verdict": "over_limit"}
    dear = {**body, "account": "chemistry", "gpus": "h100:8", "time_limit": "10:00:00"}
    poor = client.post("/api/v1/jobs", json=dear, headers=bearer(site.tokens["carol"]))
    assert poor.status_code == 402, poor.get_json()
    assert poor.get_json()["error"]["message"].startswith("gpucredit: this job would cost 288.00 credits; ")
    # A refusal the quote does not explain (job_submit refused on what the ledger's quote
    # cannot see) keeps Slurm's own words.
    fine = client.post("/api/v1/jobs", json=body, headers=bearer(site.tokens["bob"]))
    assert (fine.status_code, fine.get_json()["error"]["code"]) == (422, "slurm_refused")
    assert fine.get_json()["error"]["message"] == "Batch job submission failed (Unspecified error)"


def test_a_job_over_a_cap_on_its_own_is_refused_through_slurmrestd_with_429_naming_it(
    app: Flask, client: FlaskClient, site: Site, rest_app: FakeSlurmrestd
) -> None:
    with app.app_context(), transaction() as s:
        api.set_limits(s, "physics", user="bob", max_gpus=1)
    body = {**SPEC.as_request(), "script": SPEC.script, "gpus": "h100:2", "time_limit": "00:01:00"}
    over = client.post("/api/v1/jobs", json=body, headers=bearer(site.tokens["bob"]))
    assert over.status_code == 429, over.get_json()
    error = over.get_json()["error"]
    assert error["code"] == "concurrent_gpus"
    assert error["message"] == "gpucredit: concurrent_gpus: 2 GPUs exceed the cap of 1 for user bob"
    assert {k: error["details"][k] for k in ("limit", "scope", "value", "cap")} == {
        "limit": "concurrent_gpus",
        "scope": "user",
        "value": 2,
        "cap": 1,
    }
    # A cap is the account's and its user's: carol's same job in chemistry is not over it.
    other = {**body, "account": "chemistry"}
    fine = client.post("/api/v1/jobs", json=other, headers=bearer(site.tokens["carol"]))
    assert (fine.status_code, fine.get_json()["error"]["code"]) == (422, "slurm_refused")


def test_the_config_says_who_signs_the_submitter_unless_the_portal_is_given_the_key(app: Flask) -> None:
    portal = app.config["GPUCREDIT"]["portal"]
    portal.update({"jobs_backend": "slurmrestd", "slurmrestd_url": "http://127.0.0.1:6820"})
    app.extensions.pop("gpucredit.jobs_backend", None)
    backend = backend_of(app)
    assert isinstance(backend, RestBackend)
    assert (backend.key_path, backend.signer) == (None, "/run/gpucredit/submitter.sock")
    portal["jwt_key"] = "/etc/slurm/jwt_hs256.key"
    app.extensions.pop("gpucredit.jobs_backend", None)
    backend = backend_of(app)
    assert isinstance(backend, RestBackend)
    assert (backend.key_path, backend.signer) == ("/etc/slurm/jwt_hs256.key", None)
