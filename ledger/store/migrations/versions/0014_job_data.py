"""Paths jobs asked to have staged to their cloud nodes, and each stage-in made
(ledger.jobs.staging).

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_data",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster", sa.String(64), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("user", sa.String(128), nullable=False),
        sa.Column("paths", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_job_data"),
    )
    op.create_index("ix_job_data_cluster_job_id", "job_data", ["cluster", "job_id"])
    op.create_table(
        "stagings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("data_id", sa.Integer(), nullable=False),
        sa.Column("run", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("milliseconds", sa.Integer(), nullable=False),
        sa.Column("error", sa.String(512), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint("files >= 0 AND bytes >= 0 AND milliseconds >= 0", name="ck_stagings_figures"),
        sa.ForeignKeyConstraint(["data_id"], ["job_data.id"], name="fk_stagings_data_id_job_data"),
        sa.PrimaryKeyConstraint("id", name="pk_stagings"),
        sa.UniqueConstraint("data_id", "run", "node", name="uq_stagings_data_id_run_node"),
    )


def downgrade() -> None:
    op.drop_table("stagings")
    op.drop_index("ix_job_data_cluster_job_id", table_name="job_data")
    op.drop_table("job_data")
