"""The ledger's public surface: every read and change of money, one name per act.

Other packages read and change money only through this module (and format or parse
amounts at their edge with `ledger.money`); tests/architecture/test_boundaries.py keeps it so. It
only re-exports: each name lives in the sub-package the part names, where its rules are.

Every function takes a SQLAlchemy `Session` and never commits; the caller owns the
transaction (`with Session() as s, s.begin(): ...`). Amounts are decimal strings in
and out, or `int` micro-credits in values whose names end in `_ucredits`; times are
aware UTC datetimes. An act that changes money locks the customer account it changes
before it reads it (one account: the batch operations below lock several), so two
acts on one account run one after the other.

Acts return records (dicts as the CLI and the HTTP API print them) and take an
`idempotency_key=`: a repeat returns the first record, another request under the key is
`idempotency_conflict`. The hold acts are the exception, because the daemon, the bridge
and the meter need the hold itself: they return a `HoldState` (its `as_dict()` is the
record), and a repeat of a hold request is known by its run. Their keyed forms, for the
CLI and the HTTP API, are the part `keyed`, under the same names.

The parts, and the sub-package each lives in:

    keyed requests (books) first_result, keep_result: idempotency keys for a request the
                           ledger does not perform (a job submitted through the API)
    accounts (books)       create_account, ensure_account, account_names, add_member,
                           members, member_roles (access), memberships (views)
    transfers (books)      transfer: available credit from one account to another
    pools (books)          set_pool, pool_settings, pool_uses, room_for, Pool, Room: a
                           parent's credit lent to its children's holds
    tree (books)           account_parents, set_parent, set_parents, subtree, ancestors,
                           children_of, tree_order, check_tree: Slurm's account tree
    credit (books)         topup, grant, consume, balance, account_summary, credit_use,
                           parse_share, CreditUse, checkpoint_balances, CHECKPOINT_EVERY
    payments (books)       open_payment, mark_paid, cancel_payment, set_external_id,
                           get_payment, find_payment, list_payments
    limits (limits)        set_limits, show_limits
    prices (pricing)       set_price, list_prices, price_versions, load_price_table,
                           PriceTable, rate_of, charge_for (ledger.money), quote,
                           estimate, Estimate
    routing (pricing)      route, candidate_partitions, Route, RoutingConfig, CostLimit,
                           PartitionOption, route_quote (the placement, from the database)
    cloud budget (pricing) cloud_spend, cloud_budget_breach, CloudSpend, CloudBudgetScope:
                           an account's cloud spend this month against its budget
    job_submit (pricing)   Snapshot, SnapshotKeeper: the picture job_submit is answered from;
                           cap_refusal: the cap it refuses a job for, read now
    holds (holds)          create_hold(s, HoldRequest(...)), hold_usage, settle_hold,
                           release_hold, adjust_hold, hold_refusal, record_unreserved_run,
                           HoldRequest, HoldState, HoldStatus and UNKNOWN_SUBMIT (store);
                           get_hold, find_hold, find_active_hold, find_job_holds,
                           list_holds, holds_page, list_active_runs, ActiveRun
    keyed (holds)          keyed.create_hold, keyed.hold_usage, keyed.settle_hold,
                           keyed.release_hold: the hold acts' records, repeat-safe by key
    corrections (holds)    adjust (linked to an entry), sweep (expiry and debt)
    running jobs (holds)   cost_so_far, seconds_run, accruals, Accrual, set_accrual,
                           ACCRUES_NOW, daily_cap_overruns, capped_accounts, CapOverrun,
                           lease_needs_renewal, lease_overspend_bound
    outages (holds)        current_outage_bound, outage_prices, parse_outage,
                           OutageBound, OutageConfig
    reads (views)          usage_report, job_history, job_record, hold_entries,
                           charge_entries, running_totals, JobRecord, RunningTotals,
                           efficiency_report, add_gpu_usage, UsageDelta, account_totals,
                           AccountTotals, fairness_inputs, FairnessInputs, enforcement,
                           AccountEnforcement, MemberEnforcement, Block, ChargeCounter,
                           ChargeTotals
    cloud bill (views)     cloud_report, month_bounds, InstanceSpan, CloudReport,
                           CloudReportRow, CLOUD_REPORT_COLUMNS: a month's instance cost
                           beside the credits charged to the jobs on them
    audit (books)          verify, journal_entries
    access (access)        set_portal_user, portal_user, end_portal_sessions, roles_of,
                           create_token, authenticate_token, list_tokens, revoke_token,
                           TokenInfo; spend_credential (a MUNGE credential, once),
                           request_payload, read_request_payload, BoundRequest
                           (the request a credential is made for)

Batch operations: lock_batch, LockedBatch, create_holds, settle_holds,
apply_holds_and_settles, find_active_holds, active_holds_among, create_holds_together,
hold_usage_many, renew_leases, Renewal, adjust_holds, adjust_holds_many, Adjustment,
record_unreserved_runs, UnreservedRun, lock_accounts. They follow exactly the rules of
the one-at-a-time acts, and lock several accounts, always in id order (so two batches
never wait on each other in opposite orders), only to share one commit: the daemon's
group commit, the meter's tick, the sacct bridge's rounds.
"""

