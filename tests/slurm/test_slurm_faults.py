"""Faults injected into the real Slurm box, each ending with the books checked.

The box's ledger lives on a PRIVATE PostgreSQL this module starts (initdb into a
temporary directory, its own port), so a test can stop and start the database under a
running job; the shared PostgreSQL is never touched. Two `gpucredit daemon` processes
serve it (the primary and the backup controller's, docs/admin-guide.md "Two
controllers"); the hooks list both sockets and fail over. Policy is `reject` with
`full` holds, whose overspend bound is 0.

Every test ends with `Faults.check`: `gpucredit bridge sacct`, `gpucredit audit verify`,
then for every run sacct lists: its hold (if the prolog admitted it) is resolved and
charged exactly charge_for(price, ElapsedRaw) -- 0 for a NODE_FAIL run (refunded) --
with at most one settle and at most one adjustment; the account holds nothing and
has exactly its credit less those charges (no credit lost, no double charge), and it
never went below zero (overspend 0). What each fault showed is in docs/faults.md.

Waits poll with a bound; nothing sleeps and hopes.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select, text

from ledger import api, cli_support
from ledger.holds.state import HoldState
from ledger.money import charge_for, format_credits
from ledger.store.db import make_engine
from ledger.store.schema import upgrade
from ledger.store.tables import entries_t
from ledger.timeutil import parse_time, utcnow
from tests.support.cluster import PRICES, Box, Cluster, Gate, e2e_dir, make_box, sacct_runs
from tests.support.daemon import DaemonProcess
from tests.support.services import require

pytestmark = pytest.mark.slurm

BOX = make_box()  # a handle on the session's box (tests/slurm/conftest.py's slurm_box)
RUN_DIR = e2e_dir(BOX, "gpucredit-faults")  # as this process sees it; the hooks, inside the box
PG_BIN = Path("/usr/lib/postgresql/15/bin")
HOOK_LOG = RUN_DIR / "hooks.log"
GPUCREDIT = str(Path(sys.executable).with_name("gpucredit"))


# --------------------------------------------------------------------------- private PostgreSQL


def _free_port(preferred: int = 55432) -> int:
    for port in (preferred, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise RuntimeError("no free port")


@dataclass
class PrivatePostgres:
    """A PostgreSQL 15 cluster of our own that a test may stop and start at will."""

    root: Path
    port: int

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _as_postgres(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/usr/sbin/runuser", "-u", "postgres", "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.root,
        )

    def init(self) -> str | None:
        """initdb; returns why it failed, or None."""
        shutil.chown(self.root, "postgres", "postgres")
        proc = self._as_postgres(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"
        )
        return None if proc.returncode == 0 else f"initdb: {proc.stderr.strip()[-400:]}"

    def start(self) -> str | None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        proc = self._as_postgres(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-t", "30",
            "-o", options, "start",
        )  # fmt: skip
        return None if proc.returncode == 0 else f"pg_ctl start: {proc.stdout}{proc.stderr}"

    def stop(self) -> None:
        proc = self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def answers(self) -> bool:
        return (
            self._as_postgres(str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)).returncode
            == 0
        )


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL cluster; fails in CI when it cannot start, skips elsewhere."""
    require(
        (PG_BIN / "initdb").exists() and os.geteuid() == 0,
        f"PostgreSQL 15 server binaries ({PG_BIN}) run as root",
        "apt-get install postgresql-15 and run the Slurm tests as root",
    )
    pg = PrivatePostgres(Path(tempfile.mkdtemp(prefix="gc-pg-", dir="/tmp")), _free_port())
    problem = pg.init() or pg.start()
    require(problem is None, f"a private PostgreSQL in {pg.root}", str(problem))
    try:
        admin = create_engine(pg.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text('CREATE DATABASE "gpucredit"'))
        admin.dispose()
        engine = make_engine(pg.url("gpucredit"))
        upgrade(engine)
        engine.dispose()
        yield pg
    finally:  # never leave it running: the next session's cluster would find the port taken
        pg._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(pg.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(pg.root, ignore_errors=True)


# --------------------------------------------------------------------------- the box's gpucredit


@dataclass
class Faults(Cluster):
    """The e2e Cluster with the daemons as processes (so they can be SIGKILLed) on a
    private database, and the fault checks."""

    pg: PrivatePostgres | None = None
    daemons: list[DaemonProcess] = field(default_factory=list)

    def write_config(self, policy: str) -> None:
        self.policy = policy
        sockets = [f"@DIR@/{Path(d.socket).name}" for d in self.daemons]  # in RUN_DIR
        self.write_configs(
            f'[daemon]\nsocket = "{sockets[0]}"\n'
            f"sockets = [{', '.join(f'{s!r}'.replace(chr(39), chr(34)) for s in sockets)}]\n"
            "timeout_seconds = 2.0\nmetrics_port = 0\n"
            f'[policy]\non_ledger_unreachable = "{policy}"\nepilog_grace_seconds = 0\n'
            '[slurm]\ncluster = "lab"\nbin_dir = "@BIN@"\n'
            '[agent]\nspool_dir = "@DIR@/spool/%n"\n'
            f'[hooks]\nlog_file = "@DIR@/{HOOK_LOG.name}"\n'
        )

    def start_daemon(self) -> None:
        for daemon in self.daemons:
            if daemon.proc is None or daemon.proc.poll() is not None:
                daemon.start(self.config_path, release_interval=1.0)

    def stop_daemon(self) -> None:
        for daemon in self.daemons:
            daemon.stop()

    def kill_daemons(self, *which: int) -> None:
        for index in which or range(len(self.daemons)):
            self.daemons[index].kill()

    # ---- database ----

    def stop_database(self) -> None:
        assert self.pg is not None
        self.pg.stop()

    def start_database(self) -> None:
        assert self.pg is not None
        problem = self.pg.start()
        assert problem is None, problem
        deadline = time.monotonic() + 30
        while not self.pg.answers():
            assert time.monotonic() < deadline, "private PostgreSQL did not come back"
            time.sleep(0.1)

    # ---- Slurm ----

    def hook_lines(self, hook: str, job: int) -> list[str]:
        marker = f"gpucredit[{hook}] job={job} "
        try:
            return [line for line in HOOK_LOG.read_text().splitlines() if marker in line]
        except FileNotFoundError:
            return []

    def prolog_refused(self, job: int, run: int) -> bool:
        """The prolog logged this run and did not hold it: it parked or refused the start.
        (sacct's elapsed cannot say so: a refusal lasts as long as the prolog, over 1 s
        while the ledger's database restarts.)"""
        lines = [line for line in self.hook_lines("prolog-slurmctld", job) if f" run={run}: " in line]
        return bool(lines) and not any(f" run={run}: hold " in line for line in lines)

    def wait_hook(self, hook: str, job: int, contains: str, timeout: float = 60) -> str:
        """The hook's log line for `job` containing `contains`, once it is written."""
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.hook_lines(hook, job) if contains in line]
            if found:
                return found[-1]
            if time.monotonic() > deadline:
                job_text = self.box.run(["scontrol", "show", "job", str(job)]).stdout
                raise AssertionError(f"{hook} {job} {contains!r}: {self.hook_lines(hook, job)}\n{job_text}")
            time.sleep(0.1)

    def wait_held(self, job: int, timeout: float = 60) -> dict[str, str]:
        """`scontrol show job` once the job is held (a refused start is requeued first and
        reads Reason=BeginTime for a few seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.box.scontrol_job(job)
            if info.get("JobState") == "PENDING" and info.get("Reason") == "JobHeldAdmin":
                return info
            assert time.monotonic() < deadline, info
            time.sleep(0.2)

    def node_back(self, node: str, timeout: float = 60) -> None:
        """Resume a node set down, until it is in service again. slurmd still answers, so
        with ReturnToService=2 the node may already be back: `resume` then fails."""
        self.box.run(["scontrol", "update", f"nodename={node}", "state=resume"])
        deadline = time.monotonic() + timeout
        while True:
            state = self.box.run(["sinfo", "-h", "-n", node, "-o", "%T"]).stdout.strip()
            if state in ("idle", "mixed", "allocated", "completing"):
                return
            assert time.monotonic() < deadline, f"{node} is {state}"
            time.sleep(0.2)

    def run_hook(self, hook: str, job: int, restart: int = 0) -> int:
        """Run a controller hook by hand, as slurmctld would (a duplicated prolog or epilog)."""
        env = {
            "SLURM_JOB_ID": str(job),
            "SLURM_JOB_RESTART_COUNT": str(restart),
            "SLURM_CLUSTER_NAME": "lab",
            "SLURM_SCRIPT_CONTEXT": hook.replace("-", "_"),
            "GPUCREDIT_CONFIG": str(self.config_path),
        }
        return subprocess.run([GPUCREDIT, "hook", hook], env=env, capture_output=True, timeout=30).returncode

    # ---- the books ----

    def money_entries(self, hold_id: int) -> list[str]:
        """Kinds of the hold's entries that fix its charge (settle, adjust), in order."""
        with self.tx() as s:
            query = (
                select(entries_t.c.kind)
                .where(entries_t.c.hold_id == hold_id, entries_t.c.kind.in_(("settle", "adjust")))
                .order_by(entries_t.c.id)
            )
            return list(s.execute(query).scalars())

    def check(
        self, account: str, jobs: Mapping[int | str, int], since: datetime
    ) -> dict[int | str, list[HoldState]]:
        """Bridge, audit, and the exact books (see the module docstring). `jobs`: job id (or
        array task `A_T`) -> the price of its GPUs in micro-credits per hour. Callers first
        wait for the epilogs that do run (`wait_hook`): a run still active here is settled
        by the bridge."""
        runs = {job: sacct_runs(self.box, job, account) for job in jobs}
        ids = {job: int(rows[0]["JobIDRaw"]) for job, rows in runs.items()}
        self.bridge_sacct(since)
        assert self.gpucredit("audit", "verify").startswith("ok: ")
        spent = 0
        found = {job: self.holds(ids[job], account) for job in jobs}
        with self.tx() as s:
            for job, rows in runs.items():
                by_run = {h.run: h for h in found[job]}
                assert len(by_run) == len(found[job]), (job, found[job])  # one hold per run
                assert set(by_run) <= set(range(len(rows))), (job, found[job], rows)
                for index, row in enumerate(rows):
                    state = row["State"].split()[0]
                    expected = 0 if state == "NODE_FAIL" else charge_for(jobs[job], int(row["ElapsedRaw"]))
                    hold = by_run.get(index)
                    if hold is None:  # refused: the prolog's time can pass 1 s amid a fault
                        assert state == "REQUEUED" and self.prolog_refused(ids[job], index), (
                            job,
                            index,
                            row,
                            found[job],
                            self.hook_lines("prolog-slurmctld", ids[job]),
                        )
                        continue
                    assert hold.state in ("settled", "expired"), (job, row, hold)
                    assert hold.charged_ucredits == expected, (job, index, row, hold)
                    kinds = list(
                        s.execute(
                            select(entries_t.c.kind).where(
                                entries_t.c.hold_id == hold.id, entries_t.c.kind.in_(("settle", "adjust"))
                            )
                        ).scalars()
                    )
                    assert kinds.count("settle") <= 1 and kinds.count("adjust") <= 1, (job, index, kinds)
                    spent += expected
            balance = api.balance(s, account)
        expected_balance = format_credits(self.credit_ucredits[account] - spent)
        assert (balance["available"], balance["held"]) == (expected_balance, "0.00"), balance
        assert not balance["available"].startswith("-")  # overspend 0 under reject + full holds
        return found


