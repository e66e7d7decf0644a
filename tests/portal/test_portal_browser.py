"""The portal as a PI meets it: headless Chromium (Debian's, driven by Playwright)
against the real `gpucredit serve` (waitress), on a seeded site, paying through a fake
Stripe.

alice, the manager of physics, logs in; reads 100.00 available; buys 50 credits
(top-up form -> Stripe's checkout page -> Stripe's signed `checkout.session.completed`
webhook to the served portal -> back on the payment page) and sees 150.00; finds job
1001's exact cost; sees the usage chart drawn; downloads the CSV and finds the table's
figures in it.

Needs /usr/bin/chromium (apt-get install chromium) and playwright (the dev extras);
Playwright never downloads a browser here. Without them these tests fail under CI and
skip elsewhere. Nothing waits on a clock: Playwright's `expect` waits for page states.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_stripe import FakeStripe, event, signature
from tests.support.portal import PASSWORD, TIMEOUT_MS, Site, seed_site
from tests.support.served import Server, free_port

pytestmark = pytest.mark.browser

STRIPE_KEY = "sk_test_browser"
WEBHOOK_SECRET = "whsec_browser_test"
CHECKOUT = re.compile(r"^https://checkout\.stripe\.com/c/pay/(cs_test_\w+)$")


@pytest.fixture(scope="module")
def fake_stripe() -> Iterator[FakeStripe]:
    fake = FakeStripe(secret_key=STRIPE_KEY).start()
    yield fake
    fake.stop()
    fake.check()


@pytest.fixture(scope="module")
def served_site(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> tuple[Path, str, Site]:
    """A seeded SQLite file (tests.support.portal's site) and its URL."""
    workdir = tmp_path_factory.mktemp("served")
    database = workdir / "ledger.db"
    shutil.copy(sqlite_template, database)
    url = f"sqlite:///{database}"
    return workdir, url, seed_site(url)


@pytest.fixture(scope="module")
def portal_url(
    served_site: tuple[Path, str, Site], fake_stripe: FakeStripe, playwright_api: Any
) -> Iterator[str]:
    """`gpucredit serve` on the seeded site, paying through the fake Stripe; its base URL."""
    workdir, database_url, _site = served_site
    config = workdir / "gpucredit.toml"
    config.write_text(
        f'[database]\nurl = "{database_url}"\n\n'
        f'[portal]\nsecret_key_file = "{workdir / "secret-key"}"\nmetrics_port = 0\n\n'
        '[payments]\nprovider = "stripe"\n\n'
        f'[payments.stripe]\nsecret_key = "{STRIPE_KEY}"\nwebhook_secret = "{WEBHOOK_SECRET}"\n'
        f'api_base = "{fake_stripe.api_base}"\n'
    )
    port = free_port()
    gpucredit = str(Path(sys.executable).parent / "gpucredit")
    server = Server(
        [gpucredit, "serve", "--host", "127.0.0.1", "--port", str(port)],
        {"GPUCREDIT_CONFIG": str(config), "GPUCREDIT_DATABASE_URL": ""},
    ).start()
    yield f"http://127.0.0.1:{port}"
    assert server.stop() == 0, server.output


@pytest.fixture
def page(browser: Any, portal_url: str) -> Iterator[Any]:
    """A new browser profile's tab (no cookies) whose visits to Stripe's checkout land
    on a stand-in page: the network is closed, and the test pays through the webhook.
    What the browser logs as errors (a Content-Security-Policy violation, say) is kept
    in `tab.errors` for failure messages."""
    context = browser.new_context(base_url=portal_url, accept_downloads=True)
    context.set_default_timeout(TIMEOUT_MS)
    context.route(
        "https://checkout.stripe.com/**",
        lambda route: route.fulfill(
            status=200, content_type="text/html", body="<!doctype html><title>Checkout</title><h1>Pay</h1>"
        ),
    )
    tab = context.new_page()
    tab.errors = []
    tab.on("console", lambda message: message.type == "error" and tab.errors.append(message.text))
    yield tab
    context.close()


def log_in(page: Any, user: str) -> None:
    from playwright.sync_api import expect

    page.goto("/login")
    page.get_by_label("User name").fill(user)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="My accounts")).to_be_visible()


