"""MUNGE credentials the portal accepted, kept until they expire.

A user on a login node authenticates to the portal's API with a MUNGE credential
(docs/admin-guide.md, "MUNGE authentication"). munged refuses a credential decoded
twice, but only on one host and only until it restarts; `spent_credentials` remembers
each accepted credential (the SHA-256 of its payload) for as long as it could be used,
so a copy is refused by every portal worker, on any host, after a restart too.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "spent_credentials",
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("keep_until", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("digest", name="pk_spent_credentials"),
    )
    op.create_index("ix_spent_credentials_keep_until", "spent_credentials", ["keep_until"])


def downgrade() -> None:
    op.drop_index("ix_spent_credentials_keep_until", table_name="spent_credentials")
    op.drop_table("spent_credentials")