@pytest.fixture(scope="module")
def faults(slurm_box: Box, private_pg: PrivatePostgres) -> Iterator[Faults]:
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    HOOK_LOG.unlink(missing_ok=True)
    # Job ids restart with the box: an old run's GPU registry (its node epilog never ran
    # when the box stopped under it) would claim a new job's GPU for the agent.
    shutil.rmtree(RUN_DIR / "spool", ignore_errors=True)
    url = private_pg.url("gpucredit")
    engine = make_engine(url)
    previous_config, previous_hooks = slurm_box.config_path, slurm_box.hooks
    c = Faults(slurm_box, url, engine, RUN_DIR / "gpucredit.toml", pg=private_pg)
    c.daemons = [
        DaemonProcess(str(RUN_DIR / "primary.sock"), RUN_DIR / "primary.log"),
        DaemonProcess(str(RUN_DIR / "backup.sock"), RUN_DIR / "backup.log"),
    ]
    with c.tx() as s:
        for gres, price in PRICES.items():
            api.set_price(s, gres, format_credits(price), effective_at=parse_time("2026-01-01"))
    c.write_config("reject")
    c.start_daemon()
    try:
        yield c
    finally:
        if not private_pg.answers():
            c.start_database()
        c.stop_daemon()
        shutil.copyfile(private_pg.root / "log", RUN_DIR / "postgres.log")  # for a failure's story
        for job in slurm_box.run(["squeue", "-h", "-o", "%i|%a"]).stdout.splitlines():
            job_id, _sep, account = job.partition("|")
            if account in c.accounts:
                slurm_box.run(["scancel", job_id])
        slurm_box.config_path = previous_config
        slurm_box.use_hooks(previous_hooks)
        if c.accounts:
            slurm_box.run(["sacctmgr", "-i", "delete", "account", ",".join(c.accounts)])
        cli_engine = cli_support._engines.pop(url, None)
        if cli_engine is not None:
            cli_engine.dispose()
        engine.dispose()


