"""Balance checkpoints: an account's journal sums as of an effective time, so a balance
at any past or future time reads the nearest checkpoint plus the entries after it
instead of scanning the whole journal; and a partial index on grants with credit left,
so "now" reads only live grants however many used-up ones pile up.

Checkpoints are append-only like the journal (a late entry appends a new version of
each checkpoint it changes; see ledger/books/checkpoints.py).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "balance_checkpoints",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column(
            "account_id",
            sa.Integer(),
            sa.ForeignKey("accounts.id", name="fk_balance_checkpoints_account_id_accounts"),
            nullable=False,
        ),
        sa.Column("as_of", sa.DateTime(), nullable=False),
        sa.Column("through_seq", sa.BigInteger(), nullable=False),
        sa.Column("grant_id", sa.Integer(), nullable=True),
        sa.Column("bucket", sa.String(16), nullable=False),
        sa.Column("amount_ucredits", sa.BigInteger(), nullable=False),
        sa.Column("taken_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint("bucket IN ('available', 'held', 'debt')", name="ck_balance_checkpoints_bucket"),
        sa.PrimaryKeyConstraint("id", name="pk_balance_checkpoints"),
    )
    op.create_index(
        "ix_balance_checkpoints_account_id_as_of_through_seq",
        "balance_checkpoints",
        ["account_id", "as_of", "through_seq"],
    )
    op.create_index(
        "ix_balance_checkpoints_account_id_through_seq", "balance_checkpoints", ["account_id", "through_seq"]
    )
    op.create_index(
        "ix_grants_live",
        "grants",
        ["account_id"],
        postgresql_where=sa.text("remaining_ucredits > 0"),
        sqlite_where=sa.text("remaining_ucredits > 0"),
    )
    if op.get_bind().dialect.name == "postgresql":
        # gpucredit_append_only() comes from migration 0001.
        op.execute(
            "CREATE TRIGGER balance_checkpoints_append_only BEFORE UPDATE OR DELETE ON balance_checkpoints "
            "FOR EACH ROW EXECUTE FUNCTION gpucredit_append_only()"
        )
        op.execute(
            "CREATE TRIGGER balance_checkpoints_no_truncate BEFORE TRUNCATE ON balance_checkpoints "
            "FOR EACH STATEMENT EXECUTE FUNCTION gpucredit_append_only()"
        )
    else:
        for action in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER balance_checkpoints_no_{action.lower()} BEFORE {action} "
                f"ON balance_checkpoints BEGIN SELECT RAISE(ABORT, 'gpucredit journal is append-only: "
                f"{action} on balance_checkpoints refused'); END"
            )


def downgrade() -> None:
    op.drop_index("ix_grants_live", table_name="grants")
    op.drop_table("balance_checkpoints")
