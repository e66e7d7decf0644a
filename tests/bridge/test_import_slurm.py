"""`gpucredit account import-slurm`: Slurm associations into ledger accounts and members."""

from __future__ import annotations

from accounting_bridge.sync.associations import import_associations, parse_associations
from ledger import api
from ledger.books.accounts import members_of as members
from ledger.books.accounts import read_account

RECORDED = """lab|root||
lab|root|root|
lab|research||
lab|research|root|
lab|physics||
lab|physics|alice|
lab|physics|bob|
lab|chemistry||
lab|chemistry|bob|
other|astro|carol|
"""


def test_parse_keeps_one_cluster_and_skips_root() -> None:
    assert parse_associations(RECORDED, "lab") == {
        "research": {"root"},
        "physics": {"alice", "bob"},
        "chemistry": {"bob"},
    }


def test_import_twice_changes_nothing(tx) -> None:
    with tx() as s:
        first = import_associations(s, parse_associations(RECORDED, "lab"))
    assert first.accounts_created == ["chemistry", "physics", "research"]
    assert first.members_added == ["bob@chemistry", "alice@physics", "bob@physics", "root@research"]
    with tx() as s:
        api.create_account(s, "astro")
    with tx() as s:
        second = import_associations(s, parse_associations(RECORDED, "lab"))
        assert (second.accounts_created, second.members_added) == ([], [])
        assert members(s, read_account(s, "physics").id) == ["alice", "bob"]
        assert api.account_names(s) == ["astro", "chemistry", "physics", "research"]
