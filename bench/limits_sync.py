"""`gpucredit limits sync` for 1,000 accounts x 10 users: how long each part takes and how
many sacctmgr calls it makes.

Always (no Slurm needed): a SQLite ledger of 1,000 accounts with 10 members each; an
account cap of none, 8, 16 or 32 GPUs and a user cap of none, 2, 4 or 8 drawn at random;
5% of the accounts without credit (blocked), 2% past their daily cap, 1% of the users
past theirs. It times the ledger read (`api.enforcement`), parsing `sacctmgr show
associations` of that tree and the plan, and counts the sacctmgr calls of: the first
sync (Slurm without any GPU limit), a second one (nothing to do), and the daemon's quick
re-sync after 10 blocked accounts were topped up.

--box (root, the Slurm box up, run under the box lock): the same tree is loaded into
the box's Slurm (one `sacctmgr load`), then the real first sync and a second one run
with the SubprocessRunner, timed call by call (the five reads, and each modify with the
number of associations it changed), and the tree is deleted again.

    .venv/bin/python -m bench.limits_sync [--accounts 1000] [--users 10] [--box]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from accounting_bridge.slurm.slurmcmd import FakeRunner, SubprocessRunner
from accounting_bridge.sync.limits_sync import (
    PARTITIONS_ARGV,
    SHOW_QOS_ARGV,
    SHOW_TRES_ARGV,
    SINFO_ARGV,
    LimitsPlan,
    SlurmView,
    apply_plan,
    plan_limits,
    read_slurm,
    show_assoc_argv,
)
from accounting_bridge.sync.scarcity import ScarcityPolicy
from ledger import api
from ledger.config import DEFAULTS
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade
from ledger.timeutil import utcnow

PREFIX = "lmb"
CLUSTER = "lab"
SEED = 20261201
POLICY = ScarcityPolicy.from_config({"scarcity": {**DEFAULTS["scarcity"], "partitions": ["onprem"]}})
TRES = "cpu|\nmem|\ngres|gpu\ngres|gpu:a100\ngres|gpu:h100\n"
QOS = "normal||\ngpucredit-onprem||\n"
PARTITIONS = "PartitionName=onprem QoS=gpucredit-onprem State=UP\n"
SINFO = "node1|onprem*|gpu:a100:2,gpu:h100:2|gpu:a100:0(IDX:N/A),gpu:h100:0(IDX:N/A)|idle\n"


def build_ledger(url: str, accounts: int, users: int) -> list[str]:
    """The tree in the ledger; returns the accounts without credit."""
    rng = random.Random(SEED)
    engine = make_engine(url)
    upgrade(engine)
    factory = make_sessionmaker(engine)
    now = utcnow()
    broke = []
    for a in range(accounts):
        name = f"{PREFIX}{a:04d}"
        members = [f"{name}u{u}" for u in range(users)]
        with factory() as s, s.begin():
            api.create_account(s, name, at=now - timedelta(days=2))
            api.set_limits(s, name, max_gpus=rng.choice([None, 8, 16, 32]))
            for user in members:
                api.add_member(s, user, name)
                api.set_limits(s, name, user=user, max_gpus=rng.choice([None, 2, 4, 8]))
            if rng.random() < 0.05:
                broke.append(name)
                continue
            api.topup(s, name, "100", effective_at=now - timedelta(days=1))
            if rng.random() < 0.02:
                api.set_limits(s, name, daily_cap="5")
                api.consume(s, name, "5", at=now)
            for user in members:
                if rng.random() < 0.01:
                    api.set_limits(s, name, user=user, daily_cap="1")
                    api.consume(s, name, "1", user=user, at=now)
    engine.dispose()
    return broke


def enforcement(url: str) -> tuple[list[api.AccountEnforcement], float]:
    engine = make_engine(url)
    began = time.perf_counter()
    with make_sessionmaker(engine)() as s, s.begin():
        ledger = api.enforcement(s, utcnow())
    seconds = time.perf_counter() - began
    engine.dispose()
    return ledger, seconds


def assoc_text(ledger: Sequence[api.AccountEnforcement]) -> str:
    """`sacctmgr show associations` of Slurm holding the tree, no GPU limit anywhere."""
    lines = [f"{PREFIX}|||root|"]
    for account in ledger:
        lines.append(f"{account.account}|||{PREFIX}|")
        lines += [f"{account.account}|{m.user}|||" for m in account.members]
    return "\n".join(lines) + "\n"


def fake_slurm(text: str) -> FakeRunner:
    return FakeRunner(
        {
            tuple(show_assoc_argv(CLUSTER)): text,
            SHOW_TRES_ARGV: TRES,
            SHOW_QOS_ARGV: QOS,
            PARTITIONS_ARGV: PARTITIONS,
            SINFO_ARGV: SINFO,
        }
    )


def applied(view: SlurmView, plan: LimitsPlan) -> SlurmView:
    """The view once the plan's targets are in Slurm."""
    associations = dict(view.associations)
    for target in plan.targets:
        wanted = () if target.gpus is None else tuple((t, target.gpus) for t in sorted(view.gpu_tres))
        associations[(target.account, target.user or "")] = (wanted,)
    return replace(view, associations=associations)


def timed_plan(
    ledger: Sequence[api.AccountEnforcement], view: SlurmView, **kwargs: bool
) -> tuple[LimitsPlan, float]:
    began = time.perf_counter()
    plan = plan_limits(ledger, view, POLICY, CLUSTER, **kwargs)
    return plan, time.perf_counter() - began


