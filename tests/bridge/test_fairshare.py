"""`gpucredit fairshare`: the formula (docs/fairshare.md's worked example), the ledger's
figures behind it, the plan against recorded sacctmgr output, batched sacctmgr calls that
change exactly what they should, and the CLI with a FakeRunner."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting_bridge.slurm.slurmcmd import FakeResponse, FakeRunner
from accounting_bridge.sync.fairshare import MAX_SHARES, FairsharePolicy, Shares, account_shares, two_figures
from accounting_bridge.sync.fairshare_sync import (
    SSHARE_ARGV,
    plan_changes,
    read_associations,
    read_sshare,
    show_argv,
)
from gpucredit.cli import _build
from ledger import api, cli_support
from slurmtext import SlurmTextError, parse_parsable, parse_raw_shares
from tests import support

FIXTURES = support.FIXTURES / "fairshare"
NOW = datetime(2026, 12, 10, tzinfo=UTC)
SHOW = tuple(show_argv("lab"))
C = 1_000_000  # micro-credits per credit


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def figures(account: str, funded: int, spent: int, left: int, **members: int) -> api.FairnessInputs:
    """Whole credits in, micro-credits in the record."""
    return api.FairnessInputs(
        account, funded * C, spent * C, left * C, {u: s * C for u, s in members.items()}
    )


WORKED = [
    figures("physics", 400, 100, 300, alice=75, bob=25, carol=0),
    figures("chemistry", 100, 0, 100, bob=0),
    figures("biology", 0, 0, 50, alice=0),
    figures("geology", 0, 0, 2),
    figures("history", 200, 250, 0, bob=250),
]


def by_key(shares: Sequence[Shares]) -> dict[tuple[str, str | None], int]:
    return {(s.account, s.user): s.shares for s in shares}


# -- the formula ---------------------------------------------------------------------------------


def test_the_worked_example() -> None:
    shares = account_shares(WORKED, FairsharePolicy())
    assert by_key(shares) == {
        ("biology", None): 50,
        ("biology", "alice"): 100,
        ("chemistry", None): 100,
        ("chemistry", "bob"): 100,
        ("geology", None): 5,
        ("history", None): 0,
        ("history", "bob"): 50,
        ("physics", None): 350,
        ("physics", "alice"): 63,
        ("physics", "bob"): 88,
        ("physics", "carol"): 100,
    }
    why = {(s.account, s.user): s.why for s in shares}
    assert why[("physics", None)] == "funded 400.00 in 90 d - 50% of 100.00 spent in 7 d"
    assert why[("biology", None)] == "50.00 left (more than funded 0.00 in 90 d) - 50% of 0.00 spent in 7 d"
    assert why[("geology", None)] == "floor: 10% of the median account's 50 (own claim 2)"
    assert why[("history", None)] == "no credit left (0.00)"
    assert why[("physics", "alice")] == "100 - 50% x 75% of the account's spend"
    assert why[("chemistry", "bob")] == "100: the account spent nothing"
    assert [s.account for s in shares if s.user is None] == [
        "biology",
        "chemistry",
        "geology",
        "history",
        "physics",
    ]


def test_two_figures_rounds_half_up() -> None:
    assert [two_figures(n) for n in (0, 7, 99, 100, 349, 995, 1234, 1250, 98_765)] == [
        0,
        7,
        99,
        100,
        350,
        1000,
        1200,
        1300,
        99_000,
    ]
    assert two_figures(15, 2) == 8  # 7.5
    assert two_figures(149, 20) == 7  # 7.45
    with pytest.raises(ValueError):
        two_figures(-1)


def test_spend_beyond_the_windows_funding_damps_no_further() -> None:
    [account] = account_shares([figures("a", 100, 1000, 10)], FairsharePolicy())
    assert account.shares == 50


def test_refunds_make_spend_smaller_never_negative() -> None:
    [account, member] = account_shares([figures("a", 100, -5, 10, u=-5)], FairsharePolicy())
    assert (account.shares, member.shares) == (100, 100)


def test_held_credit_counts_as_credit_left_and_debt_as_none() -> None:
    held_only = api.FairnessInputs("a", 10 * C, 0, 1, {})  # one micro-credit left
    in_debt = api.FairnessInputs("b", 10 * C, 0, -1, {})
    assert by_key(account_shares([held_only, in_debt], FairsharePolicy())) == {
        ("a", None): 10,
        ("b", None): 0,
    }


def test_the_floor_is_at_least_one_share() -> None:
    tiny = account_shares([figures("a", 0, 0, 1), figures("b", 0, 0, 1)], FairsharePolicy())
    assert [s.shares for s in tiny] == [1, 1]


def test_shares_stop_at_max_shares() -> None:
    [rich] = account_shares([figures("a", 5 * MAX_SHARES, 0, 1)], FairsharePolicy())
    assert rich.shares == MAX_SHARES
    assert rich.why.startswith(f"at most {MAX_SHARES} (")


def test_a_member_who_spent_everything_keeps_at_least_one_share() -> None:
    policy = FairsharePolicy(damping_percent=100)
    assert by_key(account_shares([figures("a", 10, 4, 6, u=4, v=0)], policy)) == {
        ("a", None): 6,
        ("a", "u"): 1,
        ("a", "v"): 100,
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("funded_days", 0),
        ("spent_days", 4000),
        ("damping_percent", 101),
        ("floor_percent", -1),
        ("member_shares", 1.5),
    ],
)
def test_policy_refuses_values_out_of_range(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"fairshare.{field}"):
        FairsharePolicy(**{field: value})  # type: ignore[arg-type]


def test_policy_from_config_takes_the_defaults() -> None:
    from ledger.config import DEFAULTS

    assert FairsharePolicy.from_config(DEFAULTS) == FairsharePolicy()


# -- the ledger's figures ------------------------------------------------------------------------


def seed_worked_example(s) -> None:  # type: ignore[no-untyped-def]
    """The worked example's ledger at NOW (physics, chemistry, biology, history; dave is a
    ledger member of chemistry that Slurm does not know, astro an account it does not know)."""
    for account in ("physics", "chemistry", "biology", "geology", "history", "astro"):
        api.create_account(s, account)
    for user, account in [
        ("alice", "physics"),
        ("bob", "physics"),
        ("carol", "physics"),
        ("bob", "chemistry"),
        ("dave", "chemistry"),
        ("alice", "biology"),
        ("bob", "history"),
    ]:
        api.add_member(s, user, account)
    api.topup(s, "physics", "400", effective_at=NOW - timedelta(days=10))
    api.consume(s, "physics", "75", user="alice", at=NOW - timedelta(days=1))
    api.consume(s, "physics", "25", user="bob", at=NOW - timedelta(days=2))
    api.consume(s, "physics", "40", user="alice", at=NOW - timedelta(days=8))  # before the 7 days
    api.grant(s, "chemistry", "100", effective_at=NOW - timedelta(days=89))
    api.topup(s, "biology", "50", effective_at=NOW - timedelta(days=91))  # before the 90 days
    api.topup(s, "geology", "2", effective_at=NOW - timedelta(days=200))
    api.topup(s, "history", "50", effective_at=NOW - timedelta(days=200))
    api.topup(s, "history", "200", effective_at=NOW - timedelta(days=30))
    api.consume(s, "history", "250", user="bob", at=NOW - timedelta(days=3))
    api.topup(s, "astro", "30", effective_at=NOW + timedelta(days=1))  # not yet


def test_fairness_inputs_read_the_windows(tx) -> None:  # type: ignore[no-untyped-def]
    with tx() as s:
        seed_worked_example(s)
    with tx() as s:
        inputs = api.fairness_inputs(
            s, NOW, funded_since=NOW - timedelta(days=90), spent_since=NOW - timedelta(days=7)
        )
    assert inputs == [
        api.FairnessInputs("astro", 0, 0, 0, {}),
        api.FairnessInputs("biology", 0, 0, 50 * C, {"alice": 0}),
        api.FairnessInputs("chemistry", 100 * C, 0, 100 * C, {"bob": 0, "dave": 0}),
        api.FairnessInputs("geology", 0, 0, 2 * C, {}),
        api.FairnessInputs("history", 200 * C, 250 * C, 0, {"bob": 250 * C}),
        api.FairnessInputs(
            "physics", 400 * C, 100 * C, 260 * C, {"alice": 75 * C, "bob": 25 * C, "carol": 0}
        ),
    ]
    with pytest.raises(ValueError):
        api.fairness_inputs(s, NOW, funded_since=NOW + timedelta(seconds=1), spent_since=NOW)


# -- recorded Slurm text -------------------------------------------------------------------------


def test_associations_as_recorded() -> None:
    current = read_associations(recorded("sacctmgr_show_assoc.txt"))
    assert current[("physics", "")] == ("1",)
    assert current[("physics", "alice")] == ("parent",)
    assert current[("chemistry", "")] == ("100",)
    assert current[("lsb050", "")] == ("1",)
    assert ("physics", "root") in current
    assert len(current) == 66


def test_per_partition_associations_are_one_key_with_every_value() -> None:
    text = "physics|alice|onprem|5\nphysics|alice|cloud|7\nphysics|bob||7\n"
    assert read_associations(text) == {("physics", "alice"): ("5", "7"), ("physics", "bob"): ("7",)}


def test_sshare_as_recorded() -> None:
    rows = read_sshare(recorded("sshare_all.txt"))
    assert rows[("biology", "")]["raw_shares"] == "1"  # printed first and unindented
    assert rows[("chemistry", "")] == {
        "account": "chemistry",
        "user": "",
        "raw_shares": "100",
        "norm_shares": "0.649351",
        "raw_usage": "0",
        "effective_usage": "0.000000",
        "fairshare": "",
    }
    assert rows[("physics", "alice")]["raw_shares"] == "parent"
    assert rows[("physics", "alice")]["fairshare"] == "0.001972"


@pytest.mark.parametrize(
    "text",
    ["physics|alice|7\n", "physics|alice||seven\n", "physics|alice||-1\n"],
)
def test_malformed_sacctmgr_lines_are_refused(text: str) -> None:
    with pytest.raises(SlurmTextError):
        read_associations(text)


def test_parse_helpers() -> None:
    assert parse_parsable("\n a|b\n", ("x", "y")) == [{"x": " a", "y": "b"}]
    assert (parse_raw_shares("parent"), parse_raw_shares("350")) == (None, 350)


# -- the plan and its sacctmgr calls -------------------------------------------------------------


def modify_effect(text: str, argv: Sequence[str]) -> str:
    """What `sacctmgr --immediate modify account|user where ... set fairshare=N` does to
    `show_argv`'s output: every association matching all the where-lists, on this cluster."""
    assert list(argv[:5]) == ["sacctmgr", "--immediate", "modify", argv[3], "where"], argv
    kind = argv[3]
    where = dict(arg.split("=", 1) for arg in argv[5 : argv.index("set")])
    assert where.pop("cluster") == "lab"
    value = argv[-1].removeprefix("fairshare=")
    names = set(where.pop("name").split(","))
    accounts = set(where.pop("account").split(",")) if kind == "user" else None
    assert where == {}
    lines = []
    for line in text.splitlines():
        account, user, partition, old = line.split("|")
        if kind == "account" and not user and account in names:
            old = value
        if kind == "user" and accounts is not None and user in names and account in accounts:
            old = value
        lines.append("|".join([account, user, partition, old]))
    return "\n".join(lines) + "\n"


