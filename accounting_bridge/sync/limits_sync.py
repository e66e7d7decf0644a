"""The ledger's GPU caps and blocks, and scarcity caps, in Slurm's own limits.

Slurm enforces these without asking gpucredit, so they hold while the ledger, the
daemon or the network is down (docs/limits-sync.md; what the ledger says is
ledger/views/enforcement.py's)::

    the ledger says                            Slurm gets                        a job over it waits with
    account: at most N GPUs at once            account association GrpTRES      AssocGrpGRES
    member:  at most N GPUs at once            user association GrpTRES         AssocGrpGRES
    account blocked (no credit, daily cap)     account association GrpTRES = 0  AssocGrpGRES
    member blocked (their daily cap)           user association GrpTRES = 0     AssocGrpGRES
    partition scarce (scarcity.py)             the partition QOS's gres/gpu     QOSMaxGRESPerUser,
                                               MaxTRESPerUser/MaxTRESPerAccount QOSMaxGRESPerAccount

A GPU limit is written as gres/gpu=N and gres/gpu:TYPE=N for every GPU TRES Slurm
tracks: gres/gpu is what binds an untyped request (`--gres=gpu:1` counts against
gres/gpu only, and runs past a typed-only limit: docs/slurm-facts.md §15), and
writing every typed one too leaves no stale typed limit below N. No limit is written
as -1 (Slurm's "none"). Other TRES in GrpTRES (cpu, mem, ...) are the site's and are
left alone; gpucredit owns the GPU TRES of the associations of accounts the ledger
knows, and the GPU limits of the QOS of the partitions in `scarcity.partitions`.

An account with sub-accounts is a special case: a GrpTRES on it binds its whole
subtree. Its cap is meant so (`limits set dept --max-gpus 8` caps the department,
groups included: the GrpTRES goes on its association), but its block concerns the jobs
it pays for itself (a department without credit of its own must not stop groups that
have theirs), so the block goes onto its own users' associations.

Reading Slurm (`read_slurm`, five commands), planning (`plan_limits`, pure) and
applying (`apply_plan`) are separate, so `--dry-run`, `limits show --slurm` and
`slurm check` share them. Calls are batched by accounting_bridge/sync/assoc_batch.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from accounting_bridge.slurm.slurmcmd import Runner, SlurmCommandError
from accounting_bridge.sync.assoc_batch import Value, named_commands, show_associations_argv, user_commands
from accounting_bridge.sync.scarcity import ScarcityDecision, ScarcityPolicy, decide
from ledger import api
from slurmtext import (
    SlurmTextError,
    parse_parsable,
    parse_partition_qos,
    parse_sinfo_gpu_use,
    parse_tres,
)

__all__ = [
    "GPU",
    "SHOW_QOS_ARGV",
    "SHOW_TRES_ARGV",
    "SINFO_ARGV",
    "Change",
    "LimitsPlan",
    "SlurmView",
    "Target",
    "apply_plan",
    "caps_text",
    "parse_associations",
    "parse_gpu_tres",
    "parse_qos_gpu_limits",
    "plan_limits",
    "read_slurm",
    "show_assoc_argv",
    "tres_text",
]

GPU = "gres/gpu"
PARTITIONS_ARGV = ("scontrol", "show", "partition", "-o")
SHOW_QOS_ARGV = ("sacctmgr", "--noheader", "--parsable2", "show", "qos", "format=name,maxtrespu,maxtrespa")
SHOW_TRES_ARGV = ("sacctmgr", "--noheader", "--parsable2", "show", "tres", "format=type,name")
SINFO_ARGV = ("sinfo", "-h", "-N", "-O", "NodeList:0|,Partition:0|,Gres:0|,GresUsed:0|,StateLong:0")
_ASSOC_FIELDS = ("account", "user", "partition", "parent", "grptres")
_QOS_FIELDS = ("name", "per_user", "per_account")
_TRES_FIELDS = ("type", "name")
NO_LIMIT = -1  # what sacctmgr takes for "no limit"

Association = tuple[str, str]  # (account, user); user "" is the account's own association
GpuLimits = tuple[tuple[str, int], ...]  # sorted (TRES, count) pairs; () is no GPU limit


def show_assoc_argv(cluster: str) -> list[str]:
    return show_associations_argv("account", "user", "partition", "parentname", "grptres", cluster=cluster)


# --------------------------------------------------------------------------- reading Slurm


def _gpu_limits(tres_text: str) -> GpuLimits:
    limits = []
    for name, value in parse_tres(tres_text).items():
        if name == GPU or name.startswith(GPU + ":"):
            if not (value.isascii() and value.isdigit()):
                raise SlurmTextError(f"bad GPU limit {name}={value!r} in {tres_text!r}")
            limits.append((name, int(value)))
    return tuple(sorted(limits))


def parse_associations(text: str) -> tuple[dict[Association, tuple[GpuLimits, ...]], dict[str, str]]:
    """`show_assoc_argv`'s output -> (each association's GPU limits, one per partition row;
    each account's parent). A user with per-partition associations in an account has a
    row for each; `modify user ... account=a` sets them all, so they are planned as one."""
    limits: dict[Association, list[GpuLimits]] = {}
    parents: dict[str, str] = {}
    for row in parse_parsable(text, _ASSOC_FIELDS):
        key = (row["account"], row["user"])
        limits.setdefault(key, []).append(_gpu_limits(row["grptres"]))
        if not row["user"] and row["parent"]:
            parents[row["account"]] = row["parent"]
    return {key: tuple(rows) for key, rows in limits.items()}, parents


def parse_gpu_tres(text: str) -> tuple[str, ...]:
    """`SHOW_TRES_ARGV`'s output -> the GPU TRES Slurm tracks, gres/gpu first."""
    names = {
        f"{row['type']}/{row['name']}"
        for row in parse_parsable(text, _TRES_FIELDS)
        if row["type"] == "gres" and (row["name"] == "gpu" or row["name"].startswith("gpu:"))
    }
    return tuple(sorted(names, key=lambda name: (name != GPU, name)))


