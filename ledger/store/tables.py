"""Every table as a Core `Table`, defined once: the names the ledger's SQL is written in.

The mapped classes (ledger.store.models) declare the schema; the ledger's statements
(locks, grouped sums, bulk writes, lean reads) are Core, over these. A `*_t` name stays
inside the ledger: other packages read and change money through `ledger.api`
(tests/architecture/test_boundaries.py).

    accounts_t        customer and system accounts, each with its journal's head
    members_t         who may charge an account, and who manages it
    limits_t          caps per account or per user in it
    prices_t          versioned prices per GPU type (and partition)
    grants_t          credit an account may spend in a window (a top-up is a grant)
    holds_t           one reservation per job run attempt
    allocations_t     what a hold earmarked and drew on each grant
    entries_t         the journal: append-only, hash-chained per account
    postings_t        an entry's signed amounts; they sum to zero
    checkpoints_t     balance checkpoints (ledger.books.checkpoints)
    idempotency_keys_t  the first result of each keyed request
    job_runs_t        Slurm's records of job runs, as the bridge reconciled them
    cursors_t         where the bridge's incremental readers stopped
    gpu_usage_t       what NVML measured per run, node and GPU type
    portal_users_t    portal logins
    tokens_t          API tokens (their hashes)
    spent_credentials_t  MUNGE credentials the portal accepted, until they expire
    retry_policies_t  jobs' retry policies, kept when the portal submitted them
    retries_t         each retry the daemon decided, one per failed run
    job_data_t        paths jobs asked to have staged to their cloud nodes
    stagings_t        each stage-in a node's Prolog made of them
    payments_t        credit bought, pending until paid
    payment_events_t  each payment provider event, once
    pools_t           parents sharing their credit with their children
    pool_loans_t      credit a child borrowed from its parent's grants, and what went back
"""

from __future__ import annotations

from ledger.store.models import (
    Account,
    ApiToken,
    BalanceCheckpoint,
    Cursor,
    Entry,
    GpuUsage,
    Grant,
    Hold,
    HoldAllocation,
    IdempotencyKey,
    JobData,
    JobRun,
    Limit,
    Member,
    Payment,
    PaymentEvent,
    Pool,
    PoolLoan,
    PortalUser,
    Posting,
    Price,
    Retry,
    RetryPolicy,
    SpentCredential,
    Staging,
    table_of,
)

accounts_t = table_of(Account)
members_t = table_of(Member)
limits_t = table_of(Limit)
prices_t = table_of(Price)
grants_t = table_of(Grant)
holds_t = table_of(Hold)
allocations_t = table_of(HoldAllocation)
entries_t = table_of(Entry)
postings_t = table_of(Posting)
checkpoints_t = table_of(BalanceCheckpoint)
idempotency_keys_t = table_of(IdempotencyKey)
job_runs_t = table_of(JobRun)
cursors_t = table_of(Cursor)
gpu_usage_t = table_of(GpuUsage)
portal_users_t = table_of(PortalUser)
tokens_t = table_of(ApiToken)
spent_credentials_t = table_of(SpentCredential)
retry_policies_t = table_of(RetryPolicy)
retries_t = table_of(Retry)
job_data_t = table_of(JobData)
stagings_t = table_of(Staging)
payments_t = table_of(Payment)
payment_events_t = table_of(PaymentEvent)
pools_t = table_of(Pool)
pool_loans_t = table_of(PoolLoan)
