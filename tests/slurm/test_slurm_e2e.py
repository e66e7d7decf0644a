"""gpucredit wired into a real Slurm 22.05 (the box): sbatch, the hooks, the daemon, sacct.

Each test gets its own Slurm account (alice is its member) and ledger account, so
tests do not share credit. Money is checked as a user is promised it
(`Books.check`): after `gpucredit bridge sacct`, each run's final charge is sacct's
ElapsedRaw x price to the micro-credit, with at most one adjustment linked to its
settle, and the account's balance is its credit less those charges. The hooks'
own figure can be a second off for a requeued run (docs/slurm-facts.md §11), so no
test compares a hook's charge with sacct directly.

Helpers for new tests: `Cluster.new_account`, `Cluster.run_job` (submit and wait),
`Cluster.rebuild_box` (the box down and up again, job ids from 1, ledger kept),
`Cluster.gpucredit` (the CLI against this ledger) and the `books` fixture.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, select

from gpucredit.cli import _build
from gpucredit.daemon import Daemon
from ledger import api, cli_support
from ledger.config import load_config
from ledger.holds.state import HoldState
from ledger.money import charge_for, format_credits, parse_credits
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.tables import entries_t, holds_t
from ledger.timeutil import parse_time, utcnow
from slurmbox import SlurmBox, run

pytestmark = pytest.mark.slurm

RUN_DIR = Path("/run/gpucredit-e2e")
PRICES = {"a100": 2_000_000, "h100": 3_600_000}  # micro-credits per GPU-hour
_names = itertools.count(1)


@dataclass
class Cluster:
    box: SlurmBox
    url: str
    engine: Engine
    config_path: Path
    daemon_stop: threading.Event | None = None
    daemon_thread: threading.Thread | None = None
    policy: str = "reject"
    accounts: list[str] = field(default_factory=list)
    credit_ucredits: dict[str, int] = field(default_factory=dict)  # every top-up, per account

    def tx(self):  # type: ignore[no-untyped-def]
        return _Tx(make_sessionmaker(self.engine))

    def write_config(self, policy: str) -> None:
        self.policy = policy
        self.config_path.write_text(
            f'[database]\nurl = "{self.url}"\n'
            f'[daemon]\nsocket = "{RUN_DIR / "daemon.sock"}"\ntimeout_seconds = 2.0\n'
            f'[policy]\non_ledger_unreachable = "{policy}"\n[slurm]\ncluster = "lab"\n'
            f'[agent]\nspool_dir = "{RUN_DIR / "spool" / "%n"}"\n'
            f'[hooks]\nlog_file = "{RUN_DIR / "hooks.log"}"\n'
        )
        self.box.config_path = str(self.config_path)
        self.box.use_hooks("gpucredit")  # bakes socket and policy into job_submit.lua

    def start_daemon(self) -> None:
        config = load_config(self.config_path)
        ready = threading.Event()
        self.daemon_stop = threading.Event()
        self.daemon_thread = threading.Thread(
            target=Daemon(config).serve,
            args=(config["daemon"]["socket"],),
            kwargs={"release_interval": 1.0, "ready": ready, "stop": self.daemon_stop},
            daemon=True,
        )
        self.daemon_thread.start()
        assert ready.wait(10), "gpucredit daemon did not start"

    def stop_daemon(self) -> None:
        if self.daemon_stop is not None and self.daemon_thread is not None:
            self.daemon_stop.set()
            self.daemon_thread.join(10)
            self.daemon_stop = self.daemon_thread = None

    def _add_slurm_account(self, name: str) -> None:
        run(
            [
                "/usr/bin/sacctmgr",
                "-i",
                "add",
                "account",
                name,
                "parent=research",
                "Description=e2e",
                "Organization=lab",
            ]
        )
        run(["/usr/bin/sacctmgr", "-i", "add", "user", "alice", f"account={name}"])

    def new_account(self, credit: str | None) -> str:
        """A fresh Slurm account with alice in it, mirrored in the ledger with `credit`."""
        name = f"e2e{os.getpid() % 1000}x{next(_names)}"
        self._add_slurm_account(name)
        self.accounts.append(name)
        with self.tx() as s:
            api.create_account(s, name)
            api.add_member(s, "alice", name)
        self.credit_ucredits[name] = 0
        if credit is not None:
            self.topup(name, credit)
        return name

    def topup(self, account: str, amount: str) -> None:
        with self.tx() as s:
            api.topup(s, account, amount)
        self.credit_ucredits[account] += parse_credits(amount)

    def run_job(self, account: str, *sbatch_args: str, state: str = "COMPLETED", timeout: float = 90) -> int:
        """sbatch as alice on `account`; waits until the job is in `state` (a final state
        waits for sacct's record too). Returns the job id."""
        job = self.box.submit(["-A", account, *sbatch_args])
        self.box.wait_state(job, state, timeout=timeout)
        return job

    def rebuild_box(self) -> None:
        """`make slurm-down` + `make slurm-up` with this ledger kept: Slurm's state and
        accounting are wiped (job ids restart at 1), then this module's accounts are
        added to Slurm again and its hooks reinstalled."""
        detach = self.box._supervisor is None  # a box from `make slurm-up` stays detached
        self.box.down()
        self.box.up(detach=detach)
        for name in self.accounts:
            self._add_slurm_account(name)
        self.box.use_hooks("gpucredit")

    def gpucredit(self, *args: str, others_may_fail: bool = False) -> str:
        """`gpucredit ARGS` (in process) against this ledger and config; must exit 0.

        `others_may_fail`: `bridge sacct` reads every job that ended in its window, and jobs
        of accounts this ledger does not know (the box's own, other modules' deleted ones,
        cancelled at their teardown a moment ago) may end in it: the bridge reports those
        and exits 1. Only this module's accounts must reconcile cleanly."""
        result = CliRunner().invoke(_build(), list(args), env={"GPUCREDIT_CONFIG": str(self.config_path)})
        if result.exit_code == 1 and others_may_fail:
            errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
            foreign = re.compile(r"error: run \S+: not_found: account '([^']+)' does not exist$")
            unknown = [match.group(1) if (match := foreign.match(line)) else None for line in errors]
            if errors and all(name is not None and name not in self.accounts for name in unknown):
                return result.stdout
        assert result.exit_code == 0, (args, result.output, result.stderr)
        return result.output

    def bridge_sacct(self, since: datetime) -> dict:  # type: ignore[type-arg]
        output = self.gpucredit(
            "bridge", "sacct", "--since", since.isoformat(), "--format", "json", others_may_fail=True
        )
        return json.loads(output)

    def holds(self, job_id: int, account: str) -> list[HoldState]:
        """The holds of a job id taken for `account` (ids are reused: the box is rebuilt
        within the suite, and an older job with this id may have held credit), by run."""
        query = select(holds_t.c.id).where(holds_t.c.job_id == job_id).order_by(holds_t.c.id)
        with self.tx() as s:
            holds = [api.get_hold(s, hold_id) for hold_id in s.execute(query).scalars()]
        return sorted((h for h in holds if h.account == account), key=lambda h: h.run)


class _Tx:
    def __init__(self, factory) -> None:  # type: ignore[no-untyped-def]
        self.factory = factory

    def __enter__(self):  # type: ignore[no-untyped-def]
        self.session = self.factory()
        self.session.begin()
        return self.session

    def __exit__(self, exc_type, exc, tb) -> None:  # type: ignore[no-untyped-def]
        if exc_type is None:
            self.session.commit()
        else:
            self.session.rollback()
        self.session.close()


@pytest.fixture(scope="module")
def cluster(slurm_box: SlurmBox, e2e_ledger_url: str) -> Iterator[Cluster]:
    """The box wired to a daemon of this test module, on the e2e ledger (PostgreSQL;
    tests/conftest_slurm.py says when it may be SQLite)."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    engine = make_engine(e2e_ledger_url)
    previous_config = slurm_box.config_path
    c = Cluster(slurm_box, e2e_ledger_url, engine, RUN_DIR / "gpucredit.toml")
    with c.tx() as s:
        for gres, price in PRICES.items():
            api.set_price(s, gres, format_credits(price), effective_at=parse_time("2026-01-01"))
    c.write_config("reject")
    c.start_daemon()
    try:
        yield c
    finally:
        c.stop_daemon()
        for job in run(["/usr/bin/squeue", "-h", "-o", "%i|%a"], check=False).stdout.splitlines():
            job_id, _sep, account = job.partition("|")
            if account in c.accounts:
                run(["/usr/bin/scancel", job_id], check=False)
        slurm_box.config_path = previous_config
        slurm_box.use_hooks()
        if c.accounts:  # leave Slurm's association tree as we found it
            run(["/usr/bin/sacctmgr", "-i", "delete", "account", ",".join(c.accounts)], check=False)
        cli_engine = cli_support._engines.pop(e2e_ledger_url, None)
        if cli_engine is not None:
            cli_engine.dispose()
        engine.dispose()


def sacct_runs(box: SlurmBox, job_id: int | str, account: str) -> list[dict[str, str]]:
    """Allocation rows of every run of a job, once sacct has the final record.

    Filtered by the test's own account: job ids restart when the box is rebuilt, and
    sacct keeps older jobs under the same id."""
    deadline = time.monotonic() + 20
    while True:
        rows = [r for r in box.sacct_rows(job_id) if r["Account"] == account]
        if rows and all(r["End"] not in ("", "Unknown") and r["Partition"] for r in rows):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"sacct has no final rows for job {job_id}: {rows}")
        time.sleep(0.2)


def submit(box: SlurmBox, *args: str) -> int:
    return box.submit(list(args))


def is_prolog_refusal(row: Mapping[str, str]) -> bool:
    """A start PrologSlurmctld refused: REQUEUED, and it lasted only as long as the prolog,
    so Start == End or one second later (docs/slurm-facts.md §6). The job never ran."""
    return row["State"].split()[0] == "REQUEUED" and int(row["ElapsedRaw"]) <= 1


@dataclass
class Books:
    """What a user is promised about money, checked the way a user would check it."""

    cluster: Cluster
    since: datetime  # this test's jobs start after it: the bridge reads from here

    def check(self, account: str, jobs: Mapping[int | str, int]) -> dict[int | str, list[HoldState]]:
        """`jobs`: job (id or array task `A_T`) -> its GPUs' price in micro-credits per hour.

        Waits until every run the prolog admitted is settled, runs `gpucredit bridge
        sacct`, then asserts for each run in sacct: its final charge is
        charge_for(price, ElapsedRaw), with at most one adjustment, linked to the
        settle; a run no hold exists for was a prolog refusal. Then the account holds
        nothing and has its credit less exactly those charges. Returns the holds.
        """
        c = self.cluster
        runs = {job: sacct_runs(c.box, job, account) for job in jobs}
        ids = {job: int(rows[0]["JobIDRaw"]) for job, rows in runs.items()}
        for job, rows in runs.items():
            admitted = sum(not is_prolog_refusal(r) for r in rows)
            deadline = time.monotonic() + 30
            settled = 0
            while time.monotonic() < deadline:
                settled = sum(h.state == "settled" for h in c.holds(ids[job], account))
                if settled >= admitted:
                    break
                time.sleep(0.2)
            assert settled >= admitted, (job, rows, c.holds(ids[job], account))
        c.bridge_sacct(self.since)
        spent = 0
        found = {job: c.holds(ids[job], account) for job in jobs}
        with c.tx() as s:
            for job, rows in runs.items():
                by_run = {h.run: h for h in found[job]}
                assert set(by_run) <= set(range(len(rows))), (job, found[job], rows)  # a hold, a run
                for index, row in enumerate(rows):
                    expected = charge_for(jobs[job], int(row["ElapsedRaw"]))
                    hold = by_run.get(index)
                    if hold is None:
                        assert is_prolog_refusal(row), (job, index, row, found[job])
                        continue
                    assert (hold.state, hold.charged_ucredits) == ("settled", expected), (job, row, hold)
                    entries = s.execute(
                        select(entries_t.c.id, entries_t.c.kind, entries_t.c.links_entry_id)
                        .where(entries_t.c.hold_id == hold.id, entries_t.c.kind.in_(("settle", "adjust")))
                        .order_by(entries_t.c.id)
                    ).all()
                    [settle] = [e for e in entries if e.kind == "settle"]
                    adjustments = [e.links_entry_id for e in entries if e.kind == "adjust"]
                    assert adjustments in ([], [settle.id]), (job, index, entries)
                    spent += expected
            balance = api.balance(s, account)
        expected_balance = format_credits(c.credit_ucredits[account] - spent)
        assert (balance["available"], balance["held"]) == (expected_balance, "0.00"), balance
        return found


@pytest.fixture
def books(cluster: Cluster) -> Books:
    return Books(cluster, since=utcnow() - timedelta(seconds=2))


# -- refusals at submit -------------------------------------------------------------------------


def test_no_credit_is_refused_at_submit_with_cost_available_and_top_up(cluster: Cluster) -> None:
    account = cluster.new_account(None)
    rc, _out, err = cluster.box.sbatch(
        ["-A", account, "--gres=gpu:h100:2", "-t", "2:00:00", "--wrap", "true"]
    )
    assert rc == 1
    assert err.splitlines()[0] == (
        f"sbatch: error: gpucredit: this job would cost ~14.40 credits (2×h100 × 2 h) but only 0.00 are "
        f"available in {account}. Ask your PI or an admin to add credit (gpucredit topup {account} AMOUNT)."
    )
    with cluster.tx() as s:
        assert api.list_holds(s, account) == []
        assert api.balance(s, account)["held"] == "0.00"


# -- holds, settles, prices -----------------------------------------------------------------------


def test_credit_for_exactly_one_job_runs_one_and_charges_slurm_elapsed(
    cluster: Cluster, books: Books
) -> None:
    account = cluster.new_account("0.12")  # 2×h100 for 1 min at 3.60/h
    first = submit(cluster.box, "-A", account, "--gres=gpu:h100:2", "-t", "1", "--wrap", "sleep 3")
    cluster.box.wait_state(first, "RUNNING", timeout=30)
    rc, out, err = cluster.box.sbatch(
        ["--parsable", "-A", account, "--gres=gpu:h100:2", "-t", "1", "--wrap", "sleep 3"]
    )
    if rc == 0:  # accepted at submit: the prolog must hold it, with the reason
        second = int(out.strip())
        cluster.box.wait_state(second, "PENDING", timeout=30)
        deadline = time.monotonic() + 20
        while "gpucredit:" not in cluster.box.scontrol_job(second).get("Comment", ""):
            assert time.monotonic() < deadline, cluster.box.scontrol_job(second)
            time.sleep(0.2)
        job = cluster.box.scontrol_job(second)
        assert job["Reason"] == "JobHeldAdmin"
        assert job["Comment"].startswith(f"gpucredit: account {account}: this job needs 0.12 credits")
        run(["/usr/bin/scancel", str(second)])
    else:
        assert "gpucredit: this job would cost ~0.12 credits" in err
    cluster.box.wait_state(first, "COMPLETED", timeout=60)
    [[hold]] = books.check(account, {first: 2 * PRICES["h100"]}).values()
    [row] = sacct_runs(cluster.box, first, account)
    assert hold.charged_ucredits == 2 * 1000 * int(row["ElapsedRaw"]) > 0  # 0.001 credit/s per H100


def test_each_gpu_type_is_charged_at_its_own_price(cluster: Cluster, books: Books) -> None:
    account = cluster.new_account("10")
    mixed = submit(cluster.box, "-A", account, "--gres=gpu:a100:1,gpu:h100:1", "-t", "1", "--wrap", "sleep 2")
    a100 = submit(cluster.box, "-A", account, "--gres=gpu:a100:2", "-t", "1", "--wrap", "sleep 2")
    rates = {mixed: PRICES["a100"] + PRICES["h100"], a100: 2 * PRICES["a100"]}
    for job_id in rates:
        cluster.box.wait_state(job_id, "COMPLETED", timeout=60)
    holds = books.check(account, rates)
    assert {job: [h.rate_ucredits_per_hour for h in holds[job]] for job in rates} == {
        job: [rate] for job, rate in rates.items()
    }
    assert holds[mixed][0].gpus == "a100:1,h100:1"


def test_scancel_running_settles_what_ran_and_cancelled_pending_leaves_nothing(
    cluster: Cluster, books: Books
) -> None:
    account = cluster.new_account("10")
    running = submit(cluster.box, "-A", account, "--gres=gpu:h100:1", "-t", "2", "--wrap", "sleep 60")
    cluster.box.wait_state(running, "RUNNING", timeout=30)
    time.sleep(3)
    run(["/usr/bin/scancel", str(running)])
    cluster.box.wait_state(running, "CANCELLED", timeout=60)
    pending = submit(cluster.box, "-A", account, "--hold", "--gres=gpu:h100:1", "-t", "1", "--wrap", "true")
    run(["/usr/bin/scancel", str(pending)])
    cluster.box.wait_state(pending, "CANCELLED", timeout=30)
    [[hold]] = books.check(account, {running: PRICES["h100"]}).values()
    assert hold.charged_ucredits > 0
    assert cluster.holds(pending, account) == []


def test_requeue_holds_and_settles_each_run_once(cluster: Cluster, books: Books) -> None:
    account = cluster.new_account("10")
    job = submit(cluster.box, "-A", account, "--gres=gpu:a100:1", "-t", "2", "--wrap", "sleep 6")
    cluster.box.wait_state(job, "RUNNING", timeout=30)
    time.sleep(2)
    run(["/usr/bin/scontrol", "requeue", str(job)])
    cluster.box.wait_state(job, "COMPLETED", timeout=120)
    rows = sacct_runs(cluster.box, job, account)
    assert [r["State"].split()[0] for r in rows] == ["REQUEUED", "COMPLETED"]
    # The epilog of the requeued run may charge a second more than sacct (docs/slurm-facts.md
    # §11); the promise is the books after the bridge: each run charged once, as sacct says.
    holds = books.check(account, {job: PRICES["a100"]})[job]
    assert [h.run for h in holds] == [0, 1]
    assert all(h.charged_ucredits > 0 for h in holds)


def test_a_new_job_with_an_old_jobs_id_is_held_settled_and_reconciled_as_itself(
    cluster: Cluster, books: Books
) -> None:
    """`make slurm-down` + `make slurm-up` with the ledger kept: job ids restart at 1, so
    the new job 1 reuses the id of a job the ledger already settled (here for another
    account, so the old prolog refused it as "a different request" and held it for good).
    It runs, is charged once as itself, and reconciling it leaves the old job alone."""
    cluster.rebuild_box()
    old_account = cluster.new_account("10")
    old = cluster.run_job(old_account, "--gres=gpu:h100:1", "-t", "2", "--wrap", "sleep 3")
    [old_hold] = books.check(old_account, {old: PRICES["h100"]})[old]
    cluster.rebuild_box()
    new_account = cluster.new_account("10")
    new = cluster.run_job(new_account, "--gres=gpu:h100:1", "-t", "3", "--wrap", "sleep 2")
    assert new == old  # the id really was reused
    # It ran at its first start: no prolog refusal (a REQUEUED row) before the job ran.
    assert [r["State"].split()[0] for r in sacct_runs(cluster.box, new, new_account)] == ["COMPLETED"]
    [new_hold] = books.check(new_account, {new: PRICES["h100"]})[new]
    assert new_hold.run == 0
    assert new_hold.id != old_hold.id and new_hold.submitted_at > old_hold.submitted_at
    assert cluster.holds(old, old_account) == [old_hold]  # untouched by the new job's records


def test_prolog_refusal_holds_the_job_and_a_top_up_releases_it(cluster: Cluster, books: Books) -> None:
    account = cluster.new_account("0.06")  # one 1×h100 job of 1 min
    # Both are quoted while nothing is held, so job_submit accepts both; the
    # prolog's authoritative hold then admits only one.
    jobs = [
        submit(cluster.box, "-A", account, "--hold", "--gres=gpu:h100:1", "-t", "1", "--wrap", "sleep 2")
        for _ in range(2)
    ]
    run(["/usr/bin/scontrol", "release", *map(str, jobs)])
    deadline = time.monotonic() + 60
    while True:
        comments = {j: cluster.box.scontrol_job(j).get("Comment", "") for j in jobs}
        refused = [j for j, c in comments.items() if c.startswith("gpucredit:")]
        if refused:
            break
        assert time.monotonic() < deadline, comments
        time.sleep(0.2)
    [held] = refused
    [ran] = [j for j in jobs if j != held]
    cluster.box.wait_state(held, "PENDING", timeout=30)  # the refused start is requeued first
    info = cluster.box.scontrol_job(held)
    assert (info["JobState"], info["Reason"], info["Priority"]) == ("PENDING", "JobHeldAdmin", "0")
    squeue = run(["/usr/bin/squeue", "-h", "-j", str(held), "-o", "%T|%r|%k"]).stdout.strip()
    assert squeue.startswith("PENDING|JobHeldAdmin|gpucredit: account ")
    cluster.box.wait_state(ran, "COMPLETED", timeout=60)
    cluster.topup(account, "1")
    cluster.box.wait_state(held, "COMPLETED", timeout=90)
    holds = books.check(account, {ran: PRICES["h100"], held: PRICES["h100"]})
    assert [h.run for h in holds[held]] == [1]  # the refused start was run 0
    assert [h.run for h in holds[ran]] == [0]


# -- the ledger side down ---------------------------------------------------------------------


def test_ledger_down_follows_each_policy(cluster: Cluster) -> None:
    account = cluster.new_account("10")
    parked = submit(cluster.box, "-A", account, "--hold", "--gres=gpu:a100:1", "-t", "1", "--wrap", "true")
    cluster.stop_daemon()
    try:
        rc, _out, err = cluster.box.sbatch(["-A", account, "--gres=gpu:a100:1", "-t", "1", "--wrap", "true"])
        assert rc == 1
        assert "gpucredit: credit check unavailable (ledger unreachable); job refused by site policy" in err
        run(["/usr/bin/scontrol", "release", str(parked)])
        deadline = time.monotonic() + 60
        while "ledger unreachable" not in cluster.box.scontrol_job(parked).get("Comment", ""):
            assert time.monotonic() < deadline, cluster.box.scontrol_job(parked)
            time.sleep(0.2)
        assert cluster.box.scontrol_job(parked)["Reason"] == "JobHeldAdmin"
        run(["/usr/bin/scancel", str(parked)])

        cluster.write_config("accept")
        job = submit(cluster.box, "-A", account, "--gres=gpu:a100:1", "-t", "1", "--wrap", "sleep 1")
        cluster.box.wait_state(job, "COMPLETED", timeout=60)
        assert cluster.holds(job, account) == []  # ran unreserved: the bridge charges it from sacct
    finally:
        cluster.write_config("reject")
        cluster.start_daemon()


# -- multi-node jobs and arrays -------------------------------------------------------------------


def test_two_node_job_is_charged_for_the_gpus_on_both_nodes(cluster: Cluster, books: Books) -> None:
    account = cluster.new_account("10")
    job = submit(
        cluster.box, "-A", account, "-N", "2", "--gres=gpu:h100:1", "-t", "1", "--wrap", "srun sleep 2"
    )
    cluster.box.wait_state(job, "COMPLETED", timeout=60)
    [row] = sacct_runs(cluster.box, job, account)
    assert "gres/gpu:h100=2" in row["AllocTRES"]
    [[hold]] = books.check(account, {job: 2 * PRICES["h100"]}).values()
    assert hold.gpus == "h100:2"


def test_array_is_estimated_per_task_and_each_task_settles(cluster: Cluster, books: Books) -> None:
    account = cluster.new_account("10")
    rc, out, err = cluster.box.sbatch(
        ["--parsable", "-A", account, "--array=0-2", "--gres=gpu:a100:1", "-t", "1", "--wrap", "sleep 1"]
    )
    assert rc == 0, err
    # 1×a100 for 60 s is 0.033333 (rounded once per task), three times.
    assert err.strip() == (
        f"sbatch: gpucredit: ~0.099999 credits (1×a100 × 1 min, × 3 tasks), 10.00 available in {account}"
    )
    array_id = int(out.strip().split(";")[0])
    tasks = [f"{array_id}_{task}" for task in range(3)]
    for task in tasks:
        cluster.box.wait_state(task, "COMPLETED", timeout=90)
    holds = books.check(account, {task: PRICES["a100"] for task in tasks})
    assert len({h.job_id for task in tasks for h in holds[task]}) == 3  # one hold per task, by raw id
