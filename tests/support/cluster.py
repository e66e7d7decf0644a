"""The Slurm box wired to gpucredit for the end-to-end tests (tests/slurm/): `Cluster` (its
accounts, jobs, daemon and ledger) and `Books` (what a user is promised about money,
checked as a user would). The `cluster` and `books` fixtures are in
tests/slurm/conftest.py."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import Engine, select

from gpucredit.cli import _build
from gpucredit.daemon import Daemon
from ledger import api
from ledger.config import load_config
from ledger.holds.state import HoldState
from ledger.money import charge_for, format_credits, parse_credits
from ledger.store.db import make_sessionmaker
from ledger.store.tables import entries_t, holds_t
from slurmbox import SlurmBox, versions
from slurmbox.box import JOB_DIR
from slurmbox.chroot import ChrootBox

RUN_DIR = Path("/run/gpucredit-e2e")  # on the host's box; e2e_dir() is each box's

# The Slurm the end-to-end tests run on: the host's box (22.05) unless
# GPUCREDIT_E2E_SLURM names a chroot version (24.11, 26.05), e.g. `make test-slurm-versions`.
E2E_SLURM = os.environ.get("GPUCREDIT_E2E_SLURM") or versions.DEFAULT
Box = SlurmBox | ChrootBox


def make_box(name: str = E2E_SLURM) -> Box:
    """The box of Slurm `name`: a chroot box starts with pass-through hooks (the tests
    install gpucredit's with their own config), so it runs no gpucredit daemons of its own."""
    version = versions.get(name)
    return ChrootBox(version, hooks="passthrough") if version.chroot else SlurmBox()


def e2e_dir(box: Box, name: str = "gpucredit-e2e") -> Path:
    """A folder both this process and the box's hooks see, as this process sees it: /run/NAME
    on the host's box; /var/lib/NAME in a chroot box's root (its /run is the box's own)."""
    return box.inside(f"/var/lib/{name}") if isinstance(box, ChrootBox) else Path("/run") / name


def in_box(box: Box, path: Path) -> str:
    """`path` (as this process sees it, in the box) as the box's daemons, hooks and jobs see it."""
    return "/" + str(path.relative_to(box.root)) if isinstance(box, ChrootBox) else str(path)


def write_configs(box: Box, config_path: Path, template: str) -> None:
    """gpucredit's config for this process (its daemon, CLI, meter, agent) at `config_path`,
    and for the box's hooks beside it; `@DIR@` in `template` is config_path's folder and
    `@BIN@` Slurm's clients (slurm.bin_dir), each as its reader sees them. Installs the
    hooks with the box's copy (it bakes socket, policy and paths into the shims)."""
    folder = config_path.parent
    config_path.write_text(template.replace("@DIR@", str(folder)).replace("@BIN@", box.client_dir()))
    hooks_config = config_path
    if isinstance(box, ChrootBox):
        hooks_config = config_path.with_name(config_path.stem + "-hooks.toml")
        hooks_config.write_text(template.replace("@DIR@", in_box(box, folder)).replace("@BIN@", "/usr/bin"))
    box.config_path = in_box(box, hooks_config)
    box.use_hooks("gpucredit")


PRICES = {"a100": 2_000_000, "h100": 3_600_000}  # micro-credits per GPU-hour


class Gate:
    """A job that runs until the test opens its gate: a fault lands while it runs, or at
    its end, whatever the machine's speed (no sleep to outlast)."""

    def __init__(self, box: Box) -> None:
        self.box = box
        self.path = JOB_DIR / f"gate-{uuid.uuid4().hex[:10]}"  # as the job sees it, in the box

    @property
    def wrap(self) -> str:
        # ...then one more second, so the run is charged something after the gate opens.
        return f"while [ ! -e {self.path} ]; do sleep 0.1; done; sleep 1"

    def open(self) -> None:
        self.box.inside(str(self.path)).touch()


_names = itertools.count(1)


@dataclass
class Cluster:
    box: Box
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

    @property
    def dir(self) -> Path:
        """This module's folder (config, socket, hooks' log, spool), as this process sees it."""
        return self.config_path.parent

    def run(self, *argv: str, check: bool = True) -> str:
        """A Slurm command (or any command) against the box, as root; its stdout."""
        return self.box.run(list(argv), check=check).stdout

    def write_config(self, policy: str) -> None:
        self.policy = policy
        self.write_configs(
            '[daemon]\nsocket = "@DIR@/daemon.sock"\ntimeout_seconds = 2.0\n'
            f'[policy]\non_ledger_unreachable = "{policy}"\n'
            '[slurm]\ncluster = "lab"\nbin_dir = "@BIN@"\n'
            '[agent]\nspool_dir = "@DIR@/spool/%n"\n'
            '[hooks]\nlog_file = "@DIR@/hooks.log"\n'
        )

    def write_configs(self, template: str) -> None:
        """write_configs() with this ledger's [database] first."""
        write_configs(self.box, self.config_path, f'[database]\nurl = "{self.url}"\n' + template)

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
        self.run(
            "sacctmgr", "-i", "add", "account", name, "parent=research", "Description=e2e", "Organization=lab"
        )
        self.run("sacctmgr", "-i", "add", "user", "alice", f"account={name}")

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

    def rebuild_box(self, *, as_if_killed: bool = False) -> None:
        """`make slurm-down` + `make slurm-up` with this ledger kept: Slurm's state and
        accounting are wiped (job ids restart at 1), then this module's accounts are
        added to Slurm again and its hooks reinstalled.

        `as_if_killed`: slurmctld's saved state is put back after the stop, as a box
        killed without its stop (a machine's end, SIGKILL) leaves it; it names the
        cluster id of an accounting database the next start replaces."""
        detach = self.box._supervisor is None  # a box from `make slurm-up` stays detached
        state = self.box.inside("/var/lib/gpucredit-box/slurmctld")
        saved = state.with_name("slurmctld.as-if-killed")
        if as_if_killed:
            shutil.rmtree(saved, ignore_errors=True)
            shutil.copytree(state, saved, symlinks=True)
        self.box.down()
        if as_if_killed:
            assert not state.exists()
            saved.rename(state)
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

    def settled_holds(self, job_id: int, account: str, runs: int = 1, timeout: float = 30) -> list[HoldState]:
        """holds() once `runs` of them are settled: a job's end is in sacct before its
        EpilogSlurmctld has settled on 24.11 and 26.05 (22.05 mostly the other way round)."""
        deadline = time.monotonic() + timeout
        while True:
            holds = self.holds(job_id, account)
            if sum(h.state == "settled" for h in holds) >= runs or time.monotonic() > deadline:
                return holds
            time.sleep(0.2)


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


def sacct_runs(box: Box, job_id: int | str, account: str) -> list[dict[str, str]]:
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


def submit(box: Box, *args: str) -> int:
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


@contextmanager
def on_premise_full(cluster: Cluster) -> Iterator[None]:
    """Every on-premise H100 (the API's jobs go to the default partition, onprem) taken by
    one job of another account, so a job submitted now stays queued until an admin's
    hold can be put on it: held after it started, it would run (a race CI once lost)."""
    payer = cluster.new_account("10")
    every_h100 = ["-p", "onprem", "-N", "2", "--gres=gpu:h100:2", "-t", "5", "--wrap", "sleep 300"]
    filler = cluster.box.submit(["-A", payer, *every_h100])
    cluster.box.wait_state(filler, "RUNNING", timeout=30)
    try:
        yield
    finally:
        cluster.run("scancel", str(filler))
        cluster.box.wait_state(filler, {"CANCELLED", "COMPLETED"}, timeout=60)
