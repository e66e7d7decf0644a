"""A partial index on active holds: the meter and the sweep read them every tick.

Settled holds pile up by the million; without it, finding the few thousand active
ones scans them all.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_holds_active",
        "holds",
        ["id"],
        postgresql_where=sa.text("state = 'active'"),
        sqlite_where=sa.text("state = 'active'"),
    )


def downgrade() -> None:
    op.drop_index("ix_holds_active", table_name="holds")