def test_plan_against_recorded_associations() -> None:
    targets = account_shares(WORKED, FairsharePolicy())
    targets.append(Shares("chemistry", "dave", 100, "x"))
    targets.append(Shares("astro", None, 0, "x"))
    plan = plan_changes(targets, read_associations(recorded("sacctmgr_show_assoc.txt")), "lab")
    assert [(c.account, c.user, c.old, c.new) for c in plan.changes] == [
        ("biology", None, "1", 50),
        ("biology", "alice", "1", 100),
        ("chemistry", "bob", "1", 100),
        ("history", None, "1", 0),
        ("history", "bob", "1", 50),
        ("physics", None, "1", 350),
        ("physics", "alice", "parent", 63),
        ("physics", "bob", "1", 88),
        ("physics", "carol", "1", 100),
    ]
    assert (plan.unchanged, plan.missing) == (1, ("geology", "dave@chemistry", "astro"))
    modify = ("sacctmgr", "--immediate", "modify")
    assert len(plan.commands) == 8
    assert set(plan.commands) == {
        (*modify, "account", "where", "name=history", "cluster=lab", "set", "fairshare=0"),
        (*modify, "account", "where", "name=biology", "cluster=lab", "set", "fairshare=50"),
        (*modify, "account", "where", "name=physics", "cluster=lab", "set", "fairshare=350"),
        (*modify, "user", "where", "name=bob", "account=history", "cluster=lab", "set", "fairshare=50"),
        (*modify, "user", "where", "name=alice", "account=physics", "cluster=lab", "set", "fairshare=63"),
        (*modify, "user", "where", "name=bob", "account=physics", "cluster=lab", "set", "fairshare=88"),
        # alice and bob share a call across biology and chemistry (neither is in the other
        # account); carol cannot join: physics' alice and bob get other values.
        (
            *modify,
            "user",
            "where",
            "name=alice,bob",
            "account=biology,chemistry",
            "cluster=lab",
            "set",
            "fairshare=100",
        ),
        (*modify, "user", "where", "name=carol", "account=physics", "cluster=lab", "set", "fairshare=100"),
    }
    text = recorded("sacctmgr_show_assoc.txt")
    for argv in plan.commands:
        text = modify_effect(text, argv)
    after = read_associations(text)
    assert {key: after[key] for key in after if key[1] != "root" and not key[0].startswith("lsb")} == {
        **{key: (str(value),) for key, value in by_key_str(targets).items() if key in after},
        ("root", ""): ("1",),
        ("research", ""): ("1",),
    }
    assert all(after[key] == ("1",) for key in after if key[1] == "root" or key[0].startswith("lsb"))
    again = plan_changes(targets, after, "lab")
    assert (again.changes, again.commands, again.unchanged) == ((), (), 10)


