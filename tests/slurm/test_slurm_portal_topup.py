"""A top-up paid through the portal frees a job Slurm held for lack of credit.

On the real Slurm box (tests/slurm/conftest.py's `cluster`: hooks, the daemon and its
release loop, this module's own account): the prolog holds a job its account cannot
pay for, the account's member buys credit on the portal's Stripe checkout
(tests/support/fake_stripe.py) and Stripe's signed webhook marks it paid. The daemon's own
release loop, the only release path, then lets the job run.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from flask import Flask

from ledger import api
from portal.auth import hash_password
from tests.support.cluster import Cluster, submit
from tests.support.fake_stripe import FakeStripe, event, signature
from tests.support.portal import PASSWORD, csrf_token, login, make_app

pytestmark = pytest.mark.slurm
WEBHOOK_SECRET = "whsec_e2e"


@pytest.fixture
def fake_stripe() -> Iterator[FakeStripe]:
    with FakeStripe().running() as fake:
        yield fake


def wait_for_credit_hold(cluster: Cluster, job: int) -> str:
    """The prolog's refusal: the job pending, held, with gpucredit's reason in squeue."""
    deadline = time.monotonic() + 60
    while not cluster.box.scontrol_job(job).get("Comment", "").startswith("gpucredit:"):
        assert time.monotonic() < deadline, cluster.box.scontrol_job(job)
        time.sleep(0.2)
    cluster.box.wait_state(job, "PENDING", timeout=30)  # the refused start is requeued first
    return cluster.box.run(["squeue", "-h", "-j", str(job), "-o", "%T|%r|%k"], check=True).stdout.strip()


@pytest.fixture
def portal(cluster: Cluster, fake_stripe: FakeStripe) -> Iterator[Flask]:
    """The portal on this module's ledger, paying through the fake Stripe."""
    app = make_app(
        cluster.url,
        payments={
            "provider": "stripe",
            "stripe": {
                "secret_key": fake_stripe.secret_key,
                "webhook_secret": WEBHOOK_SECRET,
                "api_base": fake_stripe.api_base,
            },
        },
    )
    yield app
    app.extensions["gpucredit.engine"].dispose()


def test_a_checkout_paid_through_the_portal_releases_a_job_held_for_credit(
    cluster: Cluster, fake_stripe: FakeStripe, portal: Flask
) -> None:
    account = cluster.new_account("0.06")  # one 1×h100 job of 1 min: job_submit accepts it
    job = submit(cluster.box, "-A", account, "--hold", "--gres=gpu:h100:1", "-t", "1", "--wrap", "sleep 2")
    with cluster.tx() as s:
        api.consume(s, account, "0.06")  # spent elsewhere before the job starts
        api.set_portal_user(s, "alice", password_hash=hash_password(PASSWORD))
    cluster.box.run(["scontrol", "release", str(job)], check=True)
    assert wait_for_credit_hold(cluster, job).startswith("PENDING|JobHeldAdmin|gpucredit: account ")

    alice = portal.test_client()
    assert login(alice, "alice").status_code == 302
    page = f"/accounts/{account}/topup"
    started = alice.post(
        page, data={"amount": "1", "csrf_token": csrf_token(alice, page), "idempotency_key": "e2e"}
    )
    assert started.status_code == 303, started.get_data(as_text=True)
    session_id = re.search(r"cs_test_\w+$", started.headers["Location"])
    assert session_id, started.headers["Location"]
    with cluster.tx() as s:  # bought, not paid: nothing the daemon may release the job on
        assert api.quote(s, account, "h100:1", 60)["affordable"] is False

    paid = event("checkout.session.completed", fake_stripe.finish(session_id.group(0)))
    delivered = portal.test_client().post(
        "/api/v1/payments/stripe/webhook",
        data=paid,
        headers={"Stripe-Signature": signature(paid, WEBHOOK_SECRET), "Content-Type": "application/json"},
    )
    assert delivered.status_code == 200, delivered.get_json()
    assert delivered.get_json()["payment"]["state"] == "paid"

    assert cluster.box.wait_state(job, "COMPLETED", timeout=90) == "COMPLETED"
    [hold] = cluster.settled_holds(job, account)  # the refused start (run 0) took none
    assert (hold.run, hold.state) == (1, "settled")