@pytest.fixture
def since() -> datetime:
    return utcnow() - timedelta(seconds=2)


def submit(c: Faults, account: str, *args: str) -> int:
    return c.box.submit(["-A", account, *args])


def charged(hook_line: str) -> str:
    """`charged X of Y credits` of an epilog's log line."""
    return hook_line.split(": charged ", 1)[1].split(" (", 1)[0]


def release(job: int) -> None:
    """What an admin does for a job held with the ledger-unreachable reason. The daemons'
    release loop may have done it already (its scan at start and every minute releases
    held jobs whose account can pay), so a job no longer held is fine."""
    BOX.run(["scontrol", "release", str(job)])


# --------------------------------------------------------------------------- the database down


def test_database_stopped_at_submit_and_prolog_holds_the_job_then_it_runs_once(
    faults: Faults, since: datetime
) -> None:
    """With the database down, job_submit still quotes from the daemon's snapshot (it is
    trusted for 30 s after the last read) and accepts; the prolog cannot hold, so under
    reject the job is parked with the unreachable reason and never runs unreserved. A job
    whose prolog comes while the database is down is parked the same way. Database back,
    an admin releases them: each runs as run 1 and is charged once."""
    account = faults.new_account("10")
    args = ["-A", account, "--gres=gpu:h100:1", "-t", "1", "--wrap", "sleep 2"]
    # Accepted with the database up: the daemon's snapshot now knows the new account.
    parked = faults.box.submit(["--hold", *args])
    faults.stop_database()
    try:
        rc, out, err = faults.box.sbatch(["--parsable", *args])
        assert rc == 0, err  # quoted from the snapshot
        submitted = int(out.strip())
        release(parked)
        for job in (submitted, parked):
            faults.wait_hook("prolog-slurmctld", job, "ledger unreachable")
            info = faults.wait_held(job)
            assert (info["Reason"], info["Comment"].strip()) == (
                "JobHeldAdmin",
                "gpucredit: ledger unreachable; job held by site policy, ask your admin to release it",
            )
    finally:
        faults.start_database()
    assert faults.holds(submitted, account) == faults.holds(parked, account) == []
    for job in (submitted, parked):
        release(job)
    for job in (submitted, parked):
        faults.box.wait_state(job, "COMPLETED", timeout=90)
        faults.wait_hook("epilog-slurmctld", job, "settled hold")
    holds = faults.check(account, {submitted: PRICES["h100"], parked: PRICES["h100"]}, since)
    assert [h.run for job in (submitted, parked) for h in holds[job]] == [1, 1]  # run 0: the refused start


