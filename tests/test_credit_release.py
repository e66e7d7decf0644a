"""The daemon releases a job held for credit once its account can pay, and only a job
gpucredit really held: the mark is read from `squeue --json`, where users cannot write it
(docs/slurm-facts.md §13), not from scontrol's one-line text, where they can.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from accounting_bridge.slurmcmd import FakeRunner, UnexpectedCommandError
from gpucredit.daemon import hook_service
from ledger import api
from ledger.db import make_sessionmaker

FIXTURES = Path(__file__).parent / "fixtures" / "sacct"
SHOW = ("scontrol", "show", "job", "-d", "-o", "15")
RELEASE = [("scontrol", "update", "jobid=15", "comment=", "admincomment="), ("scontrol", "release", "15")]


def scontrol_text(job_name: str, admin_comment: str | None) -> str:
    """Job 15 of the box (1×h100, 5 min, account physics), pending."""
    line = (FIXTURES / "recorded_scontrol_show_job_d_running.txt").read_text().strip()
    line = line.replace("JobName=cancel-me", f"JobName={job_name}").replace(
        "JobState=RUNNING", "JobState=PENDING"
    )
    if admin_comment is not None:  # scontrol prints it after WorkDir, only when set
        line = line.replace("WorkDir=/tmp ", f"WorkDir=/tmp AdminComment={admin_comment} ")
    return line


def squeue_json(admin_comment: str) -> str:
    document = json.loads((FIXTURES / "recorded_squeue_running.json").read_text())
    [job] = [j for j in document["jobs"] if j["job_id"] == 15]
    job.update(job_state="PENDING", admin_comment=admin_comment)
    document["jobs"] = [job]
    return json.dumps(document)


@pytest.fixture
def sessions(tx, engine):
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.topup(s, "physics", "1", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
    return make_sessionmaker(engine)  # the daemon's own session factory


def release(sessions, runner: FakeRunner) -> str:
    marked: list[set[int]] = []

    def marked_jobs() -> set[int]:
        marked.append(hook_service.credit_held_jobs(runner))
        return marked[-1]

    return hook_service.release_if_affordable(sessions, runner, 15, marked_jobs)


def test_a_job_gpucredit_held_is_released_once_its_account_can_pay(sessions) -> None:
    runner = FakeRunner(
        {
            SHOW: scontrol_text("train", "gpucredit-hold"),
            ("squeue", "--json"): squeue_json("gpucredit-hold"),
            **{argv: "" for argv in RELEASE},
        }
    )
    assert release(sessions, runner) == "released"
    assert runner.calls[-2:] == RELEASE
    assert hook_service.credit_held_jobs(runner) == {15}


def test_a_job_name_that_spells_our_mark_is_not_released(sessions) -> None:
    """`sbatch -J 'x AdminComment=gpucredit-hold'` on a job an admin held: scontrol's text
    shows the words, squeue's admin_comment is empty, so the daemon leaves it alone."""
    runner = FakeRunner(
        {SHOW: scontrol_text("x AdminComment=gpucredit-hold", None), ("squeue", "--json"): squeue_json("")}
    )
    assert release(sessions, runner) == "gone"
    assert ("scontrol", "release", "15") not in runner.calls
    assert hook_service.credit_held_jobs(runner) == set()
    with pytest.raises(UnexpectedCommandError):  # the runner knows no release: none was tried
        runner(["scontrol", "release", "15"])


def test_a_job_the_account_cannot_pay_for_waits_without_a_squeue_dump(sessions, tx) -> None:
    with tx() as s:
        api.consume(s, "physics", "1")
    runner = FakeRunner({SHOW: scontrol_text("train", "gpucredit-hold")})
    assert release(sessions, runner) == "waiting"
    assert runner.calls == [SHOW]