def deliver_webhook(portal_url: str, body: bytes) -> int:
    """What Stripe does once the payer has paid: a signed POST to the portal."""
    request = urllib.request.Request(
        f"{portal_url}/api/v1/payments/stripe/webhook",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Stripe-Signature": signature(body, WEBHOOK_SECRET)},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return int(answer.status)


def test_a_pi_buys_credit_through_stripe_and_sees_it(
    page: Any, portal_url: str, fake_stripe: FakeStripe
) -> None:
    from playwright.sync_api import expect

    log_in(page, "alice")
    expect(page.get_by_test_id("available-physics")).to_have_text("100.00")
    page.locator('tr[data-account="physics"]').get_by_role("link", name="physics").click()
    expect(page.get_by_test_id("available")).to_have_text("100.00")
    expect(page.get_by_test_id("held")).to_have_text("14.40")

    page.goto("/accounts/physics/topup")
    page.get_by_label("Credits").fill("50")
    page.get_by_role("button", name="Continue to payment").click()
    try:
        expect(page).to_have_url(CHECKOUT)
    except AssertionError as error:
        raise AssertionError(
            f"the top-up never reached Stripe's checkout; browser errors: {page.errors}"
        ) from error
    session_id = CHECKOUT.match(page.url).group(1)  # type: ignore[union-attr]
    assert fake_stripe.sessions[session_id]["amount_total"] == 5000  # cents: 50 credits at 1.00 USD

    # Nothing is spendable until Stripe says it is paid.
    page.goto("/accounts/physics")
    expect(page.get_by_test_id("available")).to_have_text("100.00")

    paid = fake_stripe.finish(session_id)
    assert deliver_webhook(portal_url, event("checkout.session.completed", paid)) == 200

    page.reload()
    expect(page.get_by_test_id("available")).to_have_text("150.00")
    # Stripe sends the payer back to the payment's page.
    page.goto(paid["success_url"])
    expect(page.locator(".payment-state")).to_have_attribute("data-state", "paid")
    expect(page.locator(".payment-state")).to_contain_text("150.00 credits available")
    assert page.errors == []


def test_a_pi_reads_jobs_and_usage_and_downloads_the_csv(page: Any) -> None:
    from playwright.sync_api import expect

    log_in(page, "alice")
    page.goto("/accounts/physics")
    tabs = page.get_by_role("navigation", name="physics")
    tabs.get_by_role("link", name="Jobs").click()
    expect(page.locator('tr[data-job="1001"]').get_by_test_id("cost")).to_have_text("3.60")
    expect(page.locator('tr[data-job="1002"]').get_by_test_id("cost")).to_have_text("2.00")

    tabs.get_by_role("link", name="Usage").click()
    page.get_by_label("Group by").select_option("gres")
    page.get_by_role("button", name="Show").click()
    expect(page).to_have_url(re.compile(r"[?&]by=gres"))

    table = page.get_by_test_id("usage-table")
    expect(table.locator('tr[data-key="h100"]').get_by_test_id("charged")).to_have_text("3.60")
    expect(table.locator('tr[data-key="a100"]').get_by_test_id("charged")).to_have_text("2.00")
    chart = page.get_by_test_id("usage-chart")
    expect(chart).to_be_visible()
    bars = chart.locator("rect.bar")
    expect(bars).to_have_count(table.locator("tbody tr[data-key]").count())
    h100 = chart.locator('rect.bar[data-label="h100"]')
    expect(h100).to_have_attribute("data-value", "3.60")
    expect(chart.locator('rect.bar[data-label="a100"]')).to_have_attribute("data-value", "2.00")
    # Drawn, not just present: the browser laid the tallest bar out with a real height.
    box = h100.bounding_box()
    assert box is not None and box["height"] > 0 and box["width"] > 0

    shown = {
        row.get_attribute("data-key"): [
            row.get_by_test_id(testid).inner_text() for testid in ("charged", "gpu-seconds", "jobs")
        ]
        for row in table.locator("tbody tr[data-key]").all()
    }
    with page.expect_download() as downloading:
        page.get_by_test_id("csv").click()
    download = downloading.value
    assert download.suggested_filename == "usage-physics-by-gres.csv"
    rows = list(csv.DictReader(io.StringIO(Path(download.path()).read_text())))
    assert {row["gres"]: [row["charged"], row["gpu_seconds"], row["jobs"]] for row in rows} == shown
    assert shown["h100"][0] == "3.60"
    # Every page obeyed the portal's Content-Security-Policy (no inline style or script).
    assert page.errors == []
