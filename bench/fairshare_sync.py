"""`gpucredit fairshare sync` for 1,000 accounts x 10 users: how long each part takes and
how many sacctmgr calls it makes.

Always (no Slurm needed): a SQLite ledger of 1,000 accounts with 10 members each,
credit funded log-uniformly between 10 and 100,000 credits at random times in the last
120 days, and spend by random members in the last 10 days. It times the ledger read
(`api.fairness_inputs`), the formula and the plan, and counts the sacctmgr calls of
two syncs through a FakeRunner: the first one (every association still at Slurm's
default fairshare 1) and a later one after 10 accounts were topped up.

--box (root, the Slurm box up, run under the box lock): the same 1,000 accounts and
10,000 users are loaded into the box's Slurm (one `sacctmgr load`), then the real first
sync and a second one run with the SubprocessRunner, timed call by call, and the tree is
deleted again.

    .venv/bin/python -m bench.fairshare_sync [--accounts 1000] [--users 10] [--box]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from accounting_bridge.slurm.slurmcmd import FakeRunner, SubprocessRunner
from accounting_bridge.sync.fairshare import FairsharePolicy, Shares, account_shares
from accounting_bridge.sync.fairshare_sync import Plan, apply_plan, plan_changes, read_associations, show_argv
from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade
from ledger.timeutil import utcnow

PREFIX = "fsb"
CLUSTER = "lab"
SEED = 20261130


def build_ledger(url: str, accounts: int, users: int) -> None:
    rng = random.Random(SEED)
    engine = make_engine(url)
    upgrade(engine)
    factory = make_sessionmaker(engine)
    now = utcnow()
    for a in range(accounts):
        name = f"{PREFIX}{a:04d}"
        credit = round(10 ** rng.uniform(1, 5), 2)
        with factory() as s, s.begin():
            api.create_account(s, name)
            for u in range(users):
                api.add_member(s, f"{name}u{u}", name)
            age_days = rng.uniform(0, 120)
            api.topup(s, name, f"{credit:.2f}", effective_at=now - timedelta(days=age_days))
            for _ in range(rng.randint(0, 3)):
                user = f"{name}u{rng.randrange(users)}"
                spend = round(credit * rng.uniform(0, 0.2), 2)
                if spend > 0:
                    at = now - timedelta(days=rng.uniform(0, min(10, age_days)))
                    api.consume(s, name, f"{spend:.2f}", user=user, at=at)
    engine.dispose()


def figures(url: str) -> tuple[list[api.FairnessInputs], float]:
    engine = make_engine(url)
    policy = FairsharePolicy()
    now = utcnow()
    began = time.perf_counter()
    with make_sessionmaker(engine)() as s, s.begin():
        inputs = api.fairness_inputs(
            s,
            now,
            funded_since=now - timedelta(days=policy.funded_days),
            spent_since=now - timedelta(days=policy.spent_days),
        )
    seconds = time.perf_counter() - began
    engine.dispose()
    return inputs, seconds


def slurm_text(targets: Sequence[Shares], value: str | None = None) -> str:
    """`show_argv`'s output for a Slurm holding exactly these associations, each at
    `value` (None: at its target)."""
    lines = [f"{PREFIX}|||1"]
    for t in targets:
        lines.append(f"{t.account}|{t.user or ''}||{value or t.shares}")
    return "\n".join(lines) + "\n"


def count_calls(plan: Plan, current_text: str) -> int:
    runner = FakeRunner({tuple(show_argv(CLUSTER)): current_text, **{argv: "" for argv in plan.commands}})
    apply_plan(runner, plan)
    return len(runner.calls)


def topped_up(inputs: list[api.FairnessInputs], count: int) -> list[api.FairnessInputs]:
    rng = random.Random(SEED + 1)
    chosen = set(rng.sample(range(len(inputs)), count))
    return [
        api.FairnessInputs(
            f.account,
            f.funded_ucredits + 500_000_000,
            f.spent_ucredits,
            f.left_ucredits + 500_000_000,
            f.member_spent_ucredits,
        )
        if i in chosen
        else f
        for i, f in enumerate(inputs)
    ]


def load_tree(targets: Sequence[Shares], path: Path) -> None:
    """Every account under PREFIX and its users, at Slurm's defaults, in one sacctmgr load."""
    lines = [
        f"Cluster - '{CLUSTER}'",
        "Parent - 'root'",
        f"Account - '{PREFIX}':Description='bench':Organization='lab'",
    ]
    accounts = [t.account for t in targets if t.user is None]
    lines.append(f"Parent - '{PREFIX}'")
    lines += [f"Account - '{a}':Description='bench':Organization='lab'" for a in accounts]
    for account in accounts:
        lines.append(f"Parent - '{account}'")
        lines += [f"User - '{t.user}'" for t in targets if t.account == account and t.user is not None]
    path.write_text("\n".join(lines) + "\n")
    SubprocessRunner(timeout_seconds=900)(["sacctmgr", "--immediate", "load", f"file={path}"])