def load_tree(ledger: Sequence[api.AccountEnforcement], path: Path) -> None:
    lines = [
        f"Cluster - '{CLUSTER}'",
        "Parent - 'root'",
        f"Account - '{PREFIX}':Description='bench':Organization='lab'",
    ]
    lines.append(f"Parent - '{PREFIX}'")
    lines += [f"Account - '{a.account}':Description='bench':Organization='lab'" for a in ledger]
    for account in ledger:
        lines.append(f"Parent - '{account.account}'")
        lines += [f"User - '{m.user}'" for m in account.members]
    path.write_text("\n".join(lines) + "\n")
    SubprocessRunner(timeout_seconds=900)(["sacctmgr", "--immediate", "load", f"file={path}"])


def delete_tree(ledger: Sequence[api.AccountEnforcement]) -> None:
    run = SubprocessRunner(timeout_seconds=900)
    accounts = [a.account for a in ledger]
    users = [m.user for a in ledger for m in a.members]
    for names in (accounts, [PREFIX]):
        for i in range(0, len(names), 2000):
            run(
                [
                    "sacctmgr",
                    "--immediate",
                    "delete",
                    "account",
                    "where",
                    f"name={','.join(names[i : i + 2000])}",
                ]
            )
    for i in range(0, len(users), 2000):
        run(["sacctmgr", "--immediate", "delete", "user", "where", f"name={','.join(users[i : i + 2000])}"])


class TimedRunner:
    """The real runner, timing every call."""

    def __init__(self) -> None:
        self.run = SubprocessRunner(timeout_seconds=300)
        self.calls: list[tuple[str, float]] = []

    def __call__(self, argv: Sequence[str], *, timeout_seconds: float | None = None) -> str:
        began = time.perf_counter()
        try:
            return self.run(argv, timeout_seconds=timeout_seconds)
        finally:
            self.calls.append((_what(argv), time.perf_counter() - began))


def _what(argv: Sequence[str]) -> str:
    """A call in a few words: a read's object, a modify's kind and how many names it lists."""
    if "modify" not in argv:
        return str(argv[4] if argv[0] == "sacctmgr" else argv[0])
    lists = [word.split("=", 1) for word in argv[5:] if word.split("=", 1)[0] in ("name", "account")]
    return f"modify {argv[3]} " + " x ".join(f"{len(v.split(','))} {k}s" for k, v in lists)


def real_sync(ledger: Sequence[api.AccountEnforcement]) -> tuple[LimitsPlan, float, TimedRunner, float]:
    runner = TimedRunner()
    began = time.perf_counter()
    view = read_slurm(runner, CLUSTER)
    read_seconds = time.perf_counter() - began
    plan = plan_limits(ledger, view, POLICY, CLUSTER)
    apply_plan(runner, plan)
    return plan, time.perf_counter() - began, runner, read_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--box", action="store_true", help="also sync the box's real Slurm (root, box lock)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        began = time.perf_counter()
        broke = build_ledger(url, args.accounts, args.users)
        built = time.perf_counter() - began
        print(f"ledger: {args.accounts} accounts x {args.users} members built in {built:.1f} s")
        ledger, read_seconds = enforcement(url)
    blocked = sum(bool(a.blocks) for a in ledger)
    user_blocks = sum(bool(m.blocks) for a in ledger for m in a.members)
    print(f"ledger read (api.enforcement, SQLite): {read_seconds * 1000:.0f} ms")
    print(f"blocked: {blocked} accounts, {user_blocks} users")
    text = assoc_text(ledger)
    began = time.perf_counter()
    view = read_slurm(fake_slurm(text), CLUSTER)
    parse_seconds = time.perf_counter() - began
    first, first_seconds = timed_plan(ledger, view)
    print(f"parse sacctmgr show associations ({len(text.splitlines())} rows): {parse_seconds * 1000:.0f} ms")
    print(
        f"first sync: plan {first_seconds * 1000:.0f} ms, {len(first.changes)} changes "
        f"in {len(first.commands)} sacctmgr calls"
    )
    after = applied(view, first)
    second, second_seconds = timed_plan(ledger, after)
    calls = len(second.commands)
    print(f"second sync: plan {second_seconds * 1000:.0f} ms, {len(second.changes)} changes, {calls} calls")
    topped = set(broke[:10])
    unblocked = [replace(a, blocks=()) if a.account in topped else a for a in ledger if a.account in topped]
    quick, quick_seconds = timed_plan(unblocked, after, scarcity=False)
    print(
        f"daemon's re-sync after {len(topped)} top-ups: plan {quick_seconds * 1000:.1f} ms, "
        f"{len(quick.changes)} changes in {len(quick.commands)} calls"
    )
    if not args.box:
        return
    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        load_tree(ledger, Path(tmp) / "tree.cfg")
        print(f"box: tree loaded with sacctmgr load in {time.perf_counter() - began:.1f} s")
    try:
        plan, seconds, runner, reads = real_sync(ledger)
        modifies = [(what, s) for what, s in runner.calls if what.startswith("modify")]
        print(f"box: first sync {seconds:.1f} s for {len(plan.changes)} changes")
        print(f"  reads {reads:.2f} s: " + ", ".join(f"{what} {s:.2f} s" for what, s in runner.calls[:5]))
        print(f"  {len(modifies)} modify calls, {sum(s for _, s in modifies):.2f} s:")
        for what, s in modifies:
            print(f"    {what}: {s:.2f} s")
        plan, seconds, runner, reads = real_sync(ledger)
        print(f"box: second sync {seconds:.1f} s, {len(plan.commands)} modify calls")
    finally:
        delete_tree(ledger)


if __name__ == "__main__":
    main()
