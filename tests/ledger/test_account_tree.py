"""The account tree (ledger/books/tree.py): parents given with `account create --parent`
or taken from Slurm (`account import-slurm`), compared by `slurm check`; bad trees refused
with a code, changing nothing."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import Result

from accounting_bridge.sync.associations import import_associations, parse_associations, parse_parents
from ledger import api
from ledger.errors import InvalidInput, NotFound
from tests.support.cli import cli_for, dispose_engine

# sacctmgr -nP show assoc format=cluster,account,user,parentname (the box's tree, one level
# deeper, and a second cluster whose `astro` hangs under an account only it has)
ASSOC = """lab|root||
lab|root|root|
lab|research||root
lab|research|root|
lab|physics||research
lab|physics|alice|
lab|grpa||physics
lab|grpa|alice|
lab|chemistry||research
lab|chemistry|bob|
other|space||root
other|astro||space
other|astro|carol|
"""


@pytest.fixture
def gc(db_url: str) -> Iterator[Callable[..., Result]]:
    yield cli_for(db_url)
    dispose_engine(db_url)


def test_create_with_a_parent_and_move_a_subtree(gc: Callable[..., Result], tx: Callable[[], Any]) -> None:
    assert gc("account", "create", "research").output == "account research created\n"
    assert gc("account", "create", "physics", "--parent", "research").output == (
        "account physics created under research\n"
    )
    gc("account", "create", "grpa", "--parent", "physics")
    gc("account", "create", "chemistry", "--parent", "research")
    gc("topup", "grpa", "10")
    assert gc("account", "tree").output.splitlines() == [
        "ACCOUNT      PARENT    AVAILABLE  HELD  POOL",
        "research     -         0.00       0.00  -",
        "  chemistry  research  0.00       0.00  -",
        "  physics    research  0.00       0.00  -",
        "    grpa     physics   10.00      0.00  -",
    ]
    assert gc("account", "set-parent", "physics").output == "account physics now at the top level\n"
    assert gc("account", "set-parent", "physics").output == "account physics already at the top level\n"
    rows = json.loads(gc("account", "tree", "physics", "--format", "json").output)
    assert [(r["account"], r["parent"]) for r in rows] == [("physics", None), ("grpa", "physics")]
    with tx() as s:
        assert api.account_parents(s) == {
            "chemistry": "research",
            "grpa": "physics",
            "physics": None,
            "research": None,
        }
        # a swap that is a cycle half-way is one new tree, checked as a whole
        api.set_parents(s, {"research": "grpa", "physics": None})
        assert api.subtree(api.account_parents(s), "physics") == ["physics", "grpa", "research", "chemistry"]
        assert api.ancestors(api.account_parents(s), "chemistry") == ["research", "grpa", "physics"]


def test_a_bad_tree_is_refused_with_a_code_and_changes_nothing(
    gc: Callable[..., Result], tx: Callable[[], Any]
) -> None:
    gc("account", "create", "research")
    gc("account", "create", "physics", "--parent", "research")
    gc("account", "create", "grpa", "--parent", "physics")
    unknown = gc("account", "create", "x", "--parent", "nope", code=2)
    assert unknown.stderr == "error: unknown_parent: parent account 'nope' of x does not exist\n"
    cycle = gc("account", "set-parent", "research", "grpa", code=2)
    assert cycle.stderr == (
        "error: parent_cycle: account research would be its own ancestor "
        "(research -> grpa -> physics -> research)\n"
    )
    own = gc("account", "set-parent", "physics", "physics", code=2)
    assert (
        own.stderr == "error: parent_cycle: account physics would be its own ancestor (physics -> physics)\n"
    )
    assert gc("account", "set-parent", "ghost", "research", code=1).stderr.startswith("error: not_found:")
    with tx() as s:
        assert api.account_parents(s) == {"grpa": "physics", "physics": "research", "research": None}
        with pytest.raises(InvalidInput) as refused:
            api.set_parents(s, {"research": "physics"})
        assert (refused.value.code, refused.value.http_status) == ("parent_cycle", 422)
        with pytest.raises(NotFound):
            api.set_parents(s, {"ghost": None})


def test_create_with_a_parent_is_repeat_safe_by_key(gc: Callable[..., Result]) -> None:
    gc("account", "create", "research")
    key = ("--idempotency-key", "a-1")
    gc("account", "create", "physics", "--parent", "research", *key)
    gc("account", "create", "physics", "--parent", "research", *key)  # the repeat: the first result
    other = gc("account", "create", "physics", *key, code=1)
    assert other.stderr.startswith("error: idempotency_conflict:")


def test_import_keeps_slurm_s_parents_and_a_second_import_changes_nothing(tx: Callable[[], Any]) -> None:
    parents = parse_parents(ASSOC, "lab")
    assert parents == {"chemistry": "research", "grpa": "physics", "physics": "research", "research": None}
    with tx() as s:
        first = import_associations(s, parse_associations(ASSOC, "lab"), parents)
    assert first.accounts_created == ["chemistry", "grpa", "physics", "research"]
    assert first.parents_set == ["chemistry<research", "grpa<physics", "physics<research"]
    with tx() as s:
        api.set_parent(s, "grpa", "research")  # moved by hand in the ledger: Slurm's wins again
    with tx() as s:
        second = import_associations(s, parse_associations(ASSOC, "lab"), parents)
        assert (second.accounts_created, second.members_added, second.parents_set) == (
            [],
            [],
            ["grpa<physics"],
        )
        third = import_associations(s, parse_associations(ASSOC, "lab"), parents)
        assert third.parents_set == []
        assert api.account_parents(s)["grpa"] == "physics"


def test_a_parent_only_another_cluster_has_is_refused_before_anything_is_written() -> None:
    forged = ASSOC + "lab|astro||space\n"  # space has associations only in cluster `other`
    with pytest.raises(InvalidInput) as refused:
        parse_parents(forged, "lab")
    assert refused.value.code == "parent_other_cluster"
    assert refused.value.details == {"account": "astro", "parent": "space", "cluster": "lab"}
    with pytest.raises(InvalidInput) as unknown:
        parse_parents(ASSOC + "lab|moon||nowhere\n", "lab")
    assert unknown.value.code == "unknown_parent"
    assert parse_parents(ASSOC, "other") == {"astro": "space", "space": None}
