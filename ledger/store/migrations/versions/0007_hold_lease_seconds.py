"""Holds record how they were taken (lease_seconds: the lease window, NULL a full hold)
and how far their cost so far is read beyond what was posted (accrues_to_seconds).

Lease mode (docs/design.md §4.5) holds rate × window and the meter renews it; a full hold covers
the whole time limit. The meter reads this column, not the configured mode, so switching
holds.mode on a running cluster never renews a full hold nor leaves a lease unrenewed.
A running job's cost so far is computed on read, not posted every tick: accrues_to_seconds
is NULL until the meter sees the job running, then "to now" (2**31 - 1), then the seconds
at which the meter last saw it once it no longer does (written when that changes).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("holds") as batch:
        batch.add_column(sa.Column("lease_seconds", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("accrues_to_seconds", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("holds") as batch:
        batch.drop_column("accrues_to_seconds")
        batch.drop_column("lease_seconds")
