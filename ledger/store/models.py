"""The ledger's tables.

Two kinds of rows live here:
- the journal (`entries`, `postings`): append-only truth. Never updated or deleted;
  PostgreSQL refuses it by trigger, and a hash chain per account exposes edits on
  any store;
- projections (`grants.remaining/earmarked`, `holds.state/charged`,
  `accounts.debt/head`): maintained in the same transaction as the entry that
  changes them, so "now" is answered without scanning the journal.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Final, cast

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ledger.timeutil import aware_utc, naive_utc


class UTCDateTime(TypeDecorator[datetime]):
    """Stored as naive UTC on every backend; handed back as aware UTC."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: object) -> datetime | None:
        return None if value is None else naive_utc(value)

    def process_result_value(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is None:
            return None
        return aware_utc(value) if value.tzinfo is None else value.astimezone(UTC)


Ucredits = Annotated[int, mapped_column(BigInteger)]
Timestamp = Annotated[datetime, mapped_column(UTCDateTime())]
# The submit time of a job attempt whose caller did not know it (the CLI, the HTTP API,
# rows written before migration 0004): such attempts are told apart by run alone.
UNKNOWN_SUBMIT = datetime(1970, 1, 1, tzinfo=UTC)
# Spelt as SQLAlchemy binds datetimes on SQLite, which compares them as text.
_UNKNOWN_SUBMIT_SQL = text("'1970-01-01 00:00:00.000000'")
Name = Annotated[str, mapped_column(String(128))]

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Account(Base):
    """A Slurm account that pays (`customer`), or a system account (`system`)."""

    __tablename__ = "accounts"
    __table_args__ = (
        CheckConstraint("kind IN ('customer', 'system')", name="kind"),
        CheckConstraint("debt_ucredits >= 0", name="debt"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[Name] = mapped_column(unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[Timestamp]
    debt_ucredits: Mapped[Ucredits] = mapped_column(default=0)
    entry_count: Mapped[int] = mapped_column(BigInteger, default=0)
    head_hash: Mapped[str] = mapped_column(String(64), default="")
    # The account's parent in Slurm's tree; NULL: top level (under Slurm's root). Acyclic
    # (ledger/books/tree.py).
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("accounts.id"), nullable=True)


class Member(Base):
    """A Slurm user allowed to charge an account; a `manager` (PI) also manages it."""

    __tablename__ = "members"
    __table_args__ = (
        UniqueConstraint("account_id", "user"),
        CheckConstraint("role IN ('member', 'manager')", name="role"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    user: Mapped[Name]
    created_at: Mapped[Timestamp]
    role: Mapped[str] = mapped_column(String(16), server_default=text("'member'"))


class Limit(Base):
    """Caps for an account (user NULL) or for one user within it. NULL means no cap."""

    __tablename__ = "limits"
    __table_args__ = (
        UniqueConstraint("account_id", "user"),
        CheckConstraint("max_gpus IS NULL OR max_gpus >= 0", name="max_gpus"),
        CheckConstraint(
            "max_rate_ucredits_per_second IS NULL OR max_rate_ucredits_per_second >= 0", name="max_rate"
        ),
        CheckConstraint("daily_cap_ucredits IS NULL OR daily_cap_ucredits >= 0", name="daily_cap"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    user: Mapped[str | None] = mapped_column(String(128), nullable=True)
    max_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_rate_ucredits_per_second: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    daily_cap_ucredits: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_at: Mapped[Timestamp]


class Price(Base):
    """Credits per GPU-hour for a GRES type (and optionally a partition), from a time on."""

    __tablename__ = "prices"
    __table_args__ = (
        CheckConstraint("ucredits_per_gpu_hour >= 0", name="price"),
        Index(None, "gres", "partition", "effective_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gres: Mapped[str] = mapped_column(String(64))
    partition: Mapped[str | None] = mapped_column(String(128), nullable=True)
    ucredits_per_gpu_hour: Mapped[Ucredits]
    effective_at: Mapped[Timestamp]
    recorded_at: Mapped[Timestamp]


class Grant(Base):
    """Credit an account may spend inside [effective_at, expires_at). A top-up is a grant."""

    __tablename__ = "grants"
    __table_args__ = (
        CheckConstraint("amount_ucredits > 0", name="amount"),
        CheckConstraint("remaining_ucredits >= 0", name="remaining"),
        CheckConstraint(
            "earmarked_ucredits >= 0 AND earmarked_ucredits <= remaining_ucredits", name="earmarked"
        ),
        CheckConstraint("expires_at IS NULL OR expires_at > effective_at", name="window"),
        Index(None, "account_id", "expires_at"),
        # "Now" reads only grants with credit left; used-up ones pile up (migration 0006).
        Index(
            "ix_grants_live",
            "account_id",
            postgresql_where=text("remaining_ucredits > 0"),
            sqlite_where=text("remaining_ucredits > 0"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    source: Mapped[str] = mapped_column(String(16))
    amount_ucredits: Mapped[Ucredits]
    remaining_ucredits: Mapped[Ucredits]
    earmarked_ucredits: Mapped[Ucredits]
    effective_at: Mapped[Timestamp]
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    priority: Mapped[int] = mapped_column(Integer)
    reference: Mapped[str | None] = mapped_column(String(256), nullable=True)
    entry_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class Pool(Base):
    """A parent account sharing its credit with its children (`gpucredit account pool`):
    a child's hold borrows from it once the child's own credit is used, each child up to
    `child_cap_ucredits` (NULL: no cap) counted over loans made since `since`."""

    __tablename__ = "pools"
    __table_args__ = (CheckConstraint("child_cap_ucredits IS NULL OR child_cap_ucredits >= 0", name="cap"),)

    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean)
    child_cap_ucredits: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    since: Mapped[Timestamp]


class PoolLoan(Base):
    """Credit a child borrowed from one of its parent's grants into its own pool grant
    (`grant_id`, source `pool`), and how much of it went back (ledger/books/pools.py)."""

    __tablename__ = "pool_loans"
    __table_args__ = (
        CheckConstraint("taken_ucredits > 0", name="taken"),
        CheckConstraint("returned_ucredits >= 0 AND returned_ucredits <= taken_ucredits", name="returned"),
        Index(None, "lender_id", "borrower_id"),
        Index(None, "grant_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    lender_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    borrower_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    grant_id: Mapped[int] = mapped_column(ForeignKey("grants.id"))
    source_grant_id: Mapped[int] = mapped_column(ForeignKey("grants.id"))
    hold_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    taken_ucredits: Mapped[Ucredits]
    returned_ucredits: Mapped[Ucredits]
    created_at: Mapped[Timestamp]


class HoldStatus:
    """A hold's state (`holds.state`): `active` until it resolves, exactly once, as
    `settled` (charged for the seconds the run used), `released` (the rest voided) or
    `expired` (past its time limit and grace). Plain strings, as they are stored and
    shown: the bulk writes' fast path, the JSON records and the idempotency results all
    take them as they are."""

    ACTIVE: Final = "active"
    SETTLED: Final = "settled"
    RELEASED: Final = "released"
    EXPIRED: Final = "expired"
    ALL: Final = (ACTIVE, SETTLED, RELEASED, EXPIRED)


_ACTIVE_HOLD_SQL = f"state = '{HoldStatus.ACTIVE}'"


class Hold(Base):
    """A reservation for one job run: a pending transfer that resolves exactly once."""

    __tablename__ = "holds"
    __table_args__ = (
        # One attempt of one job incarnation: Slurm reuses job ids, and resets SubmitTime
        # on every requeue, so the attempt's submit time tells two jobs with one id apart.
        UniqueConstraint("cluster", "job_id", "run", "submitted_at"),
        CheckConstraint(f"state IN ({', '.join(repr(state) for state in HoldStatus.ALL)})", name="state"),
        CheckConstraint("amount_ucredits >= 0 AND charged_ucredits >= 0", name="amounts"),
        Index(None, "account_id", "state"),
        # The meter and the sweep read every active hold each tick (migration 0003).
        Index(
            "ix_holds_active",
            "id",
            postgresql_where=text(_ACTIVE_HOLD_SQL),
            sqlite_where=text(_ACTIVE_HOLD_SQL),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    user: Mapped[Name]
    cluster: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[int] = mapped_column(BigInteger)
    run: Mapped[int] = mapped_column(Integer)
    # Slurm's SubmitTime of this attempt; UNKNOWN_SUBMIT when the caller had none (CLI, API).
    submitted_at: Mapped[Timestamp] = mapped_column(server_default=_UNKNOWN_SUBMIT_SQL)
    partition: Mapped[str | None] = mapped_column(String(128), nullable=True)
    gpus: Mapped[str] = mapped_column(String(256))
    unit_prices: Mapped[str] = mapped_column(String(512))
    gpu_count: Mapped[int] = mapped_column(Integer)
    rate_ucredits_per_hour: Mapped[Ucredits]
    limit_seconds: Mapped[int] = mapped_column(Integer)
    amount_ucredits: Mapped[Ucredits]
    charged_ucredits: Mapped[Ucredits]
    charged_seconds: Mapped[int] = mapped_column(Integer)
    debt_ucredits: Mapped[Ucredits]
    state: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[Timestamp]
    expires_at: Mapped[Timestamp]
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    # The run's output file as Slurm names it (StdOut): the portal shows its owner the tail.
    output_path: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    # The lease window when the hold was taken in lease mode (it covers rate x window and
    # the meter renews it); NULL for a full hold (rate x time limit). Migration 0007.
    lease_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # How far the run's cost so far is read beyond its posted charge (ledger.holds.accrual): NULL,
    # not at all (the meter has not seen it run); ACCRUES_NOW (2**31 - 1), to now (the meter
    # sees it running); else the seconds at which the meter last saw it run. Migration 0007.
    accrues_to_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)


class HoldAllocation(Base):
    """What one hold earmarked on one grant and what it has drawn from it."""

    __tablename__ = "hold_allocations"
    __table_args__ = (
        UniqueConstraint("hold_id", "grant_id"),
        CheckConstraint("earmarked_ucredits >= 0 AND drawn_ucredits >= 0", name="amounts"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hold_id: Mapped[int] = mapped_column(ForeignKey("holds.id"))
    grant_id: Mapped[int] = mapped_column(ForeignKey("grants.id"))
    earmarked_ucredits: Mapped[Ucredits]
    drawn_ucredits: Mapped[Ucredits]


class Entry(Base):
    """One journal transaction for one customer account; its postings sum to zero."""

    __tablename__ = "entries"
    __table_args__ = (
        UniqueConstraint("account_id", "seq"),
        Index(None, "account_id", "effective_at"),
        Index(None, "hold_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    seq: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))
    effective_at: Mapped[Timestamp]
    recorded_at: Mapped[Timestamp]
    user: Mapped[str | None] = mapped_column(String(128), nullable=True)
    hold_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    links_entry_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    memo: Mapped[str] = mapped_column(Text, default="")
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))


class Posting(Base):
    """A signed amount on one account (and, for customers, one grant and bucket)."""

    __tablename__ = "postings"
    __table_args__ = (
        CheckConstraint("bucket IN ('available', 'held', 'debt', 'system')", name="bucket"),
        Index(None, "account_id", "grant_id"),
        Index(None, "entry_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    entry_id: Mapped[int] = mapped_column(ForeignKey("entries.id"))
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    grant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    bucket: Mapped[str] = mapped_column(String(16))
    amount_ucredits: Mapped[Ucredits]


class BalanceCheckpoint(Base):
    """An account's journal sums per (grant, bucket) over entries effective at or before
    `as_of` and numbered at most `through_seq`: where a balance at any time starts
    instead of scanning the journal. Append-only; see ledger/books/checkpoints.py."""

    __tablename__ = "balance_checkpoints"
    __table_args__ = (
        CheckConstraint("bucket IN ('available', 'held', 'debt')", name="bucket"),
        Index(None, "account_id", "as_of", "through_seq"),
        Index(None, "account_id", "through_seq"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    as_of: Mapped[Timestamp]
    through_seq: Mapped[int] = mapped_column(BigInteger)
    grant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    bucket: Mapped[str] = mapped_column(String(16))
    amount_ucredits: Mapped[Ucredits]
    taken_at: Mapped[Timestamp]


class IdempotencyKey(Base):
    """The first result of a keyed request, replayed for a repeat with the same body."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("account_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    key: Mapped[str] = mapped_column(String(256))
    operation: Mapped[str] = mapped_column(String(32))
    request_hash: Mapped[str] = mapped_column(String(64))
    result: Mapped[str] = mapped_column(Text)
    created_at: Mapped[Timestamp]


SYSTEM_ACCOUNTS = (
    "system:payments",
    "system:promotions",
    "system:revenue",
    "system:expired",
    "system:transfers",
)
APPEND_ONLY_TABLES = ("entries", "postings")


class JobRun(Base):
    """Slurm's own record of one job run (from sacct), and what reconciliation made of it.

    A projection the bridge maintains (money moves only through journal entries);
    `charged_ucredits` is the run's total charge once reconciled.
    """

    __tablename__ = "job_runs"
    __table_args__ = (
        UniqueConstraint("cluster", "job_id", "run", "submitted_at"),
        Index(None, "account", "end_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[int] = mapped_column(BigInteger)
    run: Mapped[int] = mapped_column(Integer)
    # sacct's Submit of this attempt (see Hold.submitted_at).
    submitted_at: Mapped[Timestamp] = mapped_column(server_default=_UNKNOWN_SUBMIT_SQL)
    display_id: Mapped[str] = mapped_column(String(64))
    account: Mapped[Name]
    user: Mapped[Name]
    partition: Mapped[str | None] = mapped_column(String(128), nullable=True)
    state: Mapped[str] = mapped_column(String(32))
    start_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    end_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    elapsed_seconds: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[str] = mapped_column(String(256))
    nodes: Mapped[str] = mapped_column(Text, default="")
    hold_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    flags: Mapped[str] = mapped_column(String(128), default="")
    charged_ucredits: Mapped[Ucredits] = mapped_column(default=0)
    ingested_at: Mapped[Timestamp]


class RetryPolicy(Base):
    """A job's retry policy, kept when the portal submitted it (ledger.jobs.retries).

    Keyed by (cluster, job id) and when it was kept: Slurm reuses job ids, and a policy
    kept before a job's submission belongs to an earlier job of that id."""

    __tablename__ = "retry_policies"
    __table_args__ = (
        CheckConstraint("max_retries BETWEEN 1 AND 10", name="max_retries"),
        CheckConstraint("backoff_seconds BETWEEN 0 AND 3600", name="backoff_seconds"),
        Index(None, "cluster", "job_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[int] = mapped_column(BigInteger)
    user: Mapped[Name]
    max_retries: Mapped[int] = mapped_column(Integer)
    retry_on: Mapped[str] = mapped_column(String(512))  # comma-separated failures
    backoff_seconds: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[Timestamp]


class Retry(Base):
    """One retry the daemon decided: the run that failed, why, and when the next may start.
    Written before the daemon acts, once per failed run."""

    __tablename__ = "retries"
    __table_args__ = (UniqueConstraint("policy_id", "run"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    policy_id: Mapped[int] = mapped_column(ForeignKey("retry_policies.id"))
    run: Mapped[int] = mapped_column(Integer)
    cause: Mapped[str] = mapped_column(String(32))
    # When the failed run really ended: Slurm moves its End to the requeue (the bridge's fix).
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    not_before: Mapped[Timestamp]
    created_at: Mapped[Timestamp]


class JobData(Base):
    """The paths a job asked to have staged to its cloud nodes, kept by the portal just
    before it submits the job and bound to the job's id once sbatch has answered
    (ledger.jobs.staging); matched to the job as a retry policy is."""

    __tablename__ = "job_data"
    __table_args__ = (Index(None, "cluster", "job_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # None: being submitted
    user: Mapped[Name]
    paths: Mapped[str] = mapped_column(Text)  # a JSON list of absolute paths
    created_at: Mapped[Timestamp]


class Staging(Base):
    """One stage-in of a job's data: what a node's Prolog copied for one run, and how long
    it took (or why it could not). Written once per run and node."""

    __tablename__ = "stagings"
    __table_args__ = (
        UniqueConstraint("data_id", "run", "node"),
        CheckConstraint("files >= 0 AND bytes >= 0 AND milliseconds >= 0", name="figures"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    data_id: Mapped[int] = mapped_column(ForeignKey("job_data.id"))
    run: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(128))
    files: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)
    milliseconds: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(512), nullable=True)
    created_at: Mapped[Timestamp]


class Cursor(Base):
    """Where an incremental reader (e.g. `bridge sacct`) stopped; restart-safe."""

    __tablename__ = "cursors"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[Timestamp]


class GpuUsage(Base):
    """How a job run really used its GPUs (NVML), per node and GPU type: metrics, not charges."""

    __tablename__ = "gpu_usage"
    __table_args__ = (UniqueConstraint("cluster", "job_id", "run", "node", "gres"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[int] = mapped_column(BigInteger)
    run: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(128))
    gres: Mapped[str] = mapped_column(String(64))
    allocated_gpu_seconds: Mapped[int] = mapped_column(BigInteger)
    busy_gpu_seconds: Mapped[int] = mapped_column(BigInteger)
    energy_joules: Mapped[int] = mapped_column(BigInteger)
    peak_memory_bytes: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[Timestamp]


def table_of(model: type[Base]) -> Table:
    """The Core table behind a mapped class, typed as a Table for Core statements."""
    return cast(Table, model.__table__)


class PortalUser(Base):
    """A person who logs in to the portal: a Slurm user name, an argon2 hash (local
    logins; NULL behind single sign-on) and whether they administer the whole site."""

    __tablename__ = "portal_users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[Name] = mapped_column(unique=True)
    password_hash: Mapped[str | None] = mapped_column(String(256), nullable=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # Sessions opened before the generation moved on (logout, a new password) are over.
    session_generation: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    created_at: Mapped[Timestamp]
    updated_at: Mapped[Timestamp]


class ApiToken(Base):
    """An API token, stored as the SHA-256 of its secret (the secret is shown once)."""

    __tablename__ = "api_tokens"
    __table_args__ = (CheckConstraint("role IN ('user', 'admin', 'service')", name="role"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user: Mapped[Name]
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    label: Mapped[str | None] = mapped_column(String(256), nullable=True)
    created_at: Mapped[Timestamp]
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class SpentCredential(Base):
    """A MUNGE credential the portal accepted, remembered (the SHA-256 of what it
    carried) until it has expired, so that a copy of it is refused by every portal
    worker and after a restart; munged's own replay cache is one host's, in memory."""

    __tablename__ = "spent_credentials"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    keep_until: Mapped[Timestamp] = mapped_column(index=True)


class Payment(Base):
    """Credit bought but not yet spendable: an invoice or a checkout session. Paying it
    creates the top-up grant, in the same transaction that marks it paid."""

    __tablename__ = "payments"
    __table_args__ = (
        CheckConstraint("amount_ucredits > 0", name="amount"),
        CheckConstraint("state IN ('pending', 'paid', 'cancelled')", name="state"),
        UniqueConstraint("provider", "external_id"),
        Index(None, "account_id", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    amount_ucredits: Mapped[Ucredits]
    provider: Mapped[str] = mapped_column(String(16))
    external_id: Mapped[str | None] = mapped_column(String(256), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    requested_by: Mapped[Name]
    created_at: Mapped[Timestamp]
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    grant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)


class PaymentEvent(Base):
    """A payment provider's event, once: its unique id is written in the transaction
    that acts on it, so a replayed or concurrent duplicate credits nothing."""

    __tablename__ = "payment_events"
    __table_args__ = (UniqueConstraint("provider", "event_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    provider: Mapped[str] = mapped_column(String(16))
    event_id: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(64))
    payment_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    received_at: Mapped[Timestamp]