def test_an_outage_past_the_snapshots_30_seconds_refuses_at_submit_and_says_why(faults: Faults) -> None:
    """For 30 s after the database last answered, job_submit quotes from the daemons'
    snapshot; past that it has no figures it may trust, and under reject sbatch is refused
    with the reason. Database back, sbatch is quoted again."""
    account = faults.new_account("10")
    args = ["--parsable", "-A", account, "--hold", "--gres=gpu:h100:1", "-t", "1", "--wrap", "true"]
    # Accepted with the database up: the daemons' snapshot now knows the new account.
    accepted: list[int] = [faults.box.submit(args[1:])]
    faults.stop_database()
    try:
        deadline = time.monotonic() + 120  # a guard against a snapshot trusted for ever
        while True:
            rc, out, err = faults.box.sbatch(args)
            if rc != 0:
                break
            assert "gpucredit: ~0.06 credits" in err  # still quoted from the snapshot
            accepted.append(int(out.strip()))
            assert time.monotonic() < deadline, "job_submit kept quoting from a snapshot past 30 s"
            time.sleep(1)
        assert len(accepted) > 1, f"the snapshot was not trusted even at the start of the outage: {err}"
        assert err.splitlines()[0] == (
            "sbatch: error: gpucredit: credit check unavailable (ledger unreachable); "
            "job refused by site policy; try again shortly or contact your admin"
        )
    finally:
        faults.start_database()
        for job in accepted:
            faults.box.run(["scancel", str(job)])
    deadline = time.monotonic() + 30
    while True:  # the daemons' next snapshot, a second or so after the database answers
        rc, out, err = faults.box.sbatch(args)
        if rc == 0:
            break
        assert time.monotonic() < deadline, err
        time.sleep(0.5)
    faults.box.run(["scancel", out.strip()])
    assert "gpucredit: ~0.06 credits (1×h100 × 1 min), 10.00 available in " + account in err


