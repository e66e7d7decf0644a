"""The ledger's commands in the `gpucredit` CLI (docs/design.md §5.1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from ledger.cli_support import (
    at_option,
    emit,
    engine_for,
    format_option,
    key_option,
    ledger_command,
    parse_time_option,
    transaction,
)
from ledger.timeutil import parse_slurm_duration, utcnow

if TYPE_CHECKING:
    from ledger.views.enforcement import AccountEnforcement

HOLD_COLUMNS = [
    "id",
    "account",
    "user",
    "cluster",
    "job_id",
    "run",
    "state",
    "gpus",
    "amount",
    "charged",
    "expires_at",
]


def _emit_balance(result: dict[str, Any], fmt: str, notes: list[str] | None = None) -> None:
    if fmt != "table":
        emit(
            result if fmt == "json" else result["grants"],
            fmt,
            None
            if fmt == "json"
            else ["id", "source", "amount", "remaining", "effective_at", "expires_at", "priority"],
        )
        return
    click.echo(
        f"account {result['account']} at {result['at']}: available {result['available']}, "
        f"held {result['held']}" + (f", debt {result['debt']}" if result["debt"] != "0.00" else "")
    )
    for note in notes or []:
        click.echo(note)
    emit(
        result["grants"],
        fmt,
        ["id", "source", "amount", "remaining", "effective_at", "expires_at", "priority"],
    )


@click.command("init")
@ledger_command
def init_command() -> None:
    """Create or upgrade the database."""
    from ledger.store.schema import upgrade

    engine = engine_for()
    revision = upgrade(engine)
    click.echo(f"database {engine.url.render_as_string(hide_password=True)} at revision {revision}")


@click.group("account")
def account_group() -> None:
    """Customer accounts (mirroring Slurm accounts)."""


@account_group.command("create")
@click.argument("name")
@click.option("--parent", default=None, help="The parent account in Slurm's tree (default: top level).")
@at_option
@key_option
@ledger_command
def account_create(name: str, parent: str | None, at: str | None, idempotency_key: str | None) -> None:
    from ledger import api

    with transaction() as s:
        api.create_account(
            s, name, parent=parent, at=parse_time_option(at, "at"), idempotency_key=idempotency_key
        )
    click.echo(f"account {name} created" + (f" under {parent}" if parent else ""))


@account_group.command("set-parent")
@click.argument("name")
@click.argument("parent", required=False)
@key_option
@ledger_command
def account_set_parent(name: str, parent: str | None, idempotency_key: str | None) -> None:
    """Move NAME (with its subtree) under PARENT; without PARENT, to the top level."""
    from ledger import api

    with transaction() as s:
        result = api.set_parent(s, name, parent, idempotency_key=idempotency_key)
    where = f"under {parent}" if parent else "at the top level"
    click.echo(f"account {name} {'now' if result['changed'] else 'already'} {where}")


@account_group.command("pool")
@click.argument("parent")
@click.argument("state", type=click.Choice(["on", "off"]))
@click.option("--child-cap", default=None, help="the most of PARENT's credit each child may use (credits)")
@key_option
@ledger_command
def account_pool(parent: str, state: str, child_cap: str | None, idempotency_key: str | None) -> None:
    """Share PARENT's credit with its children (on) or stop (off): a child's job draws on
    it once the child's own credit is used, each child up to --child-cap."""
    from ledger import api

    with transaction() as s:
        result = api.set_pool(s, parent, state == "on", child_cap, idempotency_key=idempotency_key)
    cap = f", each child up to {result['child_cap']} credits" if result["child_cap"] else ""
    children = ", ".join(result["children"]) or "none yet"
    click.echo(f"pool of {parent} {result['pool']}{cap} (children: {children})")


@account_group.command("tree")
@click.argument("name", required=False)
@format_option
@ledger_command
def account_tree(name: str | None, fmt: str) -> None:
    """The account tree (or NAME's subtree) with each account's own credit."""
    from ledger import api
    from ledger.errors import NotFound

    with transaction() as s:
        parents = api.account_parents(s)
        if name is not None and name not in parents:
            raise NotFound(f"account {name!r} does not exist", details={"account": name})
        wanted = None if name is None else set(api.subtree(parents, name))
        pools = api.pool_settings(s)
        rows = []
        for account, depth in api.tree_order(parents):
            if wanted is not None and account not in wanted:
                continue
            b = api.balance(s, account)
            rows.append(
                {
                    "account": "  " * depth + account if fmt == "table" else account,
                    "parent": parents[account],
                    "available": b["available"],
                    "held": b["held"],
                    "pool": _pool_text(pools.get(account)),
                }
            )
    emit(rows, fmt, ["account", "parent", "available", "held", "pool"])


