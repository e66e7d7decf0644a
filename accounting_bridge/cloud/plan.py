"""Pure decisions, text and records in, records out: the bill's rows and reconcile's plan."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from accounting_bridge.cloud.journal import JournalEntry
from accounting_bridge.cloud.provider import Instance
from ledger.api import InstanceSpan

__all__ = ["InstanceRow", "Termination", "instance_rows", "plan_reconcile", "slurm_node_states"]

# sinfo's StateComplete flags of a node that should have no instance.
POWERED_DOWN = frozenset({"powered_down"})
POWERING_UP = "powering_up"


@dataclass(frozen=True)
class InstanceRow:
    id: str
    node: str | None
    instance_type: str
    region: str
    state: str
    launched_at: datetime
    terminated_at: datetime | None
    cost_ucredits: int | None  # None: no price configured for its type

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "node": self.node,
            "type": self.instance_type,
            "region": self.region,
            "state": self.state,
            "launched_at": self.launched_at.isoformat(),
            "terminated_at": self.terminated_at.isoformat() if self.terminated_at else None,
            "cost_ucredits": self.cost_ucredits,
        }


def instance_rows(
    live: Sequence[Instance],
    journal: Mapping[str, JournalEntry],
    price_of: Callable[[str, str], int | None],
    now: datetime,
) -> list[InstanceRow]:
    """Every instance the provider lists or the journal holds, with its cost so far.

    The provider charges from launch to termination, boot and idle included: cost =
    ledger.api.charge_for(the type's price an hour, whole seconds launched), rounded
    once (ledger.api.InstanceSpan.cost_ucredits, which `cloud report` uses too), at
    `price_of(type, region)` (CloudConfig.price_of: None, no price). The
    end is the journal's (when gpucredit ended it), else the time the provider gives
    for the change, else, for an instance still listed as ending, now.
    """
    rows: dict[str, InstanceRow] = {}
    for entry in journal.values():
        rows[entry.id] = _row(
            entry.id,
            entry.node,
            entry.instance_type,
            entry.region,
            "terminated" if entry.terminated_at else "unlisted",
            entry.launched_at,
            entry.terminated_at,
            price_of,
            now,
        )
    for instance in live:
        known = journal.get(instance.id)
        ended = known.terminated_at if known else None
        if ended is None and instance.state in ("shutting-down", "terminated"):
            ended = instance.state_changed_at or now
        rows[instance.id] = _row(
            instance.id,
            instance.node,
            instance.instance_type,
            instance.region,
            instance.state,
            instance.launched_at,
            ended,
            price_of,
            now,
        )
    return sorted(rows.values(), key=lambda row: (row.launched_at, row.node or "", row.id))


def _row(
    id_: str,
    node: str | None,
    instance_type: str,
    region: str,
    state: str,
    launched_at: datetime,
    ended: datetime | None,
    price_of: Callable[[str, str], int | None],
    now: datetime,
) -> InstanceRow:
    # The cost rule is the monthly report's too (ledger.api.InstanceSpan): one place.
    span = InstanceSpan(id_, node, instance_type, launched_at, ended, price_of(instance_type, region))
    return InstanceRow(id_, node, instance_type, region, state, launched_at, ended, span.cost_ucredits(now))


def slurm_node_states(rows: Sequence[Mapping[str, str]]) -> dict[str, frozenset[str]]:
    """sinfo's NodeList/StateComplete rows (`idle+cloud+powered_down`) -> each node's
    state words, lower case."""
    return {row["NodeList"]: frozenset(row["StateComplete"].lower().split("+")) for row in rows}


@dataclass(frozen=True)
class Termination:
    instance: Instance
    reason: str  # untagged | unknown_node | node_powered_down | duplicate


def plan_reconcile(instances: Sequence[Instance], slurm: Mapping[str, frozenset[str]]) -> list[Termination]:
    """The instances to end: those the provider runs that Slurm does not know.

    For each live instance (pending, running, stopping, stopped) of this cluster, the
    first row that matches:

    | its gpucredit:node tag | the node in Slurm                  | verdict                    |
    |------------------------|------------------------------------|----------------------------|
    | none                   |                                    | end: `untagged`            |
    | a name                 | not a node                         | end: `unknown_node`        |
    | a name                 | powered down, not powering up      | end: `node_powered_down`   |
    | a name                 | up or powering up, and a later-    | end: `duplicate`           |
    |                        | launched live instance has it too  |                            |
    | a name                 | up or powering up                  | keep                       |

    Instances already shutting down or terminated are never in the plan. A node that is
    powering down keeps its instance: its SuspendProgram is ending it now.
    """
    plan: list[Termination] = []
    newest: dict[str, Instance] = {}
    for instance in sorted((i for i in instances if i.live), key=lambda i: (i.launched_at, i.id)):
        states = slurm.get(instance.node) if instance.node else None
        if instance.node is None:
            plan.append(Termination(instance, "untagged"))
        elif states is None:
            plan.append(Termination(instance, "unknown_node"))
        elif states & POWERED_DOWN and POWERING_UP not in states:
            plan.append(Termination(instance, "node_powered_down"))
        else:
            older = newest.get(instance.node)
            if older is not None:
                plan.append(Termination(older, "duplicate"))
            newest[instance.node] = instance
    return plan
