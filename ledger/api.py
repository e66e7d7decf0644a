"""The ledger's public operations: one place to read what the ledger can do.

Every function takes a `Session` and never commits; the caller owns the transaction
(`with Session() as s, s.begin(): ...`). Amounts are decimal strings in, decimal
strings out; times are aware UTC datetimes. Each mutating operation locks exactly
one customer account row.

Other packages read and change money only through this module (and format or parse
amounts at their edge with `ledger.money`); tests/test_boundaries.py keeps it so.
Readers that price many things at once get the pricing rules as values: a
`PriceTable` (the price in force), `rate_of` (a GPU mix), `charge_for` (seconds at a
rate, rounded once), `Estimate` (a quote), and the job_submit `Snapshot`. Amounts in
those are `int` micro-credits, named `*_ucredits`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

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
from ledger.books import accounts as _accounts
from ledger.books import grants as _grants
from ledger.books import idempotency
from ledger.books import payments as _payments
from ledger.books.accounts import (
    account_names,
    check_name,
    ensure_account,
    lock_account,
    lock_account_by_id,
    lock_accounts,
)
from ledger.books.audit import verify
from ledger.books.balance import account_summary, balance
from ledger.books.checkpoints import CHECKPOINT_EVERY, checkpoint_balances
from ledger.books.credit_use import CreditUse, credit_use, parse_share
from ledger.books.grants import DEFAULT_PRIORITY
from ledger.books.journal import REVENUE, Leg, LockedAccount, entries_page, post
from ledger.books.payments import (
    cancel_payment,
    find_payment,
    get_payment,
    list_payments,
    mark_paid,
    set_external_id,
)
from ledger.errors import InvalidInput, NotFound
from ledger.holds.accrual import ACCRUES_NOW, Accrual, accruals, cost_so_far, seconds_run, set_accrual
from ledger.holds.adjustments import Adjustment, adjust_hold, adjust_holds, adjust_holds_many
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
from ledger.holds.expire import expire_holds
from ledger.holds.leases import Renewal, lease_needs_renewal, lease_overspend_bound, renew_leases
from ledger.holds.overruns import CapOverrun, capped_accounts, daily_cap_overruns
from ledger.holds.request import DEFAULT_GRACE_SECONDS
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
from ledger.limits import caps as _caps
from ledger.limits.caps import show_limits
from ledger.money import charge_for, format_credits, parse_credits
from ledger.pricing.prices import (
    PriceTable,
    format_gpus,
    list_prices,
    load_price_table,
    parse_gpus,
    price_versions,
    rate_of,
    set_price,
)
from ledger.pricing.quotes import Estimate, estimate, quote
from ledger.pricing.routing import (
    CostLimit,
    PartitionOption,
    Route,
    RoutingConfig,
    candidate_partitions,
    route,
)
from ledger.pricing.snapshot import Snapshot, SnapshotKeeper
from ledger.store.models import UNKNOWN_SUBMIT
from ledger.store.tables import entries_t, holds_t
from ledger.timeutil import format_time, parse_seconds, utcnow
from ledger.views.charge_counter import ChargeCounter, ChargeTotals
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
    "UNKNOWN_SUBMIT",
    "AccountEnforcement",
    "AccountTotals",
    "Accrual",
    "ActiveRun",
    "Adjustment",
    "Block",
    "CapOverrun",
    "ChargeCounter",
    "ChargeTotals",
    "CostLimit",
    "CreditUse",
    "Estimate",
    "FairnessInputs",
    "HoldState",
    "JobRecord",
    "LockedAccount",
    "LockedBatch",
    "MemberEnforcement",
    "OutageBound",
    "OutageConfig",
    "PartitionOption",
    "PriceTable",
    "Renewal",
    "Route",
    "RoutingConfig",
    "RunningTotals",
    "Snapshot",
    "SnapshotKeeper",
    "TokenInfo",
    "UnreservedRun",
    "UsageDelta",
    "account_names",
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
    "apply_holds_and_settles",
    "authenticate_token",
    "balance",
    "cancel_payment",
    "candidate_partitions",
    "capped_accounts",
    "charge_entries",
    "charge_for",
    "charge_usage",
    "checkpoint_balances",
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
    "entries_t",
    "estimate",
    "fairness_inputs",
    "find_active_hold",
    "find_active_holds",
    "find_hold",
    "find_job_holds",
    "find_payment",
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
    "open_payment",
    "outage_prices",
    "parse_outage",
    "parse_share",
    "portal_user",
    "price_versions",
    "quote",
    "rate_of",
    "record_unreserved_run",
    "record_unreserved_runs",
    "release",
    "release_hold",
    "renew_leases",
    "reserve",
    "revoke_token",
    "roles_of",
    "route",
    "running_totals",
    "seconds_run",
    "set_accrual",
    "set_external_id",
    "set_limits",
    "set_portal_user",
    "set_price",
    "settle",
    "settle_hold",
    "settle_holds",
    "show_limits",
    "sweep",
    "topup",
    "usage_report",
    "verify",
]


def members(s: Session, account: str) -> list[str]:
    """The users who may charge `account`, by name."""
    return _accounts.members(s, _accounts.read_account(s, account).id)


def journal_entries(
    s: Session, account: str, *, before_id: int | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """One page of `account`'s journal, newest first, with postings (the audit view)."""
    return entries_page(s, _accounts.read_account(s, account).id, before_id=before_id, limit=limit)