from __future__ import annotations

from ledger.access.credentials import (
    BoundRequest,
    read_request_payload,
    request_payload,
    spend_credential,
)
from ledger.access.identity import (
    TokenInfo,
    authenticate_token,
    create_token,
    end_portal_sessions,
    list_tokens,
    member_roles,
    portal_user,
    revoke_token,
    roles_of,
    set_portal_user,
)
from ledger.books.accounts import (
    account_names,
    add_member,
    create_account,
    ensure_account,
    lock_accounts,
    members,
)
from ledger.books.audit import journal_entries, verify
from ledger.books.balance import account_summary, balance
from ledger.books.checkpoints import CHECKPOINT_EVERY, checkpoint_balances
from ledger.books.credit_use import CreditUse, credit_use, parse_share
from ledger.books.grants import consume, grant, topup
from ledger.books.keyed_requests import first_result, keep_result
from ledger.books.payments import (
    cancel_payment,
    find_payment,
    get_payment,
    list_payments,
    mark_paid,
    open_payment,
    set_external_id,
)
from ledger.books.pools import Pool, Room, pool_settings, pool_uses, room_for, set_pool
from ledger.books.transfers import transfer
from ledger.books.tree import (
    account_parents,
    ancestors,
    check_tree,
    children_of,
    set_parent,
    set_parents,
    subtree,
    tree_order,
)
from ledger.holds import keyed
from ledger.holds.accrual import ACCRUES_NOW, Accrual, accruals, cost_so_far, seconds_run, set_accrual
from ledger.holds.adjustments import Adjustment, adjust, adjust_hold, adjust_holds, adjust_holds_many
from ledger.holds.batch import (
    LockedBatch,
    active_holds_among,
    apply_holds_and_settles,
    create_holds,
    find_active_holds,
    lock_batch,
    settle_holds,
)
from ledger.holds.bounds import OutageBound, OutageConfig, current_outage_bound, outage_prices, parse_outage
from ledger.holds.create import create_hold, create_holds_together, hold_refusal
from ledger.holds.expire import sweep
from ledger.holds.leases import Renewal, lease_needs_renewal, lease_overspend_bound, renew_leases
from ledger.holds.overruns import CapOverrun, capped_accounts, daily_cap_overruns
from ledger.holds.request import HoldRequest
from ledger.holds.resolve import release_hold, settle_hold
from ledger.holds.state import (
    ActiveRun,
    HoldState,
    find_active_hold,
    find_hold,
    find_job_holds,
    get_hold,
    holds_page,
    list_active_runs,
    list_holds,
)
from ledger.holds.unreserved import UnreservedRun, record_unreserved_run, record_unreserved_runs
from ledger.holds.usage import hold_usage, hold_usage_many
from ledger.limits.caps import set_limits, show_limits
from ledger.money import charge_for
from ledger.pricing.cloud_budget import CloudBudgetScope, CloudSpend, cloud_budget_breach, cloud_spend
from ledger.pricing.prices import (
    PriceTable,
    list_prices,
    load_price_table,
    price_versions,
    rate_of,
    set_price,
)
from ledger.pricing.quotes import Estimate, estimate, quote
from ledger.pricing.route_quote import route_quote
from ledger.pricing.routing import (
    CostLimit,
    PartitionOption,
    Route,
    RoutingConfig,
    candidate_partitions,
    route,
)
from ledger.pricing.snapshot import Snapshot, SnapshotKeeper, cap_refusal
from ledger.store.models import UNKNOWN_SUBMIT, HoldStatus
from ledger.views.charge_counter import ChargeCounter, ChargeTotals
from ledger.views.cloud_report import COLUMNS as CLOUD_REPORT_COLUMNS
from ledger.views.cloud_report import CloudReport, CloudReportRow, InstanceSpan, cloud_report, month_bounds
from ledger.views.efficiency import UsageDelta, add_gpu_usage, efficiency_report
from ledger.views.enforcement import AccountEnforcement, Block, MemberEnforcement, enforcement
from ledger.views.fairness_inputs import FairnessInputs, fairness_inputs
from ledger.views.history import (
    JobRecord,
    RunningTotals,
    charge_entries,
    hold_entries,
    job_history,
    job_record,
    running_totals,
)
from ledger.views.reports import usage_report
from ledger.views.totals import AccountTotals, account_totals, memberships

