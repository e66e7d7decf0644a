"""The monthly cloud report's inputs: the journal's instances at the configured prices,
the cloud nodes of `[cloud.nodes]` and the partitions tagged `site = "cloud"`.

The report itself is computed by `ledger.api.cloud_report` (one function, which the
portal's /admin/cloud renders too); this module only gathers what the ledger does not
know. No provider call: the journal is the bill's record (an instance the provider runs
that the journal never saw is `cloud reconcile`'s business, and is on the record once it
is ended).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from accounting_bridge.cloud.config import CloudConfig, load_cloud_config
from accounting_bridge.cloud.journal import Journal, JournalEntry
from ledger.api import CloudReport, InstanceSpan, RoutingConfig, cloud_report

__all__ = ["ReportInputs", "instance_spans", "month_report", "report_inputs"]


@dataclass(frozen=True)
class ReportInputs:
    """What `ledger.api.cloud_report` needs from outside the ledger."""

    instances: tuple[InstanceSpan, ...]
    cloud_nodes: frozenset[str]
    cloud_partitions: frozenset[str]


def instance_spans(journal: Mapping[str, JournalEntry], config: CloudConfig) -> list[InstanceSpan]:
    """Each journal entry as the bill sees it, priced at its type's configured price."""
    return [
        InstanceSpan(
            entry.id,
            entry.node,
            entry.instance_type,
            entry.launched_at,
            entry.terminated_at,
            config.price_of(entry.instance_type, entry.region),
        )
        for entry in sorted(journal.values(), key=lambda e: (e.launched_at, e.id))
    ]


def report_inputs(config: Mapping[str, Any]) -> ReportInputs:
    """The inputs from a loaded gpucredit config: CloudConfigError for a bad `[cloud]`,
    JournalError for a journal line that cannot be read (no report from part of it),
    ledger InvalidInput for a bad `[partitions]` table."""
    cloud = load_cloud_config(config)
    sites = RoutingConfig.from_config(config).sites
    return ReportInputs(
        tuple(instance_spans(Journal(cloud.state_dir).entries(), cloud)),
        frozenset(cloud.node_gpu_types),
        frozenset(name for name, site in sites.items() if site == "cloud"),
    )


def month_report(s: Session, inputs: ReportInputs, month: str, now: datetime) -> CloudReport:
    return cloud_report(
        s,
        month=month,
        instances=inputs.instances,
        cloud_nodes=inputs.cloud_nodes,
        cloud_partitions=inputs.cloud_partitions,
        now=now,
    )
