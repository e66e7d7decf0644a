"""Administration pages (/admin) and account managers' pages (/accounts/<a>/manage).

Each test reads the page a user would read (exact figures of the seeded site) and,
after a change, the database through `ledger.api` in a fresh transaction.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from html.parser import HTMLParser
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import text
from sqlalchemy.orm import Session

from ledger import api
from ledger.api import HoldState
from ledger.store.db import make_engine, make_sessionmaker
from ledger.timeutil import format_time
from tests.support.portal import LoginAs, Site, csrf_token

_KEY = re.compile(r'name="idempotency_key" value="([^"]+)"')


@contextmanager
def ledger(db_url: str) -> Iterator[Session]:
    """A fresh transaction on the portal's database: what a request left behind."""
    engine = make_engine(db_url)
    try:
        with make_sessionmaker(engine)() as s, s.begin():
            yield s
    finally:
        engine.dispose()


class _Tables(HTMLParser):
    """Each <table class=NAME>'s body rows as lists of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._in_head = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._table = dict(attrs).get("class") or ""
            self.tables[self._table] = []
        elif tag == "thead":
            self._in_head = True
        elif tag == "tr" and self._table is not None and not self._in_head:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "thead":
            self._in_head = False
        elif tag == "td" and self._row is not None and self._cell is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def table(html: str, name: str) -> list[list[str]]:
    parser = _Tables()
    parser.feed(html)
    return parser.tables[name]


def page(client: FlaskClient, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_data(as_text=True)


def form(client: FlaskClient, path: str, **fields: Any) -> dict[str, Any]:
    """The fields a form on `path` posts: its CSRF token and a key it rendered, plus `fields`."""
    html = page(client, path)
    key = _KEY.search(html)
    assert key, f"no idempotency key on {path}"
    return {"csrf_token": csrf_token(client, path), "idempotency_key": key.group(1), **fields}


def post(client: FlaskClient, path: str, action: str, **fields: Any) -> Any:
    return client.post(action, data=form(client, path, **fields))


def available(db_url: str, account: str) -> tuple[str, str]:
    with ledger(db_url) as s:
        balance = api.balance(s, account)
    return balance["available"], balance["held"]


def hold_of(db_url: str, job_id: int) -> HoldState:
    with ledger(db_url) as s:
        hold = api.find_hold(s, "default", job_id, 0)
    assert hold is not None
    return hold


def charge_entry(db_url: str, account: str, job_id: int) -> int:
    with ledger(db_url) as s:
        return next(
            c["entry_id"] for c in api.charge_entries(s, account) if c["job"] == f"default/{job_id}/0"
        )


# --- who may enter ---------------------------------------------------------------------

ADMIN_PAGES = ["/admin/", "/admin/prices", "/admin/holds", "/admin/audit", "/admin/accounts/physics"]


@pytest.mark.parametrize("user", ["alice", "bob", "carol", "dave"])
def test_the_admin_area_is_not_found_for_anyone_but_an_admin(
    login_as: LoginAs, portal_db: str, user: str
) -> None:
    client = login_as(user)
    assert [client.get(path).status_code for path in ADMIN_PAGES] == [404] * len(ADMIN_PAGES)
    token = csrf_token(client, "/login")
    refused = client.post(
        "/admin/prices", data={"csrf_token": token, "idempotency_key": "k1", "gres": "h100", "price": "0"}
    )
    released = client.post("/admin/holds/1/release", data={"csrf_token": token, "idempotency_key": "k2"})
    assert (refused.status_code, released.status_code) == (404, 404)
    with ledger(portal_db) as s:
        assert len(api.list_prices(s)) == 2
        assert [h.state for h in api.list_holds(s, state="active")] == ["active"]


def test_a_visitor_who_has_not_logged_in_is_sent_to_log_in(client: FlaskClient, site: Site) -> None:
    response = client.get("/admin/prices")
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/login?next=/admin/prices")


# --- accounts --------------------------------------------------------------------------


def test_the_start_page_lists_accounts_with_available_and_held(login_as: LoginAs) -> None:
    html = page(login_as("admin"), "/admin/")
    assert table(html, "accounts") == [
        ["chemistry", "39.00", "0.00", "0.00", "Manager's page"],
        ["physics", "100.00", "14.40", "0.00", "Manager's page"],
    ]


def test_an_admin_creates_an_account_once_however_often_the_form_is_sent(
    login_as: LoginAs, portal_db: str
) -> None:
    client = login_as("admin")
    fields = form(client, "/admin/", name="biology")
    first = client.post("/admin/accounts", data=fields)
    again = client.post("/admin/accounts", data=fields)
    assert (first.status_code, again.status_code) == (302, 302)
    assert first.headers["Location"] == "/admin/accounts/biology"
    with ledger(portal_db) as s:
        assert api.account_names(s) == ["biology", "chemistry", "physics"]
    assert table(page(client, "/admin/"), "accounts")[0] == [
        "biology",
        "0.00",
        "0.00",
        "0.00",
        "Manager's page",
    ]
    # A new form (a new key) for a name that exists is refused with the ledger's message.
    clash = post(client, "/admin/", "/admin/accounts", name="biology")
    assert clash.status_code == 409
    assert "account biology already exists" in clash.get_data(as_text=True)


def test_a_bad_account_name_is_refused_and_nothing_is_created(login_as: LoginAs, portal_db: str) -> None:
    response = post(login_as("admin"), "/admin/", "/admin/accounts", name="no spaces")
    assert response.status_code == 422
    html = response.get_data(as_text=True)
    assert "account name &#39;no spaces&#39; is not a valid Slurm name" in html
    assert 'value="no spaces"' in html  # the form comes back as it was sent
    with ledger(portal_db) as s:
        assert api.account_names(s) == ["chemistry", "physics"]


def test_the_account_page_shows_balance_grants_members_and_charges(login_as: LoginAs, site: Site) -> None:
    html = page(login_as("admin"), "/admin/accounts/physics")
    assert 'class="value available">100.00<' in html and 'class="value held">14.40<' in html
    promotion_expiry = format_time(site.now + timedelta(days=5))
    assert [row[1:6] for row in table(html, "grants")] == [
        ["grant", "20.00", "14.40", format_time(site.start), promotion_expiry],
        ["topup", "100.00", "100.00", format_time(site.start), "never"],
    ]
    assert [row[:2] for row in table(html, "members")] == [["alice", "manager"], ["bob", "member"]]
    assert [row[2:] for row in table(html, "charges")] == [
        ["bob", "default/1002/0", "a100:1", "2.00"],
        ["alice", "default/1001/0", "h100:2", "3.60"],
    ]
    assert table(html, "limits") == [["physics (the whole account)", "—", "—", "—"]]


def test_an_account_that_does_not_exist_is_not_found(login_as: LoginAs) -> None:
    assert login_as("admin").get("/admin/accounts/biology").status_code == 404


def test_an_admin_adds_a_member_and_changes_a_role(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("admin")
    path = "/admin/accounts/physics"
    added = post(client, path, path + "/members", user="erin", role="manager")
    promoted = post(client, path, path + "/members", user="bob", role="manager")
    assert (added.status_code, promoted.status_code) == (302, 302)
    with ledger(portal_db) as s:
        assert api.member_roles(s, "physics") == [
            {"user": "alice", "role": "manager"},
            {"user": "bob", "role": "manager"},
            {"user": "erin", "role": "manager"},
        ]
    assert "bob is now a manager of physics." in page(client, path)


def test_a_role_that_is_neither_member_nor_manager_is_refused(login_as: LoginAs, portal_db: str) -> None:
    path = "/admin/accounts/physics"
    response = post(login_as("admin"), path, path + "/members", user="bob", role="owner")
    assert response.status_code == 422
    assert "role must be member or manager" in response.get_data(as_text=True)
    with ledger(portal_db) as s:
        assert {"user": "bob", "role": "member"} in api.member_roles(s, "physics")


# --- limits ----------------------------------------------------------------------------


def test_an_admin_sets_the_account_caps_and_a_users_caps(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("admin")
    path = "/admin/accounts/physics"
    account = post(client, path, path + "/limits", user="", max_gpus="8", max_rate="", daily_cap="50")
    alice = post(client, path, path + "/limits", user="alice", max_gpus="4", max_rate="0.005", daily_cap="30")
    assert (account.status_code, alice.status_code) == (302, 302)
    with ledger(portal_db) as s:
        assert api.show_limits(s, "physics") == {
            "account": "physics",
            "account_limits": {"max_gpus": 8, "max_rate": None, "daily_cap": "50.00"},
            "users": {"alice": {"max_gpus": 4, "max_rate": "0.005", "daily_cap": "30.00"}},
        }
    assert table(page(client, path), "limits") == [
        ["physics (the whole account)", "8", "—", "50.00"],
        ["alice", "4", "0.005", "30.00"],
    ]
    # A blank field leaves its cap; "remove all caps first" starts from none.
    post(client, path, path + "/limits", user="alice", max_gpus="2")
    post(client, path, path + "/limits", user="", clear="yes", max_gpus="16")
    with ledger(portal_db) as s:
        limits = api.show_limits(s, "physics")
    assert limits["account_limits"] == {"max_gpus": 16, "max_rate": None, "daily_cap": None}
    assert limits["users"]["alice"] == {"max_gpus": 2, "max_rate": "0.005", "daily_cap": "30.00"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_gpus": "four"}, "max GPUs &#39;four&#39; must be a whole number"),
        ({"max_rate": "fast"}, "max_rate &#39;fast&#39; is not a decimal number"),
        ({"daily_cap": "-3"}, "daily_cap &#39;-3&#39; must not be negative"),
    ],
)
def test_a_bad_cap_is_refused_and_no_cap_changes(
    login_as: LoginAs, portal_db: str, fields: dict[str, str], message: str
) -> None:
    path = "/admin/accounts/physics"
    response = post(login_as("admin"), path, path + "/limits", **{"user": "alice", "max_gpus": "4", **fields})
    assert response.status_code == 422
    assert message in response.get_data(as_text=True)
    with ledger(portal_db) as s:
        assert api.show_limits(s, "physics")["users"] == {}


# --- credit: grants, top-ups, adjustments -----------------------------------------------


def test_an_admin_records_a_grant_and_a_top_up(login_as: LoginAs, portal_db: str, site: Site) -> None:
    client = login_as("admin")
    path = "/admin/accounts/physics"
    expires = format_time(site.now + timedelta(days=30))
    granted = post(
        client, path, path + "/grants", amount="10", expires=expires, priority="5", reference="allocation-27"
    )
    topped = post(client, path, path + "/topups", amount="25.50", reference="invoice-7")
    assert (granted.status_code, topped.status_code) == (302, 302)
    assert available(portal_db, "physics") == ("135.50", "14.40")
    with ledger(portal_db) as s:
        grants = api.balance(s, "physics")["grants"]
    assert [(g["source"], g["amount"], g["priority"], g["expires_at"]) for g in grants] == [
        ("grant", "10.00", 5, expires),
        ("grant", "20.00", 10, format_time(site.now + timedelta(days=5))),
        ("topup", "100.00", 10, None),
        ("topup", "25.50", 10, None),
    ]
    html = page(client, path)
    assert "Top-up of 25.50 credits to physics recorded." in html
    assert 'class="value available">135.50<' in html


def test_a_double_submitted_top_up_is_recorded_once(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("admin")
    path = "/admin/accounts/physics"
    fields = form(client, path, amount="25", reference="invoice-7")
    codes = [client.post(path + "/topups", data=fields).status_code for _ in range(2)]
    assert codes == [302, 302]
    assert available(portal_db, "physics") == ("125.00", "14.40")


@pytest.mark.parametrize(
    ("action", "fields", "message"),
    [
        ("/topups", {"amount": "lots"}, "amount &#39;lots&#39; is not a decimal number"),
        ("/grants", {"amount": "0"}, "amount must be greater than zero"),
        (
            "/grants",
            {"amount": "5", "effective": "tomorrow"},
            "effective time &#39;tomorrow&#39; is not an ISO",
        ),
        (
            "/grants",
            {"amount": "5", "effective": "2030-01-02T00:00", "expires": "2030-01-01T00:00"},
            "expiry 2030-01-01T00:00:00Z is not after the effective time 2030-01-02T00:00:00Z",
        ),
        ("/grants", {"amount": "5", "priority": "first"}, "priority &#39;first&#39; must be a whole number"),
    ],
)
def test_bad_credit_input_is_refused_with_the_ledgers_message(
    login_as: LoginAs, portal_db: str, action: str, fields: dict[str, str], message: str
) -> None:
    path = "/admin/accounts/physics"
    response = post(login_as("admin"), path, path + action, **fields)
    assert response.status_code == 422
    assert message in response.get_data(as_text=True)
    assert available(portal_db, "physics") == ("100.00", "14.40")
    with ledger(portal_db) as s:
        assert len(api.balance(s, "physics")["grants"]) == 2


def test_a_refund_linked_to_a_run_returns_credit(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("admin")
    path = "/admin/accounts/physics"
    entry = charge_entry(portal_db, "physics", 1001)
    fields = form(client, path, entry_id=str(entry), amount="-1.80", reason="half the run was a node fault")
    codes = [client.post(path + "/adjustments", data=fields).status_code for _ in range(2)]
    assert codes == [302, 302]
    assert available(portal_db, "physics") == ("101.80", "14.40")
    assert hold_of(portal_db, 1001).charged_ucredits == 1_800_000
    html = page(client, path)
    assert f"Adjustment of -1.80 credits linked to entry {entry}." in html
    assert ["alice", "default/1001/0", "h100:2", "1.80"] in [row[2:] for row in table(html, "charges")]


def test_a_refund_larger_than_the_runs_charge_is_refused(login_as: LoginAs, portal_db: str) -> None:
    path = "/admin/accounts/physics"
    entry = charge_entry(portal_db, "physics", 1001)
    response = post(
        login_as("admin"), path, path + "/adjustments", entry_id=str(entry), amount="-5", reason="oops"
    )
    assert response.status_code == 422
    assert "a refund of 5.00 exceeds the 3.60 this run was charged" in response.get_data(as_text=True)
    assert available(portal_db, "physics") == ("100.00", "14.40")


def test_an_adjustment_must_link_to_a_charge_of_this_account(login_as: LoginAs, portal_db: str) -> None:
    path = "/admin/accounts/physics"
    chemistry_entry = charge_entry(portal_db, "chemistry", 2001)
    response = post(
        login_as("admin"), path, path + "/adjustments", entry_id=str(chemistry_entry), amount="-1", reason="x"
    )
    assert response.status_code == 404
    assert f"entry {chemistry_entry} of account physics does not exist" in response.get_data(as_text=True)
    assert available(portal_db, "chemistry") == ("39.00", "0.00")


# --- prices ----------------------------------------------------------------------------


def test_the_prices_page_marks_the_version_in_force(login_as: LoginAs, site: Site) -> None:
    html = page(login_as("admin"), "/admin/prices")
    set_at = format_time(site.start - timedelta(days=30))
    assert table(html, "prices") == [
        ["a100", "all", "2.00", set_at, "in force"],
        ["h100", "all", "3.60", set_at, "in force"],
    ]


def test_a_price_set_for_tomorrow_leaves_todays_in_force(
    login_as: LoginAs, portal_db: str, site: Site
) -> None:
    client = login_as("admin")
    tomorrow = format_time(site.now + timedelta(days=1))
    response = post(client, "/admin/prices", "/admin/prices", gres="h100", price="4.00", effective=tomorrow)
    assert response.status_code == 302
    html = page(client, "/admin/prices")
    assert f"Price of h100 set to 4.00 credits per GPU-hour from {tomorrow}." in html
    set_at = format_time(site.start - timedelta(days=30))
    assert table(html, "prices")[1:] == [
        ["h100", "all", "3.60", set_at, "in force"],
        ["h100", "all", "4.00", tomorrow, ""],
    ]
    with ledger(portal_db) as s:
        prices = api.load_price_table(s)
    assert prices.price_at("h100", None, site.now) == 3_600_000
    assert prices.price_at("h100", None, site.now + timedelta(days=1)) == 4_000_000


def test_a_double_submitted_price_is_one_version(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("admin")
    fields = form(client, "/admin/prices", gres="a100", price="2.50", partition="cloud")
    codes = [client.post("/admin/prices", data=fields).status_code for _ in range(2)]
    assert codes == [302, 302]
    with ledger(portal_db) as s:
        cloud = [p for p in api.list_prices(s) if p["partition"] == "cloud"]
    assert [(p["gres"], p["credits_per_gpu_hour"]) for p in cloud] == [("a100", "2.50")]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gres": "h 100", "price": "4"}, "GPU type &#39;h 100&#39; is not a valid GRES type name"),
        ({"gres": "h100", "price": "cheap"}, "price &#39;cheap&#39; is not a decimal number"),
        ({"gres": "h100", "price": "4", "effective": "next week"}, "effective time &#39;next week&#39;"),
    ],
)
def test_a_bad_price_is_refused_and_no_version_is_added(
    login_as: LoginAs, portal_db: str, fields: dict[str, str], message: str
) -> None:
    response = post(login_as("admin"), "/admin/prices", "/admin/prices", **fields)
    assert response.status_code == 422
    assert message in response.get_data(as_text=True)
    with ledger(portal_db) as s:
        assert len(api.list_prices(s)) == 2


# --- holds -----------------------------------------------------------------------------


def test_the_holds_page_lists_active_holds(login_as: LoginAs, portal_db: str) -> None:
    hold = hold_of(portal_db, 1003)
    html = page(login_as("admin"), "/admin/holds")
    assert table(html, "holds") == [
        [
            "physics",
            "alice",
            "1003 default",
            "h100:1",
            "14.40",
            "0.00",
            format_time(hold.expires_at),
            "Release",
        ]
    ]


def test_releasing_a_hold_returns_its_credit_once(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("admin")
    hold_id = hold_of(portal_db, 1003).id
    fields = form(client, "/admin/holds")
    codes = [client.post(f"/admin/holds/{hold_id}/release", data=fields).status_code for _ in range(2)]
    assert codes == [302, 302]
    assert available(portal_db, "physics") == ("114.40", "0.00")
    with ledger(portal_db) as s:
        assert api.get_hold(s, hold_id).state == "released"
    html = page(client, "/admin/holds")
    assert f"Hold {hold_id} of job 1003 (physics) released; 0.00 stays charged." in html
    assert table(html, "holds") == [["No active holds."]]


def test_a_hold_that_has_settled_cannot_be_released(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("admin")
    hold_id = hold_of(portal_db, 1001).id
    response = client.post(f"/admin/holds/{hold_id}/release", data=form(client, "/admin/holds"))
    assert response.status_code == 409
    assert f"hold {hold_id} is already settled; it resolves exactly once" in response.get_data(as_text=True)
    assert available(portal_db, "physics") == ("100.00", "14.40")


# --- audit -----------------------------------------------------------------------------


def test_the_audit_reports_a_clean_journal(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("admin")
    assert "audit-result" not in page(client, "/admin/audit")
    with ledger(portal_db) as s:
        entries = api.verify(s).entries
    response = client.post("/admin/audit", data={"csrf_token": csrf_token(client, "/admin/audit")})
    assert response.status_code == 200
    assert f"OK: 2 accounts, {entries} entries checked, no problems." in response.get_data(as_text=True)


def test_the_audit_shows_the_first_broken_chain(login_as: LoginAs, portal_db: str) -> None:
    entry = charge_entry(portal_db, "physics", 1001)
    with ledger(portal_db) as s:  # a tamperer with the file drops the append-only triggers first
        triggers = s.execute(text("SELECT name FROM sqlite_master WHERE type = 'trigger'")).scalars().all()
        for name in triggers:
            s.execute(text(f"DROP TRIGGER {name}"))
        s.execute(text("UPDATE entries SET memo = '{}' WHERE id = :id"), {"id": entry})
    client = login_as("admin")
    response = client.post("/admin/audit", data={"csrf_token": csrf_token(client, "/admin/audit")})
    html = response.get_data(as_text=True)
    assert 'data-ok="false"' in html
    assert f"entry {entry} (seq" in html and "hash mismatch; the entry or its postings were edited" in html


# --- forms without their tokens ------------------------------------------------------------


def test_a_form_without_its_csrf_token_changes_nothing(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("admin")
    fields = form(client, "/admin/accounts/physics", amount="25")
    del fields["csrf_token"]
    assert client.post("/admin/accounts/physics/topups", data=fields).status_code == 400
    assert client.post("/admin/prices", data={**fields, "gres": "h100", "price": "9"}).status_code == 400
    assert available(portal_db, "physics") == ("100.00", "14.40")
    with ledger(portal_db) as s:
        assert len(api.list_prices(s)) == 2


def test_a_form_without_an_idempotency_key_changes_nothing(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("admin")
    fields = form(client, "/admin/accounts/physics", amount="25")
    del fields["idempotency_key"]
    response = client.post("/admin/accounts/physics/topups", data=fields)
    assert response.status_code == 400
    assert "no idempotency key" in response.get_data(as_text=True)
    assert available(portal_db, "physics") == ("100.00", "14.40")


# --- account managers --------------------------------------------------------------------

MANAGE = "/accounts/physics/manage"


def test_a_manager_sees_members_caps_and_grants_of_their_account(login_as: LoginAs) -> None:
    html = page(login_as("alice"), MANAGE)
    assert 'class="value available">100.00<' in html
    assert [row[:2] for row in table(html, "members")] == [["alice", "manager"], ["bob", "member"]]
    assert table(html, "members")[0][2] == "you"  # a manager's own role is not theirs to change
    assert table(html, "limits") == [
        ["physics (the whole account)", "—", "—", "—"],
        ["alice", "—", "—", "—"],
        ["bob", "—", "—", "—"],
    ]
    assert [row[1:4] for row in table(html, "grants")] == [
        ["grant", "20.00", "14.40"],
        ["topup", "100.00", "100.00"],
    ]
    assert "/topups" not in html and "/adjustments" not in html


def test_a_manager_adds_a_member_and_sets_a_members_caps(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("alice")
    added = post(client, MANAGE, MANAGE + "/members", user="erin", role="member")
    capped = post(client, MANAGE, MANAGE + "/limits", user="bob", max_gpus="2", daily_cap="10")
    assert (added.status_code, capped.status_code) == (302, 302)
    assert added.headers["Location"] == MANAGE
    with ledger(portal_db) as s:
        assert {"user": "erin", "role": "member"} in api.member_roles(s, "physics")
        limits = api.show_limits(s, "physics")
    assert limits["users"] == {"bob": {"max_gpus": 2, "max_rate": None, "daily_cap": "10.00"}}
    assert limits["account_limits"] == {"max_gpus": None, "max_rate": None, "daily_cap": None}
    assert ["bob", "2", "—", "10.00"] in table(page(client, MANAGE), "limits")


def test_a_double_submitted_manager_form_changes_once(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("alice")
    fields = form(client, MANAGE, user="bob", max_gpus="3")
    codes = [client.post(MANAGE + "/limits", data=fields).status_code for _ in range(2)]
    assert codes == [302, 302]
    with ledger(portal_db) as s:
        assert api.show_limits(s, "physics")["users"]["bob"]["max_gpus"] == 3


def test_a_manager_sets_caps_only_for_members_and_never_the_accounts_own(
    login_as: LoginAs, portal_db: str
) -> None:
    client = login_as("alice")
    outsider = post(client, MANAGE, MANAGE + "/limits", user="carol", max_gpus="1")
    blank = post(client, MANAGE, MANAGE + "/limits", user="", max_gpus="1")
    assert (outsider.status_code, blank.status_code) == (422, 422)
    assert "carol is not a member of physics" in outsider.get_data(as_text=True)
    with ledger(portal_db) as s:
        limits = api.show_limits(s, "physics")
    assert limits["users"] == {} and limits["account_limits"]["max_gpus"] is None


def test_a_manager_cannot_change_their_own_role(login_as: LoginAs, portal_db: str) -> None:
    response = post(login_as("alice"), MANAGE, MANAGE + "/members", user="alice", role="member")
    assert response.status_code == 403
    assert "you cannot change your own role" in response.get_data(as_text=True)
    with ledger(portal_db) as s:
        assert {"user": "alice", "role": "manager"} in api.member_roles(s, "physics")


def test_a_manager_of_another_account_gets_not_found(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("alice")
    assert client.get("/accounts/chemistry/manage").status_code == 404
    token = csrf_token(client, MANAGE)
    data = {"csrf_token": token, "idempotency_key": "k", "user": "erin", "role": "member", "max_gpus": "1"}
    assert client.post("/accounts/chemistry/manage/members", data=data).status_code == 404
    assert client.post("/accounts/chemistry/manage/limits", data={**data, "user": "carol"}).status_code == 404
    with ledger(portal_db) as s:
        assert api.member_roles(s, "chemistry") == [{"user": "carol", "role": "manager"}]
        assert api.show_limits(s, "chemistry")["users"] == {}


def test_a_member_gets_forbidden_on_the_manager_pages(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("bob")
    response = client.get(MANAGE)
    assert response.status_code == 403
    assert "only a manager of physics may do this" in response.get_data(as_text=True)
    token = csrf_token(client, "/login")
    data = {"csrf_token": token, "idempotency_key": "k", "user": "bob", "max_gpus": "99", "role": "manager"}
    assert client.post(MANAGE + "/limits", data=data).status_code == 403
    assert client.post(MANAGE + "/members", data=data).status_code == 403
    with ledger(portal_db) as s:
        assert {"user": "bob", "role": "member"} in api.member_roles(s, "physics")
        assert api.show_limits(s, "physics")["users"] == {}


@pytest.mark.parametrize(("user", "status"), [("dave", 404), ("carol", 404), ("admin", 200)])
def test_others_see_the_manager_page_as_if_the_account_did_not_exist(
    login_as: LoginAs, user: str, status: int
) -> None:
    assert login_as(user).get(MANAGE).status_code == status


def test_the_chemistry_manager_manages_chemistry(login_as: LoginAs, portal_db: str) -> None:
    client = login_as("carol")
    path = "/accounts/chemistry/manage"
    assert 'class="value available">39.00<' in page(client, path)
    assert post(client, path, path + "/members", user="dave", role="member").status_code == 302
    with ledger(portal_db) as s:
        assert api.member_roles(s, "chemistry") == [
            {"user": "carol", "role": "manager"},
            {"user": "dave", "role": "member"},
        ]
