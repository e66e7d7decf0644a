"""Accounts form a tree, as Slurm's do: each customer account may name a parent.

Slurm keeps accounts in a tree (root -> college -> department -> group -> project) and
Fair Tree compares siblings level by level, so the ledger keeps the same tree: fairshare
derives a parent's shares from its subtree (docs/fairshare.md). NULL is a top-level
account (a child of Slurm's `root`, which nobody pays). The ledger refuses cycles
(ledger/books/tree.py); the foreign key keeps a parent from vanishing under its children.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # On SQLite a plain ADD COLUMN with a REFERENCES clause: a batch rebuild of `accounts`
    # would trip the foreign keys of every table naming it (they are on in the ledger).
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "ALTER TABLE accounts ADD COLUMN parent_id INTEGER "
            "CONSTRAINT fk_accounts_parent_id_accounts REFERENCES accounts (id)"
        )
        return
    op.add_column("accounts", sa.Column("parent_id", sa.Integer(), nullable=True))
    op.create_foreign_key("fk_accounts_parent_id_accounts", "accounts", "accounts", ["parent_id"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("parent_id")