def delete_tree(targets: Sequence[Shares]) -> None:
    run = SubprocessRunner(timeout_seconds=900)
    accounts = [t.account for t in targets if t.user is None]
    users = [t.user for t in targets if t.user is not None]
    for chunk in _chunked(accounts):
        run(["sacctmgr", "--immediate", "delete", "account", "where", f"name={','.join(chunk)}"])
    run(["sacctmgr", "--immediate", "delete", "account", "where", f"name={PREFIX}"])
    for chunk in _chunked(users):
        run(["sacctmgr", "--immediate", "delete", "user", "where", f"name={','.join(chunk)}"])


def _chunked(names: Sequence[str], size: int = 2000) -> list[Sequence[str]]:
    return [names[i : i + size] for i in range(0, len(names), size)]


class TimedRunner:
    """The real runner, timing every call."""

    def __init__(self) -> None:
        self.run = SubprocessRunner(timeout_seconds=300)
        self.seconds: list[float] = []

    def __call__(self, argv: Sequence[str], *, timeout_seconds: float | None = None) -> str:
        began = time.perf_counter()
        try:
            return self.run(argv, timeout_seconds=timeout_seconds)
        finally:
            self.seconds.append(time.perf_counter() - began)


def real_sync(targets: Sequence[Shares]) -> tuple[Plan, float, TimedRunner]:
    runner = TimedRunner()
    began = time.perf_counter()
    current = read_associations(runner(show_argv(CLUSTER)))
    plan = plan_changes(targets, current, CLUSTER)
    apply_plan(runner, plan)
    return plan, time.perf_counter() - began, runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--box", action="store_true", help="also sync the box's real Slurm (root, box lock)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        began = time.perf_counter()
        build_ledger(url, args.accounts, args.users)
        built = time.perf_counter() - began
        print(f"ledger: {args.accounts} accounts x {args.users} members built in {built:.1f} s")
        inputs, read_seconds = figures(url)
    began = time.perf_counter()
    targets = account_shares(inputs, FairsharePolicy())
    formula_seconds = time.perf_counter() - began
    fresh = slurm_text(targets, "1")
    began = time.perf_counter()
    first = plan_changes(targets, read_associations(fresh), CLUSTER)
    plan_seconds = time.perf_counter() - began
    accounts = [t for t in targets if t.user is None]
    print(f"ledger read (fairness_inputs, SQLite): {read_seconds * 1000:.0f} ms")
    print(f"formula: {formula_seconds * 1000:.0f} ms; plan of the first sync: {plan_seconds * 1000:.0f} ms")
    print(
        f"first sync: {len(first.changes)} changes in {count_calls(first, fresh)} sacctmgr calls "
        f"({len({t.shares for t in accounts})} distinct account shares, "
        f"{len({t.shares for t in targets if t.user})} distinct user shares)"
    )
    right = slurm_text(targets)
    later = account_shares(topped_up(inputs, 10), FairsharePolicy())
    steady = plan_changes(later, read_associations(right), CLUSTER)
    print(f"after 10 top-ups: {len(steady.changes)} changes in {count_calls(steady, right)} sacctmgr calls")
    again = plan_changes(targets, read_associations(right), CLUSTER)
    print(f"repeat of a sync: {len(again.changes)} changes, {len(again.commands)} calls")
    if not args.box:
        return
    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        load_tree(targets, Path(tmp) / "tree.cfg")
        print(f"box: {len(accounts)} accounts and their users loaded in {time.perf_counter() - began:.1f} s")
    try:
        plan, seconds, runner = real_sync(targets)
        modify = runner.seconds[1:]
        print(
            f"box: first sync {seconds:.1f} s: read {runner.seconds[0]:.2f} s, {len(modify)} sacctmgr modify "
            f"calls, median {statistics.median(modify):.2f} s, max {max(modify):.2f} s, "
            f"{len(plan.changes)} associations changed"
        )
        plan, seconds, runner = real_sync(targets)
        print(f"box: second sync {seconds:.1f} s, {len(plan.commands)} calls ({len(plan.changes)} changes)")
        per_call = statistics.median(modify)
        print(
            f"box: one call per changed association would take ~{len(first.changes) * per_call:.0f} s "
            f"({len(first.changes)} x {per_call:.2f} s); batched: {len(first.commands)} calls, "
            f"{math.ceil(len(first.changes) / max(1, len(first.commands)))} associations per call on average"
        )
    finally:
        delete_tree(targets)


if __name__ == "__main__":
    main()
