"""Issue 26 on the real box: what a researcher can write into a job must never forge a
charge, skip a hold or escape billing, and a refused job must not loop.

Each test replays an attack or a loop that worked before the fix (S1..S6 of the issue)
and asserts what a user would notice: holds taken, exact charges after the bridge,
balances of accounts nobody touched, `squeue` states and restart counts, messages.
tests/slurm/conftest.py's `cluster` (hooks, this module's ledger, accounts) and `books`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger import api
from slurmbox.box import GRES_TYPES
from tests.support.cluster import E2E_SLURM, PRICES, Books, Cluster, in_box, sacct_runs

pytestmark = pytest.mark.slurm

# Every line separator Python's splitlines() knows, and each got a GPU job run with no
# hold when written into its name (S2); then text that poses as fields, quotes, length.
SEPARATORS = ["\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
POSING = [
    " TimeLimit=00:00:01 TRES=cpu=1 JobState=COMPLETED",
    "x\nJobId=1 TRES=cpu=1,gres/gpu=0 Account=root",
    "a|b|c|d",
    "'\"$(id)`id`",
    "L" * 200,
]
FIELDS_DIR = Path("/tmp/gpucredit-doors")  # work and output dirs with odd names, alice's


@pytest.fixture(scope="module")
def odd_dirs() -> Iterator[Path]:
    FIELDS_DIR.mkdir(mode=0o755, exist_ok=True)
    os.chown(FIELDS_DIR, 1001, 1001)
    yield FIELDS_DIR


def wait_for(what: str, check, timeout: float = 40):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def hold_state(cluster: Cluster, job: int, account: str) -> str | None:
    holds = cluster.holds(job, account)
    return holds[-1].state if holds else None


def restarts(cluster: Cluster, job: int | str) -> int:
    return int(cluster.box.scontrol_job(job)["Restarts"])


# -- S1: a forged accounting record in a job name ------------------------------------------------


def test_a_job_name_holding_a_whole_accounting_row_charges_nobody(cluster: Cluster, books: Books) -> None:
    """A CPU job named `x` + newline + a complete sacct row (another account, 2×h100, an
    hour) once made `bridge sacct` post a 7.20 unreserved charge to that account."""
    attacker = cluster.new_account("1")
    victim = cluster.new_account("100")
    forged = "|".join(
        [
            "999999", "999999", "lab", "alice", victim, "onprem", "COMPLETED", "2026-12-03T00:00:00",
            "2026-12-03T00:00:00", "2026-12-03T01:00:00", "3600", "60", "1", "node1",
            "billing=41,cpu=1,gres/gpu:h100=2,gres/gpu=2,node=1",
            "billing=41,cpu=1,gres/gpu:h100=2,gres/gpu=2,node=1", "forged",
        ]
    )  # fmt: skip
    job = cluster.box.submit(["-A", attacker, "-J", f"x\n{forged}", "-t", "1", "--wrap", "true"])
    cluster.box.wait_state(job, "COMPLETED", timeout=60)
    report = cluster.bridge_sacct(books.since)
    assert [r for r in report["runs"] if r["job"].startswith("lab/999999/")] == []
    with cluster.tx() as s:
        assert api.balance(s, victim)["available"] == "100.00"
        assert api.list_holds(s, victim) == []
    books.check(attacker, {})  # the attacker's own CPU job costs nothing either


# -- S2: line breaks and posing text in every field a user sets -------------------------------------


def _field_cases(dirs: Path) -> list[tuple[str, list[str]]]:
    cases: list[tuple[str, list[str]]] = []
    for index, text in enumerate(SEPARATORS + POSING):
        safe = text.replace("/", "_")
        label = f"{index}"
        cases += [
            (f"name{label}", ["-J", f"y{text}z"]),
            (f"comment{label}", ["--comment", f"c{text}d"]),
            (f"mail{label}", ["--mail-user", f"m{text}n", "--mail-type=NONE"]),
            (f"export{label}", [f"--export=ALL,GPUCREDIT_ODD=e{text}f"]),
        ]
        if "\x00" not in text and "|" not in text and len(safe) < 100:
            work = dirs / f"w{index}{safe}"
            work.mkdir(exist_ok=True)
            os.chown(work, 1001, 1001)
            cases += [
                (f"workdir{label}", ["-D", str(work), "-o", "/dev/null"]),
                (f"output{label}", ["-o", str(dirs / f"o{index}{safe}-%j.out")]),
            ]
    return cases


def test_no_text_in_any_field_lets_a_gpu_job_run_without_its_hold(
    cluster: Cluster, books: Books, odd_dirs: Path
) -> None:
    """Every field a user sets (name, comment, mail user, exported variables, work dir,
    output path) carrying each line separator and text that poses as fields: each GPU
    job is held by its prolog and settled by its epilog, and the books are exact."""
    account = cluster.new_account("50")
    jobs: dict[int, str] = {}
    for label, args in _field_cases(odd_dirs):
        job = cluster.box.submit(["-A", account, "--gres=gpu:a100:1", "-t", "1", *args, "--wrap", "sleep 1"])
        jobs[job] = label
    for job in jobs:
        cluster.box.wait_state(job, ("COMPLETED", "FAILED"), timeout=240)
    unheld = [label for job, label in jobs.items() if hold_state(cluster, job, account) != "settled"]
    assert unheld == []
    books.check(account, dict.fromkeys(jobs, PRICES["a100"]))


def test_renaming_a_pending_or_running_job_never_skips_its_hold_or_its_settle(
    cluster: Cluster, books: Books
) -> None:
    account = cluster.new_account("10")
    pending = cluster.box.submit(["-A", account, "-H", "--gres=gpu:a100:1", "-t", "1", "--wrap", "sleep 2"])
    cluster.box.run(["scontrol", "update", f"jobid={pending}", "name=p\nq JobState=COMPLETED"], check=True)
    cluster.box.run(["scontrol", "release", str(pending)], check=True)
    running = cluster.box.submit(["-A", account, "--gres=gpu:h100:1", "-t", "1", "--wrap", "sleep 6"])
    cluster.box.wait_state(running, "RUNNING", timeout=60)
    cluster.box.run(["scontrol", "update", f"jobid={running}", "name=r\u2028s"], check=True)
    for job in (pending, running):
        cluster.box.wait_state(job, "COMPLETED", timeout=60)
        # settled by its own epilog, not later by the bridge
        wait_for(f"job {job}'s settle", lambda job=job: hold_state(cluster, job, account) == "settled")
    books.check(account, {pending: PRICES["a100"], running: PRICES["h100"]})


# -- S3: GPU time that was never charged ------------------------------------------------------------


def test_a_request_slurm_left_inconsistent_is_still_charged_to_the_second(
    cluster: Cluster, books: Books
) -> None:
    """22.05 adds on `scontrol update TresPerNode=` of a held job: ReqTRES then lists more
    typed GPUs than its total, and the bridge refused the row every round; renamed with a
    newline once running, its epilog settled nothing, and the sweep expired the hold:
    50 s on two GPUs charged 0. Here the epilog cannot settle (the daemon is down when the
    job ends), so only the bridge can charge it."""
    account = cluster.new_account("10")
    job = cluster.box.submit(["-A", account, "-H", "--gres=gpu:a100:1", "-t", "1", "--wrap", "sleep 5"])
    cluster.box.run(["scontrol", "update", f"jobid={job}", "TresPerNode=gres:gpu:h100:1"], check=True)
    cluster.box.run(["scontrol", "release", str(job)], check=True)
    cluster.box.wait_state(job, "RUNNING", timeout=60)
    cluster.box.run(["scontrol", "update", f"jobid={job}", "name=t\nu"], check=True)
    cluster.stop_daemon()
    try:
        cluster.box.wait_state(job, "COMPLETED", timeout=60)
        assert hold_state(cluster, job, account) == "active"  # nobody settled it
    finally:
        cluster.start_daemon()
    [row] = sacct_runs(cluster.box, job, account)
    config = cluster.config_path.read_text()
    # The bridge settles a run the epilog left once policy.epilog_grace_seconds have passed.
    cluster.config_path.write_text(config.replace("[policy]\n", "[policy]\nepilog_grace_seconds = 0\n"))
    try:
        cluster.bridge_sacct(books.since)
    finally:
        cluster.config_path.write_text(config)
    # 22.05 kept the a100 beside the h100; 24.11 and 26.05 replace the request (slurm-facts §16).
    gpus = ("a100", "h100") if E2E_SLURM.startswith("22.05") else ("h100",)
    assert {t for t in GRES_TYPES if f"gres/gpu:{t}=1" in row["AllocTRES"].split(",")} == set(gpus), row
    [[hold]] = books.check(account, {job: sum(PRICES[t] for t in gpus)}).values()
    assert hold.charged_ucredits > 0


# -- S4: limit refusals that looped ----------------------------------------------------------------


def test_a_job_over_a_cap_on_its_own_is_held_once_and_told_why(cluster: Cluster, books: Books) -> None:
    """Credit enough, the daily cap not: the daemon released it each round, the prolog
    refused it, Slurm requeued it (Restarts=32 in six minutes). Now it is held once, says
    it cannot start under the cap, and runs once the cap is raised."""
    account = cluster.new_account("10")
    job = cluster.box.submit(["-A", account, "-H", "--gres=gpu:a100:1", "-t", "20", "--wrap", "sleep 2"])
    with cluster.tx() as s:  # set after submit, as an admin might: job_submit saw no cap
        api.set_limits(s, account, user="alice", daily_cap="0.5")
    cluster.box.run(["scontrol", "release", str(job)], check=True)
    comment = wait_for("the refusal", lambda: cluster.box.scontrol_job(job).get("Comment", "").strip())
    assert comment == (
        f"gpucredit: user alice in account {account}: 0.666667 credits today would exceed the daily cap "
        "of 0.50 (0.00 spent + 0.00 held + 0.666667 for this job) Alone over the cap: it cannot start "
        "until the cap is raised (or scancel it)."
    )
    # Refused once: the prolog's non-zero exit requeued it (Restarts 1) and its hold stuck.
    wait_for("the requeue of the refused start", lambda: restarts(cluster, job) == 1)
    time.sleep(15)  # a release would start it again within ~11 s (cred_expire + scheduling)
    info = cluster.box.scontrol_job(job)
    assert (info["JobState"], info["Reason"], int(info["Restarts"])) == ("PENDING", "JobHeldAdmin", 1)
    with cluster.tx() as s:
        api.set_limits(s, account, user="alice", daily_cap="1")
    cluster.box.wait_state(job, "COMPLETED", timeout=90)
    books.check(account, {job: PRICES["a100"]})


def test_a_job_over_a_cap_beside_a_running_job_waits_and_starts_when_it_fits(
    cluster: Cluster, books: Books
) -> None:
    account = cluster.new_account("10")
    with cluster.tx() as s:
        api.set_limits(s, account, user="alice", max_gpus=1)
    first = cluster.box.submit(["-A", account, "--gres=gpu:h100:1", "-t", "1", "--wrap", "sleep 8"])
    cluster.box.wait_state(first, "RUNNING", timeout=60)
    # Accepted at submit (told it waits, from the daemon's picture: tests/daemon/test_daemon.py),
    # held by its prolog, released once the first job's GPU is free; never a loop.
    second = cluster.box.submit(["-A", account, "--gres=gpu:a100:1", "-t", "1", "--wrap", "sleep 1"])
    cluster.box.wait_state(second, "COMPLETED", timeout=90)
    cluster.box.wait_state(first, "COMPLETED", timeout=90)
    assert restarts(cluster, second) <= 1  # at most the one refusal, never a loop
    books.check(account, {first: PRICES["h100"], second: PRICES["a100"]})


# -- S5: heterogeneous jobs whose parts fit alone but not together ---------------------------------


def test_a_heterogeneous_job_is_held_whole_and_runs_once_it_fits_whole(
    cluster: Cluster, books: Books, tmp_path: Path
) -> None:
    """Two parts of 0.166667 against 0.20: each fits alone, not both. The parts took turns
    at a hold, each loop charged the part that got one (0.0037 over sacct after six)."""
    account = cluster.new_account("0.2")
    script = cluster.box.inside("/tmp/gpucredit-box-jobs") / f"het-{account}.sh"  # where sbatch reads it
    script.write_text(
        "#!/bin/sh\n"
        f"#SBATCH -A {account} -t 5 --gres=gpu:a100:1\n"
        "#SBATCH hetjob\n"
        f"#SBATCH -A {account} -t 5 --gres=gpu:a100:1\n"
        "sleep 2\n"
    )
    script.chmod(0o755)
    job = cluster.box.submit([in_box(cluster.box, script)])
    comment = wait_for("the refusal", lambda: cluster.box.scontrol_job(job).get("Comment", "").strip())
    assert comment.startswith(f"gpucredit: account {account}: this job needs 0.166667 credits")
    time.sleep(10)
    info = cluster.box.scontrol_job(job)
    assert (info["JobState"], info["Reason"]) == ("PENDING", "JobHeldAdmin")
    with cluster.tx() as s:
        assert api.list_holds(s, account) == []  # no part was held, none charged
    cluster.topup(account, "0.2")
    cluster.box.wait_state(job, "COMPLETED", timeout=90)
    parts = {f"{job}+0": PRICES["a100"], job + 1: PRICES["a100"]}  # sacct -j JOB lists both
    holds = books.check(account, parts)
    assert [len(holds[part]) for part in parts] == [1, 1]


# -- S6: the smaller doors ---------------------------------------------------------------------------


def test_a_gpu_type_the_partition_lacks_is_refused_by_gpucredit_not_quoted(cluster: Cluster) -> None:
    """A priced type no partition has: Slurm refuses the job after job_submit, and a quote
    printed before that refusal reads `sbatch: error: gpucredit: ~0.50 credits ...`."""
    account = cluster.new_account("10")
    with cluster.tx() as s:
        api.set_price(s, "v100", "1.00")
    rc, _out, err = cluster.box.sbatch(
        ["-A", account, "-p", "cloud", "--gres=gpu:v100:1", "-t", "1", "--wrap", "true"]
    )
    assert rc == 1
    assert err.splitlines()[0] == (
        "sbatch: error: gpucredit: partition cloud has no v100 GPUs (GPU types there: a100, h100); "
        "ask for a type it has"
    )


def test_an_exclusive_job_without_gpus_is_told_it_pays_for_the_nodes_gpus(
    cluster: Cluster, books: Books
) -> None:
    account = cluster.new_account("10")
    rc, out, err = cluster.box.sbatch(
        ["--parsable", "-A", account, "--exclusive", "-t", "1", "--wrap", "sleep 1"]
    )
    assert rc == 0, err
    assert err.splitlines()[0] == (
        "sbatch: gpucredit: --exclusive gives this job every GPU of its node(s), and they are charged "
        "from when it starts; ask for GPUs with --gres to be quoted"
    )
    job = int(out.strip())
    cluster.box.wait_state(job, "COMPLETED", timeout=60)
    [row] = sacct_runs(cluster.box, job, account)
    assert "gres/gpu:a100=2" in row["AllocTRES"] and "gres/gpu:h100=2" in row["AllocTRES"]
    books.check(account, {job: 2 * PRICES["a100"] + 2 * PRICES["h100"]})