def parse_qos_gpu_limits(text: str) -> dict[str, tuple[int | None, int | None]]:
    """`SHOW_QOS_ARGV`'s output -> {QOS: (gres/gpu per user, gres/gpu per account)}."""
    table = {}
    for row in parse_parsable(text, _QOS_FIELDS):
        per_user = dict(_gpu_limits(row["per_user"])).get(GPU)
        per_account = dict(_gpu_limits(row["per_account"])).get(GPU)
        table[row["name"]] = (per_user, per_account)
    return table


@dataclass(frozen=True)
class SlurmView:
    """What Slurm has now, as far as these limits go."""

    associations: Mapping[Association, tuple[GpuLimits, ...]]
    parents: Mapping[str, str]  # account -> parent account
    gpu_tres: tuple[str, ...]
    qos_limits: Mapping[str, tuple[int | None, int | None]]
    partition_qos: Mapping[str, str | None]
    gpu_use: Mapping[str, tuple[int, int]]  # partition -> (GPUs, allocated)

    def has_subaccounts(self, account: str) -> bool:
        return account in self._parents_of_others

    @cached_property
    def _parents_of_others(self) -> frozenset[str]:
        return frozenset(self.parents.values())


def read_slurm(run: Runner, cluster: str, *, timeout_seconds: float = 60.0) -> SlurmView:
    """Five read-only commands. SlurmCommandError and SlurmTextError propagate."""
    associations, parents = parse_associations(run(show_assoc_argv(cluster), timeout_seconds=timeout_seconds))
    return SlurmView(
        associations,
        parents,
        parse_gpu_tres(run(list(SHOW_TRES_ARGV), timeout_seconds=timeout_seconds)),
        parse_qos_gpu_limits(run(list(SHOW_QOS_ARGV), timeout_seconds=timeout_seconds)),
        parse_partition_qos(run(list(PARTITIONS_ARGV), timeout_seconds=timeout_seconds)),
        parse_sinfo_gpu_use(run(list(SINFO_ARGV), timeout_seconds=timeout_seconds)),
    )


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Target:
    """The GPU limit one association should carry (None: none of ours), and why."""

    account: str
    user: str | None
    gpus: int | None
    reason: str


