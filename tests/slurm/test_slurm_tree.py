"""Fairshare through a three-level account tree on the real box: `fairshare sync` writes
every level's shares (parents included), `sshare -P` shows them, and with the partition
full a job of the *poorer* group of the better-funded department ranks above the job of
a richer top-level account (sprio): Fair Tree ranks the department first, by its
subtree's credit.

The module's tree sits under a parent of its own (`trNNN`, under root), so Fair Tree
compares it with nothing else of ours; the pass-through hooks run while it exists (the
test is about priority), and everything is cancelled, deleted and restored at the end::

    trNNN            (ledger: 160 from its subtree)
    ├── trNNNdept    (no credit of its own: 110 from its groups)
    │   ├── trNNNga  100 credits
    │   └── trNNNgb   10 credits
    └── trNNNsolo     50 credits
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

from accounting_bridge.sync.fairshare_sync import read_sshare
from gpucredit.cli import _build
from ledger import api, cli_support
from ledger.store.db import make_engine, make_sessionmaker
from slurmtext import parse_parsable
from tests.support.cluster import Box

pytestmark = pytest.mark.slurm

TOP = f"tr{os.getpid() % 1000}"
DEPT, GA, GB, SOLO, BUSY = (f"{TOP}{part}" for part in ("dept", "ga", "gb", "solo", "busy"))
PARENTS = {TOP: None, DEPT: TOP, GA: DEPT, GB: DEPT, SOLO: TOP}
CREDIT = {GA: "100", GB: "10", SOLO: "50"}
USED = (GA, GB, SOLO, BUSY)  # alice's associations
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED"}
# structured sshare: one row per association, `|`-separated, the account not indented
SSHARE = (
    "sshare",
    "-n",
    "-P",
    "-a",
    "-o",
    "Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare",
)


def sacctmgr(box: Box, *args: str) -> None:
    box.run(["sacctmgr", "--immediate", *args], check=True)


def wait_until(check: Callable[[], object], timeout: float, what: str, seen: object = None) -> object:
    """Poll `check` until it returns something true; `seen` is in the failure's message."""
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

    def sshare(self) -> dict[tuple[str, str], dict[str, str]]:
        return read_sshare(self.box.run(list(SSHARE), check=True).stdout)

    def jobs(self) -> dict[str, str]:
        out = self.box.run(["squeue", "-h", "-t", "all", "-o", "%i|%a|%T"]).stdout
        rows = parse_parsable(out, ("job", "account", "state"))
        return {r["job"]: r["state"] for r in rows if r["account"] in (*PARENTS, BUSY)}


@pytest.fixture(scope="module")
def site(slurm_box: Box, e2e_ledger_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    config = tmp_path_factory.mktemp("tree") / "gpucredit.toml"
    config.write_text(
        f'[database]\nurl = "{e2e_ledger_url}"\n'
        f'[slurm]\ncluster = "lab"\nbin_dir = "{slurm_box.client_dir()}"\n'
    )
    engine = make_engine(e2e_ledger_url)
    with make_sessionmaker(engine)() as s, s.begin():
        for account, parent in PARENTS.items():
            api.create_account(s, account, parent=parent)
        for account, credit in CREDIT.items():
            api.add_member(s, "alice", account)
            api.topup(s, account, credit)
    hooks = slurm_box.hooks
    slurm_box.use_hooks("passthrough")
    org = ("Description=e2e", "Organization=lab")
    sacctmgr(slurm_box, "add", "account", TOP, "parent=root", *org)
    sacctmgr(slurm_box, "add", "account", f"{DEPT},{SOLO}", f"parent={TOP}", *org)
    sacctmgr(slurm_box, "add", "account", f"{GA},{GB}", f"parent={DEPT}", *org)
    sacctmgr(slurm_box, "add", "account", BUSY, "parent=root", *org)  # only fills the partition; not ours
    sacctmgr(slurm_box, "add", "user", "alice", f"account={','.join(USED)}")
    s = Site(slurm_box, config)
    try:
        yield s
    finally:
        for job in s.jobs():
            slurm_box.run(["scancel", job])
        wait_until(lambda: not set(s.jobs().values()) & ACTIVE, 60, "this module's jobs to end")
        sacctmgr(slurm_box, "delete", "account", f"name={GA},{GB},{BUSY}")
        sacctmgr(slurm_box, "delete", "account", f"name={DEPT},{SOLO}")
        sacctmgr(slurm_box, "delete", "account", f"name={TOP}")
        slurm_box.use_hooks(hooks)
        cli_engine = cli_support._engines.pop(e2e_ledger_url, None)
        if cli_engine is not None:
            cli_engine.dispose()
        engine.dispose()


def test_sync_writes_every_level_and_sshare_shows_the_tree(site: Site) -> None:
    first = json.loads(site.gpucredit("fairshare", "sync", "--format", "json"))
    assert {c["account"]: c["new"] for c in first["changes"] if c["user"] is None} == {
        TOP: 160,
        DEPT: 110,
        GA: 100,
        GB: 10,
        SOLO: 50,
    }
    shares = site.sshare()
    assert {a: shares[(a, "")]["raw_shares"] for a in PARENTS} == {
        TOP: "160",
        DEPT: "110",
        GA: "100",
        GB: "10",
        SOLO: "50",
    }
    assert shares[(DEPT, "")]["norm_shares"] == "0.687500"  # 110 of 160 under TOP
    assert shares[(GB, "")]["norm_shares"] == "0.090909"  # 10 of 110 under the department
    second = json.loads(site.gpucredit("fairshare", "sync", "--format", "json"))
    assert (second["changes"], second["commands"]) == ([], [])
    table = site.gpucredit("fairshare", "show").splitlines()
    assert [line.split()[0] for line in table[1:] if line.split()[1] == "-"] == [TOP, DEPT, GA, GB, SOLO]
    assert [len(line) - len(line.lstrip()) for line in table[1:] if line.split()[1] == "-"] == [0, 2, 4, 4, 2]


def test_the_better_funded_subtree_ranks_higher_at_the_top_level(site: Site) -> None:
    """gb holds 10 credits and solo 50, but gb's department holds 110: gb's job ranks
    first. (Flat, the department had 0 shares and solo's job went first.)"""
    site.gpucredit("fairshare", "sync")
    # An association without usage ranks above all (S/U is infinite): both first use the
    # same GPU-seconds, so their shares decide.
    warmup = [
        site.box.submit(["-A", account, "-p", "onprem", "--gres=gpu:a100:1", "-t", "2", "--wrap", "sleep 8"])
        for account in (GB, SOLO)
    ]
    for job in warmup:
        site.box.wait_state(job, "COMPLETED", timeout=120)
    wait_until(
        lambda: all(int(site.sshare()[(a, "")]["raw_usage"]) > 0 for a in (GB, SOLO)),
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
        for account in (GB, SOLO)
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
        return by_account if by_account[GB] > by_account[SOLO] else None

    assert wait_until(fairshare_priorities, 90, "the department's job ahead of solo's on fairshare", seen)
    shares = site.sshare()
    assert float(shares[(GB, "alice")]["fairshare"]) > float(shares[(SOLO, "alice")]["fairshare"])
    assert {site.box.job_state(job) for job in pending.values()} == {"PENDING"}