def by_key_str(targets: Sequence[Shares]) -> dict[tuple[str, str], int]:
    return {(t.account, t.user or ""): t.shares for t in targets}


def test_same_shares_share_one_call_and_long_lists_are_cut() -> None:
    current = {(f"acct{i}", ""): ("1",) for i in range(10)}
    current |= {(f"acct{i}", f"user{i}"): ("1",) for i in range(10)}
    targets = [Shares(f"acct{i}", None, 5, "x") for i in range(10)]
    targets += [Shares(f"acct{i}", f"user{i}", 100, "x") for i in range(10)]
    plan = plan_changes(targets, current, "lab")
    assert len(plan.commands) == 2  # all accounts in one call, all users in one
    assert plan.commands[1][5] == "name=" + ",".join(sorted(f"user{i}" for i in range(10)))
    cut = plan_changes(targets, current, "lab", max_list_chars=20)
    assert all(len(arg) <= 25 for argv in cut.commands for arg in argv[5:7])  # "account=" + 20
    assert len(cut.commands) > 2
    text = "".join(f"{a}|{u}||1\n" for a, u in current)
    for argv in cut.commands:
        text = modify_effect(text, argv)
    assert read_associations(text) == {key: (str(value),) for key, value in by_key_str(targets).items()}


names = st.sampled_from(["a", "b", "c", "d", "e"])


