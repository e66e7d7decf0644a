"""Initial schema: accounts, grants, holds, the journal, and its immutability.

Revision ID: 0001
Revises:
Create Date: 2026-11-29 09:10:13.157213
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("debt_ucredits", sa.BigInteger(), nullable=False),
        sa.Column("entry_count", sa.BigInteger(), nullable=False),
        sa.Column("head_hash", sa.String(length=64), nullable=False),
        sa.CheckConstraint("kind IN ('customer', 'system')", name=op.f("ck_accounts_kind")),
        sa.CheckConstraint("debt_ucredits >= 0", name=op.f("ck_accounts_debt")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_accounts")),
        sa.UniqueConstraint("name", name=op.f("uq_accounts_name")),
    )
    op.create_table(
        "prices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gres", sa.String(length=64), nullable=False),
        sa.Column("partition", sa.String(length=128), nullable=True),
        sa.Column("ucredits_per_gpu_hour", sa.BigInteger(), nullable=False),
        sa.Column("effective_at", sa.DateTime(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint("ucredits_per_gpu_hour >= 0", name=op.f("ck_prices_price")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prices")),
    )
    with op.batch_alter_table("prices", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_prices_gres_partition_effective_at"),
            ["gres", "partition", "effective_at"],
            unique=False,
        )

    op.create_table(
        "entries",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("effective_at", sa.DateTime(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.Column("user", sa.String(length=128), nullable=True),
        sa.Column("hold_id", sa.Integer(), nullable=True),
        sa.Column("links_entry_id", sa.BigInteger(), nullable=True),
        sa.Column("memo", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"], name=op.f("fk_entries_account_id_accounts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_entries")),
        sa.UniqueConstraint("account_id", "seq", name=op.f("uq_entries_account_id_seq")),
    )
    with op.batch_alter_table("entries", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_entries_account_id_effective_at"), ["account_id", "effective_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_entries_hold_id"), ["hold_id"], unique=False)

    op.create_table(
        "grants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("amount_ucredits", sa.BigInteger(), nullable=False),
        sa.Column("remaining_ucredits", sa.BigInteger(), nullable=False),
        sa.Column("earmarked_ucredits", sa.BigInteger(), nullable=False),
        sa.Column("effective_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("reference", sa.String(length=256), nullable=True),
        sa.Column("entry_id", sa.BigInteger(), nullable=True),
        sa.CheckConstraint("amount_ucredits > 0", name=op.f("ck_grants_amount")),
        sa.CheckConstraint(
            "earmarked_ucredits >= 0 AND earmarked_ucredits <= remaining_ucredits",
            name=op.f("ck_grants_earmarked"),
        ),
        sa.CheckConstraint("expires_at IS NULL OR expires_at > effective_at", name=op.f("ck_grants_window")),
        sa.CheckConstraint("remaining_ucredits >= 0", name=op.f("ck_grants_remaining")),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"], name=op.f("fk_grants_account_id_accounts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_grants")),
    )
    with op.batch_alter_table("grants", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_grants_account_id_expires_at"), ["account_id", "expires_at"], unique=False
        )

    op.create_table(
        "holds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("user", sa.String(length=128), nullable=False),
        sa.Column("cluster", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("run", sa.Integer(), nullable=False),
        sa.Column("partition", sa.String(length=128), nullable=True),
        sa.Column("gpus", sa.String(length=256), nullable=False),
        sa.Column("unit_prices", sa.String(length=512), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("rate_ucredits_per_hour", sa.BigInteger(), nullable=False),
        sa.Column("limit_seconds", sa.Integer(), nullable=False),
        sa.Column("amount_ucredits", sa.BigInteger(), nullable=False),
        sa.Column("charged_ucredits", sa.BigInteger(), nullable=False),
        sa.Column("charged_seconds", sa.Integer(), nullable=False),
        sa.Column("debt_ucredits", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("resolved_at", sa.DateTime(), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.CheckConstraint(
            "state IN ('active', 'settled', 'released', 'expired')", name=op.f("ck_holds_state")
        ),
        sa.CheckConstraint("amount_ucredits >= 0 AND charged_ucredits >= 0", name=op.f("ck_holds_amounts")),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"], name=op.f("fk_holds_account_id_accounts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_holds")),
        sa.UniqueConstraint("cluster", "job_id", "run", name=op.f("uq_holds_cluster_job_id_run")),
    )
    with op.batch_alter_table("holds", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_holds_account_id_state"), ["account_id", "state"], unique=False)

    op.create_table(
        "idempotency_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("operation", sa.String(length=32), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("result", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_idempotency_keys_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_idempotency_keys")),
        sa.UniqueConstraint("account_id", "key", name=op.f("uq_idempotency_keys_account_id_key")),
    )
    op.create_table(
        "limits",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("user", sa.String(length=128), nullable=True),
        sa.Column("max_gpus", sa.Integer(), nullable=True),
        sa.Column("max_rate_ucredits_per_second", sa.BigInteger(), nullable=True),
        sa.Column("daily_cap_ucredits", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint(
            "daily_cap_ucredits IS NULL OR daily_cap_ucredits >= 0", name=op.f("ck_limits_daily_cap")
        ),
        sa.CheckConstraint("max_gpus IS NULL OR max_gpus >= 0", name=op.f("ck_limits_max_gpus")),
        sa.CheckConstraint(
            "max_rate_ucredits_per_second IS NULL OR max_rate_ucredits_per_second >= 0",
            name=op.f("ck_limits_max_rate"),
        ),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"], name=op.f("fk_limits_account_id_accounts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_limits")),
        sa.UniqueConstraint("account_id", "user", name=op.f("uq_limits_account_id_user")),
    )
    op.create_table(
        "members",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("user", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"], name=op.f("fk_members_account_id_accounts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_members")),
        sa.UniqueConstraint("account_id", "user", name=op.f("uq_members_account_id_user")),
    )
    op.create_table(
        "hold_allocations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hold_id", sa.Integer(), nullable=False),
        sa.Column("grant_id", sa.Integer(), nullable=False),
        sa.Column("earmarked_ucredits", sa.BigInteger(), nullable=False),
        sa.Column("drawn_ucredits", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "earmarked_ucredits >= 0 AND drawn_ucredits >= 0", name=op.f("ck_hold_allocations_amounts")
        ),
        sa.ForeignKeyConstraint(
            ["grant_id"], ["grants.id"], name=op.f("fk_hold_allocations_grant_id_grants")
        ),
        sa.ForeignKeyConstraint(["hold_id"], ["holds.id"], name=op.f("fk_hold_allocations_hold_id_holds")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hold_allocations")),
        sa.UniqueConstraint("hold_id", "grant_id", name=op.f("uq_hold_allocations_hold_id_grant_id")),
    )
    op.create_table(
        "postings",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("entry_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("grant_id", sa.Integer(), nullable=True),
        sa.Column("bucket", sa.String(length=16), nullable=False),
        sa.Column("amount_ucredits", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "bucket IN ('available', 'held', 'debt', 'system')", name=op.f("ck_postings_bucket")
        ),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_postings_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(["entry_id"], ["entries.id"], name=op.f("fk_postings_entry_id_entries")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_postings")),
    )
    with op.batch_alter_table("postings", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_postings_account_id_grant_id"), ["account_id", "grant_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_postings_entry_id"), ["entry_id"], unique=False)

    # ### end Alembic commands ###
    _system_accounts()
    _append_only(("entries", "postings"))


SYSTEM_ACCOUNTS = {-1: "system:payments", -2: "system:promotions", -3: "system:revenue", -4: "system:expired"}


def _system_accounts() -> None:
    accounts = sa.table(
        "accounts",
        sa.column("id", sa.Integer),
        sa.column("name", sa.String),
        sa.column("kind", sa.String),
        sa.column("created_at", sa.DateTime),
        sa.column("debt_ucredits", sa.BigInteger),
        sa.column("entry_count", sa.BigInteger),
        sa.column("head_hash", sa.String),
    )
    now = datetime.now(UTC).replace(tzinfo=None)
    op.bulk_insert(
        accounts,
        [
            {
                "id": i,
                "name": n,
                "kind": "system",
                "created_at": now,
                "debt_ucredits": 0,
                "entry_count": 0,
                "head_hash": "",
            }
            for i, n in SYSTEM_ACCOUNTS.items()
        ],
    )


def _append_only(tables: tuple[str, ...]) -> None:
    """The journal is never updated or deleted: the database itself refuses it."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute("""
            CREATE FUNCTION gpucredit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              RAISE EXCEPTION 'gpucredit journal is append-only: % on % refused', TG_OP, TG_TABLE_NAME
                USING ERRCODE = 'insufficient_privilege';
            END $$""")
        for table in tables:
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION gpucredit_append_only()"
            )
            op.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION gpucredit_append_only()"
            )
    else:
        for table in tables:
            for action in ("UPDATE", "DELETE"):
                op.execute(
                    f"CREATE TRIGGER {table}_no_{action.lower()} BEFORE {action} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, 'gpucredit journal is append-only: "
                    f"{action} on {table} refused'); END"
                )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in ("entries", "postings"):
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
        op.execute("DROP FUNCTION IF EXISTS gpucredit_append_only()")
    with op.batch_alter_table("postings", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_postings_entry_id"))
        batch_op.drop_index(batch_op.f("ix_postings_account_id_grant_id"))

    op.drop_table("postings")
    op.drop_table("hold_allocations")
    op.drop_table("members")
    op.drop_table("limits")
    op.drop_table("idempotency_keys")
    with op.batch_alter_table("holds", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_holds_account_id_state"))

    op.drop_table("holds")
    with op.batch_alter_table("grants", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_grants_account_id_expires_at"))

    op.drop_table("grants")
    with op.batch_alter_table("entries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_entries_hold_id"))
        batch_op.drop_index(batch_op.f("ix_entries_account_id_effective_at"))

    op.drop_table("entries")
    with op.batch_alter_table("prices", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_prices_gres_partition_effective_at"))

    op.drop_table("prices")
    op.drop_table("accounts")
    # ### end Alembic commands ###
