"""`gpucredit fairshare sync` on the real box: Slurm shows the shares the ledger's credit
implies, a second sync changes nothing, and with the partition full the better-funded
account's pending job ranks higher on fairshare (sprio).

The module's accounts sit under a parent of their own (`fsNNN`, under root), so Fair
Tree compares them with each other only; the box runs the pass-through hooks while
they exist (these jobs are not billed: the test is about priority), and everything
is cancelled, deleted and restored at the end.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from accounting_bridge.sync.fairshare_sync import SSHARE_ARGV, read_sshare
from gpucredit.cli import _build
from ledger import api, cli_support
from ledger.store.db import make_engine, make_sessionmaker
from slurmtext import parse_parsable
from tests.support.cluster import Box

pytestmark = pytest.mark.slurm

PARENT = f"fs{os.getpid() % 1000}"
RICH, POOR, BUSY = f"{PARENT}rich", f"{PARENT}poor", f"{PARENT}busy"
CREDIT = {RICH: "400", POOR: "100", BUSY: "100"}  # shares 400, 100, 100
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED"}


def sacctmgr(box: Box, *args: str) -> None:
    box.run(["sacctmgr", "--immediate", *args], check=True)


def wait_until(check: Callable[[], object], timeout: float, what: str, seen: object = None) -> object:
    """Poll `check` every half second until it returns something true; `seen` is in the
    failure's message."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s{f'; saw {seen}' if seen else ''}")
        time.sleep(0.5)


@dataclass
class Site:
    box: Box
    config: Path

    def gpucredit(self, *args: str) -> str:
        result = CliRunner().invoke(_build(), list(args), env={"GPUCREDIT_CONFIG": str(self.config)})
        assert result.exit_code == 0, (args, result.output, result.stderr)
        return result.output

    def sync(self) -> dict:  # type: ignore[type-arg]
        return json.loads(self.gpucredit("fairshare", "sync", "--format", "json"))

    def sshare(self) -> dict[tuple[str, str], dict[str, str]]:
        return read_sshare(self.box.run(list(SSHARE_ARGV), check=True).stdout)

    def jobs(self) -> dict[str, str]:
        """This module's jobs still in squeue: id -> state."""
        out = self.box.run(["squeue", "-h", "-t", "all", "-o", "%i|%a|%T"]).stdout
        rows = parse_parsable(out, ("job", "account", "state"))
        return {r["job"]: r["state"] for r in rows if r["account"] in CREDIT}


@pytest.fixture(scope="module")
def site(slurm_box: Box, e2e_ledger_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    config = tmp_path_factory.mktemp("fairshare") / "gpucredit.toml"
    config.write_text(
        f'[database]\nurl = "{e2e_ledger_url}"\n'
        f'[slurm]\ncluster = "lab"\nbin_dir = "{slurm_box.client_dir()}"\n'
    )
    engine = make_engine(e2e_ledger_url)
    with make_sessionmaker(engine)() as s, s.begin():
        for account, credit in CREDIT.items():
            api.create_account(s, account)
            api.add_member(s, "alice", account)
            api.topup(s, account, credit)
    hooks = slurm_box.hooks
    slurm_box.use_hooks("passthrough")
    sacctmgr(slurm_box, "add", "account", PARENT, "parent=root", "Description=e2e", "Organization=lab")
    sacctmgr(
        slurm_box,
        "add",
        "account",
        ",".join(CREDIT),
        f"parent={PARENT}",
        "Description=e2e",
        "Organization=lab",
    )
    sacctmgr(slurm_box, "add", "user", "alice", f"account={','.join(CREDIT)}")
    s = Site(slurm_box, config)
    try:
        yield s
    finally:
        for job in s.jobs():
            slurm_box.run(["scancel", job])
        wait_until(lambda: not set(s.jobs().values()) & ACTIVE, 60, "this module's jobs to end")
        sacctmgr(slurm_box, "delete", "account", f"name={','.join(CREDIT)}")
        sacctmgr(slurm_box, "delete", "account", PARENT)
        slurm_box.use_hooks(hooks)
        cli_engine = cli_support._engines.pop(e2e_ledger_url, None)
        if cli_engine is not None:
            cli_engine.dispose()
        engine.dispose()


def test_sync_sets_the_shares_and_a_second_sync_changes_nothing(site: Site) -> None:
    first = site.sync()
    assert {(c["account"], c["user"]): (c["old"], c["new"]) for c in first["changes"]} == {
        (RICH, None): ("1", 400),
        (POOR, None): ("1", 100),
        (BUSY, None): ("1", 100),
        (RICH, "alice"): ("1", 100),
        (POOR, "alice"): ("1", 100),
        (BUSY, "alice"): ("1", 100),
    }
    # Accounts alike share a call; alice's three associations take one.
    assert len(first["commands"]) == 3
    shares = site.sshare()
    assert [shares[(account, "")]["raw_shares"] for account in (RICH, POOR, BUSY)] == ["400", "100", "100"]
    assert {shares[(account, "alice")]["raw_shares"] for account in CREDIT} == {"100"}
    assert shares[(RICH, "")]["norm_shares"] == "0.666667"  # 400 of 600 under the parent
    second = site.sync()
    assert (second["changes"], second["commands"], second["unchanged"]) == ([], [], 6)
    assert site.gpucredit("fairshare", "sync").splitlines() == ["no changes; 6 associations already right"]


def test_the_better_funded_accounts_pending_job_ranks_higher(site: Site) -> None:
    site.sync()
    # Fair Tree ranks an account without usage above all others (S/U is infinite), so
    # both first use the same GPU-seconds; their shares then decide.
    warmup = [
        site.box.submit(["-A", account, "-p", "onprem", "--gres=gpu:a100:1", "-t", "2", "--wrap", "sleep 8"])
        for account in (RICH, POOR)
    ]
    for job in warmup:
        site.box.wait_state(job, "COMPLETED", timeout=120)
    wait_until(
        lambda: all(int(site.sshare()[(a, "")]["raw_usage"]) > 0 for a in (RICH, POOR)),
        150,  # usage is applied every PriorityCalcPeriod (1 minute on the box)
        "usage of both accounts in sshare",
    )
    blocker = site.box.submit(
        [
            "-A",
            BUSY,
            "-p",
            "onprem",
            "-N",
            "2",
            "--gres=gpu:a100:2,gpu:h100:2",
            "-t",
            "10",
            "--wrap",
            "sleep 600",
        ]
    )
    site.box.wait_state(blocker, "RUNNING", timeout=60)
    pending = {
        account: site.box.submit(
            ["-A", account, "-p", "onprem", "--gres=gpu:a100:1", "-t", "2", "--wrap", "true"]
        )
        for account in (RICH, POOR)
    }

    seen: list[str] = []  # sprio's last answer, and sshare's, for a failure's message

    def fairshare_priorities() -> dict[str, int] | None:
        # Every pending job, not `-j A,B`: 24.11 refuses a list ("Invalid job id: A").
        out = site.box.run(["sprio", "-h", "-o", "%i|%F"]).stdout
        seen[:] = [out, site.box.run(["sshare", "-a", "-l"]).stdout]
        weighted = {
            row["job"].strip(): int(float(row["fairshare"]))
            for row in parse_parsable(out, ("job", "fairshare"))
        }
        by_account = {account: weighted.get(str(job), 0) for account, job in pending.items()}
        return by_account if by_account[RICH] > by_account[POOR] else None

    ranked = wait_until(fairshare_priorities, 90, "the richer account's job ahead on fairshare", seen)
    assert ranked
    assert {site.box.job_state(job) for job in pending.values()} == {"PENDING"}