@settings(max_examples=200, deadline=None)
@given(
    associations=st.sets(st.tuples(names, st.sampled_from(["", "u", "v", "w", "x"])), min_size=1),
    values=st.lists(st.integers(min_value=0, max_value=3), min_size=25, max_size=25),
    known=st.lists(st.booleans(), min_size=25, max_size=25),
    limit=st.integers(min_value=3, max_value=12),
)
def test_batched_calls_change_exactly_the_planned_associations(
    associations: set[tuple[str, str]], values: list[int], known: list[bool], limit: int
) -> None:
    """Any tree, any targets (some associations unknown to the ledger, every account
    association included), any list limit: applying the calls with sacctmgr's
    users x accounts semantics gives every target its value and leaves the rest."""
    everything = associations | {(a, "") for a, _u in associations}
    ordered = sorted(everything)
    current = {key: ("1",) for key in ordered}
    targets = [
        Shares(a, u or None, values[i % 25], "x")
        for i, (a, u) in enumerate(ordered)
        if known[i % 25] or not u
    ]
    plan = plan_changes(targets, current, "lab", max_list_chars=limit)
    text = "".join(f"{a}|{u}||1\n" for a, u in ordered)
    for argv in plan.commands:
        text = modify_effect(text, argv)
    expected = {key: ("1",) for key in ordered} | {k: (str(v),) for k, v in by_key_str(targets).items()}
    assert read_associations(text) == expected
    assert plan_changes(targets, read_associations(text), "lab").commands == ()


# -- the CLI -------------------------------------------------------------------------------------


@pytest.fixture
def cli(db_url: str, tmp_path: Path, tx) -> Iterator[Callable[..., Result]]:  # type: ignore[no-untyped-def]
    config = tmp_path / "gpucredit.toml"
    config.write_text('[slurm]\ncluster = "lab"\n')
    with tx() as s:
        seed_worked_example(s)
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


