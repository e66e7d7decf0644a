"""Fairshare through the account tree (accounting_bridge/sync/fairshare.py): a parent's
shares come from its subtree's figures and each set of siblings is ranked on its own, as
Fair Tree compares them; docs/fairshare.md's worked tree, with exact figures, the ledger's
figures behind it, and `fairshare sync`/`show` writing and printing every level."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from accounting_bridge.slurm.slurmcmd import FakeRunner
from accounting_bridge.sync.fairshare import FairsharePolicy, account_shares, subtree_figures
from accounting_bridge.sync.fairshare_sync import SSHARE_ARGV, show_argv
from gpucredit.cli import _build
from ledger import api, cli_support

NOW = datetime(2026, 12, 10, tzinfo=UTC)
SHOW = tuple(show_argv("lab"))
C = 1_000_000


def figures(account: str, parent: str | None, funded: int, spent: int, left: int) -> api.FairnessInputs:
    return api.FairnessInputs(account, funded * C, spent * C, left * C, {}, parent)


# The worked tree: a department of two groups, one with two projects, beside a
# department-less account. dept and grpa hold little or no credit of their own.
TREE = [
    figures("dept", None, 0, 0, 0),
    figures("grpa", "dept", 20, 0, 20),
    figures("proj1", "grpa", 60, 20, 40),
    figures("proj2", "grpa", 40, 0, 40),
    figures("grpb", "dept", 40, 0, 40),
    figures("solo", None, 50, 0, 50),
]
# level, account, subtree funded, spent, left -> shares
WORKED_TREE = [
    (0, "dept", 160, 20, 140, 150),
    (1, "grpa", 120, 20, 100, 110),
    (2, "proj1", 60, 20, 40, 50),
    (2, "proj2", 40, 0, 40, 40),
    (1, "grpb", 40, 0, 40, 40),
    (0, "solo", 50, 0, 50, 50),
]


def test_the_worked_tree() -> None:
    totals = subtree_figures(TREE)
    shares = account_shares(TREE, FairsharePolicy())
    assert [
        (
            s.depth,
            s.account,
            totals[s.account].funded_ucredits // C,
            totals[s.account].spent_ucredits // C,
            totals[s.account].left_ucredits // C,
            s.shares,
        )
        for s in shares
    ] == WORKED_TREE
    why = {s.account: s.why for s in shares}
    assert why["dept"] == "subtree of 5 accounts: funded 160.00 in 90 d - 50% of 20.00 spent in 7 d"
    assert why["proj2"] == "funded 40.00 in 90 d - 50% of 0.00 spent in 7 d"
    # The department outranks solo at the top level (150 vs 50); flat, it had nothing.
    flat = {
        s.account: s.shares
        for s in account_shares(
            [
                figures(f.account, None, f.funded_ucredits // C, f.spent_ucredits // C, f.left_ucredits // C)
                for f in TREE
            ],
            FairsharePolicy(),
        )
    }
    assert flat == {"dept": 0, "grpa": 20, "grpb": 40, "proj1": 50, "proj2": 40, "solo": 50}


def test_the_floor_is_per_set_of_siblings() -> None:
    """A tiny group is lifted to a tenth of its siblings' median, not of the whole site's."""
    tree = [
        figures("big", None, 1000, 0, 1000),
        figures("dept", None, 0, 0, 0),
        figures("g1", "dept", 100, 0, 100),
        figures("g2", "dept", 1, 0, 1),
        figures("g3", "dept", 300, 0, 300),
    ]
    shares = {s.account: (s.shares, s.why) for s in account_shares(tree, FairsharePolicy())}
    assert shares["g2"] == (10, "floor: 10% of the median sibling's 100 (own claim 1)")
    assert shares["dept"][0] == 400
    assert shares["big"][0] == 1000


def test_an_empty_subtree_gets_nothing_and_says_so() -> None:
    tree = [figures("dept", None, 0, 0, 0), figures("g1", "dept", 10, 10, 0), figures("solo", None, 5, 0, 5)]
    shares = {s.account: (s.shares, s.why) for s in account_shares(tree, FairsharePolicy())}
    assert shares["dept"] == (0, "subtree of 2 accounts: no credit left (0.00)")
    assert shares["g1"] == (0, "no credit left (0.00)")


def seed_tree(s: Any) -> None:
    """The worked tree in a ledger: credit a week before NOW, proj1 spent 20 since."""
    week = NOW - timedelta(days=3)
    for account, parent in (
        ("dept", None),
        ("grpa", "dept"),
        ("proj1", "grpa"),
        ("proj2", "grpa"),
        ("grpb", "dept"),
        ("solo", None),
    ):
        api.create_account(s, account, parent=parent, at=week)
    api.add_member(s, "alice", "proj1")
    for account, credit in (("grpa", "20"), ("proj1", "60"), ("proj2", "40"), ("grpb", "40"), ("solo", "50")):
        api.topup(s, account, credit, effective_at=week)
    api.consume(s, "proj1", "20", at=NOW - timedelta(days=1), user="alice")


def test_the_ledgers_figures_carry_the_tree(tx: Callable[[], Any]) -> None:
    with tx() as s:
        seed_tree(s)
    with tx() as s:
        inputs = api.fairness_inputs(
            s, NOW, funded_since=NOW - timedelta(days=90), spent_since=NOW - timedelta(days=7)
        )
    shares = account_shares(inputs, FairsharePolicy())
    assert [(s.depth, s.account, s.user, s.shares) for s in shares] == [
        (0, "dept", None, 150),
        (1, "grpa", None, 110),
        (2, "proj1", None, 50),
        (3, "proj1", "alice", 50),
        (2, "proj2", None, 40),
        (1, "grpb", None, 40),
        (0, "solo", None, 50),
    ]


ASSOC = """root|||1
root|root||1
dept|||1
grpa|||1
proj1|||1
proj1|alice||1
proj2|||1
grpb|||1
solo|||1
"""
SSHARE = """root|||0.000000|0|0.000000|
 dept||150|0.750000|0|0.000000|
  grpa||110|0.733333|0|0.000000|
   proj1||50|0.555556|0|0.000000|
    proj1|alice|50|1.000000|0|0.000000|0.875000
   proj2||40|0.444444|0|0.000000|
  grpb||40|0.266667|0|0.000000|
 solo||50|0.250000|0|0.000000|
