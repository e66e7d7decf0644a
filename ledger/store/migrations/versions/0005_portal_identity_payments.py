"""The portal's rows: member roles, portal logins, API tokens, payments and their events.

Members get a role (`member`, or `manager` for a PI); existing members stay members.
Holds keep the run's output file (Slurm's StdOut), so the portal can show its tail.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("holds", sa.Column("output_path", sa.String(1024), nullable=True))
    with op.batch_alter_table("members") as batch_op:
        batch_op.add_column(sa.Column("role", sa.String(16), nullable=False, server_default="member"))
        batch_op.create_check_constraint("role", "role IN ('member', 'manager')")
    op.create_table(
        "portal_users",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("password_hash", sa.String(256), nullable=True),
        sa.Column("is_admin", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("name", name="uq_portal_users_name"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("user", sa.String(128), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("label", sa.String(256), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.CheckConstraint("role IN ('user', 'admin', 'service')", name="ck_api_tokens_role"),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )
    op.create_table(
        "payments",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "account_id",
            sa.Integer(),
            sa.ForeignKey("accounts.id", name="fk_payments_account_id_accounts"),
            nullable=False,
        ),
        sa.Column("amount_ucredits", sa.BigInteger(), nullable=False),
        sa.Column("provider", sa.String(16), nullable=False),
        sa.Column("external_id", sa.String(256), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("requested_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("resolved_at", sa.DateTime(), nullable=True),
        sa.Column("grant_id", sa.Integer(), nullable=True),
        sa.CheckConstraint("amount_ucredits > 0", name="ck_payments_amount"),
        sa.CheckConstraint("state IN ('pending', 'paid', 'cancelled')", name="ck_payments_state"),
        sa.UniqueConstraint("provider", "external_id", name="uq_payments_provider_external_id"),
    )
    op.create_index("ix_payments_account_id_state", "payments", ["account_id", "state"])
    op.create_table(
        "payment_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("provider", sa.String(16), nullable=False),
        sa.Column("event_id", sa.String(256), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("payment_id", sa.Integer(), nullable=True),
        sa.Column("received_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("provider", "event_id", name="uq_payment_events_provider_event_id"),
    )


def downgrade() -> None:
    op.drop_table("payment_events")
    op.drop_index("ix_payments_account_id_state", table_name="payments")
    op.drop_table("payments")
    op.drop_table("api_tokens")
    op.drop_table("portal_users")
    with op.batch_alter_table("members") as batch_op:
        batch_op.drop_constraint("ck_members_role", type_="check")
        batch_op.drop_column("role")
    op.drop_column("holds", "output_path")