def _pool_text(pool: Any) -> str | None:
    """A pool as the tree shows it: None (none), "on", or "on, child cap 20.00"."""
    if pool is None:
        return None
    from ledger.money import format_credits

    cap = pool.child_cap_ucredits
    return "on" if cap is None else f"on, child cap {format_credits(cap)}"


@account_group.command("list")
@format_option
@ledger_command
def account_list(fmt: str) -> None:
    from ledger import api

    with transaction() as s:
        rows = []
        for name in api.account_names(s):
            b = api.balance(s, name)
            rows.append({"account": name, "available": b["available"], "held": b["held"], "debt": b["debt"]})
    emit(rows, fmt)


@account_group.command("show")
@click.argument("name")
@format_option
@ledger_command
def account_show(name: str, fmt: str) -> None:
    from ledger import api

    with transaction() as s:
        summary = api.account_summary(s, name)
    _emit_balance(summary, fmt)


@click.group("user")
def user_group() -> None:
    """Members of accounts."""


@user_group.command("add")
@click.argument("user")
@click.argument("account")
@click.option(
    "--role",
    type=click.Choice(["member", "manager"]),
    default="member",
    show_default=True,
    help="manager: a PI, who manages the account's members, limits and top-ups in the portal.",
)
@key_option
@ledger_command
def user_add(user: str, account: str, role: str, idempotency_key: str | None) -> None:
    """Let USER charge ACCOUNT (again: change their role)."""
    from ledger import api

    with transaction() as s:
        api.add_member(s, user, account, role=role, idempotency_key=idempotency_key)
    click.echo(f"user {user} added to {account}" + (" as manager" if role == "manager" else ""))


@click.group("price")
def price_group() -> None:
    """Credits per GPU-hour by GPU type."""


@price_group.command("set")
@click.argument("gres")
@click.argument("credits_per_gpu_hour")
@click.option("--partition", default=None)
@click.option("--effective", default=None, metavar="TIME", help="When the price takes effect.")
@key_option
@format_option
@ledger_command
def price_set(
    gres: str,
    credits_per_gpu_hour: str,
    partition: str | None,
    effective: str | None,
    idempotency_key: str | None,
    fmt: str,
) -> None:
    """A new price version from --effective (default now); earlier versions stay."""
    from ledger import api

    with transaction() as s:
        result = api.set_price(
            s,
            gres,
            credits_per_gpu_hour,
            partition=partition,
            effective_at=parse_time_option(effective, "effective"),
            idempotency_key=idempotency_key,
        )
    if result["unchanged"] and fmt == "table":
        where = f" in partition {result['partition']}" if result["partition"] else ""
        click.echo(
            f"price of {gres}{where} unchanged: {result['credits_per_gpu_hour']} credits per GPU-hour "
            f"since {result['effective_at']}; no new version",
            err=True,
        )
    emit(result if fmt == "json" else {k: v for k, v in result.items() if k != "unchanged"}, fmt)


@price_group.command("list")
@format_option
@ledger_command
def price_list(fmt: str) -> None:
    from ledger import api

    with transaction() as s:
        emit(api.list_prices(s), fmt, ["gres", "partition", "credits_per_gpu_hour", "effective_at"])


@click.group("limits")
def limits_group() -> None:
    """Caps on concurrent GPUs, spend rate and daily spend."""