"""


@pytest.fixture
def cli(db_url: str, tmp_path: Path, tx: Callable[[], Any]) -> Iterator[Callable[..., Result]]:
    config = tmp_path / "gpucredit.toml"
    config.write_text('[slurm]\ncluster = "lab"\n')
    with tx() as s:
        seed_tree(s)
    root = _build()

    def run(*args: str, runner: FakeRunner, code: int = 0) -> Result:
        env = {"GPUCREDIT_DATABASE_URL": db_url, "GPUCREDIT_CONFIG": str(config)}
        result = CliRunner().invoke(root, list(args), env=env, obj={"runner": runner, "clock": lambda: NOW})
        assert result.exit_code == code, (args, result.output, result.stderr)
        return result

    yield run
    engine = cli_support._engines.pop(db_url, None)
    if engine is not None:
        engine.dispose()


def test_sync_writes_every_level_parents_included(cli: Callable[..., Result]) -> None:
    plan = json.loads(
        cli("fairshare", "sync", "--dry-run", "--format", "json", runner=FakeRunner({SHOW: ASSOC})).stdout
    )
    assert {(c["account"], c["user"]): c["new"] for c in plan["changes"]} == {
        ("dept", None): 150,
        ("grpa", None): 110,
        ("proj1", None): 50,
        ("proj1", "alice"): 50,
        ("proj2", None): 40,
        ("grpb", None): 40,
        ("solo", None): 50,
    }
    modify = ("sacctmgr", "--immediate", "modify", "account", "where")
    accounts = [argv for argv in plan["commands"] if tuple(argv[:5]) == modify]
    assert accounts == [
        [*modify, "name=grpa", "cluster=lab", "set", "fairshare=110"],
        [*modify, "name=dept", "cluster=lab", "set", "fairshare=150"],
        [*modify, "name=grpb,proj2", "cluster=lab", "set", "fairshare=40"],
        [*modify, "name=proj1,solo", "cluster=lab", "set", "fairshare=50"],
    ]


def test_show_prints_the_tree_with_each_levels_figures(cli: Callable[..., Result]) -> None:
    runner = FakeRunner({SSHARE_ARGV: SSHARE})
    table = cli("fairshare", "show", runner=runner).stdout.splitlines()
    assert [line.split()[:7] for line in table[1:]] == [
        ["dept", "-", "160.00", "20.00", "140.00", "150", "150"],
        ["grpa", "-", "120.00", "20.00", "100.00", "110", "110"],
        ["proj1", "-", "60.00", "20.00", "40.00", "50", "50"],
        ["proj1", "alice", "-", "20.00", "-", "50", "50"],
        ["proj2", "-", "40.00", "0.00", "40.00", "40", "40"],
        ["grpb", "-", "40.00", "0.00", "40.00", "40", "40"],
        ["solo", "-", "50.00", "0.00", "50.00", "50", "50"],
    ]
    assert [line[: len(line) - len(line.lstrip())] for line in table[1:4]] == ["", "  ", "    "]
    rows = json.loads(cli("fairshare", "show", "--format", "json", runner=runner).stdout)
    assert [(r["account"], r["parent"], r["depth"], r["norm_shares"]) for r in rows if r["user"] is None] == [
        ("dept", None, 0, "0.750000"),
        ("grpa", "dept", 1, "0.733333"),
        ("proj1", "grpa", 2, "0.555556"),
        ("proj2", "grpa", 2, "0.444444"),
        ("grpb", "dept", 1, "0.266667"),
        ("solo", None, 0, "0.250000"),
    ]
