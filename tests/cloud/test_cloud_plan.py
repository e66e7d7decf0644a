"""plan_reconcile's decision table and the bill's rows, pure: records in, records out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from accounting_bridge.cloud.journal import JournalEntry
from accounting_bridge.cloud.plan import instance_rows, plan_reconcile, slurm_node_states
from accounting_bridge.cloud.provider import Instance

T0 = datetime(2026, 12, 3, 20, 0, tzinfo=UTC)
PRICES = {"p5.48xlarge": 3_600_000}  # 1000 micro-credits a second


def instance(id_: str, node: str | None, state: str = "running", minute: int = 0) -> Instance:
    return Instance(id_, node, "p5.48xlarge", "us-east-1", state, T0 + timedelta(minutes=minute))


STATES = slurm_node_states(
    [
        {"NodeList": "cloud1", "StateComplete": "MIXED+CLOUD"},
        {"NodeList": "cloud2", "StateComplete": "idle+cloud+powered_down"},
        {"NodeList": "cloud3", "StateComplete": "idle+cloud+powered_down+powering_up"},
        {"NodeList": "cloud4", "StateComplete": "idle+cloud+powering_down"},
    ]
)


def test_the_decision_table() -> None:
    found = plan_reconcile(
        [
            instance("i-keep", "cloud1"),
            instance("i-down", "cloud2"),
            instance("i-booting", "cloud3"),
            instance("i-suspending", "cloud4"),
            instance("i-nobody", "cloud9"),
            instance("i-untagged", None),
            instance("i-ended", "cloud2", state="terminated"),
            instance("i-ending", "cloud9", state="shutting-down"),
        ],
        STATES,
    )
    assert [(t.instance.id, t.reason) for t in found] == [
        ("i-down", "node_powered_down"),
        ("i-nobody", "unknown_node"),
        ("i-untagged", "untagged"),
    ]


def test_two_live_instances_of_one_up_node_keep_the_later_launch() -> None:
    found = plan_reconcile([instance("i-new", "cloud1", minute=5), instance("i-old", "cloud1")], STATES)
    assert [(t.instance.id, t.reason) for t in found] == [("i-old", "duplicate")]


def test_rows_cost_to_the_journals_end_else_the_providers_else_now() -> None:
    journal = {
        "i-a": JournalEntry(
            "i-a", "cloud1", "p5.48xlarge", "us-east-1", T0, T0 + timedelta(seconds=90), "suspend"
        ),
        "i-gone": JournalEntry("i-gone", "cloud2", "p5.48xlarge", "us-east-1", T0),
    }
    listed = [
        instance("i-a", "cloud1", state="terminated"),
        Instance("i-b", "cloud3", "p5.48xlarge", "us-east-1", "terminated", T0, T0 + timedelta(seconds=30)),
        instance("i-c", "cloud4"),
        Instance("i-d", "cloud4", "g5.xlarge", "us-east-1", "running", T0),
    ]
    now = T0 + timedelta(seconds=600)
    rows = {row.id: row for row in instance_rows(listed, journal, lambda kind, region: PRICES.get(kind), now)}
    assert {id_: (row.state, row.cost_ucredits) for id_, row in rows.items()} == {
        "i-a": ("terminated", 90_000),
        "i-b": ("terminated", 30_000),
        "i-c": ("running", 600_000),
        "i-d": ("running", None),  # no price for its type
        "i-gone": ("unlisted", 600_000),  # the provider forgot it, the journal has no end
    }
