"""The jobs API on the real Slurm box: the portal's POST/GET/DELETE /api/v1/jobs reach
Slurm as alice, so every job passes job_submit.lua and the hooks like any sbatch; costs
are the ledger's, checked against sacct's ElapsedRaw. On 22.05 (the host's box) through
the root submitter (portal/jobs/submitter.py), which runs alice's own sbatch/scancel; on
24.11 and 26.05 (chroot boxes) through the box's slurmrestd with a token minted for
alice (portal/jobs/rest.py).

Run under the box lock: flock /tmp/gpucredit-box.lock pytest -m slurm tests/slurm/test_slurm_jobs_api.py
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select

from ledger import api
from ledger.jobs.retries import job_retries
from ledger.money import charge_for, format_credits
from ledger.store.tables import accounts_t, entries_t
from portal.auth import Forbidden
from slurmbox.box import BUNDLE_DIR
from slurmbox.chroot import ChrootBox
from slurmtext import parse_time
from tests.support.cluster import PRICES, Cluster, on_premise_full, sacct_runs
from tests.support.jobs_portal import rest_backend
from tests.support.portal import bearer

pytestmark = pytest.mark.slurm
SCRIPT = "#!/bin/sh\nsleep 2\necho job-says-done\n"


def submit(client: FlaskClient, headers: dict[str, str], account: str, script: str = SCRIPT) -> Any:
    body = {
        "account": account,
        "script": script,
        "gpus": "h100:1",
        "time_limit": "00:01:00",
        "name": "apitest",
    }
    return client.post(
        "/api/v1/jobs", json=body, headers={**headers, "Idempotency-Key": f"k-{account}-{time.monotonic()}"}
    )


def wait_for(
    client: FlaskClient, headers: dict[str, str], job_id: int, states: set[str], timeout: float = 90
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        answer = client.get(f"/api/v1/jobs/{job_id}", headers=headers)
        assert answer.status_code == 200, answer.get_json()
        job = answer.get_json()
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.2)


def test_a_job_submitted_through_the_api_runs_and_costs_exactly_its_seconds(
    cluster: Cluster, portal: Flask, alice: dict[str, str]
) -> None:
    account = cluster.new_account("10")
    client = portal.test_client()
    answer = submit(client, alice, account)
    assert answer.status_code == 201, answer.get_json()
    body = answer.get_json()
    job_id = body["job_id"]
    assert body["state"] == "queued"
    assert body["message"].startswith("gpucredit: ~0.06 credits (1×h100 × 1 min)"), body
    assert (body["quote"]["cost"], body["quote"]["affordable"]) == ("0.06", True)
    first = client.get(f"/api/v1/jobs/{job_id}", headers=alice).get_json()
    assert (first["account"], first["user"], first["state"] in ("queued", "running")) == (
        account,
        "alice",
        True,
    )
    listed = client.get(f"/api/v1/jobs?account={account}", headers=alice).get_json()
    assert [job["job_id"] for job in listed["items"]] == [job_id]

    wait_for(client, alice, job_id, {"running", "completed"})
    cluster.box.wait_state(job_id, "COMPLETED", timeout=90)
    [hold] = cluster.settled_holds(job_id, account)
    [row] = sacct_runs(cluster.box, job_id, account)
    expected = charge_for(PRICES["h100"], int(row["ElapsedRaw"]))
    assert hold.charged_ucredits == expected
    done = wait_for(client, alice, job_id, {"completed"})
    assert (done["cost"], done["gpus"], done["time_limit"]) == (
        format_credits(expected),
        "h100:1",
        "00:01:00",
    )
    assert [(a["run"], a["charged"]) for a in done["attempts"]] == [(0, format_credits(expected))]
    if isinstance(cluster.box, ChrootBox):  # its files are under its root, not where the portal looks
        assert cluster.box.inside(str(hold.output_path)).read_text() == "job-says-done\n"
        return
    output = client.get(f"/api/v1/jobs/{job_id}/output?lines=5", headers=alice).get_json()
    assert "job-says-done" in output["lines"], (output, hold.output_path)


def test_a_refused_submission_changes_nothing(cluster: Cluster, portal: Flask, alice: dict[str, str]) -> None:
    account = cluster.new_account(None)
    client = portal.test_client()
    answer = submit(client, alice, account)
    assert answer.status_code == 402, answer.get_json()
    error = answer.get_json()["error"]
    assert error["code"] == "insufficient_credits"
    if isinstance(cluster.box, ChrootBox):  # slurmrestd keeps sbatch's words in its log: the quote's
        assert error["message"].startswith(
            f"gpucredit: this job would cost 0.06 credits; 0.00 available in {account}: "
        ), error["message"]
        assert error["details"]["slurmrestd"] == "Batch job submission failed (Unspecified error)", error
    else:
        assert error["message"].startswith(
            "gpucredit: this job would cost ~0.06 credits (1×h100 × 1 min) but only "
        ), error["message"]
    assert cluster.run("squeue", "-h", "-A", account, "-o", "%i") == ""
    assert cluster.run("sacct", "-n", "-X", "-P", "-A", account, "-S", "now-1hours", "-o", "JobIDRaw") == ""
    with cluster.tx() as s:
        assert api.holds_page(s, accounts=[account]) == []
        account_id = s.execute(select(accounts_t.c.id).where(accounts_t.c.name == account)).scalar_one()
        assert s.execute(entries_t.select().where(entries_t.c.account_id == account_id)).all() == []
    assert client.get(f"/api/v1/jobs?account={account}", headers=alice).get_json()["items"] == []


def test_a_job_over_a_cap_on_its_own_is_refused_with_429_naming_it(
    cluster: Cluster, portal: Flask, alice: dict[str, str]
) -> None:
    """On 22.05 from sbatch's words; through slurmrestd (which keeps them in its log) from
    the cap the ledger finds the job over, as job_submit found it."""
    account = cluster.new_account("10")
    with cluster.tx() as s:
        api.set_limits(s, account, user="alice", max_gpus=1)
    client = portal.test_client()
    body = {"account": account, "script": SCRIPT, "gpus": "h100:2", "time_limit": "00:01:00"}
    # job_submit quotes from the daemon's picture, which sees a new cap within its refresh
    # (1 s): a job accepted before that is cancelled, and the submit tried again.
    deadline = time.monotonic() + 30
    while (answer := client.post("/api/v1/jobs", json=body, headers=alice)).status_code == 201:
        cluster.run("scancel", str(answer.get_json()["job_id"]))
        assert time.monotonic() < deadline, "job_submit never saw the cap"
        time.sleep(1)
    assert answer.status_code == 429, answer.get_json()
    error = answer.get_json()["error"]
    assert error["code"] == "concurrent_gpus"
    assert "gpucredit: concurrent_gpus: 2 GPUs exceed the cap of 1 for user alice" in error["message"], error


def test_a_queued_job_cancelled_costs_nothing(cluster: Cluster, portal: Flask, alice: dict[str, str]) -> None:
    account = cluster.new_account("10")
    client = portal.test_client()
    with on_premise_full(cluster):
        job_id = submit(client, alice, account).get_json()["job_id"]
        cluster.run("scontrol", "hold", str(job_id))  # an admin's hold keeps it queued
    queued = wait_for(client, alice, job_id, {"queued"})
    assert queued["reason"] == "held by an administrator"
    cancelled = client.delete(f"/api/v1/jobs/{job_id}", headers=alice)
    assert cancelled.status_code == 200, cancelled.get_json()
    cluster.box.wait_state(job_id, "CANCELLED", timeout=60)
    final = wait_for(client, alice, job_id, {"cancelled"})
    assert (final["cost"], final["attempts"]) == ("0.00", [])
    assert cluster.holds(job_id, account) == []


def test_the_accounts_manager_cancels_alices_queued_job_as_alice(
    cluster: Cluster, portal: Flask, alice: dict[str, str]
) -> None:
    """A PI with no Unix account here (and no Slurm coordinator role) cancels a member's
    job from the portal: scancel runs as alice, whose job it is, and it costs nothing."""
    account = cluster.new_account("10")
    with cluster.tx() as s:
        api.add_member(s, "pi-of-" + account, account, role="manager")
        pi = bearer(api.create_token(s, "pi-of-" + account, "user")[1])
    client = portal.test_client()
    with on_premise_full(cluster):
        job_id = submit(client, alice, account).get_json()["job_id"]
        cluster.run("scontrol", "hold", str(job_id))  # an admin's hold keeps it queued
    assert wait_for(client, pi, job_id, {"queued"})["user"] == "alice"
    cancelled = client.delete(f"/api/v1/jobs/{job_id}", headers=pi)
    assert cancelled.status_code == 200, cancelled.get_json()
    cluster.box.wait_state(job_id, "CANCELLED", timeout=60)
    [row] = sacct_runs(cluster.box, job_id, account)
    alice_uid = cluster.box.run(["id", "-u", "alice"], check=True).stdout.strip()  # the box's own alice
    assert row["State"] == f"CANCELLED by {alice_uid}", row
    assert wait_for(client, pi, job_id, {"cancelled"})["cost"] == "0.00"
    assert cluster.holds(job_id, account) == []


def test_a_running_job_cancelled_is_settled_to_the_second(
    cluster: Cluster, portal: Flask, alice: dict[str, str]
) -> None:
    account = cluster.new_account("10")
    client = portal.test_client()
    job_id = submit(client, alice, account, "#!/bin/sh\nsleep 50\n").get_json()["job_id"]
    wait_for(client, alice, job_id, {"running"})
    time.sleep(2)  # let it run a couple of seconds, so the charge is not zero
    cancelled = client.delete(f"/api/v1/jobs/{job_id}", headers=alice)
    assert cancelled.status_code == 200, cancelled.get_json()
    cluster.box.wait_state(job_id, "CANCELLED", timeout=60)
    [hold] = cluster.settled_holds(job_id, account)
    [row] = sacct_runs(cluster.box, job_id, account)
    expected = charge_for(PRICES["h100"], int(row["ElapsedRaw"]))
    assert (hold.state, hold.charged_ucredits) == ("settled", expected)
    final = wait_for(client, alice, job_id, {"cancelled"})
    assert final["cost"] == format_credits(expected)


def test_a_token_for_another_user_cannot_cancel_alices_job(
    cluster: Cluster, portal: Flask, alice: dict[str, str]
) -> None:
    """Behind the portal's own rule, Slurm's: slurmrestd acts as the token's user, and
    slurmctld refuses bob's cancel of alice's job (it keeps running)."""
    if not isinstance(cluster.box, ChrootBox):
        pytest.skip("the host's 22.05 box has no slurmrestd: its cancels run as the user (the submitter)")
    account = cluster.new_account("10")
    client = portal.test_client()
    job_id = submit(client, alice, account, "#!/bin/sh\nsleep 30\n").get_json()["job_id"]
    wait_for(client, alice, job_id, {"running"})
    backend = rest_backend(cluster.box)
    with pytest.raises(Forbidden, match=f"Slurm refused to cancel job {job_id} as bob"):
        backend.cancel("bob", job_id)
    assert cluster.box.scontrol_job(job_id)["JobState"] == "RUNNING"
    backend.cancel("alice", job_id)
    cluster.box.wait_state(job_id, "CANCELLED", timeout=60)


def test_a_job_runs_in_its_container_and_costs_exactly_its_seconds(
    cluster: Cluster, portal: Flask, alice: dict[str, str]
) -> None:
    """`container` is sbatch --container (the REST job's `container`): the box's oci.conf
    runs the script with rootless runc in alice's busybox bundle (slurmbox/containers.py),
    whose hostname is runc's and whose / holds only the bundle's rootfs. Held and charged
    like any job, on every version."""
    account = cluster.new_account("10")
    client = portal.test_client()
    body = {
        "account": account,
        "script": "#!/bin/sh\nhostname\nls /\n",
        "gpus": "h100:1",
        "time_limit": "00:01:00",
        "container": str(BUNDLE_DIR / "alice"),
    }
    chroot = isinstance(cluster.box, ChrootBox)
    if not chroot:  # the submitter checks the bundle as alice; slurmctld does not (REST)
        unreadable = client.post("/api/v1/jobs", json={**body, "container": "/root"}, headers=alice)
        assert unreadable.status_code == 422, unreadable.get_json()
        assert unreadable.get_json()["error"]["message"] == "container alice cannot read /root"
    answer = client.post("/api/v1/jobs", json=body, headers=alice)
    assert answer.status_code == 201, answer.get_json()
    job_id = answer.get_json()["job_id"]
    assert cluster.box.scontrol_job(job_id)["Container"] == str(BUNDLE_DIR / "alice")
    cluster.box.wait_state(job_id, "COMPLETED", timeout=90)
    [hold] = cluster.settled_holds(job_id, account)
    [row] = sacct_runs(cluster.box, job_id, account)
    assert hold.charged_ucredits == charge_for(PRICES["h100"], int(row["ElapsedRaw"]))
    if chroot:  # its files are under its root, not where the portal looks
        lines = cluster.box.inside(str(hold.output_path)).read_text().splitlines()
    else:
        lines = client.get(f"/api/v1/jobs/{job_id}/output?lines=20", headers=alice).get_json()["lines"]
    # slurmstepd adds lines of its own: 22.05 about runc's state JSON ("slurmstepd-node1:
    # error: _try_parse: ... boolean expected"), 24.11 and 26.05 a RunTimeQuery of the
    # container just gone (26.05's begins with a time stamp), and a blank line. The
    # script's own lines are single words: a hostname, then names in /.
    inside = [line for line in lines if line.strip() and " " not in line]
    # 24.11 and later mount the step's spool (/var/spool/slurmd) into the container.
    root = ["bin", "dev", "proc", "sys", "tmp", *(["var"] if chroot else [])]
    assert inside == ["runc", *root], "\n".join(lines)


def test_another_unix_user_cannot_reach_the_submitter(cluster: Cluster, submitter: str) -> None:
    """Only the portal's uid may connect (the socket is 0600, and the peer uid is checked
    behind that): alice asking it directly is refused before a byte is read."""
    probe = (
        "import socket,sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.connect(sys.argv[1])\nexcept OSError as e:\n    print(type(e).__name__); sys.exit(3)\n"
    )
    done = cluster.box.run_as("alice", ["/usr/bin/python3", "-c", probe, submitter])
    assert (done.returncode, done.stdout.strip()) == (3, "PermissionError"), (done.stdout, done.stderr)


def test_a_run_that_exits_75_is_retried_after_its_backoff_and_each_attempt_is_charged(
    cluster: Cluster, portal: Flask, alice: dict[str, str]
) -> None:
    """The daemon's retry pass requeues the failed run (submitted --requeue: Slurm requeues
    an ended job only if it is requeueable) to start no sooner than its backoff; the second
    run succeeds. Each run has its own hold. Requeueing moves the failed run's End in sacct
    to the requeue; the bridge charges it to when it really ended, which the pass recorded."""
    since = datetime.now(UTC)
    account = cluster.new_account("10")
    client = portal.test_client()
    script = '#!/bin/sh\nsleep 2\n[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] || exit 75\necho second-time-lucky\n'
    body = {
        "account": account,
        "script": script,
        "gpus": "h100:1",
        "time_limit": "00:01:00",
        "retry": {"max": 2, "on": ["exit:75"], "backoff_seconds": 5},
    }
    answer = client.post("/api/v1/jobs", json=body, headers=alice)
    assert answer.status_code == 201, answer.get_json()
    job_id = answer.get_json()["job_id"]
    assert cluster.box.scontrol_job(job_id)["Requeue"] == "1"
    cluster.box.wait_state(job_id, "COMPLETED", timeout=150)
    cluster.settled_holds(job_id, account, runs=2)
    rows = sacct_runs(cluster.box, job_id, account)
    # 22.05's and 24.11's sacct name the requeued run REQUEUED, 26.05's by how it ended.
    newest = isinstance(cluster.box, ChrootBox) and cluster.box.version.name == "26.05"
    requeued = "FAILED" if newest else "REQUEUED"
    assert [(row["State"].split()[0], row["ExitCode"]) for row in rows] == [
        (requeued, "75:0"),
        ("COMPLETED", "0:0"),
    ]
    # Slurm's own times: the second run began at least the backoff after the first ended.
    ended, began = (datetime.fromisoformat(rows[0]["End"]), datetime.fromisoformat(rows[1]["Start"]))
    assert began >= ended + timedelta(seconds=5), rows
    with cluster.tx() as s:
        [retry] = job_retries(s, "lab", [job_id])[job_id].retries
    assert (retry.run, retry.cause) == (0, "exit:75")
    assert retry.ended_at is not None
    started = parse_time(rows[0]["Start"])  # as the bridge reads sacct's local times
    assert started is not None
    really = int((retry.ended_at - started).total_seconds())
    assert 2 <= really <= int(rows[0]["ElapsedRaw"]), (retry, rows)
    cluster.bridge_sacct(since)
    holds = cluster.holds(job_id, account)
    assert [(h.run, h.state, h.charged_ucredits) for h in holds] == [
        (0, "settled", charge_for(PRICES["h100"], really)),  # not sacct's, which runs to the requeue
        (1, "settled", charge_for(PRICES["h100"], int(rows[1]["ElapsedRaw"]))),
    ]
    done = wait_for(client, alice, job_id, {"completed"})
    assert [(a["run"], a["charged"]) for a in done["attempts"]] == [
        (h.run, format_credits(h.charged_ucredits)) for h in holds
    ]
    assert done["cost"] == format_credits(sum(h.charged_ucredits for h in holds))
    assert (done["retry"]["done"], [r["cause"] for r in done["retry"]["retries"]]) == (1, ["exit:75"])


def _until(what: str, check: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout} s"
        time.sleep(0.5)
    return got


def _node_back(cluster: Cluster, node: str) -> None:
    """Resume a node set down (it may be back already: `resume` then fails), until it serves."""
    cluster.box.run(["scontrol", "update", f"nodename={node}", "state=resume"])
    up = ("idle", "mixed", "allocated", "completing")
    _until(f"{node} back", lambda: cluster.run("sinfo", "-h", "-n", node, "-o", "%T").strip() in up, 60)


def test_a_node_failure_the_policy_names_is_retried_once_then_the_job_is_cancelled_and_each_run_refunded(
    cluster: Cluster, portal: Flask, alice: dict[str, str]
) -> None:
    """Slurm requeues a node failure itself; the daemon's retry pass counts it against the
    policy's max (sacct says the run ended NODE_FAIL) and, past max, cancels the job."""
    since = datetime.now(UTC)
    account = cluster.new_account("10")
    client = portal.test_client()
    body = {
        "account": account,
        "script": "#!/bin/sh\nsleep 300\n",
        "gpus": "h100:1",
        "time_limit": "00:10:00",
        "retry": {"max": 1, "on": ["node_fail"], "backoff_seconds": 0},
    }
    answer = client.post("/api/v1/jobs", json=body, headers=alice)
    assert answer.status_code == 201, answer.get_json()
    job_id = answer.get_json()["job_id"]
    for run in (0, 1):
        info = _until(
            f"run {run} running",
            lambda run=run: (
                (i := cluster.box.scontrol_job(job_id))["JobState"] == "RUNNING"
                and int(i["Restarts"]) == run
                and i
            ),
        )
        node = info["NodeList"]
        cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=gpucredit-node-fail-test")
        try:
            if run == 0:  # retried: the pass recorded it; Slurm starts run 1 (on the other H100 node)
                with_retry = _until(
                    "the retry",
                    lambda: client.get(f"/api/v1/jobs/{job_id}", headers=alice).get_json()["retry"][
                        "retries"
                    ],
                )
                assert [(r["after_run"], r["cause"]) for r in with_retry] == [(0, "node_fail")]
            else:  # its one retry used: cancelled
                cluster.box.wait_state(job_id, "CANCELLED", timeout=90)
        finally:
            _node_back(cluster, node)
    rows = sacct_runs(cluster.box, job_id, account)
    assert [row["State"].split()[0] for row in rows] == ["NODE_FAIL", "NODE_FAIL", "CANCELLED"], rows
    cluster.bridge_sacct(since)
    holds = cluster.holds(job_id, account)
    assert [(h.run, h.state, h.charged_ucredits) for h in holds] == [(0, "settled", 0), (1, "settled", 0)]
    done = wait_for(client, alice, job_id, {"cancelled"})
    assert [(a["run"], a["charged"], a["refunded"]) for a in done["attempts"]] == [
        (0, "0.00", True),
        (1, "0.00", True),
    ]
    assert (done["retry"]["done"], done["cost"]) == (1, "0.00")