def open_payment(
    s: Session,
    account: str,
    amount: str,
    *,
    provider: str,
    requested_by: str,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Credit bought but not yet paid (not spendable): `mark_paid` turns it into a top-up."""
    return _payments.open_payment(
        s,
        account,
        parse_credits(amount),
        provider=provider,
        requested_by=requested_by,
        idempotency_key=idempotency_key,
    )


def topup(
    s: Session,
    account: str,
    amount: str,
    *,
    effective_at: datetime | None = None,
    expires_at: datetime | None = None,
    reference: str | None = None,
    idempotency_key: str | None = None,
    at: datetime | None = None,
) -> dict[str, Any]:
    """Paid credit; visible at once; pays recorded debt first."""
    acct = lock_account(s, account)
    return _grants.create_grant(
        s,
        acct,
        parse_credits(amount),
        source="topup",
        effective_at=effective_at,
        expires_at=expires_at,
        reference=reference,
        idempotency_key=idempotency_key,
        at=at,
    )


def grant(
    s: Session,
    account: str,
    amount: str,
    *,
    effective_at: datetime | None = None,
    expires_at: datetime | None = None,
    priority: int = DEFAULT_PRIORITY,
    reference: str | None = None,
    idempotency_key: str | None = None,
    at: datetime | None = None,
) -> dict[str, Any]:
    """Promotional or allocated credit, optionally time-windowed."""
    acct = lock_account(s, account)
    return _grants.create_grant(
        s,
        acct,
        parse_credits(amount),
        source="grant",
        effective_at=effective_at,
        expires_at=expires_at,
        priority=priority,
        reference=reference,
        idempotency_key=idempotency_key,
        at=at,
    )


def consume(
    s: Session,
    account: str,
    amount: str,
    *,
    at: datetime | None = None,
    user: str | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    acct = lock_account(s, account)
    return _grants.consume(s, acct, parse_credits(amount), at=at, user=user, idempotency_key=idempotency_key)


def adjust(
    s: Session,
    account: str,
    amount: str,
    *,
    links_entry_id: int,
    reason: str = "",
    at: datetime | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Post a signed correction linked to an earlier charge (repeat-safe with a key)."""
    delta = parse_credits(amount, field="amount", allow_negative=True)
    acct = lock_account(s, account)
    request = {
        "amount": delta,
        "links_entry_id": links_entry_id,
        "reason": reason,
        "at": format_time(at) if at else None,
    }
    first = idempotency.replay(s, acct.id, idempotency_key, "adjust", request)
    if first is not None:
        return first
    result = _adjust(s, acct, delta, links_entry_id, reason, at or utcnow())
    idempotency.remember(s, acct.id, idempotency_key, "adjust", request, result)
    return result


def _adjust(
    s: Session, acct: LockedAccount, delta: int, links_entry_id: int, reason: str, at: datetime
) -> dict[str, Any]:
    """A correction of a job run's charge goes through its hold (so refunds return to the
    grants the run drew from); any other correction charges free credit (else debt) or
    refunds as a new grant."""
    account = acct.name
    linked = s.execute(
        select(entries_t.c.id, entries_t.c.account_id, entries_t.c.hold_id).where(
            entries_t.c.id == links_entry_id
        )
    ).first()
    if linked is None or linked.account_id != acct.id:
        raise NotFound(
            f"entry {links_entry_id} of account {account} does not exist",
            details={"entry_id": links_entry_id, "account": account},
        )
    if linked.hold_id is not None:
        hold = get_hold(s, linked.hold_id)
        target = hold.charged_ucredits + delta
        if target < 0:
            raise InvalidInput(
                f"a refund of {format_credits(-delta)} exceeds the "
                f"{format_credits(hold.charged_ucredits)} this run was charged",
                code="invalid_amount",
            )
        hold = adjust_hold(s, hold.id, target, at=at, reason=reason, links_entry_id=links_entry_id)
        return {
            "account": account,
            "adjustment": format_credits(delta),
            "hold": hold.as_dict(),
            "links_entry_id": links_entry_id,
        }
    if delta > 0:
        grants = _grants.load_grants(s, acct.id)
        legs: list[Leg] = []
        short = _grants.take_free(grants, acct, delta, at, None, legs)
        if short:
            legs.append(Leg(acct.id, -short, "debt"))
        legs.append(Leg(REVENUE, delta))
        entry = post(
            s,
            acct,
            "adjust",
            at,
            legs,
            links_entry_id=links_entry_id,
            memo={"reason": reason} if reason else None,
        )
        _grants.save_grants(s, grants)
        return {
            "account": account,
            "adjustment": format_credits(delta),
            "entry_id": entry.id,
            "links_entry_id": links_entry_id,
        }
    result = _grants.create_grant(s, acct, -delta, source="refund", at=at, links_entry_id=links_entry_id)
    return {
        "account": account,
        "adjustment": format_credits(delta),
        "entry_id": result["entry_id"],
        "links_entry_id": links_entry_id,
        "grant": result["grant"],
    }


def sweep(
    s: Session, account: str, at: datetime | None = None, *, idempotency_key: str | None = None
) -> dict[str, Any]:
    """Expire holds past time limit + grace, post expired grant credit and pay debt from
    active credit, for one account. A repeat of a keyed sweep returns its first result."""
    scope = lock_account(s, account).id
    request = {"at": format_time(at)}
    first = idempotency.replay(s, scope, idempotency_key, "sweep", request)
    if first is not None:
        return first
    at = at or utcnow()
    expired_holds = expire_holds(s, account, at)
    acct = lock_account(s, account)
    expired = _grants.expire_grants(s, acct, at)
    paid = _grants.pay_debt(s, acct, at)
    result = {
        "account": account,
        "at": format_time(at),
        "expired_holds": expired_holds,
        "expired_credits": format_credits(expired),
        "debt_paid": format_credits(paid),
    }
    idempotency.remember(s, scope, idempotency_key, "sweep", request, result)
    return result


# -- repeat-safe forms for the CLI and HTTP: a key makes a repeat return the first result --


def create_account(
    s: Session, name: str, *, at: datetime | None = None, idempotency_key: str | None = None
) -> dict[str, Any]:
    """A customer account. It locks no customer account yet, so its key is global."""
    request = {"name": name, "at": format_time(at)}
    return idempotency.once(
        s,
        idempotency.GLOBAL_SCOPE,
        idempotency_key,
        "account_create",
        request,
        lambda: _accounts.create_account(s, name, at=at),
    )


def add_member(
    s: Session, user: str, account: str, *, role: str = "member", idempotency_key: str | None = None
) -> dict[str, Any]:
    """Let `user` charge `account`; a `manager` (PI) also manages its members, limits and top-ups."""
    check_name(user, "user")
    scope = lock_account(s, account).id
    body = {"user": user} if role == "member" else {"user": user, "role": role}
    return idempotency.once(
        s, scope, idempotency_key, "user_add", body, lambda: _accounts.add_member(s, user, account, role)
    )


def set_limits(
    s: Session,
    account: str,
    *,
    user: str | None = None,
    max_gpus: int | None = None,
    max_rate: str | None = None,
    daily_cap: str | None = None,
    clear: bool = False,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Set the given caps (others unchanged; `clear` removes all caps first). A repeat of a
    keyed request returns the caps as the first one left them."""
    scope = lock_account(s, account).id
    request = {
        "user": user,
        "max_gpus": max_gpus,
        "max_rate": None if max_rate is None else parse_credits(max_rate, field="max_rate", allow_zero=True),
        "daily_cap": None
        if daily_cap is None
        else parse_credits(daily_cap, field="daily_cap", allow_zero=True),
        "clear": clear,
    }
    return idempotency.once(
        s,
        scope,
        idempotency_key,
        "limits_set",
        request,
        lambda: _caps.set_limits(
            s, account, user=user, max_gpus=max_gpus, max_rate=max_rate, daily_cap=daily_cap, clear=clear
        ),
    )


def reserve(
    s: Session,
    account: str,
    *,
    user: str,
    job_id: int,
    gpus: str | dict[str, int],
    seconds: int | str,
    cluster: str = "default",
    run: int = 0,
    partition: str | None = None,
    at: datetime | None = None,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
    submitted_at: datetime | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """`create_hold` as a dict; with a key, a repeat returns the hold as first created."""
    check_name(user, "user")
    request = {
        "user": user,
        "job_id": job_id,
        "cluster": cluster,
        "run": run,
        "gpus": format_gpus(parse_gpus(gpus)),
        "seconds": parse_seconds(seconds, field="seconds"),
        "partition": partition,
        "at": format_time(at),
        "grace_seconds": grace_seconds,
        "submitted_at": format_time(submitted_at),
    }
    scope = lock_account(s, account).id
    return idempotency.once(
        s,
        scope,
        idempotency_key,
        "hold_create",
        request,
        lambda: create_hold(
            s,
            account,
            user=user,
            job_id=job_id,
            gpus=gpus,
            seconds=seconds,
            cluster=cluster,
            run=run,
            partition=partition,
            at=at,
            grace_seconds=grace_seconds,
            submitted_at=submitted_at,
        ).as_dict(),
    )


def charge_usage(
    s: Session,
    hold_id: int,
    elapsed_seconds: int | str,
    *,
    at: datetime | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """`hold_usage` as a dict; with a key, a repeat returns the hold as first charged."""
    elapsed = parse_seconds(elapsed_seconds, field="elapsed")
    request = {"hold_id": hold_id, "elapsed": elapsed, "at": format_time(at)}
    return idempotency.once(
        s,
        _hold_scope(s, hold_id),
        idempotency_key,
        "hold_usage",
        request,
        lambda: hold_usage(s, hold_id, elapsed, at).as_dict(),
    )


def settle(
    s: Session,
    hold_id: int,
    elapsed_seconds: int | str,
    *,
    at: datetime | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """`settle_hold` as a dict; with a key, a repeat returns the hold as first settled."""
    elapsed = parse_seconds(elapsed_seconds, field="elapsed")
    request = {"hold_id": hold_id, "elapsed": elapsed, "at": format_time(at)}
    return idempotency.once(
        s,
        _hold_scope(s, hold_id),
        idempotency_key,
        "hold_settle",
        request,
        lambda: settle_hold(s, hold_id, elapsed, at).as_dict(),
    )


def release(
    s: Session, hold_id: int, *, at: datetime | None = None, idempotency_key: str | None = None
) -> dict[str, Any]:
    """`release_hold` as a dict; with a key, a repeat returns the hold as first released."""
    request = {"hold_id": hold_id, "at": format_time(at)}
    return idempotency.once(
        s,
        _hold_scope(s, hold_id),
        idempotency_key,
        "hold_release",
        request,
        lambda: release_hold(s, hold_id, at).as_dict(),
    )


def _hold_scope(s: Session, hold_id: int) -> int:
    """Lock the account that owns the hold (the key's scope) and return its id."""
    owner = select(holds_t.c.account_id).where(holds_t.c.id == hold_id).scalar_subquery()
    account = lock_account_by_id(s, owner)
    if account is None:
        raise NotFound(f"hold {hold_id} does not exist", details={"hold_id": hold_id})
    return account.id
