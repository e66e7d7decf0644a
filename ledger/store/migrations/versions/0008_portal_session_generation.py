"""Portal logins count their sessions' generation, so a session can be ended.

A browser session is a signed cookie: without state on the server, a cookie copied
before logout (or before a password change) would work until it expires. Each login
now has `session_generation`; a session carries the generation it was opened in, and
logout and a new password move the generation on, ending every session opened before.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("portal_users") as batch:
        batch.add_column(sa.Column("session_generation", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("portal_users") as batch:
        batch.drop_column("session_generation")
