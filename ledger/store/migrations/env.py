"""Alembic environment: runs against the connection `ledger.store.schema` hands it."""

from __future__ import annotations

from alembic import context

from ledger.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `gpucredit init` (ledger.store.schema.upgrade)")
context.configure(
    connection=connection, target_metadata=Base.metadata, render_as_batch=connection.dialect.name == "sqlite"
)
with context.begin_transaction():
    context.run_migrations()