@limits_group.command("set")
@click.argument("account")
@click.option("--user", default=None, help="Set the caps of one member instead of the account.")
@click.option("--max-gpus", type=int, default=None)
@click.option("--max-rate", default=None, metavar="CREDITS_PER_SECOND")
@click.option("--daily-cap", default=None, metavar="CREDITS")
@click.option("--clear", is_flag=True, help="Remove the existing caps first.")
@key_option
@format_option
@ledger_command
def limits_set(
    account: str,
    user: str | None,
    max_gpus: int | None,
    max_rate: str | None,
    daily_cap: str | None,
    clear: bool,
    idempotency_key: str | None,
    fmt: str,
) -> None:
    from ledger import api

    with transaction() as s:
        result = api.set_limits(
            s,
            account,
            user=user,
            max_gpus=max_gpus,
            max_rate=max_rate,
            daily_cap=daily_cap,
            clear=clear,
            idempotency_key=idempotency_key,
        )
    emit(result, "json" if fmt == "table" else fmt)


@limits_group.command("show")
@click.argument("account")
@format_option
@ledger_command
def limits_show(account: str, fmt: str) -> None:
    from ledger import api

    with transaction() as s:
        result = api.show_limits(s, account)
    if fmt == "json":
        emit(result, fmt)
        return
    rows = [{"scope": "account", **result["account_limits"]}]
    rows += [{"scope": f"user {u}", **lim} for u, lim in result["users"].items()]
    emit(rows, fmt, ["scope", "max_gpus", "max_rate", "daily_cap"])


def _credit_command(source: str) -> Any:
    @click.argument("account")
    @click.argument("amount")
    @click.option("--effective", default=None, metavar="TIME", help="When the credit becomes usable.")
    @click.option("--expires", default=None, metavar="TIME", help="When the unused credit expires.")
    @at_option
    @key_option
    @format_option
    @ledger_command
    def command(
        account: str,
        amount: str,
        effective: str | None,
        expires: str | None,
        at: str | None,
        idempotency_key: str | None,
        fmt: str,
        **extra: Any,
    ) -> None:
        from ledger import api

        operation = api.topup if source == "topup" else api.grant
        with transaction() as s:
            result = operation(
                s,
                account,
                amount,
                effective_at=parse_time_option(effective, "effective"),
                expires_at=parse_time_option(expires, "expires"),
                at=parse_time_option(at, "at"),
                idempotency_key=idempotency_key,
                **extra,
            )
        emit(result["grant"], fmt)

    return command


topup_command = click.command("topup", help="Add paid credit to ACCOUNT (pays debt first).")(
    click.option("--reference", default=None, help="Payment reference.")(_credit_command("topup"))
)
grant_command = click.command("grant", help="Grant credit to ACCOUNT, optionally time-windowed.")(
    click.option("--priority", type=int, default=10, show_default=True, help="Lower is spent first.")(
        _credit_command("grant")
    )
)


@click.command("consume")
@click.argument("account")
@click.argument("amount")
@click.option("--user", default=None)
@at_option
@key_option
@format_option
@ledger_command
def consume_command(
    account: str, amount: str, user: str | None, at: str | None, idempotency_key: str | None, fmt: str
) -> None:
    """Charge AMOUNT to ACCOUNT directly (no job)."""
    from ledger import api

    with transaction() as s:
        result = api.consume(
            s, account, amount, at=parse_time_option(at, "at"), user=user, idempotency_key=idempotency_key
        )
    emit(result, fmt)


@click.command("transfer")
@click.argument("from_account", metavar="FROM")
@click.argument("to_account", metavar="TO")
@click.argument("amount")
@click.option("--expires", default=None, metavar="TIME", help="Expire the moved credit no later than this.")
@at_option
@key_option
@format_option
@ledger_command
def transfer_command(
    from_account: str,
    to_account: str,
    amount: str,
    expires: str | None,
    at: str | None,
    idempotency_key: str | None,
    fmt: str,
) -> None:
    """Move AMOUNT of FROM's available credit (its burn order) to TO, keeping the earliest
    expiry of what it takes; all of it or nothing."""
    from ledger import api

    with transaction() as s:
        result = api.transfer(
            s,
            from_account,
            to_account,
            amount,
            expires_at=parse_time_option(expires, "expires"),
            at=parse_time_option(at, "at"),
            idempotency_key=idempotency_key,
        )
    if fmt == "json":
        emit(result, fmt)
        return
    if fmt == "table":
        expiry = f", expiring {result['expires_at']}" if result["expires_at"] else ""
        click.echo(f"transferred {result['amount']} from {from_account} to {to_account}{expiry}; taken:")
    emit(result["taken"], fmt, ["grant_id", "amount"])


