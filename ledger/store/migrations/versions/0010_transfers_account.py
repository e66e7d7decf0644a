"""A system account for transfers between customer accounts: `system:transfers` (id -5).

No journal entry touches two customer accounts (each chain, and each checkpoint, is one
account's), so a transfer is two entries: FROM's credit to `system:transfers`, then from
it to a new grant of TO's (source `transfer`). Its balance is zero after every transfer.

Revision ID: 0010
Revises: 0009
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
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
                "id": -5,
                "name": "system:transfers",
                "kind": "system",
                "created_at": now,
                "debt_ucredits": 0,
                "entry_count": 0,
                "head_hash": "",
            }
        ],
    )


def downgrade() -> None:
    op.execute("DELETE FROM accounts WHERE id = -5")