def test_sync_applies_the_plan_and_a_second_run_changes_nothing(cli) -> None:  # type: ignore[no-untyped-def]
    before = recorded("sacctmgr_show_assoc.txt")
    dry = FakeRunner({SHOW: before})
    plan = json.loads(cli("fairshare", "sync", "--dry-run", "--format", "json", runner=dry).stdout)
    assert dry.calls == [SHOW]  # a dry run only reads
    assert plan["dry_run"] is True
    assert plan["missing"] == ["astro", "dave@chemistry", "geology"]
    assert {(c["account"], c["user"]): c["new"] for c in plan["changes"]}[("physics", None)] == 350
    after = before
    for argv in plan["commands"]:
        after = modify_effect(after, argv)
    apply = FakeRunner({SHOW: before, **{tuple(argv): " Modified ...\n" for argv in plan["commands"]}})
    table = cli("fairshare", "sync", runner=apply).stdout
    assert apply.calls == [SHOW, *(tuple(argv) for argv in plan["commands"])]
    lines = table.splitlines()
    assert lines[0].split() == ["ACCOUNT", "USER", "OLD", "NEW", "WHY"]
    assert lines[1].split(None, 4) == [
        "biology",
        "-",
        "1",
        "50",
        "50.00 left (more than funded 0.00 in 90 d) - 50% of 0.00 spent in 7 d",
    ]
    assert lines[-2:] == [
        f"changed 9 associations with {len(plan['commands'])} sacctmgr calls; 1 associations already right",
        "not in Slurm, left alone: astro, dave@chemistry, geology",
    ]
    second = FakeRunner({SHOW: after})
    again = cli("fairshare", "sync", runner=second).stdout
    assert second.calls == [SHOW]
    assert again.splitlines()[0] == "no changes; 10 associations already right"
    csv_out = cli("fairshare", "sync", "--format", "csv", runner=FakeRunner({SHOW: after})).stdout
    assert csv_out == ""  # no rows: no changes


def test_a_failed_sacctmgr_call_exits_1_and_says_how_far_it_got(cli) -> None:  # type: ignore[no-untyped-def]
    before = recorded("sacctmgr_show_assoc.txt")
    plan = json.loads(
        cli("fairshare", "sync", "--dry-run", "--format", "json", runner=FakeRunner({SHOW: before})).stdout
    )
    first, second = (tuple(argv) for argv in plan["commands"][:2])
    failing = FakeRunner(
        {SHOW: before, first: "", second: FakeResponse(returncode=1, stderr=" Nothing modified\n")}
    )
    result = cli("fairshare", "sync", runner=failing, code=1)
    assert failing.calls == [SHOW, first, second]
    assert result.stderr.splitlines()[-1] == (
        f"error: 1 of {len(plan['commands'])} sacctmgr calls were made; sync again to finish"
    )
    assert "Nothing modified" in result.stderr


def test_show_puts_the_shares_beside_sshare(cli) -> None:  # type: ignore[no-untyped-def]
    runner = FakeRunner({SSHARE_ARGV: recorded("sshare_all.txt")})
    rows = json.loads(cli("fairshare", "show", "--format", "json", runner=runner).stdout)
    by_row = {(row["account"], row["user"]): row for row in rows}
    assert by_row[("physics", None)] == {
        "account": "physics",
        "user": None,
        "funded": "400.00",
        "spent": "100.00",
        "left": "260.00",
        "shares": 350,
        "slurm_shares": "1",
        "norm_shares": "0.006494",
        "effective_usage": "0.216507",
        "fairshare": None,
        "parent": None,
        "depth": 0,
    }
    assert by_row[("physics", "alice")]["slurm_shares"] == "parent"
    assert by_row[("physics", "alice")]["fairshare"] == "0.001972"
    assert by_row[("physics", "alice")]["spent"] == "75.00"
    assert by_row[("chemistry", "dave")]["slurm_shares"] is None  # no association in Slurm
    assert by_row[("astro", None)]["shares"] == 0
    table = cli("fairshare", "show", runner=runner).stdout.splitlines()
    assert table[0].split() == [
        c.upper()
        for c in (
            "account",
            "user",
            "funded",
            "spent",
            "left",
            "shares",
            "slurm_shares",
            "norm_shares",
            "effective_usage",
            "fairshare",
        )
    ]