__all__ = [
    "ACCRUES_NOW",
    "CHECKPOINT_EVERY",
    "CLOUD_REPORT_COLUMNS",
    "UNKNOWN_SUBMIT",
    "AccountEnforcement",
    "AccountTotals",
    "Accrual",
    "ActiveRun",
    "Adjustment",
    "Block",
    "BoundRequest",
    "CapOverrun",
    "ChargeCounter",
    "ChargeTotals",
    "CloudBudgetScope",
    "CloudReport",
    "CloudReportRow",
    "CloudSpend",
    "CostLimit",
    "CreditUse",
    "Estimate",
    "FairnessInputs",
    "HoldRequest",
    "HoldState",
    "HoldStatus",
    "InstanceSpan",
    "JobRecord",
    "LockedBatch",
    "MemberEnforcement",
    "OutageBound",
    "OutageConfig",
    "PartitionOption",
    "Pool",
    "PriceTable",
    "Renewal",
    "Room",
    "Route",
    "RoutingConfig",
    "RunningTotals",
    "Snapshot",
    "SnapshotKeeper",
    "TokenInfo",
    "UnreservedRun",
    "UsageDelta",
    "account_names",
    "account_parents",
    "account_summary",
    "account_totals",
    "accruals",
    "active_holds_among",
    "add_gpu_usage",
    "add_member",
    "adjust",
    "adjust_hold",
    "adjust_holds",
    "adjust_holds_many",
    "ancestors",
    "apply_holds_and_settles",
    "authenticate_token",
    "balance",
    "cancel_payment",
    "candidate_partitions",
    "cap_refusal",
    "capped_accounts",
    "charge_entries",
    "charge_for",
    "check_tree",
    "checkpoint_balances",
    "children_of",
    "cloud_budget_breach",
    "cloud_report",
    "cloud_spend",
    "consume",
    "cost_so_far",
    "create_account",
    "create_hold",
    "create_holds",
    "create_holds_together",
    "create_token",
    "credit_use",
    "current_outage_bound",
    "daily_cap_overruns",
    "efficiency_report",
    "end_portal_sessions",
    "enforcement",
    "ensure_account",
    "estimate",
    "fairness_inputs",
    "find_active_hold",
    "find_active_holds",
    "find_hold",
    "find_job_holds",
    "find_payment",
    "first_result",
    "get_hold",
    "get_payment",
    "grant",
    "hold_entries",
    "hold_refusal",
    "hold_usage",
    "hold_usage_many",
    "holds_page",
    "job_history",
    "job_record",
    "journal_entries",
    "keep_result",
    "keyed",
    "lease_needs_renewal",
    "lease_overspend_bound",
    "list_active_runs",
    "list_holds",
    "list_payments",
    "list_prices",
    "list_tokens",
    "load_price_table",
    "lock_accounts",
    "lock_batch",
    "mark_paid",
    "member_roles",
    "members",
    "memberships",
    "month_bounds",
    "open_payment",
    "outage_prices",
    "parse_outage",
    "parse_share",
    "pool_settings",
    "pool_uses",
    "portal_user",
    "price_versions",
    "quote",
    "rate_of",
    "read_request_payload",
    "record_unreserved_run",
    "record_unreserved_runs",
    "release_hold",
    "renew_leases",
    "request_payload",
    "revoke_token",
    "roles_of",
    "room_for",
    "route",
    "route_quote",
    "running_totals",
    "seconds_run",
    "set_accrual",
    "set_external_id",
    "set_limits",
    "set_parent",
    "set_parents",
    "set_pool",
    "set_portal_user",
    "set_price",
    "settle_hold",
    "settle_holds",
    "show_limits",
    "spend_credential",
    "subtree",
    "sweep",
    "topup",
    "transfer",
    "tree_order",
    "usage_report",
    "verify",
]
