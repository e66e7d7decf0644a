"""gpucredit wired into a real Slurm 22.05 (the box): sbatch, the hooks, the daemon, sacct.

Each test gets its own Slurm account (alice is its member) and ledger account, so
tests do not share credit. Charges are checked against Slurm's own start and end
times from sacct, at exact micro-credit precision.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from gpucredit.daemon import Daemon
from ledger import api
from ledger.config import load_config
from ledger.db import make_engine, make_sessionmaker
from ledger.holds import HoldState, holds_t
from ledger.money import charge_for
from ledger.timeutil import parse_time
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

    def new_account(self, credit: str | None) -> str:
        """A fresh Slurm account with alice in it, mirrored in the ledger with `credit`."""
        name = f"e2e{os.getpid() % 1000}x{next(_names)}"
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
        self.accounts.append(name)
        with self.tx() as s:
            api.create_account(s, name)
            api.add_member(s, "alice", name)
            if credit is not None:
                api.topup(s, name, credit)
        return name

    def holds(self, job_id: int) -> list[HoldState]:
        with self.tx() as s:
            return [
                api.get_hold(s, hold_id)
                for hold_id in s.execute(
                    select(holds_t.c.id).where(holds_t.c.job_id == job_id).order_by(holds_t.c.run)
                ).scalars()
            ]

    def wait_holds(self, job_id: int, state: str, count: int = 1, timeout: float = 30) -> list[HoldState]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            holds = self.holds(job_id)
            if len(holds) >= count and all(h.state == state for h in holds):
                return holds
            time.sleep(0.2)
        raise AssertionError(f"job {job_id}: holds {self.holds(job_id)} not {count}x {state}")


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
def cluster(
    slurm_box: SlurmBox, pg_template: str | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """The box wired to a daemon of this test module, on PostgreSQL when it answers."""
    from sqlalchemy import text

    from tests.conftest import _pg_admin, _pg_url

    RUN_DIR.mkdir(parents=True, exist_ok=True)
    admin = _pg_admin() if pg_template else None
    dbname = f"gpucredit_e2e_{uuid.uuid4().hex[:8]}"
    if admin is not None:
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{dbname}" TEMPLATE "{pg_template}"'))
        url = _pg_url(dbname)
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('e2e') / 'ledger.db'}"
        from ledger.schema import upgrade

        upgrade(make_engine(url))
    engine = make_engine(url)
    previous_config = slurm_box.config_path
    c = Cluster(slurm_box, url, engine, RUN_DIR / "gpucredit.toml")
    with c.tx() as s:
        for gres, price in PRICES.items():
            api.set_price(s, gres, str(price / 1_000_000), effective_at=parse_time("2026-01-01"))
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
        engine.dispose()
        if admin is not None:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
            admin.dispose()


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


def elapsed_of(row: dict[str, str]) -> int:
    start, end = datetime.fromisoformat(row["Start"]), datetime.fromisoformat(row["End"])
    return int((end - start).total_seconds())


def submit(box: SlurmBox, *args: str) -> int:
    return box.submit(list(args))


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


def test_credit_for_exactly_one_job_runs_one_and_charges_slurm_elapsed(cluster: Cluster) -> None:
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
    [hold] = cluster.wait_holds(first, "settled")
    [row] = sacct_runs(cluster.box, first, account)
    assert hold.charged_ucredits == charge_for(2 * PRICES["h100"], elapsed_of(row))
    assert hold.charged_ucredits == 2 * 1000 * int(row["ElapsedRaw"])  # 0.001 credit/s per H100
    with cluster.tx() as s:
        assert api.balance(s, account)["held"] == "0.00"


def test_each_gpu_type_is_charged_at_its_own_price(cluster: Cluster) -> None:
    account = cluster.new_account("10")
    mixed = submit(cluster.box, "-A", account, "--gres=gpu:a100:1,gpu:h100:1", "-t", "1", "--wrap", "sleep 2")
    a100 = submit(cluster.box, "-A", account, "--gres=gpu:a100:2", "-t", "1", "--wrap", "sleep 2")
    for job_id, rate in ((mixed, PRICES["a100"] + PRICES["h100"]), (a100, 2 * PRICES["a100"])):
        cluster.box.wait_state(job_id, "COMPLETED", timeout=60)
        [hold] = cluster.wait_holds(job_id, "settled")
        [row] = sacct_runs(cluster.box, job_id, account)
        assert hold.rate_ucredits_per_hour == rate
        assert hold.charged_ucredits == charge_for(rate, elapsed_of(row))
    assert cluster.holds(mixed)[0].gpus == "a100:1,h100:1"


def test_scancel_running_settles_what_ran_and_cancelled_pending_leaves_nothing(cluster: Cluster) -> None:
    account = cluster.new_account("10")
    running = submit(cluster.box, "-A", account, "--gres=gpu:h100:1", "-t", "2", "--wrap", "sleep 60")
    cluster.box.wait_state(running, "RUNNING", timeout=30)
    time.sleep(3)
    run(["/usr/bin/scancel", str(running)])
    cluster.box.wait_state(running, "CANCELLED", timeout=60)
    [hold] = cluster.wait_holds(running, "settled")
    [row] = sacct_runs(cluster.box, running, account)
    assert hold.charged_ucredits == charge_for(PRICES["h100"], elapsed_of(row)) > 0
    pending = submit(cluster.box, "-A", account, "--hold", "--gres=gpu:h100:1", "-t", "1", "--wrap", "true")
    run(["/usr/bin/scancel", str(pending)])
    cluster.box.wait_state(pending, "CANCELLED", timeout=30)
    assert cluster.holds(pending) == []


def test_requeue_holds_and_settles_each_run_once(cluster: Cluster) -> None:
    account = cluster.new_account("10")
    job = submit(cluster.box, "-A", account, "--gres=gpu:a100:1", "-t", "2", "--wrap", "sleep 6")
    cluster.box.wait_state(job, "RUNNING", timeout=30)
    time.sleep(2)
    run(["/usr/bin/scontrol", "requeue", str(job)])
    cluster.box.wait_state(job, "COMPLETED", timeout=120)
    holds = cluster.wait_holds(job, "settled", count=2)
    assert [h.run for h in holds] == [0, 1]
    rows = sacct_runs(cluster.box, job, account)
    assert [r["State"].split()[0] for r in rows] == ["REQUEUED", "COMPLETED"]
    assert [h.charged_ucredits for h in holds] == [charge_for(PRICES["a100"], elapsed_of(r)) for r in rows]


def test_prolog_refusal_holds_the_job_and_a_top_up_releases_it(cluster: Cluster) -> None:
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
    with cluster.tx() as s:
        api.topup(s, account, "1")
    cluster.box.wait_state(held, "COMPLETED", timeout=90)
    [hold] = cluster.wait_holds(held, "settled")
    assert hold.run == 1  # the refused start was run 0
    rows = sacct_runs(cluster.box, held, account)
    assert hold.charged_ucredits == charge_for(PRICES["h100"], elapsed_of(rows[-1]))


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
        assert cluster.holds(job) == []  # ran unreserved: the bridge charges it from sacct
    finally:
        cluster.write_config("reject")
        cluster.start_daemon()


# -- multi-node jobs and arrays -------------------------------------------------------------------


def test_two_node_job_is_charged_for_the_gpus_on_both_nodes(cluster: Cluster) -> None:
    account = cluster.new_account("10")
    job = submit(
        cluster.box, "-A", account, "-N", "2", "--gres=gpu:h100:1", "-t", "1", "--wrap", "srun sleep 2"
    )
    cluster.box.wait_state(job, "COMPLETED", timeout=60)
    [hold] = cluster.wait_holds(job, "settled")
    [row] = sacct_runs(cluster.box, job, account)
    assert hold.gpus == "h100:2"
    assert "gres/gpu:h100=2" in row["AllocTRES"]
    assert hold.charged_ucredits == charge_for(2 * PRICES["h100"], elapsed_of(row))


def test_array_is_estimated_per_task_and_each_task_settles(cluster: Cluster) -> None:
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
    raw_ids = []
    for task in range(3):
        cluster.box.wait_state(f"{array_id}_{task}", "COMPLETED", timeout=90)
        [row] = sacct_runs(cluster.box, f"{array_id}_{task}", account)
        raw_ids.append(int(row["JobIDRaw"]))
        [hold] = cluster.wait_holds(int(row["JobIDRaw"]), "settled")
        assert hold.charged_ucredits == charge_for(PRICES["a100"], elapsed_of(row))
    assert len(set(raw_ids)) == 3