@click.command("adjust")
@click.argument("account")
@click.argument("amount")
@click.option(
    "--links",
    "links_entry_id",
    type=int,
    required=True,
    metavar="ENTRY_ID",
    help="The journal entry this corrects.",
)
@click.option("--reason", default="")
@at_option
@key_option
@format_option
@ledger_command
def adjust_command(
    account: str,
    amount: str,
    links_entry_id: int,
    reason: str,
    at: str | None,
    idempotency_key: str | None,
    fmt: str,
) -> None:
    """Post a signed correction (+charge / -refund) linked to an earlier charge."""
    from ledger import api

    with transaction() as s:
        result = api.adjust(
            s,
            account,
            amount,
            links_entry_id=links_entry_id,
            reason=reason,
            at=parse_time_option(at, "at"),
            idempotency_key=idempotency_key,
        )
    emit(result, "json" if fmt == "table" else fmt)


@click.command("balance")
@click.argument("account", required=False)
@at_option
@format_option
@ledger_command
def balance_command(account: str | None, at: str | None, fmt: str) -> None:
    """What ACCOUNT can spend at a time, past or future (default now). Without ACCOUNT:
    one line per account of the calling user ($USER), like `sshare -U`."""
    from ledger import api

    if account is None:
        _emit_own_balances(at, fmt)
        return
    when = parse_time_option(at, "at")
    with transaction() as s:
        result = api.balance(s, account, when)
        [limits] = api.enforcement(s, when or utcnow(), [account])
    _emit_balance(result, fmt, _enforcement_notes(limits))


def _enforcement_notes(limits: AccountEnforcement) -> list[str]:
    """Blocks and GPU caps Slurm enforces for the account (docs/limits-sync.md), in words."""
    notes = [f"blocked: {block.message}; GPU jobs wait in Slurm" for block in limits.blocks]
    notes += [
        f"user {m.user} blocked: {b.message}; their GPU jobs wait" for m in limits.members for b in m.blocks
    ]
    caps = [f"account {limits.max_gpus}"] if limits.max_gpus is not None else []
    caps += [f"{m.user} {m.max_gpus}" for m in limits.members if m.max_gpus is not None]
    return notes + ([f"GPU caps: {', '.join(caps)} at once"] if caps else [])


def _emit_own_balances(at: str | None, fmt: str) -> None:
    import getpass
    import os
    import sys

    from ledger import api

    user = os.environ.get("USER") or getpass.getuser()
    when = parse_time_option(at, "at")
    with transaction() as s:
        rows = []
        for name in api.roles_of(s, user):
            found = api.balance(s, name, when)
            rows.append({"account": name, "available": found["available"], "held": found["held"]})
    if not rows:
        click.echo(
            f"error: no_account: {user} is a member of no account; name one: gpucredit balance ACCOUNT",
            err=True,
        )
        sys.exit(1)
    emit(rows, fmt, ["account", "available", "held"])


@click.command("quote")
@click.option("--account", required=True)
@click.option("--gpus", required=True, metavar="TYPE:N[,TYPE:N]")
@click.option("--time", "time_limit", required=True, metavar="[D-]HH:MM:SS")
@click.option("--partition", default=None)
@click.option("--tasks", type=click.IntRange(1, 1_000_000), default=1, help="Array tasks.")
@at_option
@format_option
@ledger_command
def quote_command(
    account: str, gpus: str, time_limit: str, partition: str | None, tasks: int, at: str | None, fmt: str
) -> None:
    """What a job would cost, and whether ACCOUNT can afford it now. Reserves nothing."""
    from ledger import api

    seconds = parse_slurm_duration(time_limit)
    with transaction() as s:
        result = api.quote(
            s, account, gpus, seconds, partition=partition, at=parse_time_option(at, "at"), tasks=tasks
        )
    emit(
        result,
        fmt,
        None
        if fmt == "json"
        else ["account", "gpus", "seconds", "tasks", "cost", "rate", "available", "affordable"],
    )


@click.group("hold")
def hold_group() -> None:
    """Reservations for job runs."""


