"""A researcher submits and cancels a job in a real browser: headless Chromium (Debian's,
driven by Playwright) against the portal served by waitress, on the seeded site.

bob logs in, opens New job and sees the defaults priced; types a script and 2×h100 for
two hours and sees the quote (14.40) and the sbatch line change as he types (the live
quote's script runs under the portal's Content-Security-Policy); submits; finds the job
queued in My jobs with its reason; cancels it there and sees it cancelled.

Slurm is the fake backend (tests/support/fake_jobs.py), so the portal runs in this
process (waitress on a thread) rather than as `gpucredit serve`: the backend is put in
the app before it serves. Needs /usr/bin/chromium and playwright as
test_portal_browser.py does (skips elsewhere, fails under CI); nothing waits on a clock:
Playwright's `expect` waits for page states.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from portal.jobs.backend import JobSpec
from tests.support.fake_jobs import FakeBackend, seeded_backend
from tests.support.portal import PASSWORD, TIMEOUT_MS, make_app, seed_site
from tests.support.served import free_port

pytestmark = pytest.mark.browser

SCRIPT = "#!/bin/bash\npython train.py\n"


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path
) -> Iterator[tuple[str, FakeBackend]]:
    """The portal on a seeded SQLite file with the fake backend, served by waitress on a
    thread; its base URL and the backend."""
    from waitress.server import create_server

    database = tmp_path_factory.mktemp("served-jobs") / "ledger.db"
    shutil.copy(sqlite_template, database)
    url = f"sqlite:///{database}"
    site = seed_site(url)
    app = make_app(url)
    backend = seeded_backend(site.start)
    app.extensions["gpucredit.jobs_backend"] = backend
    app.config["GPUCREDIT"]["slurm"]["cluster"] = "default"  # the seeded holds' cluster
    server = create_server(app, host="127.0.0.1", port=free_port(), threads=4)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.effective_port}", backend
    server.close()
    thread.join(timeout=20)


@pytest.fixture
def tab(browser: Any, served: tuple[str, FakeBackend]) -> Iterator[Any]:
    """A new profile's tab; what the browser logs as errors (a CSP violation, say) is kept,
    and the path of every response that was an error."""
    context = browser.new_context(base_url=served[0])
    context.set_default_timeout(TIMEOUT_MS)
    tab = context.new_page()
    tab.errors = []
    tab.failed = []
    tab.on("console", lambda message: message.type == "error" and tab.errors.append(message.text))
    tab.on("response", lambda answer: answer.status >= 400 and tab.failed.append(answer.url.split("/", 3)[3]))
    yield tab
    context.close()


def test_a_researcher_submits_a_job_sees_it_queued_and_cancels_it(
    tab: Any, served: tuple[str, FakeBackend]
) -> None:
    from playwright.sync_api import expect

    backend = served[1]
    tab.goto("/login")
    tab.get_by_label("User name").fill("bob")
    tab.get_by_label("Password").fill(PASSWORD)
    tab.get_by_role("button", name="Log in").click()
    expect(tab.get_by_role("heading", name="My accounts")).to_be_visible()

    tab.get_by_role("link", name="New job").click()
    expect(tab.get_by_test_id("cost")).to_have_text("2.00")  # the defaults: 1×a100 for 1 h
    tab.get_by_label("Script").fill(SCRIPT)
    tab.get_by_label("GPU type").select_option("h100")
    tab.get_by_label("Number of GPUs").fill("2")
    tab.get_by_label("Time limit").fill("02:00:00")
    tab.get_by_label("Job name").fill("train")
    sbatch = "sbatch -A physics --gres=gpu:h100:2 -t 02:00:00 -J train job.sh"
    try:
        expect(tab.get_by_test_id("sbatch")).to_have_text(sbatch)
    except AssertionError as error:
        raise AssertionError(f"the live quote never came; browser errors: {tab.errors}") from error
    expect(tab.get_by_test_id("cost")).to_have_text("14.40")  # 2×h100 at 3.60 for 2 h
    expect(tab.get_by_test_id("available")).to_have_text("100.00")

    tab.get_by_role("button", name="Submit job").click()
    expect(tab.get_by_role("heading", name="Job 5001")).to_be_visible()
    assert backend.submits == [("bob", JobSpec("physics", SCRIPT, "h100:2", "02:00:00", name="train"))]

    tab.get_by_role("link", name="My jobs").click()
    queued = tab.locator('[data-testid="queued"] tr[data-job="5001"]')
    expect(queued.get_by_test_id("reason")).to_have_text("waiting for GPUs")
    queued.get_by_role("button", name="Cancel").click()
    expect(tab.get_by_role("status")).to_have_text("Job 5001 cancelled; it is now cancelled.")
    finished = tab.locator('[data-testid="finished"] tr[data-job="5001"]')
    expect(finished.get_by_test_id("state")).to_have_text("cancelled")
    expect(tab.locator('[data-testid="queued"] tr[data-job="5001"]')).to_have_count(0)
    assert backend.cancels == [("bob", 5001)]
    # Nothing refused by the Content-Security-Policy, no request failed but the favicon's.
    assert [error for error in tab.errors if "Content Security Policy" in error] == []
    assert set(tab.failed) <= {"favicon.ico"}, tab.failed
