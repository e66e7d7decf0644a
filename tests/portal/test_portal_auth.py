"""Logging in, tokens and who sees what: the portal's front door."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from portal.settings import PortalConfigError
from tests.support.portal import PASSWORD, Site, bearer, csrf_token, login, make_app, private_file


def test_login_with_the_right_password_opens_a_session(client: FlaskClient, site: Site) -> None:
    response = login(client, "alice")
    assert response.status_code == 302
    with client.session_transaction() as session:
        assert session["user"] == "alice"


def test_a_wrong_password_or_unknown_user_is_refused_and_logged(
    client: FlaskClient, site: Site, caplog
) -> None:
    caplog.set_level(logging.WARNING, "gpucredit.portal.auth")
    assert login(client, "alice", "wrong password").status_code == 401
    assert login(client, "mallory", PASSWORD).status_code == 401
    with client.session_transaction() as session:
        assert "user" not in session
    assert [r.getMessage() for r in caplog.records] == [
        "failed login for 'alice' from 127.0.0.1",
        "failed login for 'mallory' from 127.0.0.1",
    ]


def test_a_login_form_without_its_csrf_token_is_refused(client: FlaskClient, site: Site) -> None:
    response = client.post("/login", data={"username": "alice", "password": PASSWORD})
    assert response.status_code == 400
    with client.session_transaction() as session:
        assert "user" not in session


def test_logins_are_rate_limited_per_user_name(client: FlaskClient, site: Site) -> None:
    token = csrf_token(client)
    codes = [
        client.post("/login", data={"username": "bob", "password": "nope", "csrf_token": token}).status_code
        for _ in range(11)
    ]
    assert codes == [401] * 10 + [429]
    # The right password does not get through while the limit holds for that name...
    assert (
        client.post("/login", data={"username": "bob", "password": PASSWORD, "csrf_token": token}).status_code
        == 429
    )
    # ...and another user is not locked out by it.
    assert login(client, "alice").status_code == 302


def test_the_session_cookie_is_httponly_and_samesite(client: FlaskClient, site: Site) -> None:
    response = login(client, "alice")
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie


def test_cookies_are_secure_once_the_portal_is_served_over_https(portal_db: str, site: Site) -> None:
    client = make_app(portal_db, portal={"url": "https://gpucredit.example.org/"}).test_client()
    cookie = login(client, "alice").headers["Set-Cookie"]
    assert "Secure" in cookie


def test_every_response_carries_the_security_headers(client: FlaskClient, site: Site) -> None:
    headers = client.get("/login").headers
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    assert "unsafe-inline" not in headers["Content-Security-Policy"]


def test_single_sign_on_header_is_honoured_only_from_the_proxy_with_its_secret(
    portal_db: str, site: Site, tmp_path: Path
) -> None:
    secret = "s3cr3t-" + "x" * 40
    app = make_app(
        portal_db,
        portal={
            "auth": "header",
            "sso_header": "X-Remote-User",
            "trusted_proxies": ["10.0.0.7"],
            "proxy_secret_file": str(private_file(tmp_path / "proxy-secret", secret)),
        },
    )
    from portal.auth import current
    from portal.proxy import PROXY_SECRET_HEADER

    def who(address: str, headers: dict[str, str]) -> str | None:
        with app.test_request_context("/", headers=headers, environ_base={"REMOTE_ADDR": address}):
            app.preprocess_request()
            found = current()
            return None if found is None else f"{found.user} via {found.via}"

    assert who("10.0.0.7", {"X-Remote-User": "alice", PROXY_SECRET_HEADER: secret}) == "alice via header"
    # The proxy's address without its secret (any process on its host), the secret from
    # elsewhere, or a wrong secret: nobody.
    assert who("10.0.0.7", {"X-Remote-User": "admin"}) is None
    assert who("10.0.0.7", {"X-Remote-User": "admin", PROXY_SECRET_HEADER: secret[:-1] + "y"}) is None
    assert who("10.0.0.8", {"X-Remote-User": "admin", PROXY_SECRET_HEADER: secret}) is None


def test_header_sign_on_will_not_start_without_a_configured_proxy(
    portal_db: str, site: Site, tmp_path
) -> None:
    for portal, named in (
        ({"auth": "header"}, "portal.trusted_proxies"),  # nothing: once loopback was trusted
        ({"auth": "header", "trusted_proxies": ["127.0.0.1"]}, "portal.proxy_secret_file"),
        (
            {"auth": "header", "trusted_proxies": ["127.0.0.1"], "proxy_secret_file": str(tmp_path / "none")},
            "does not exist",
        ),
    ):
        with pytest.raises(PortalConfigError, match=re.escape(named)):
            make_app(portal_db, portal=portal)


def test_a_token_authenticates_until_it_is_revoked_or_expires(app, site: Site) -> None:
    from datetime import timedelta

    from ledger import api
    from ledger.timeutil import utcnow
    from portal.auth import current
    from portal.store import transaction

    def who(secret: str):
        with app.test_request_context("/api/v1/prices", headers=bearer(secret)):
            app.preprocess_request()
            return current()

    assert who(site.tokens["alice"]).user == "alice"
    assert who(site.tokens["service"]).role == "service"
    assert who("gpc_not-a-token") is None
    with app.app_context(), transaction() as s:
        expires_at = utcnow() + timedelta(hours=1)
        _token, secret = api.create_token(s, "bob", "user", expires_at=expires_at)
        assert api.authenticate_token(s, secret, now=expires_at - timedelta(seconds=1)) is not None
        assert api.authenticate_token(s, secret, now=expires_at) is None  # expired from that instant
        alice_token = next(t for t in api.list_tokens(s, "alice"))
        api.revoke_token(s, alice_token.id)
    assert who(secret).user == "bob"
    assert who(site.tokens["alice"]) is None