@hold_group.command("create")
@click.argument("account")
@click.option("--user", required=True)
@click.option("--job-id", type=int, required=True)
@click.option("--cluster", default=None, help="Default: slurm.cluster from the config.")
@click.option("--run", type=int, default=0, show_default=True)
@click.option("--gpus", required=True, metavar="TYPE:N[,TYPE:N]")
@click.option("--seconds", required=True, help="Time limit in seconds.")
@click.option("--partition", default=None)
@at_option
@key_option
@format_option
@ledger_command
def hold_create(
    account: str,
    user: str,
    job_id: int,
    cluster: str | None,
    run: int,
    gpus: str,
    seconds: str,
    partition: str | None,
    at: str | None,
    idempotency_key: str | None,
    fmt: str,
) -> None:
    from ledger import api
    from ledger.config import load_config

    config = load_config()
    with transaction() as s:
        request = api.HoldRequest(
            account,
            user=user,
            job_id=job_id,
            cluster=cluster or config["slurm"]["cluster"],
            run=run,
            gpus=gpus,
            seconds=seconds,
            partition=partition,
            at=parse_time_option(at, "at"),
            grace_seconds=int(config["holds"]["grace_seconds"]),
        )
        hold = api.keyed.create_hold(s, request, idempotency_key=idempotency_key)
    emit(hold, fmt, None if fmt == "json" else HOLD_COLUMNS)


def _hold_charge(name: str, doc: str) -> Any:
    @hold_group.command(name, help=doc)
    @click.argument("hold_id", type=int)
    @click.option("--elapsed", required=True, help="Seconds the run has used.")
    @at_option
    @key_option
    @format_option
    @ledger_command
    def command(hold_id: int, elapsed: str, at: str | None, idempotency_key: str | None, fmt: str) -> None:
        from ledger import api

        operation = api.keyed.hold_usage if name == "usage" else api.keyed.settle_hold
        with transaction() as s:
            hold = operation(
                s, hold_id, elapsed, at=parse_time_option(at, "at"), idempotency_key=idempotency_key
            )
        emit(hold, fmt, None if fmt == "json" else HOLD_COLUMNS)

    return command


_hold_charge("usage", "Provisional charge for ELAPSED seconds run so far.")
_hold_charge("settle", "Final charge for ELAPSED seconds; the rest of the hold returns.")


@hold_group.command("release")
@click.argument("hold_id", type=int)
@at_option
@key_option
@format_option
@ledger_command
def hold_release(hold_id: int, at: str | None, idempotency_key: str | None, fmt: str) -> None:
    """Return the rest of a hold without a further charge."""
    from ledger import api

    with transaction() as s:
        hold = api.keyed.release_hold(
            s, hold_id, at=parse_time_option(at, "at"), idempotency_key=idempotency_key
        )
    emit(hold, fmt, None if fmt == "json" else HOLD_COLUMNS)


# HoldStatus.ALL, spelt out: the CLI builds its commands before it imports SQLAlchemy.
HOLD_STATES = ["active", "settled", "released", "expired"]


@hold_group.command("list")
@click.option("--account", default=None)
@click.option("--state", type=click.Choice(HOLD_STATES), default=None)
@format_option
@ledger_command
def hold_list(account: str | None, state: str | None, fmt: str) -> None:
    from ledger import api

    with transaction() as s:
        holds = [h.as_dict() for h in api.list_holds(s, account, state)]
    emit(holds, fmt, None if fmt == "json" else HOLD_COLUMNS)


@hold_group.command("show")
@click.argument("hold_id", type=int)
@format_option
@ledger_command
def hold_show(hold_id: int, fmt: str) -> None:
    from ledger import api

    with transaction() as s:
        hold = api.get_hold(s, hold_id)
    emit(hold.as_dict(), fmt, None if fmt == "json" else HOLD_COLUMNS)


