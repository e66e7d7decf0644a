"""Jobs' retry policies and the retries the daemon decided (ledger.jobs.retries).

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "retry_policies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(64), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("user", sa.String(128), nullable=False),
        sa.Column("max_retries", sa.Integer(), nullable=False),
        sa.Column("retry_on", sa.String(512), nullable=False),
        sa.Column("backoff_seconds", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint("max_retries BETWEEN 1 AND 10", name="ck_retry_policies_max_retries"),
        sa.CheckConstraint("backoff_seconds BETWEEN 0 AND 3600", name="ck_retry_policies_backoff_seconds"),
        sa.PrimaryKeyConstraint("id", name="pk_retry_policies"),
    )
    op.create_index("ix_retry_policies_cluster_job_id", "retry_policies", ["cluster", "job_id"])
    op.create_table(
        "retries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("policy_id", sa.Integer(), nullable=False),
        sa.Column("run", sa.Integer(), nullable=False),
        sa.Column("cause", sa.String(32), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("not_before", sa.DateTime(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["policy_id"], ["retry_policies.id"], name="fk_retries_policy_id_retry_policies"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_retries"),
        sa.UniqueConstraint("policy_id", "run", name="uq_retries_policy_id_run"),
    )


def downgrade() -> None:
    op.drop_table("retries")
    op.drop_index("ix_retry_policies_cluster_job_id", table_name="retry_policies")
    op.drop_table("retry_policies")
