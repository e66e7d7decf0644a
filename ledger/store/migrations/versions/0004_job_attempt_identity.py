"""Job identity survives id reuse: holds and job runs carry the attempt's submit time.

Slurm reuses job ids (a wiped StateSaveLocation, FirstJobId, the wrap at MaxJobId)
and resets SubmitTime on every requeue, so `(cluster, job_id, run, submitted_at)`
names one attempt of one job incarnation. Rows from before this migration, and
holds made without a submit time (CLI, HTTP API), get 1970-01-01 (UNKNOWN_SUBMIT).

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Spelt as SQLAlchemy binds datetimes on SQLite, which compares them as text: a
# migrated row must match UNKNOWN_SUBMIT in the ledger's queries.
UNKNOWN_SUBMIT_SQL = sa.text("'1970-01-01 00:00:00.000000'")


@contextmanager
def _holds_rebuildable() -> Iterator[None]:
    """SQLite alters a constraint by rebuilding the table (DROP + RENAME). Dropping `holds`
    while hold_allocations rows point at it trips their foreign key, and it cannot be
    switched off inside the migration's transaction; so those rows step aside meanwhile."""
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        op.execute("CREATE TEMP TABLE _hold_allocations_copy AS SELECT * FROM hold_allocations")
        op.execute("DELETE FROM hold_allocations")
    yield
    if sqlite:
        op.execute("INSERT INTO hold_allocations SELECT * FROM _hold_allocations_copy")
        op.execute("DROP TABLE _hold_allocations_copy")


def upgrade() -> None:
    with _holds_rebuildable():
        _upgrade()


def _upgrade() -> None:
    for table in ("holds", "job_runs"):
        with op.batch_alter_table(table) as batch_op:
            batch_op.add_column(
                sa.Column("submitted_at", sa.DateTime(), nullable=False, server_default=UNKNOWN_SUBMIT_SQL)
            )
            batch_op.drop_constraint(f"uq_{table}_cluster_job_id_run", type_="unique")
            batch_op.create_unique_constraint(
                f"uq_{table}_cluster_job_id_run_submitted_at", ["cluster", "job_id", "run", "submitted_at"]
            )


def downgrade() -> None:
    with _holds_rebuildable():
        _downgrade()


def _downgrade() -> None:
    for table in ("holds", "job_runs"):
        with op.batch_alter_table(table) as batch_op:
            batch_op.drop_constraint(f"uq_{table}_cluster_job_id_run_submitted_at", type_="unique")
            batch_op.create_unique_constraint(f"uq_{table}_cluster_job_id_run", ["cluster", "job_id", "run"])
            batch_op.drop_column("submitted_at")