@dataclass(frozen=True)
class Change:
    """One association or partition QOS that differs from what the ledger implies."""

    scope: str  # "account" | "user" | "partition"
    name: str  # the account, user@account or partition
    old: str
    new: str
    reason: str

    def as_row(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "name": self.name,
            "old": self.old,
            "new": self.new,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class LimitsPlan:
    targets: tuple[Target, ...]
    scarcity: tuple[ScarcityDecision, ...]
    changes: tuple[Change, ...]
    commands: tuple[tuple[str, ...], ...]
    unchanged: int  # associations and QOS already right
    notes: tuple[str, ...]  # what cannot be written, and why
    missing: tuple[str, ...]  # ledger accounts (`a`) and members (`u@a`) Slurm has no association for


def tres_text(limits: GpuLimits) -> str:
    """GPU limits as sacctmgr prints them, gres/gpu first; '-' for none."""
    ordered = sorted(limits, key=lambda item: (item[0] != GPU, item[0]))
    return ",".join(f"{name}={count}" for name, count in ordered) or "-"


def _wanted(gpus: int | None, gpu_tres: Sequence[str]) -> GpuLimits:
    return () if gpus is None else tuple(sorted((name, gpus) for name in gpu_tres))


def _blocked(blocks: Iterable[api.Block]) -> str:
    return "blocked: " + "; ".join(block.message for block in blocks)


def _account_target(account: api.AccountEnforcement) -> Target:
    if account.blocks:
        return Target(account.account, None, 0, _blocked(account.blocks))
    if account.max_gpus is not None:
        return Target(account.account, None, account.max_gpus, f"account cap of {account.max_gpus} GPUs")
    return Target(account.account, None, None, "no account cap")


def _parent_target(account: api.AccountEnforcement) -> Target:
    """A parent's cap binds its subtree, as Slurm's GrpTRES on it does (the tree is the
    department's); its block stays on its own users (`_user_target`): a department
    without credit of its own does not stop groups that have theirs."""
    if account.max_gpus is not None:
        cap = account.max_gpus
        return Target(account.account, None, cap, f"subtree cap of {cap} GPUs (with its sub-accounts)")
    return Target(account.account, None, None, "no account cap")


def _user_target(account: api.AccountEnforcement, user: str, parent: bool) -> Target:
    member = account.member(user)
    if member is not None and member.blocks:
        return Target(account.account, user, 0, _blocked(member.blocks))
    if parent and account.blocks:
        return Target(
            account.account,
            user,
            0,
            f"{_blocked(account.blocks)} (on each user: the account has sub-accounts)",
        )
    if member is not None and member.max_gpus is not None:
        return Target(account.account, user, member.max_gpus, f"cap of {member.max_gpus} GPUs for {user}")
    return Target(account.account, user, None, "no user cap" if member is not None else "not a ledger member")


def _targets(
    ledger: Sequence[api.AccountEnforcement], view: SlurmView
) -> tuple[list[Target], list[str], list[str]]:
    """Every association of the ledger's accounts that Slurm has, with its target; notes
    on what cannot be written; what of the ledger's Slurm lacks (pure)."""
    users_of: dict[str, list[str]] = {}
    for name, user in sorted(view.associations):
        if user:
            users_of.setdefault(name, []).append(user)
    targets: list[Target] = []
    notes: list[str] = []
    missing: list[str] = []
    for account in ledger:
        if (account.account, "") not in view.associations:
            missing.append(account.account)
            continue
        parent = view.has_subaccounts(account.account)
        targets.append(_parent_target(account) if parent else _account_target(account))
        targets += [_user_target(account, user, parent) for user in users_of.get(account.account, [])]
        missing += [
            f"{m.user}@{account.account}"
            for m in account.members
            if (account.account, m.user) not in view.associations
        ]
    return targets, notes, missing


def plan_limits(
    ledger: Sequence[api.AccountEnforcement],
    view: SlurmView,
    policy: ScarcityPolicy,
    cluster: str,
    *,
    scarcity: bool = True,
) -> LimitsPlan:
    """Compare what the ledger implies with Slurm and batch the differences (pure).

    `ledger` may be a few accounts (the daemon's quick re-sync after a block changed);
    `scarcity=False` leaves the partition QOS alone.
    """
    targets, notes, missing = _targets(ledger, view)
    planned: dict[Association, Value] = {}
    account_changes: dict[str, Value] = {}
    user_changes: dict[Association, Value] = {}
    changes: list[Change] = []
    unchanged = 0
    for target in targets:
        key = (target.account, target.user or "")
        wanted = _wanted(target.gpus, view.gpu_tres)
        count = NO_LIMIT if target.gpus is None else target.gpus
        value = ("GrpTRES=" + ",".join(f"{name}={count}" for name in view.gpu_tres),)
        planned[key] = value
        current = view.associations[key]
        if all(limits == wanted for limits in current):
            unchanged += 1
            continue
        if target.user:
            user_changes[key] = value
        else:
            account_changes[target.account] = value
        changes.append(
            Change(
                "user" if target.user else "account",
                f"{target.user}@{target.account}" if target.user else target.account,
                " | ".join(sorted({tres_text(limits) for limits in current})),
                tres_text(wanted),
                target.reason,
            )
        )
    commands = named_commands("account", account_changes, where=[f"cluster={cluster}"])
    commands += user_commands(user_changes, planned, (k for k in view.associations if k[1]), cluster=cluster)
    decisions: list[ScarcityDecision] = []
    if scarcity:
        qos_changes, qos_unchanged = _plan_scarcity(policy, view, decisions, changes, notes)
        commands += named_commands("qos", qos_changes)
        unchanged += qos_unchanged
    return LimitsPlan(
        tuple(targets),
        tuple(decisions),
        tuple(changes),
        tuple(commands),
        unchanged,
        tuple(notes),
        tuple(missing),
    )


def caps_text(per_user: int | None, per_account: int | None) -> str:
    """A partition QOS's GPU caps as the sync prints them; '-' for none."""
    parts = [
        f"{who} {GPU}={n}"
        for who, n in (("per user", per_user), ("per account", per_account))
        if n is not None
    ]
    return ", ".join(parts) or "-"


def _plan_scarcity(
    policy: ScarcityPolicy,
    view: SlurmView,
    decisions: list[ScarcityDecision],
    changes: list[Change],
    notes: list[str],
) -> tuple[dict[str, Value], int]:
    qos_changes: dict[str, Value] = {}
    unchanged = 0
    owner: dict[str, str] = {}
    for partition in policy.partitions:
        qos = view.partition_qos.get(partition)
        if partition not in view.gpu_use or partition not in view.partition_qos:
            notes.append(f"partition {partition} (scarcity.partitions) is not in Slurm: not capped")
            continue
        if qos is None:
            notes.append(
                f"partition {partition} has no QOS of its own: not capped (add QOS=gpucredit-{partition} to "
                "its PartitionName line, docs/limits-sync.md)"
            )
            continue
        if qos not in view.qos_limits:
            notes.append(f"QOS {qos} of partition {partition} is not in sacctmgr: not capped")
            continue
        if qos in owner:
            notes.append(f"partitions {owner[qos]} and {partition} share QOS {qos}: {partition} not capped")
            continue
        owner[qos] = partition
        current = view.qos_limits[qos]
        gpus, allocated = view.gpu_use[partition]
        decision = decide(policy, partition, gpus, allocated, engaged_now=current != (None, None))
        decisions.append(decision)
        wanted = (decision.max_per_user, decision.max_per_account) if decision.engaged else (None, None)
        if wanted == current:
            unchanged += 1
            continue
        qos_changes[qos] = tuple(
            f"{field}={GPU}={NO_LIMIT if n is None else n}"
            for field, n in (("MaxTRESPerUser", wanted[0]), ("MaxTRESPerAccount", wanted[1]))
        )
        changes.append(
            Change("partition", partition, caps_text(*current), caps_text(*wanted), decision.reason)
        )
    return qos_changes, unchanged


# --------------------------------------------------------------------------- applying


def apply_plan(run: Runner, plan: LimitsPlan, *, timeout_seconds: float = 60.0) -> None:
    """Run the plan's sacctmgr calls in order. The first failure propagates with a note of
    how far it got; the next sync plans what is left (a sync of what is right plans nothing)."""
    for done, argv in enumerate(plan.commands):
        try:
            run(list(argv), timeout_seconds=timeout_seconds)
        except SlurmCommandError as error:
            error.add_note(f"{done} of {len(plan.commands)} sacctmgr calls were made; sync again to finish")
            raise