def test_a_lease_the_meter_cannot_renew_while_the_database_is_down_is_caught_up_after(
    faults: Faults, since: datetime
) -> None:
    """Lease mode (a 20 s window, the meter every 2 s): the database stops while a job runs,
    the meter's ticks fail (its renewal cannot be taken), the job runs past what its hold
    covers; database back, the next tick charges the seconds run and renews the lease, and
    the run's final charge is exact."""
    account = faults.new_account("10")
    lease = '[holds]\nmode = "lease"\nlease_seconds = 20\n[meter]\ninterval_seconds = 2\n'
    faults.config_path.write_text(faults.config_path.read_text() + lease)
    faults.stop_daemon()
    faults.start_daemon()
    env = {**os.environ, "GPUCREDIT_CONFIG": str(faults.config_path)}
    meter_log = RUN_DIR / "meter-lease.log"
    meter_log.unlink(missing_ok=True)
    gate = Gate(BOX)
    meter = None
    down = False
    try:
        job = submit(faults, account, "--gres=gpu:h100:1", "-t", "5", "--wrap", gate.wrap)
        faults.box.wait_state(job, "RUNNING", timeout=30)
        faults.wait_hook("prolog-slurmctld", job, "hold ")
        [hold] = faults.holds(job, account)
        assert (hold.lease_seconds, hold.amount_ucredits) == (20, 20 * 1000)  # 20 s of 1×h100
        with open(meter_log, "ab") as out:
            meter = subprocess.Popen(
                [GPUCREDIT, "bridge", "meter", "--interval", "2"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for(lambda: "meter tick:" in meter_log.read_text(), meter, meter_log)
        [hold] = faults.holds(job, account)
        covered = hold.amount_ucredits // 1000  # seconds the hold covers now
        faults.stop_database()
        down = True
        wait_for(lambda: "meter tick failed" in meter_log.read_text(), meter, meter_log)
        while utcnow() < hold.started_at + timedelta(seconds=covered + 4):  # past its lease
            assert faults.box.job_state(job) == "RUNNING"
            time.sleep(0.5)
        faults.start_database()
        down = False
        caught_up = len(meter_log.read_text())
        wait_for(lambda: "'renewed': 1" in meter_log.read_text()[caught_up:], meter, meter_log)
        [after] = faults.holds(job, account)
        assert after.charged_seconds > covered  # the seconds run while down, charged
        assert after.amount_ucredits >= charge_for(after.rate_ucredits_per_hour, after.charged_seconds + 10)
        gate.open()
        faults.box.wait_state(job, "COMPLETED", timeout=90)
        faults.wait_hook("epilog-slurmctld", job, "settled hold")
    finally:
        if meter is not None:
            meter.kill()
            meter.wait(10)
        if down:
            faults.start_database()
        faults.write_config(faults.policy)
        faults.stop_daemon()
        faults.start_daemon()
    faults.check(account, {job: PRICES["h100"]}, since)


def wait_for(condition: Callable[[], bool], process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)


def test_database_stopped_while_running_and_back_before_the_epilog(faults: Faults, since: datetime) -> None:
    account = faults.new_account("10")
    gate = Gate(BOX)
    job = submit(faults, account, "--gres=gpu:a100:1", "-t", "1", "--wrap", gate.wrap)
    faults.box.wait_state(job, "RUNNING", timeout=30)
    faults.wait_hook("prolog-slurmctld", job, "hold ")
    faults.stop_database()
    faults.start_database()
    gate.open()
    faults.box.wait_state(job, "COMPLETED", timeout=60)
    faults.wait_hook("epilog-slurmctld", job, "settled hold")
    faults.check(account, {job: PRICES["a100"]}, since)


def test_database_stopped_during_the_epilog_the_bridge_settles_the_run(
    faults: Faults, since: datetime
) -> None:
    account = faults.new_account("10")
    gate = Gate(BOX)
    job = submit(faults, account, "--gres=gpu:a100:2", "-t", "1", "--wrap", gate.wrap)
    faults.box.wait_state(job, "RUNNING", timeout=30)
    faults.wait_hook("prolog-slurmctld", job, "hold ")
    faults.stop_database()
    try:
        gate.open()
        faults.wait_hook("epilog-slurmctld", job, "the bridge will reconcile this run")
    finally:
        faults.start_database()
    [hold] = faults.holds(job, account)
    assert hold.state == "active"  # the epilog's settle never reached the ledger
    faults.box.wait_state(job, "COMPLETED", timeout=60)
    [[settled]] = faults.check(account, {job: 2 * PRICES["a100"]}, since).values()
    assert settled.state == "settled"


# --------------------------------------------------------------------------- the daemons killed


def test_primary_daemon_killed_mid_job_the_backup_settles(faults: Faults, since: datetime) -> None:
    account = faults.new_account("10")
    gate = Gate(BOX)
    job = submit(faults, account, "--gres=gpu:h100:1", "-t", "1", "--wrap", gate.wrap)
    faults.box.wait_state(job, "RUNNING", timeout=30)
    faults.wait_hook("prolog-slurmctld", job, "hold ")
    faults.kill_daemons(0)
    try:
        gate.open()
        faults.box.wait_state(job, "COMPLETED", timeout=60)
        faults.wait_hook("epilog-slurmctld", job, "settled hold")  # through the backup
        faults.check(account, {job: PRICES["h100"]}, since)
    finally:
        faults.start_daemon()


def test_both_daemons_killed_at_submit_prolog_running_and_epilog(faults: Faults, since: datetime) -> None:
    """Submit with no daemon: refused (reject). Prolog with none: held with the reason.
    Killed while running and back before the epilog: settled. Killed at the epilog: the
    bridge settles. One job of each, books exact."""
    account = faults.new_account("10")
    args = ["--gres=gpu:a100:1", "-t", "1"]
    running_gate, epilog_gate = Gate(BOX), Gate(BOX)
    parked = submit(faults, account, "--hold", *args, "--wrap", "sleep 1")
    running = submit(faults, account, *args, "--wrap", running_gate.wrap)
    at_epilog = submit(faults, account, *args, "--wrap", epilog_gate.wrap)
    for job in (running, at_epilog):
        faults.box.wait_state(job, "RUNNING", timeout=30)
        faults.wait_hook("prolog-slurmctld", job, "hold ")
    faults.kill_daemons()
    try:
        rc, _out, err = faults.box.sbatch(["-A", account, *args, "--wrap", "true"])
        assert rc == 1
        assert "gpucredit: credit check unavailable (ledger unreachable); job refused by site policy" in err
        release(parked)
        faults.wait_hook("prolog-slurmctld", parked, "ledger unreachable")
        # The prolog marked it before it exited (held for good once its requeue settles).
        assert faults.box.scontrol_job(parked)["Comment"].startswith("gpucredit: ledger unreachable")
        epilog_gate.open()
        faults.wait_hook("epilog-slurmctld", at_epilog, "the bridge will reconcile this run")
    finally:
        faults.start_daemon()  # its scan at start releases the parked job: its account can pay
    running_gate.open()
    for job in (parked, running, at_epilog):
        faults.box.wait_state(job, "COMPLETED", timeout=90)
    faults.wait_hook("epilog-slurmctld", running, "settled hold")
    price = PRICES["a100"]
    holds = faults.check(account, {parked: price, running: price, at_epilog: price}, since)
    assert [h.run for h in holds[parked]] == [1]


# --------------------------------------------------------------------------- hooks repeated or lost


def test_duplicated_prolog_and_epilog_hold_and_settle_once(faults: Faults, since: datetime) -> None:
    account = faults.new_account("10")
    job = submit(faults, account, "--gres=gpu:h100:1", "-t", "1", "--wrap", "sleep 3")
    faults.box.wait_state(job, "RUNNING", timeout=30)
    faults.wait_hook("prolog-slurmctld", job, "hold ")
    assert faults.run_hook("prolog-slurmctld", job) == 0  # Slurm retrying the prolog
    faults.box.wait_state(job, "COMPLETED", timeout=60)
    first = faults.wait_hook("epilog-slurmctld", job, "settled hold")
    assert faults.run_hook("epilog-slurmctld", job) == 0  # and the epilog
    again = [line for line in faults.hook_lines("epilog-slurmctld", job) if "settled hold" in line][1:]
    assert [charged(line) for line in again] == [charged(first)]  # the first settle, replayed
    [[hold]] = faults.check(account, {job: PRICES["h100"]}, since).values()
    assert hold.state == "settled"


def test_lost_epilog_is_recovered_by_the_bridge_and_the_sweep(faults: Faults, since: datetime) -> None:
    """No EpilogSlurmctld at all for two jobs: the bridge settles one from sacct; the
    other is first expired by the sweep (as at time limit + grace) and then corrected by
    the bridge to Slurm's elapsed. Nothing stays held, each is charged exactly once."""
    account = faults.new_account("10")
    with faults.box.custom_hook("epilog-slurmctld", "#!/bin/sh\nexit 0\n"):
        # A longer time limit: the sweep below, at the other's expiry, leaves this one be.
        bridged = submit(faults, account, "--gres=gpu:a100:1", "-t", "2", "--wrap", "sleep 2")
        swept = submit(faults, account, "--gres=gpu:a100:1", "-t", "1", "--wrap", "sleep 2")
        for job in (bridged, swept):
            faults.box.wait_state(job, "COMPLETED", timeout=60)
    assert [h.state for job in (bridged, swept) for h in faults.holds(job, account)] == ["active", "active"]
    [hold] = faults.holds(swept, account)
    faults.gpucredit("sweep", "--at", (hold.expires_at + timedelta(seconds=1)).isoformat())
    assert [h.state for job in (bridged, swept) for h in faults.holds(job, account)] == ["active", "expired"]
    holds = faults.check(account, {bridged: PRICES["a100"], swept: PRICES["a100"]}, since)
    assert [h.state for h in holds[bridged]] == ["settled"]
    # The bridge settled one; the other, expired with nothing charged, it adjusted.
    assert [faults.money_entries(h.id) for job in (bridged, swept) for h in holds[job]] == [
        ["settle"],
        ["adjust"],
    ]


# --------------------------------------------------------------------------- a node killed


def test_node_killed_under_a_job_is_refunded_and_the_requeued_run_charged_once(
    faults: Faults, since: datetime
) -> None:
    account = faults.new_account("10")
    gate = Gate(BOX)
    job = submit(
        faults, account, "-p", "onprem", "-w", "node2", "--gres=gpu:h100:1", "-t", "1", "--wrap", gate.wrap
    )
    faults.box.wait_state(job, "RUNNING", timeout=30)
    faults.wait_hook("prolog-slurmctld", job, "hold ")
    try:
        faults.box.scontrol("update", "nodename=node2", "state=down", "reason=gpucredit-fault-test")
        deadline = time.monotonic() + 30
        while faults.box.scontrol_job(job).get("Restarts", "0") == "0":
            assert time.monotonic() < deadline, faults.box.scontrol_job(job)
            time.sleep(0.2)
    finally:
        faults.node_back("node2")
    faults.box.wait_state(job, "RUNNING", timeout=90)  # the requeued run
    gate.open()
    faults.box.wait_state(job, "COMPLETED", timeout=120)
    rows = sacct_runs(faults.box, job, account)
    assert [r["State"].split()[0] for r in rows] == ["NODE_FAIL", "COMPLETED"]
    holds = faults.check(account, {job: PRICES["h100"]}, since)[job]
    assert [(h.run, h.charged_ucredits == 0) for h in holds] == [(0, True), (1, False)]
    # Run 0: the epilog's settle then the bridge's refund, or, when the bridge came first,
    # its settle at 0; run 1: its settle alone.
    entries = [faults.money_entries(h.id) for h in holds]
    assert entries in ([["settle", "adjust"], ["settle"]], [["settle"], ["settle"]]), entries


# --------------------------------------------------------------------------- meter and bridge killed


def _stalled_sacct_config(faults: Faults, folder: Path) -> tuple[Path, Path]:
    """A copy of the config whose `slurm.bin_dir` holds an sacct that says it started (its
    pid in the marker) and then never ends: the bridge is caught inside sacct every time,
    however fast the real one answers. The other clients are the box's own."""
    folder.mkdir(parents=True, exist_ok=True)
    real = Path(faults.box.client_dir())
    for name in ("sacctmgr", "sbatch", "scancel", "scontrol", "sinfo", "squeue", "sshare"):
        link = folder / name
        link.unlink(missing_ok=True)
        link.symlink_to(real / name)
    marker = folder / "sacct.pid"
    marker.unlink(missing_ok=True)
    sacct = folder / "sacct"
    sacct.write_text(f"#!/bin/sh\necho $$ > {marker}.tmp && mv {marker}.tmp {marker}\nexec sleep 600\n")
    sacct.chmod(0o755)
    text = faults.config_path.read_text()
    assert f'bin_dir = "{real}"' in text, text
    config = folder / "config.toml"
    config.write_text(text.replace(f'bin_dir = "{real}"', f'bin_dir = "{folder}"'))
    return config, marker


def test_meter_and_bridge_killed_mid_work_change_nothing(faults: Faults, since: datetime) -> None:
    """The meter SIGKILLed after a tick and run again; the bridge SIGKILLed while its
    sacct runs (mid-ingest), then run to the end: every charge is still exact once."""
    account = faults.new_account("10")
    gate = Gate(BOX)
    job = submit(faults, account, "--gres=gpu:h100:1", "-t", "1", "--wrap", gate.wrap)
    faults.box.wait_state(job, "RUNNING", timeout=30)
    faults.wait_hook("prolog-slurmctld", job, "hold ")
    env = {**os.environ, "GPUCREDIT_CONFIG": str(faults.config_path)}
    meter_log = RUN_DIR / "meter.log"
    meter_log.unlink(missing_ok=True)
    with open(meter_log, "ab") as out:
        meter = subprocess.Popen(
            [GPUCREDIT, "bridge", "meter", "--interval", "1"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 30
        while "meter tick:" not in meter_log.read_text():
            assert meter.poll() is None and time.monotonic() < deadline, meter_log.read_text()[-2000:]
            time.sleep(0.1)
    finally:
        meter.kill()
        meter.wait(10)
    rerun = subprocess.run(
        [GPUCREDIT, "bridge", "meter", "--once"], env=env, capture_output=True, text=True, timeout=60
    )
    assert rerun.returncode == 0, rerun.stderr
    gate.open()
    faults.box.wait_state(job, "COMPLETED", timeout=60)
    faults.wait_hook("epilog-slurmctld", job, "settled hold")
    sacct_runs(faults.box, job, account)  # final in sacct, so the bridge has it to ingest
    config, marker = _stalled_sacct_config(faults, RUN_DIR / "stalled-sacct")
    bridge = subprocess.Popen(
        [GPUCREDIT, "bridge", "sacct", "--since", since.isoformat()],
        env={**env, "GPUCREDIT_CONFIG": str(config)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert bridge.poll() is None, "the bridge ended before it ran sacct"
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        bridge.kill()
        bridge.wait(10)
        if marker.exists():
            os.kill(int(marker.read_text()), 9)
    faults.check(account, {job: PRICES["h100"]}, since)


# --------------------------------------------------------------------------- a restart amid holds


def test_database_restarted_amid_a_burst_of_holds_each_run_holds_once(
    faults: Faults, since: datetime
) -> None:
    """The database is stopped and started the moment the first of four array tasks has
    its hold, while the others' prologs are in flight. Whichever holds the restart cut
    off, those tasks are parked (reject) and, released, hold again as their next run:
    one hold per run, books exact."""
    account = faults.new_account("10")

    def prologs() -> int:
        return HOOK_LOG.read_text().count("gpucredit[prolog-slurmctld] job=") if HOOK_LOG.exists() else 0

    before = prologs()
    rc, out, err = faults.box.sbatch(
        ["--parsable", "-A", account, "--array=0-3", "--gres=gpu:a100:1", "-t", "1", "--wrap", "sleep 3"]
    )
    assert rc == 0, err
    tasks = [f"{int(out.strip().split(';')[0])}_{task}" for task in range(4)]
    deadline = time.monotonic() + 60
    while prologs() == before:
        assert time.monotonic() < deadline, "no prolog ran"
        time.sleep(0.01)
    faults.stop_database()
    faults.start_database()
    for task in tasks:  # each either ran or was parked; parked ones are released
        deadline = time.monotonic() + 90
        while True:
            info = faults.box.scontrol_job(task)
            if info.get("Reason") == "JobHeldAdmin":
                release(task)
            if info.get("JobState") in ("RUNNING", "COMPLETING", "COMPLETED"):
                break
            assert time.monotonic() < deadline, info
            time.sleep(0.2)
    for task in tasks:
        faults.box.wait_state(task, "COMPLETED", timeout=90)
    raw = {task: int(sacct_runs(faults.box, task, account)[-1]["JobIDRaw"]) for task in tasks}
    for task in tasks:
        faults.wait_hook("epilog-slurmctld", raw[task], "settled hold")
    holds = faults.check(account, dict.fromkeys(tasks, PRICES["a100"]), since)
    for task in tasks:
        rows = sacct_runs(faults.box, task, account)
        seen = [(h.run, h.state, h.charged_ucredits) for h in holds[task]]
        states = [(r["State"], r["ElapsedRaw"]) for r in rows]
        # The run that ran holds and settles once. A refused start may still own a hold: its
        # commit went through as the database went down, so the daemon could not say so
        # (an in-doubt commit); check() above showed it charged exactly sacct's elapsed,
        # which is the prolog's own time and can pass 1 s while the database restarts. So
        # the prolog's log, not the elapsed, says which run it refused.
        assert [h.run for h in holds[task] if h.state == "settled"][-1:] == [len(rows) - 1], (
            task,
            seen,
            states,
        )
        refused = {run for run in range(len(rows)) if faults.prolog_refused(raw[task], run)}
        assert all(h.run == len(rows) - 1 or h.run in refused for h in holds[task]), (
            seen,
            states,
            faults.hook_lines("prolog-slurmctld", raw[task]),
        )
        assert all(rows[run]["State"].split()[0] == "REQUEUED" for run in refused), (states, refused)


# --------------------------------------------------------------------------- the NVML agent killed


def test_nvml_agent_killed_leaves_a_gap_in_usage_and_charges_alone(faults: Faults, since: datetime) -> None:
    """The node agent (fake NVML here) is SIGKILLed while a job runs: its usage record
    stops short of the run (a gap: fewer allocated GPU-seconds than sacct's elapsed), and
    the charge, which never reads it, is exact."""
    from ledger.store.models import GpuUsage, table_of

    usage_t = table_of(GpuUsage)
    account = faults.new_account("10")
    gate = Gate(BOX)
    job = submit(faults, account, "-w", "node1", "--gres=gpu:a100:1", "-t", "1", "--wrap", gate.wrap)
    faults.box.wait_state(job, "RUNNING", timeout=30)
    faults.wait_hook("prolog", job, "registered")
    env = {**os.environ, "GPUCREDIT_CONFIG": str(faults.config_path)}
    agent_log = RUN_DIR / "agent.log"
    with open(agent_log, "wb") as out:
        agent = subprocess.Popen(
            [GPUCREDIT, "agent", "--node", "node1", "--fake-nvml", "a100:2,h100:2@50", "--interval", "0.5"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def usage() -> list[tuple[int, int]]:
        with faults.tx() as s:
            query = select(usage_t.c.allocated_gpu_seconds, usage_t.c.busy_gpu_seconds).where(
                usage_t.c.job_id == job, usage_t.c.node == "node1"
            )
            return [tuple(row) for row in s.execute(query)]

    try:
        deadline = time.monotonic() + 30
        while not usage():
            assert agent.poll() is None and time.monotonic() < deadline, agent_log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        agent.kill()
        agent.wait(10)
    recorded = usage()
    # Keep the job running past what the agent saw, so the gap is there whatever the timing.
    deadline = time.monotonic() + 30
    while (utcnow() - faults.holds(job, account)[0].started_at).total_seconds() < recorded[0][0] + 3:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    gate.open()
    faults.box.wait_state(job, "COMPLETED", timeout=60)
    faults.wait_hook("epilog-slurmctld", job, "settled hold")
    faults.check(account, {job: PRICES["a100"]}, since)
    [row] = sacct_runs(faults.box, job, account)
    [(allocated, busy)] = usage()
    assert 0 < allocated < int(row["ElapsedRaw"]) and busy <= allocated  # the gap
