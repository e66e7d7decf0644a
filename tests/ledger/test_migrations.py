"""The Alembic migrations build exactly the schema the models describe, on both stores,
and `gpucredit init` is repeat-safe."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from ledger.store.db import make_engine
from ledger.store.models import Base
from ledger.store.schema import upgrade


def test_migrations_match_the_models(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    assert upgrade(engine) == "0014"  # already at head: nothing to do, same revision
    engine.dispose()


def test_a_hold_from_before_0004_keeps_its_identity_on_sqlite(tmp_path) -> None:
    """Migration 0004 gives old holds the UNKNOWN_SUBMIT submit time, spelt as the ledger
    binds it: SQLite compares times as text, so a repeat of an old run must still find it
    (and its allocations survive the table rebuild)."""
    from ledger.holds.state import find_hold
    from ledger.store.db import make_sessionmaker

    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    assert upgrade(engine, "0003") == "0003"
    with engine.begin() as c:
        for statement in (
            "INSERT INTO accounts (id, name, kind, created_at, debt_ucredits, entry_count, head_hash) "
            "VALUES (100, 'physics', 'customer', '2026-01-01 00:00:00', 0, 0, 'x')",
            "INSERT INTO grants (id, account_id, source, amount_ucredits, remaining_ucredits, "
            "earmarked_ucredits, effective_at, priority) "
            "VALUES (1, 100, 'topup', 1, 1, 1, '2026-01-01 00:00:00', 10)",
            'INSERT INTO holds (id, account_id, "user", cluster, job_id, run, gpus, unit_prices, gpu_count, '
            "rate_ucredits_per_hour, limit_seconds, amount_ucredits, charged_ucredits, charged_seconds, "
            "debt_ucredits, state, started_at, expires_at, request_hash) "
            "VALUES (1, 100, 'alice', 'lab', 7, 0, 'h100:1', 'h100:3600000', 1, 3600000, 60, 60000, "
            "0, 0, 0, 'active', '2026-01-01 00:00:00', "
            "'2026-01-01 00:11:00', 'h')",
            "INSERT INTO hold_allocations (id, hold_id, grant_id, earmarked_ucredits, drawn_ucredits) "
            "VALUES (1, 1, 1, 1, 0)",
        ):
            c.exec_driver_sql(statement)
    assert upgrade(engine) == "0014"
    with make_sessionmaker(engine)() as s:
        found = find_hold(s, "lab", 7, 0)
        assert found is not None and found.id == 1
    with engine.connect() as c:
        assert c.exec_driver_sql("SELECT hold_id, grant_id FROM hold_allocations").all() == [(1, 1)]
    engine.dispose()


def test_the_database_holds_exactly_the_hold_states(db_url: str) -> None:
    """holds.state's CHECK, as the migrations wrote it, admits every HoldStatus and no
    other word: the one list in the code is the one in the database."""
    import pytest
    from sqlalchemy.exc import IntegrityError

    from ledger import api
    from ledger.store.db import make_sessionmaker
    from ledger.store.models import HoldStatus

    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        api.set_price(s, "h100", "3.60")
        api.create_account(s, "physics")
        api.topup(s, "physics", "10")
        hold = api.create_hold(
            s, api.HoldRequest("physics", user="alice", job_id=1, gpus="h100:1", seconds=60)
        )
    for state in HoldStatus.ALL:
        with sessions() as s, s.begin():
            s.connection().exec_driver_sql(f"UPDATE holds SET state = '{state}' WHERE id = {hold.id}")
    with pytest.raises(IntegrityError), sessions() as s, s.begin():
        s.connection().exec_driver_sql(f"UPDATE holds SET state = 'paused' WHERE id = {hold.id}")
    engine.dispose()
