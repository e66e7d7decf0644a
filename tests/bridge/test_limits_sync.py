"""`gpucredit limits sync`, `limits show --slurm`, `slurm check` and the daemon's keeper:
the ledger's blocks and caps (ledger/views/enforcement.py), scarcity's decision table, the plan
against recorded Slurm output (tests/fixtures/limits), batched sacctmgr calls that change
exactly what they should, and the CLI with a FakeRunner that plays Slurm's state."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import click
import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from accounting_bridge.slurm.slurmcmd import FakeResponse, FakeRunner
from accounting_bridge.sync import fairshare_sync
from accounting_bridge.sync.assoc_batch import named_commands, user_commands
from accounting_bridge.sync.limits_sync import (
    PARTITIONS_ARGV,
    SHOW_QOS_ARGV,
    SHOW_TRES_ARGV,
    SINFO_ARGV,
    SlurmView,
    parse_associations,
    parse_gpu_tres,
    parse_qos_gpu_limits,
    plan_limits,
    read_slurm,
    show_assoc_argv,
)
from accounting_bridge.sync.scarcity import ScarcityPolicy, decide
from accounting_bridge.sync.slurm_check import SHOW_CONFIG_ARGV
from gpucredit.cli import _build
from gpucredit.daemon.limits_keeper import LimitsKeeper
from ledger import api, cli_support
from ledger.config import DEFAULTS
from ledger.store.db import make_sessionmaker
from slurmtext import SlurmTextError, parse_partition_qos, parse_sinfo_gpu_use, parse_tres
from tests import support

FIXTURES = support.FIXTURES / "limits"
NOW = datetime(2026, 12, 2, 10, tzinfo=UTC)
SHOW = tuple(show_assoc_argv("lab"))
GPU_TRES = ("gres/gpu", "gres/gpu:a100", "gres/gpu:h100")
MODIFY = ("sacctmgr", "--immediate", "modify")
POLICY = ScarcityPolicy.from_config({"scarcity": {**DEFAULTS["scarcity"], "partitions": ["onprem", "cloud"]}})


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def grp(count: int) -> str:
    return "GrpTRES=" + ",".join(f"{name}={count}" for name in GPU_TRES)


# -- parsing recorded output ---------------------------------------------------------------------


def test_sinfo_gives_each_partitions_gpus_and_allocation_without_drained_nodes() -> None:
    # node1: a100 x2 and h100 x1 allocated; node3 (cloud) drained while recording.
    assert parse_sinfo_gpu_use(recorded("sinfo_gpu_use.txt")) == {"onprem": (8, 3), "cloud": (0, 0)}
    shared = (
        "n1|a|gpu:4|gpu:1(IDX:0)|mixed\nn1|b*|gpu:4|gpu:1(IDX:0)|mixed\nn2|b*|gpu:4|gpu:0(IDX:N/A)|idle~\n"
    )
    assert parse_sinfo_gpu_use(shared) == {"a": (4, 1), "b": (8, 1)}  # a node counts in both
    assert parse_sinfo_gpu_use("n1|a|gpu:4|gpu:4(IDX:0-3)|down*\n") == {"a": (0, 0)}
    for bad in ("n1|a|gpu:4|gpu:1", "n1|a|gpu:1|gpu:2(IDX:0-1)|mixed", "n1|a|gpu:1|gpu:0|Idle?"):
        with pytest.raises(SlurmTextError):
            parse_sinfo_gpu_use(bad)


def test_partition_qos_from_scontrol() -> None:
    assert parse_partition_qos(recorded("scontrol_show_partition.txt")) == {
        "onprem": "gpucredit-onprem",
        "cloud": "gpucredit-cloud",
    }
    assert parse_partition_qos("PartitionName=x QoS=N/A State=UP\n\n") == {"x": None}
    for bad in ("PartitionName=x QoS=N/A two words=1", "PartitionName=x State=UP"):
        with pytest.raises(SlurmTextError):
            parse_partition_qos(bad)


def test_associations_tres_and_qos_from_sacctmgr() -> None:
    limits, parents = parse_associations(recorded("sacctmgr_show_assoc.txt"))
    assert limits[("limleaf", "")] == (
        (("gres/gpu", 4), ("gres/gpu:a100", 4), ("gres/gpu:h100", 4)),
    )  # no cpu
    assert limits[("limleaf", "alice")] == ((("gres/gpu:a100", 1),),)
    assert limits[("limleaf", "carol")] == ((("gres/gpu", 2),), ())  # one row per partition
    assert limits[("physics", "bob")] == ((),)
    assert parents["limsub"] == "limtop" and parents["limleaf"] == "research" and "root" not in parents
    assert parse_gpu_tres(recorded("sacctmgr_show_tres.txt")) == GPU_TRES
    assert parse_qos_gpu_limits(recorded("sacctmgr_show_qos.txt")) == {
        "normal": (None, None),
        "gpucredit-cloud": (None, None),
        "gpucredit-onprem": (4, 6),
    }
    with pytest.raises(SlurmTextError):
        parse_associations("a|u||p|gres/gpu=lots\n")


# -- the ledger's blocks and caps ----------------------------------------------------------------


def test_blocks_follow_credit_and_daily_caps_and_lift_at_midnight(tx: Callable[[], Any]) -> None:
    day = datetime(2026, 12, 1, tzinfo=UTC)
    with tx() as s:
        for name in ("rich", "broke", "capped"):
            api.create_account(s, name, at=day)
            api.add_member(s, "alice", name)
            api.add_member(s, "bob", name)
        api.topup(s, "rich", "10", effective_at=day)
        api.topup(s, "capped", "10", effective_at=day)
        api.set_limits(s, "rich", max_gpus=8)
        api.set_limits(s, "rich", user="alice", max_gpus=2)
        api.set_limits(s, "capped", daily_cap="3")
        api.set_limits(s, "capped", user="bob", daily_cap="1")
        api.consume(s, "capped", "1", user="bob", at=NOW)
        api.consume(s, "capped", "1.5", user="alice", at=NOW)
        found = {a.account: a for a in api.enforcement(s, NOW)}
    assert found["rich"].blocks == () and found["rich"].max_gpus == 8
    assert found["rich"].member("alice") == api.MemberEnforcement("alice", 2, ())
    assert [b.code for b in found["broke"].blocks] == ["no_credit"]
    assert found["broke"].blocks[0].message == "no credit left (0.00 available, 0.00 held)"
    capped = found["capped"]
    assert capped.blocks == ()  # 2.50 of 3.00
    [bob] = found["capped"].member("bob").blocks  # type: ignore[union-attr]
    assert (bob.code, bob.until) == ("daily_cap", datetime(2026, 12, 3, tzinfo=UTC))
    assert bob.message == "daily cap of 1.00 reached (1.00 spent today) until 2026-12-03T00:00:00Z"
    with tx() as s:
        api.consume(s, "capped", "0.5", user="alice", at=NOW)  # exactly the cap blocks
        [capped] = api.enforcement(s, NOW, ["capped"])
        [next_day] = api.enforcement(s, NOW + timedelta(days=1), ["capped"])
    assert [b.code for b in capped.blocks] == ["daily_cap"]
    assert next_day.blocks == () and next_day.member("bob").blocks == ()  # type: ignore[union-attr]


def test_credit_held_by_a_running_job_is_no_block(tx: Callable[[], Any]) -> None:
    with tx() as s:
        api.set_price(s, "h100", "3.60", effective_at=NOW - timedelta(days=1))
        api.create_account(s, "busy")
        api.topup(s, "busy", "3.60", effective_at=NOW - timedelta(days=1))
        api.create_hold(
            s, api.HoldRequest("busy", user="alice", job_id=1, gpus={"h100": 1}, seconds=3600, at=NOW)
        )
        [busy] = api.enforcement(s, NOW)
    assert busy.blocks == ()  # 0.00 available, 3.60 held: the job may return some


# -- scarcity ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engaged_now", "allocated", "engaged"),
    [
        (False, 6, False),  # 75%
        (False, 7, True),  # 87.5% > 80%
        (True, 5, True),  # 62.5%: not below 60% yet
        (True, 4, False),  # 50%
        (False, 5, False),  # in the band, off: stays off
    ],
)
def test_scarcity_caps_engage_above_and_lift_below_with_hysteresis(
    engaged_now: bool, allocated: int, engaged: bool
) -> None:
    decision = decide(POLICY, "onprem", 8, allocated, engaged_now)
    assert decision.engaged is engaged
    assert (decision.max_per_user, decision.max_per_account) == ((4, 6) if engaged else (None, None))


def test_scarcity_reasons_and_edges() -> None:
    assert decide(POLICY, "onprem", 8, 7, False).reason == (
        "7 of 8 GPUs allocated (87%), more than 80%: at most 4 per user and 6 per account until below 60%"
    )
    assert decide(POLICY, "p", 8, 5, True).reason.endswith(
        "not below 60% yet: at most 4 per user and 6 per account until below 60%"
    )
    edge = decide(POLICY, "p", 5, 4, False)  # exactly 80%: not more
    assert not edge.engaged and edge.reason == "4 of 5 GPUs allocated (80%), not more than 80%: no caps"
    assert decide(POLICY, "p", 0, 0, True).engaged is False
    tiny = decide(replace(POLICY, user_share=Fraction(1, 10), account_share=None), "p", 2, 2, False)
    assert (tiny.max_per_user, tiny.max_per_account) == (1, None)  # at least one GPU


@pytest.mark.parametrize(
    "section",
    [
        {"engage_above": 0.5, "lift_below": 0.6},
        {"engage_above": 0},
        {"user_share": 1.5},
        {"user_share": "half"},
        {"partitions": "onprem"},
    ],
)
def test_bad_scarcity_settings_are_refused(section: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="scarcity"):
        ScarcityPolicy.from_config({"scarcity": {**DEFAULTS["scarcity"], **section}})


# -- the plan against recorded Slurm -------------------------------------------------------------


def recorded_view() -> SlurmView:
    runner = FakeRunner(
        {
            SHOW: recorded("sacctmgr_show_assoc.txt"),
            SHOW_TRES_ARGV: recorded("sacctmgr_show_tres.txt"),
            SHOW_QOS_ARGV: recorded("sacctmgr_show_qos.txt"),
            PARTITIONS_ARGV: recorded("scontrol_show_partition.txt"),
            SINFO_ARGV: recorded("sinfo_gpu_use.txt"),
        }
    )
    return read_slurm(runner, "lab")


def member(user: str, gpus: int | None = None, *blocks: api.Block) -> api.MemberEnforcement:
    return api.MemberEnforcement(user, gpus, tuple(blocks))


CAP = api.Block("daily_cap", "daily cap of 1.00 reached (1.00 spent today) until 2026-12-03T00:00:00Z")
BROKE = api.Block("no_credit", "no credit left (0.00 available, 0.00 held)")
LEDGER = [
    api.AccountEnforcement(
        "limleaf", 4, (), (member("alice", 2), member("bob", None, CAP), member("carol"), member("dave"))
    ),
    api.AccountEnforcement("limtop", 3, (BROKE,), (member("alice"),)),
    api.AccountEnforcement("limsub", None, (), (member("alice"),)),
    api.AccountEnforcement("ghost", None, (BROKE,), ()),
]


def test_plan_maps_caps_blocks_and_scarcity_onto_slurm() -> None:
    plan = plan_limits(LEDGER, recorded_view(), POLICY, "lab")
    assert [(c.scope, c.name, c.old, c.new) for c in plan.changes] == [
        ("user", "alice@limleaf", "gres/gpu:a100=1", "gres/gpu=2,gres/gpu:a100=2,gres/gpu:h100=2"),
        ("user", "bob@limleaf", "-", "gres/gpu=0,gres/gpu:a100=0,gres/gpu:h100=0"),
        ("user", "carol@limleaf", "- | gres/gpu=2", "-"),  # both partition rows lose it
        # a parent's cap binds its subtree (issue 30); its block stays on its own users
        ("account", "limtop", "-", "gres/gpu=3,gres/gpu:a100=3,gres/gpu:h100=3"),
        ("user", "alice@limtop", "-", "gres/gpu=0,gres/gpu:a100=0,gres/gpu:h100=0"),
        ("partition", "onprem", "per user gres/gpu=4, per account gres/gpu=6", "-"),
    ]
    reasons = {c.name: c.reason for c in plan.changes}
    assert reasons["bob@limleaf"] == f"blocked: {CAP.message}"
    assert reasons["alice@limtop"] == f"blocked: {BROKE.message} (on each user: the account has sub-accounts)"
    assert reasons["onprem"] == "3 of 8 GPUs allocated (37%), below 60%: no caps"
    assert plan.unchanged == 4  # limleaf and limsub accounts, alice@limsub, cloud's QOS
    assert reasons["limtop"] == "subtree cap of 3 GPUs (with its sub-accounts)"
    assert plan.notes == ()
    assert plan.missing == ("dave@limleaf", "ghost")
    assert plan.commands == (
        (*MODIFY, "account", "where", "name=limtop", "cluster=lab", "set", grp(3)),
        (*MODIFY, "user", "where", "name=carol", "account=limleaf", "cluster=lab", "set", grp(-1)),
        # bob@limleaf and alice@limtop cannot share a call: alice@limleaf gets 2.
        (*MODIFY, "user", "where", "name=bob", "account=limleaf", "cluster=lab", "set", grp(0)),
        (*MODIFY, "user", "where", "name=alice", "account=limtop", "cluster=lab", "set", grp(0)),
        (*MODIFY, "user", "where", "name=alice", "account=limleaf", "cluster=lab", "set", grp(2)),
        (
            *MODIFY,
            "qos",
            "where",
            "name=gpucredit-onprem",
            "set",
            "MaxTRESPerUser=gres/gpu=-1",
            "MaxTRESPerAccount=gres/gpu=-1",
        ),
    )
    again = plan_limits(LEDGER, apply_to_view(recorded_view(), plan.commands), POLICY, "lab")
    assert (again.changes, again.commands, again.unchanged) == ((), (), 10)


def test_a_blocked_leaf_account_gets_zero_on_its_own_association_and_scarcity_engages() -> None:
    view = recorded_view()
    busy = replace(
        view,
        gpu_use={"onprem": (8, 7), "cloud": (4, 0)},
        qos_limits={**view.qos_limits, "gpucredit-onprem": (None, None)},
    )
    ledger = [replace(LEDGER[0], blocks=(BROKE,))]
    plan = plan_limits(ledger, busy, POLICY, "lab")
    assert plan.changes[0].as_row() == {
        "scope": "account",
        "name": "limleaf",
        "old": "gres/gpu=4,gres/gpu:a100=4,gres/gpu:h100=4",
        "new": "gres/gpu=0,gres/gpu:a100=0,gres/gpu:h100=0",
        "reason": f"blocked: {BROKE.message}",
    }
    assert plan.commands[0] == (*MODIFY, "account", "where", "name=limleaf", "cluster=lab", "set", grp(0))
    assert plan.commands[-1] == (
        *MODIFY,
        "qos",
        "where",
        "name=gpucredit-onprem",
        "set",
        "MaxTRESPerUser=gres/gpu=4",
        "MaxTRESPerAccount=gres/gpu=6",
    )
    without = plan_limits(ledger, busy, POLICY, "lab", scarcity=False)
    assert all(c.scope != "partition" for c in without.changes) and without.scarcity == ()


def test_partitions_that_cannot_be_capped_are_noted() -> None:
    view = replace(recorded_view(), partition_qos={"onprem": None, "cloud": "gpucredit-onprem"})
    policy = replace(POLICY, partitions=("onprem", "cloud", "gone"))
    plan = plan_limits([], view, policy, "lab")
    assert plan.notes == (
        "partition onprem has no QOS of its own: not capped (add QOS=gpucredit-onprem to its PartitionName "
        "line, docs/limits-sync.md)",
        "partition gone (scarcity.partitions) is not in Slurm: not capped",
    )
    shared = replace(
        recorded_view(), partition_qos={"onprem": "q", "cloud": "q"}, qos_limits={"q": (None, None)}
    )
    assert (
        plan_limits([], shared, POLICY, "lab").notes[-1]
        == "partitions onprem and cloud share QOS q: cloud not capped"
    )


# -- Slurm's state, played by a FakeRunner -------------------------------------------------------


def _merge_tres(text: str, setting: str) -> str:
    tres = parse_tres(text)
    for name, value in parse_tres(setting).items():
        if value == "-1":
            tres.pop(name, None)
        else:
            tres[name] = value
    return ",".join(f"{k}={v}" for k, v in sorted(tres.items()))


class FakeSlurm:
    """Slurm's associations and QOS, which `sacctmgr --immediate modify` changes as Slurm
    does (users x accounts). As a runner it answers the reads and only the modifies that
    `expect` names (a FakeRunner), or with `any_modify` every modify."""

    def __init__(self) -> None:
        self.rows = [
            dict(zip(("account", "user", "partition", "parent", "grptres"), line.split("|"), strict=True))
            | {"fairshare": "1"}
            for line in recorded("sacctmgr_show_assoc.txt").splitlines()
        ]
        self.qos = {
            name: [per_user, per_account]
            for name, per_user, per_account in (
                line.split("|") for line in recorded("sacctmgr_show_qos.txt").splitlines()
            )
        }
        self.modified: list[tuple[str, ...]] = []
        self.any_modify = False
        self.fake = FakeRunner()

    def assoc_text(self) -> str:
        return "".join(
            f"{r['account']}|{r['user']}|{r['partition']}|{r['parent']}|{r['grptres']}\n" for r in self.rows
        )

    def expect(self, *allowed: Sequence[str], any_modify: bool = False) -> FakeSlurm:
        self.any_modify = any_modify
        self.fake = FakeRunner(
            {
                SHOW: self.assoc_text(),
                tuple(fairshare_sync.show_argv("lab")): "".join(
                    f"{r['account']}|{r['user']}|{r['partition']}|{r['fairshare']}\n" for r in self.rows
                ),
                SHOW_TRES_ARGV: recorded("sacctmgr_show_tres.txt"),
                SHOW_QOS_ARGV: "".join(f"{name}|{u}|{a}\n" for name, (u, a) in self.qos.items()),
                PARTITIONS_ARGV: recorded("scontrol_show_partition.txt"),
                SINFO_ARGV: recorded("sinfo_gpu_use.txt"),
                SHOW_CONFIG_ARGV: (FIXTURES.parent / "slurm-22.05" / "scontrol_show_config.txt").read_text(),
                **{tuple(argv): " Modified ...\n" for argv in allowed},
            }
        )
        return self

    def __call__(self, argv: Sequence[str], *, timeout_seconds: float | None = None) -> str:
        modify = tuple(argv[:3]) == MODIFY
        out = (
            " Modified ...\n"
            if modify and self.any_modify
            else self.fake(argv, timeout_seconds=timeout_seconds)
        )
        if modify:
            self.modify(argv)
            self.modified.append(tuple(argv))
        return out

    def modify(self, argv: Sequence[str]) -> None:
        assert argv[4] == "where"
        kind, rest = argv[3], list(argv[5:])
        where = {k: v.split(",") for k, v in (word.split("=", 1) for word in rest[: rest.index("set")])}
        changes = dict(word.split("=", 1) for word in rest[rest.index("set") + 1 :])
        if kind == "qos":
            for name in where["name"]:
                limits = self.qos[name]
                limits[0] = _merge_tres(limits[0], changes.get("MaxTRESPerUser", ""))
                limits[1] = _merge_tres(limits[1], changes.get("MaxTRESPerAccount", ""))
            return
        assert where.pop("cluster") == ["lab"]
        for row in self.rows:
            if kind == "account":
                hit = not row["user"] and row["account"] in where["name"]
            else:
                hit = row["user"] in where["name"] and row["account"] in where["account"]
            if hit and "GrpTRES" in changes:
                row["grptres"] = _merge_tres(row["grptres"], changes["GrpTRES"])
            if hit and "fairshare" in changes:
                row["fairshare"] = changes["fairshare"]


def apply_to_view(view: SlurmView, commands: Sequence[Sequence[str]]) -> SlurmView:
    slurm = FakeSlurm()
    for argv in commands:
        slurm.modify(argv)
    associations, parents = parse_associations(slurm.assoc_text())
    qos = "".join(f"{name}|{u}|{a}\n" for name, (u, a) in slurm.qos.items())
    return replace(view, associations=associations, parents=parents, qos_limits=parse_qos_gpu_limits(qos))


# -- batching ------------------------------------------------------------------------------------


def test_a_thousand_accounts_of_ten_users_with_one_value_take_few_calls() -> None:
    associations = [(f"acct{a:04d}", f"u{a:04d}x{i}") for a in range(1000) for i in range(10)]
    value = (grp(4),)
    changes = dict.fromkeys(associations, value)
    commands = user_commands(changes, changes, associations, cluster="lab")
    assert len(commands) == 3  # users x accounts: only the pairs that exist change; lists cut at 32,000
    assert all(len(arg) <= 32_000 + len("account=") for argv in commands for arg in argv)
    accounts = named_commands("account", {f"acct{a:04d}": value for a in range(1000)}, where=["cluster=lab"])
    assert len(accounts) == 1


names = st.sampled_from(["a", "b", "c", "d", "e"])


@settings(max_examples=200, deadline=None)
@given(
    associations=st.sets(st.tuples(names, st.sampled_from(["u", "v", "w", "x"])), min_size=1),
    values=st.lists(st.integers(min_value=0, max_value=2), min_size=20, max_size=20),
    planned=st.lists(st.booleans(), min_size=20, max_size=20),
    changed=st.lists(st.booleans(), min_size=20, max_size=20),
    limit=st.integers(min_value=1, max_value=8),
)
def test_batched_user_calls_change_exactly_the_planned_associations(
    associations: set[tuple[str, str]],
    values: list[int],
    planned: list[bool],
    changed: list[bool],
    limit: int,
) -> None:
    """Any associations, any targets (some without one, some already right), any list
    limit: applying the calls with sacctmgr's users x accounts semantics sets every
    changed association and no association to another value than its target."""
    ordered = sorted(associations)
    targets = {key: (str(values[i % 20]),) for i, key in enumerate(ordered) if planned[i % 20]}
    changes = {key: value for i, (key, value) in enumerate(targets.items()) if changed[i % 20]}
    state: dict[tuple[str, str], tuple[str, ...] | None] = dict.fromkeys(ordered)
    for argv in user_commands(changes, targets, ordered, cluster="lab", max_list_chars=limit):
        users = argv[5].removeprefix("name=").split(",")
        accounts = argv[6].removeprefix("account=").split(",")
        for key in ordered:
            if key[1] in users and key[0] in accounts:
                state[key] = tuple(argv[9:])
    for key in ordered:
        if key in changes:
            assert state[key] == changes[key]
        elif state[key] is not None:
            assert state[key] == targets.get(key)  # touched only when it already had that value


# -- the CLI and the daemon's keeper -------------------------------------------------------------


@pytest.fixture
def cli(db_url: str, tmp_path: Path, tx: Callable[[], Any]) -> Iterator[Callable[..., Result]]:
    config = tmp_path / "gpucredit.toml"
    config.write_text('[slurm]\ncluster = "lab"\n[scarcity]\npartitions = ["onprem", "cloud"]\n')
    day = NOW - timedelta(days=1)
    with tx() as s:
        for name in ("limleaf", "limtop", "limsub"):
            api.create_account(s, name, at=day)
            api.add_member(s, "alice", name)
        api.add_member(s, "bob", "limleaf")
        api.topup(s, "limleaf", "10", effective_at=day)
        api.topup(s, "limsub", "10", effective_at=day)
        api.set_limits(s, "limleaf", max_gpus=4)
        api.set_limits(s, "limleaf", user="alice", max_gpus=2)
    root = cast(click.Command, _build())

    def run(*args: str, runner: FakeRunner, code: int = 0, now: datetime = NOW) -> Result:
        env = {"GPUCREDIT_DATABASE_URL": db_url, "GPUCREDIT_CONFIG": str(config)}
        result = CliRunner().invoke(root, list(args), env=env, obj={"runner": runner, "clock": lambda: now})
        assert result.exit_code == code, (args, result.output, result.stderr)
        return result

    yield run
    engine = cli_support._engines.pop(db_url, None)
    if engine is not None:
        engine.dispose()


def test_sync_applies_its_plan_and_a_second_run_changes_nothing(cli: Callable[..., Result]) -> None:
    slurm = FakeSlurm()
    dry = json.loads(cli("limits", "sync", "--dry-run", "--format", "json", runner=slurm.expect()).stdout)
    assert slurm.modified == []  # a dry run only reads
    assert dry["dry_run"] is True and dry["at"] == "2026-12-02T10:00:00Z"
    assert [(c["name"], c["new"]) for c in dry["changes"]] == [
        ("alice@limleaf", "gres/gpu=2,gres/gpu:a100=2,gres/gpu:h100=2"),
        ("carol@limleaf", "-"),
        ("alice@limtop", "gres/gpu=0,gres/gpu:a100=0,gres/gpu:h100=0"),  # limtop has no credit
        ("onprem", "-"),
    ]
    table = cli("limits", "sync", runner=slurm.expect(*dry["commands"])).stdout.splitlines()
    assert slurm.modified == [tuple(argv) for argv in dry["commands"]]
    assert table[0].split() == ["SCOPE", "NAME", "OLD", "NEW", "REASON"]
    assert table[1].split(None, 4) == [
        "user",
        "alice@limleaf",
        "gres/gpu:a100=1",
        "gres/gpu=2,gres/gpu:a100=2,gres/gpu:h100=2",
        "cap of 2 GPUs for alice",
    ]
    assert table[5:] == [f"changed 4 with {len(dry['commands'])} sacctmgr calls; 6 already right"]
    again = cli("limits", "sync", runner=slurm.expect()).stdout.splitlines()
    assert again == ["no changes; 10 already right"]
    assert len(slurm.modified) == len(dry["commands"])  # the second run modified nothing
    assert (
        cli("limits", "sync", "--format", "csv", runner=slurm.expect()).stdout
        == "scope,name,old,new,reason\n"
    )  # the header alone


def test_a_failed_call_exits_1_and_says_how_far_it_got(cli: Callable[..., Result]) -> None:
    slurm = FakeSlurm()
    dry = json.loads(cli("limits", "sync", "--dry-run", "--format", "json", runner=slurm.expect()).stdout)
    first, second = (tuple(argv) for argv in dry["commands"][:2])
    failing = slurm.expect(first)
    failing.fake.add(second, FakeResponse(returncode=1, stderr=" Nothing modified\n"))
    result = cli("limits", "sync", runner=failing, code=1)
    assert slurm.modified == [first]
    assert result.stderr.splitlines()[-1] == (
        f"error: 1 of {len(dry['commands'])} sacctmgr calls were made; sync again to finish"
    )


def test_show_with_slurm_puts_what_slurm_enforces_beside_the_ledger(cli: Callable[..., Result]) -> None:
    plain = cli("limits", "show", "limleaf", runner=FakeRunner()).stdout.splitlines()
    assert plain == [
        "SCOPE       MAX_GPUS  MAX_RATE  DAILY_CAP",
        "account     4         -         -",
        "user alice  2         -         -",
    ]
    shown = json.loads(
        cli("limits", "show", "limleaf", "--slurm", "--format", "json", runner=FakeSlurm().expect()).stdout
    )
    assert shown["account_limits"]["max_gpus"] == 4
    assert shown["slurm"]["associations"][:2] == [
        {
            "scope": "account",
            "wanted": "gres/gpu=4,gres/gpu:a100=4,gres/gpu:h100=4",
            "in_slurm": "gres/gpu=4,gres/gpu:a100=4,gres/gpu:h100=4",
            "reason": "account cap of 4 GPUs",
        },
        {
            "scope": "user alice",
            "wanted": "gres/gpu=2,gres/gpu:a100=2,gres/gpu:h100=2",
            "in_slurm": "gres/gpu:a100=1",
            "reason": "cap of 2 GPUs for alice",
        },
    ]
    assert shown["slurm"]["partitions"] == [
        {
            "partition": "onprem",
            "gpus": 8,
            "allocated": 3,
            "caps": "-",
            "in_slurm": "per user gres/gpu=4, per account gres/gpu=6",
            "reason": "3 of 8 GPUs allocated (37%), below 60%: no caps",
        },
        {
            "partition": "cloud",
            "gpus": 0,
            "allocated": 0,
            "caps": "-",
            "in_slurm": "-",
            "reason": "no GPUs that can take jobs",
        },
    ]
    table = cli("limits", "show", "limtop", "--slurm", runner=FakeSlurm().expect()).stdout
    assert (
        "blocked: no credit left (0.00 available, 0.00 held) (on each user: the account has sub-accounts)"
        in table
    )


def test_slurm_check_lists_every_difference_and_sync_fixes_them(
    cli: Callable[..., Result], tx: Callable[[], Any]
) -> None:
    with tx() as s:
        api.create_account(s, "ghost")  # the ledger's only: Slurm runs nothing for it
        api.add_member(s, "dave", "limleaf")
    slurm = FakeSlurm()
    found = json.loads(cli("slurm", "check", "--format", "json", runner=slurm.expect(), code=1).stdout)
    assert slurm.modified == []
    rows = {(r["kind"], r["name"]): (r["slurm"], r["ledger"], r["fix"]) for r in found["differences"]}
    imported, manual = "account import-slurm", "none (sacctmgr add, if it should run jobs)"
    assert {key: row for key, row in rows.items() if key[0] in ("account", "member")} == {
        **{("account", a): ("yes", "-", imported) for a in ("chemistry", "physics", "research")},
        **{
            ("member", m): ("yes", "-", imported)
            for m in (
                "bob@chemistry",
                "root@chemistry",
                "carol@limleaf",
                "alice@physics",
                "bob@physics",
                "root@physics",
                "root@research",
            )
        },
        ("account", "ghost"): ("-", "yes", manual),
        ("member", "dave@limleaf"): ("-", "yes", manual),
    }
    assert rows[("shares", "limleaf")] == ("1", "10", "fairshare sync")
    assert rows[("limit", "alice@limleaf")] == (
        "gres/gpu:a100=1",
        "gres/gpu=2,gres/gpu:a100=2,gres/gpu:h100=2",
        "limits sync",
    )
    assert rows[("scarcity", "onprem")] == ("per user gres/gpu=4, per account gres/gpu=6", "-", "limits sync")
    assert rows[("parent", "limsub")] == ("limtop", "-", imported)  # the tree is compared too
    assert found["left"] == len(found["differences"]) == 24
    assert [note.split(" (")[0] for note in found["notes"]] == ["devices are not constrained"]
    sync = ("slurm", "check", "--sync", "--format", "json")
    fixed = json.loads(cli(*sync, runner=slurm.expect(any_modify=True), code=1).stdout)
    assert fixed["left"] == 2
    assert {r["fix"] for r in fixed["differences"]} == {"imported", "fixed", manual}
    assert any(argv[-1].startswith("fairshare=") for argv in slurm.modified)
    broke = [argv for argv in slurm.modified if argv[3] == "account" and argv[-1] == grp(0)]
    assert broke[0][5] == "name=chemistry,physics"  # imported, no credit; research's users get it
    after = json.loads(cli("slurm", "check", "--format", "json", runner=slurm.expect(), code=1).stdout)
    assert [(r["kind"], r["name"]) for r in after["differences"]] == [
        ("account", "ghost"),
        ("member", "dave@limleaf"),
    ]
    with tx() as s:
        assert "physics" in api.account_names(s) and ("root", "research") in api.memberships(s)


def test_balance_says_when_slurm_blocks_or_caps_the_account(cli: Callable[..., Result]) -> None:
    at = ("--at", "2026-12-02T10:00Z")
    blocked = cli("balance", "limtop", *at, runner=FakeRunner()).stdout.splitlines()
    assert blocked[1] == "blocked: no credit left (0.00 available, 0.00 held); GPU jobs wait in Slurm"
    capped = cli("balance", "limleaf", *at, runner=FakeRunner()).stdout.splitlines()
    assert capped[:2] == [
        "account limleaf at 2026-12-02T10:00:00Z: available 10.00, held 0.00",
        "GPU caps: account 4, alice 2 at once",
    ]
    assert "caps" not in cli("balance", "limleaf", *at, "--format", "json", runner=FakeRunner()).stdout


def test_the_keeper_syncs_everything_first_then_only_accounts_whose_block_changed(
    tx: Callable[[], Any], engine: Engine
) -> None:
    day = NOW - timedelta(days=1)
    with tx() as s:
        for name in ("limleaf", "limsub"):
            api.create_account(s, name, at=day)
            api.add_member(s, "alice", name)
            api.topup(s, name, "5", effective_at=day)
        api.set_limits(s, "limleaf", daily_cap="1")
    clock = [NOW]
    ticks = [0.0]
    config = {**DEFAULTS, "scarcity": {**DEFAULTS["scarcity"], "partitions": ["onprem"]}}
    keeper = LimitsKeeper(
        make_sessionmaker(engine), FakeRunner(), config, clock=lambda: clock[0], monotonic=lambda: ticks[0]
    )
    slurm = FakeSlurm()
    lift = ("MaxTRESPerUser=gres/gpu=-1", "MaxTRESPerAccount=gres/gpu=-1")
    first = [
        (*MODIFY, "account", "where", "name=limleaf", "cluster=lab", "set", grp(-1)),
        (*MODIFY, "user", "where", "name=alice,carol", "account=limleaf", "cluster=lab", "set", grp(-1)),
        (*MODIFY, "qos", "where", "name=gpucredit-onprem", "set", *lift),
    ]
    keeper.run = slurm.expect(*first)
    plan = keeper.tick()
    assert plan is not None and slurm.modified == first  # the first tick syncs everything
    keeper.run = slurm.expect()
    assert keeper.tick() is None  # nothing changed, nothing due: no Slurm command at all
    with tx() as s:
        api.consume(s, "limleaf", "1", user="alice", at=NOW)  # reaches the daily cap: a block
    block = (*MODIFY, "account", "where", "name=limleaf", "cluster=lab", "set", grp(0))
    keeper.run = slurm.expect(block)
    plan = keeper.tick()
    assert plan is not None and [c.name for c in plan.changes] == ["limleaf"] and plan.scarcity == ()
    assert slurm.modified[-1] == block
    clock[0] = NOW + timedelta(days=1)  # the next UTC day lifts it
    unblock = (*MODIFY, "account", "where", "name=limleaf", "cluster=lab", "set", grp(-1))
    keeper.run = slurm.expect(unblock)
    assert [c.new for c in keeper.tick().changes] == ["-"]  # type: ignore[union-attr]
    ticks[0] = 31.0  # the full sync is due again: reads, finds nothing to do
    keeper.run = slurm.expect()
    assert keeper.tick().changes == ()  # type: ignore[union-attr]


def test_every_reader_of_associations_runs_the_one_command_line() -> None:
    """import-slurm, fairshare and limits read `sacctmgr show associations` through one builder,
    with their own fields: the argv the recorded fixtures were taken with."""
    from accounting_bridge.sync.assoc_batch import show_associations_argv
    from accounting_bridge.sync.associations import SACCTMGR_ARGV

    show = ["sacctmgr", "--noheader", "--parsable2", "show", "associations"]
    lab = [*show, "where", "cluster=lab"]
    assert list(SACCTMGR_ARGV) == [*show, "format=cluster,account,user,parentname"]
    assert fairshare_sync.show_argv("lab") == [*lab, "format=account,user,partition,fairshare"]
    assert show_assoc_argv("lab") == [*lab, "format=account,user,partition,parentname,grptres"]
    assert show_associations_argv("account", cluster="lab") == [*lab, "format=account"]
