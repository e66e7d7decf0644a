"""The Alembic migrations build exactly the schema the models describe, on both stores,
and `gpucredit init` is repeat-safe."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from ledger.db import make_engine
from ledger.models import Base
from ledger.schema import upgrade


def test_migrations_match_the_models(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    assert upgrade(engine) == "0004"  # already at head: nothing to do, same revision
    engine.dispose()
