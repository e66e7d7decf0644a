"""Operations: the Open OnDemand balance document and file, /metrics, /healthz, the
Grafana dashboard's metric names, and `gpucredit balance` for one's own accounts.

Figures are the seeded site's (tests/conftest_portal.py): physics 100.00 available and
14.40 held (job 1003 runs), 5.60 spent; chemistry 39.00 available, 1.00 spent.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ledger.db import make_engine, make_sessionmaker
from portal.ood import ood_document
from tests.conftest_portal import Site

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def read_ood(db_url: str, **kwargs: object) -> dict[str, object]:
    engine = make_engine(db_url)
    try:
        with make_sessionmaker(engine)() as s, s.begin():
            return ood_document(s, **kwargs)  # type: ignore[arg-type]
    finally:
        engine.dispose()


# --- Open OnDemand -----------------------------------------------------------------------


def test_ood_document_lists_each_member_with_whole_credits_rounded_down(portal_db: str, site: Site) -> None:
    assert read_ood(portal_db, now=NOW) == {
        "version": 1,
        "timestamp": int(NOW.timestamp()),
        "config": {"unit": "credits", "project_type": "account"},
        "balances": [
            {"user": "alice", "project": "physics", "value": 100},
            {"user": "bob", "project": "physics", "value": 100},
            {"user": "carol", "project": "chemistry", "value": 39},
        ],
    }


def test_ood_document_for_one_user_and_for_none(portal_db: str, site: Site) -> None:
    assert read_ood(portal_db, user="carol")["balances"] == [
        {"user": "carol", "project": "chemistry", "value": 39}
    ]
    assert read_ood(portal_db, user="dave")["balances"] == []


def test_ood_value_is_rounded_down_not_to_nearest(portal_db: str, site: Site) -> None:
    from ledger import api

    engine = make_engine(portal_db)
    with make_sessionmaker(engine)() as s, s.begin():
        api.consume(s, "chemistry", "0.01")
    engine.dispose()
    assert read_ood(portal_db, user="carol")["balances"] == [
        {"user": "carol", "project": "chemistry", "value": 38}
    ]