@click.command("report")
@click.option("--account", default=None)
@click.option("--subtree", is_flag=True, help="With --account: its sub-accounts' usage too (--by account).")
@click.option("--user", default=None)
@click.option("--from", "start", default=None, metavar="TIME")
@click.option("--to", "end", default=None, metavar="TIME")
@click.option(
    "--by",
    type=click.Choice(["day", "gres", "user", "partition", "account", "job"]),
    default=None,
    help="Group rows by this (default: day; job with --efficiency).",
)
@click.option(
    "--efficiency",
    is_flag=True,
    help="Allocated vs busy GPU-seconds (NVML) by job, user, account or gres; runs by start time.",
)
@format_option
@ledger_command
def report_command(
    account: str | None,
    subtree: bool,
    user: str | None,
    start: str | None,
    end: str | None,
    by: str | None,
    efficiency: bool,
    fmt: str,
) -> None:
    """Charges and GPU-seconds grouped by day, GPU type, user, partition or account."""
    from ledger import api

    with transaction() as s:
        if efficiency:
            from ledger.views.efficiency import EFFICIENCY_COLUMNS, efficiency_report

            by = by or "job"
            rows = efficiency_report(
                s,
                by=by,
                account=account,
                user=user,
                start=parse_time_option(start, "from"),
                end=parse_time_option(end, "to"),
            )
            columns = [by, *EFFICIENCY_COLUMNS]
        else:
            by = by or "day"
            rows = api.usage_report(
                s,
                account=account,
                user=user,
                start=parse_time_option(start, "from"),
                end=parse_time_option(end, "to"),
                by=by,
                subtree=subtree,
            )
            columns = [by, "charged", "gpu_seconds", "jobs"]
    emit(rows, fmt, columns)


@click.command("sweep")
@at_option
@key_option
@format_option
@ledger_command
def sweep_command(at: str | None, idempotency_key: str | None, fmt: str) -> None:
    """Expire holds past time limit + grace and grant credit past its expiry; pay debt
    from credit active then. A keyed repeat replays each account's first sweep."""
    from ledger import api

    when = parse_time_option(at, "at")
    with transaction() as s:
        names = api.account_names(s)
    rows = []
    for name in names:  # one transaction per account: the ledger's one-lock rule
        with transaction() as s:
            result = api.sweep(s, name, when, idempotency_key=idempotency_key)
        with transaction() as s:  # at most one an hour: balances at past times stay fast
            api.checkpoint_balances(s, name, every=api.CHECKPOINT_EVERY)
        rows.append({**result, "expired_holds": len(result["expired_holds"])})
    emit(rows, fmt, ["account", "expired_holds", "expired_credits", "debt_paid"])


@click.group("audit")
def audit_group() -> None:
    """Check the journal."""


@audit_group.command("verify")
@format_option
@ledger_command
def audit_verify(fmt: str) -> None:
    """Recompute every hash chain and projection; exit 1 on any mismatch."""
    from ledger import api

    with transaction() as s:
        report = api.verify(s)
    result = {
        "ok": report.ok,
        "accounts": report.accounts,
        "entries": report.entries,
        "problems": report.problems,
    }
    if fmt == "json":
        emit(result, fmt)
    else:
        for problem in report.problems:
            click.echo(f"PROBLEM: {problem}")
        click.echo(
            f"{'ok' if report.ok else 'FAILED'}: {report.accounts} accounts, "
            f"{report.entries} entries, {len(report.problems)} problems"
        )
    if not report.ok:
        raise SystemExit(1)


@audit_group.command("checkpoint")
@click.option("--account", "accounts", multiple=True, help="Only this account (repeatable).")
@click.option("--at", default=None, metavar="TIME", help="Effective time (ISO 8601); default an hour ago.")
@format_option
@ledger_command
def audit_checkpoint(accounts: tuple[str, ...], at: str | None, fmt: str) -> None:
    """Checkpoint balances as of --at (default an hour ago), so a balance at any time
    reads the nearest checkpoint and the entries after it, not the whole journal.
    `sweep` takes one an hour by itself; this is for a first run or a backfill."""
    from ledger import api

    when = parse_time_option(at, "at")
    if not accounts:
        with transaction() as s:
            accounts = tuple(api.account_names(s))
    rows = []
    for name in accounts:  # one transaction per account: the ledger's one-lock rule
        with transaction() as s:
            rows.append(api.checkpoint_balances(s, name, when))
    emit(rows, fmt, ["account", "at", "written", "reissued", "through_seq"])


COMMANDS = [
    init_command,
    account_group,
    user_group,
    price_group,
    limits_group,
    topup_command,
    grant_command,
    consume_command,
    transfer_command,
    adjust_command,
    balance_command,
    quote_command,
    hold_group,
    report_command,
    sweep_command,
    audit_group,
]
