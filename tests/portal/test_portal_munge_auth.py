"""MUNGE authentication for the API (portal/munge_auth.py) with real credentials from a
munged of the test's own (tests/support/munged.py), the fake job backend standing in
for Slurm: who a credential proves, and each credential the portal must refuse with
401 and words that say why. Tests that encode as another uid need root (`munge --uid`)."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from ledger import api
from portal.jobs.backend import SlurmJob
from portal.munge_auth import parse_unmunge
from tests.support.fake_jobs import FakeBackend
from tests.support.munge_site import USER, seed_munge_site
from tests.support.munged import as_user, encode, users_munged
from tests.support.portal import Site, make_app

KEY = os.urandom(1024)  # the cluster's key: every munged of this module's shares it
JOBS = "/api/v1/jobs"
REPLAYED = "MUNGE credential refused: it was used before (replayed); make a new one for each request"


@pytest.fixture
def socket() -> Iterator[str]:
    with users_munged(KEY) as path:
        yield path


@pytest.fixture
def seeded(portal_db: str) -> Site:
    """The seeded site, and the Unix user who runs the CLI a member of physics."""
    return seed_munge_site(portal_db)


def slurm_job(job_id: int, account: str, user: str, state: str) -> SlurmJob:
    return SlurmJob(job_id, account, user, state, state.upper(), None, "gpu", 7200, None, None, None)


def munge_app(db_url: str, socket: str, **portal: Any) -> Flask:
    app = make_app(db_url, portal={"munge_auth": True, "munge_socket": socket, **portal})
    backend = FakeBackend()
    app.extensions["gpucredit.jobs_backend"] = backend
    for job_id, user, state in ((1001, "alice", "completed"), (1002, "bob", "completed")):
        backend.jobs_by_id[job_id] = slurm_job(job_id, "physics", user, state)
    backend.jobs_by_id[1005] = slurm_job(1005, "physics", USER.pw_name, "running")
    return app


@pytest.fixture
def client(portal_db: str, seeded: Site, socket: str) -> FlaskClient:
    return munge_app(portal_db, socket).test_client()


def credential(socket: str, method: str, target: str, body: bytes = b"", **how: Any) -> dict[str, str]:
    """The Authorization header the CLI sends for this request, as `how` says (uid, ttl)."""
    how.setdefault("uid", as_user(USER))
    payload = api.request_payload(secrets.token_hex(16), method, target, body)
    return {"Authorization": f"MUNGE {encode(socket, payload, **how)}"}


def refusal(answer: Any) -> tuple[int, str, str]:
    error = answer.get_json()["error"]
    return answer.status_code, error["code"], error["message"]


def test_a_users_credential_lists_only_their_own_jobs(client: FlaskClient, socket: str) -> None:
    answer = client.get(JOBS, headers=credential(socket, "GET", JOBS))
    assert answer.status_code == 200, answer.get_json()
    assert [(job["job_id"], job["user"]) for job in answer.get_json()["items"]] == [(1005, USER.pw_name)]
    other = client.get("/api/v1/jobs/1001", headers=credential(socket, "GET", "/api/v1/jobs/1001"))
    assert other.status_code == 404  # alice's job, in the same account: as if it did not exist


def test_a_replayed_credential_is_refused(client: FlaskClient, socket: str) -> None:
    headers = credential(socket, "GET", JOBS)
    assert client.get(JOBS, headers=headers).status_code == 200
    assert refusal(client.get(JOBS, headers=headers)) == (401, "unauthenticated", REPLAYED)


def test_a_credential_replayed_on_another_portal_host_is_refused(db_url: str, socket: str) -> None:
    """Two portal hosts on one database, each with its own munged (the cluster's key):
    the second munged never saw the credential, so only the database can refuse the copy;
    on SQLite and PostgreSQL."""
    seed_munge_site(db_url)
    with users_munged(KEY) as other_socket:
        first, second = munge_app(db_url, socket), munge_app(db_url, other_socket)
        try:
            headers = credential(socket, "GET", JOBS)
            assert first.test_client().get(JOBS, headers=headers).status_code == 200
            replayed = second.test_client().get(JOBS, headers=headers)
            assert refusal(replayed) == (401, "unauthenticated", REPLAYED)
            fresh = credential(socket, "GET", JOBS)
            assert second.test_client().get(JOBS, headers=fresh).status_code == 200
        finally:
            for app in (first, second):
                app.extensions["gpucredit.engine"].dispose()


def test_a_credential_made_with_another_key_is_refused(client: FlaskClient, tmp_path: Path) -> None:
    with users_munged() as foreign:
        headers = credential(foreign, "GET", JOBS)
    assert refusal(client.get(JOBS, headers=headers)) == (
        401,
        "unauthenticated",
        "MUNGE credential refused: Invalid credential",
    )


def test_an_expired_credential_is_refused(client: FlaskClient, socket: str) -> None:
    headers = credential(socket, "GET", JOBS, ttl=1)
    time.sleep(2.2)
    assert refusal(client.get(JOBS, headers=headers)) == (
        401,
        "unauthenticated",
        "MUNGE credential refused: Expired credential",
    )


@pytest.mark.parametrize(
    ("uid", "message"),
    [
        (0, "a MUNGE credential of root (uid 0) is not accepted: run as your own user"),
        (54321, "uid 54321 has no passwd entry on the portal host"),
    ],
)
def test_root_and_a_uid_with_no_passwd_entry_are_refused(
    client: FlaskClient, socket: str, uid: int, message: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("encodes a credential as another uid (munge --uid): needs root")
    answer = client.get(JOBS, headers=credential(socket, "GET", JOBS, uid=uid or None))
    assert refusal(answer) == (401, "unauthenticated", message)


def test_a_credential_for_another_request_or_none_is_refused(client: FlaskClient, socket: str) -> None:
    listed = credential(socket, "GET", JOBS)
    answer = client.delete("/api/v1/jobs/1005", headers=listed)
    assert refusal(answer) == (
        401,
        "unauthenticated",
        "the MUNGE credential was made for another request (GET /api/v1/jobs), not DELETE /api/v1/jobs/1005",
    )
    body = b'{"account": "physics"}'
    other_body = credential(socket, "POST", JOBS, b'{"account": "chemistry"}')
    answer = client.post(JOBS, data=body, headers={**other_body, "Content-Type": "application/json"})
    assert refusal(answer) == (
        401,
        "unauthenticated",
        "the MUNGE credential was made for another body of POST /api/v1/jobs",
    )
    bare = {"Authorization": f"MUNGE {encode(socket, b'', uid=as_user(USER))}"}
    assert refusal(client.get(JOBS, headers=bare)) == (
        401,
        "unauthenticated",
        "the MUNGE credential carries no gpucredit request (make it with gpucredit)",
    )
    assert refusal(client.get(JOBS, headers={"Authorization": "MUNGE not-a-credential"})) == (
        401,
        "unauthenticated",
        "not a MUNGE credential (Authorization: MUNGE MUNGE:...:)",
    )


def test_munge_is_refused_unless_the_portal_enables_it(portal_db: str, seeded: Site, socket: str) -> None:
    app = munge_app(portal_db, socket, munge_auth=False)
    assert refusal(app.test_client().get(JOBS, headers=credential(socket, "GET", JOBS))) == (
        401,
        "unauthenticated",
        "MUNGE authentication is not enabled on this portal (portal.munge_auth): "
        "send an API token, Authorization: Bearer gpc_...",
    )


def test_a_portal_without_unmunge_says_it_cannot_check(portal_db: str, seeded: Site, socket: str) -> None:
    app = munge_app(portal_db, socket, unmunge="/nonexistent/unmunge")
    assert refusal(app.test_client().get(JOBS, headers=credential(socket, "GET", JOBS))) == (
        401,
        "unauthenticated",
        "the portal cannot check MUNGE credentials now (unmunge failed); try again",
    )


RECORDED = (  # `unmunge --numeric`, munge 0.5.15
    b"STATUS:          0\nENCODE_HOST:     127.0.0.1\nENCODE_TIME:     1796487424\n"
    b"DECODE_TIME:     1796487424\nTTL:             300\nCIPHER:          4\nMAC:             5\n"
    b"ZIP:             0\nUID:             65534\nGID:             65534\nLENGTH:          5\n\nhe\n\nl"
)


def test_unmunges_output_is_read_by_one_parser() -> None:
    decoded = parse_unmunge(RECORDED)
    assert (decoded.status, decoded.uid, decoded.gid) == (0, 65534, 65534)
    assert (decoded.encode_time, decoded.ttl_seconds, decoded.payload) == (1796487424, 300, b"he\n\nl")
    with pytest.raises(ValueError, match="no number for UID"):
        parse_unmunge(RECORDED.replace(b"UID:             65534", b"UID:             nobody"))
    with pytest.raises(ValueError, match="no number for STATUS, UID, GID, ENCODE_TIME, TTL"):
        parse_unmunge(b"")


def test_the_portal_will_not_start_with_unmunge_named_without_its_path(portal_db: str) -> None:
    """A bare name would be looked up on the portal's PATH: whoever could put a program
    there would decide who everyone is."""
    from portal.settings import PortalConfigError

    with pytest.raises(PortalConfigError, match=r"portal\.unmunge must be an absolute path, not 'unmunge'"):
        make_app(portal_db, portal={"munge_auth": "true", "unmunge": "unmunge"})


def test_a_credential_signs_nobody_on_to_the_pages(client: FlaskClient, socket: str) -> None:
    """A local process with a valid credential for a page is still a visitor there: MUNGE
    reaches the API only, never a session or a form."""
    answer = client.get("/my-jobs", headers=credential(socket, "GET", "/my-jobs"))
    assert answer.status_code == 302
    assert "/login" in answer.headers["Location"]
