"""Pooled credit: a parent account may share its credit with its children.

`pools` says which parents share, and how much each child may use (a cap counted over
loans since `since`); `pool_loans` records each loan, from one of the parent's grants
into a `pool` grant of the child's, and what of it went back (ledger/books/pools.py).

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column(
            "account_id",
            sa.Integer(),
            sa.ForeignKey("accounts.id", name="fk_pools_account_id_accounts"),
            nullable=False,
        ),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("child_cap_ucredits", sa.BigInteger(), nullable=True),
        sa.Column("since", sa.DateTime(), nullable=False),
        sa.CheckConstraint("child_cap_ucredits IS NULL OR child_cap_ucredits >= 0", name="ck_pools_cap"),
        sa.PrimaryKeyConstraint("account_id", name="pk_pools"),
    )
    op.create_table(
        "pool_loans",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "lender_id",
            sa.Integer(),
            sa.ForeignKey("accounts.id", name="fk_pool_loans_lender_id_accounts"),
            nullable=False,
        ),
        sa.Column(
            "borrower_id",
            sa.Integer(),
            sa.ForeignKey("accounts.id", name="fk_pool_loans_borrower_id_accounts"),
            nullable=False,
        ),
        sa.Column(
            "grant_id",
            sa.Integer(),
            sa.ForeignKey("grants.id", name="fk_pool_loans_grant_id_grants"),
            nullable=False,
        ),
        sa.Column(
            "source_grant_id",
            sa.Integer(),
            sa.ForeignKey("grants.id", name="fk_pool_loans_source_grant_id_grants"),
            nullable=False,
        ),
        sa.Column("hold_id", sa.Integer(), nullable=True),
        sa.Column("taken_ucredits", sa.BigInteger(), nullable=False),
        sa.Column("returned_ucredits", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint("taken_ucredits > 0", name="ck_pool_loans_taken"),
        sa.CheckConstraint(
            "returned_ucredits >= 0 AND returned_ucredits <= taken_ucredits", name="ck_pool_loans_returned"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_pool_loans"),
    )
    op.create_index("ix_pool_loans_lender_id_borrower_id", "pool_loans", ["lender_id", "borrower_id"])
    op.create_index("ix_pool_loans_grant_id", "pool_loans", ["grant_id"])


def downgrade() -> None:
    op.drop_table("pool_loans")
    op.drop_table("pools")
