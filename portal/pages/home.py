"""Home (my accounts and how to charge them) and an account's dashboard."""

from __future__ import annotations

from typing import Any

from flask import redirect, render_template, request, url_for

from ledger import api
from ledger.errors import NotFound
from ledger.money import format_credits
from ledger.timeutil import format_time, utcnow
from portal.auth import accounts_of, login_required, principal, require_account
from portal.pages import bp
from portal.pages.common import form_time, low_balance_ucredits, ucredits
from portal.pages.figures import duration_words, run_out_at
from portal.pages.nav import endpoint_exists
from portal.store import transaction


@bp.route("/")
@login_required
def home() -> Any:
    who = principal()
    now = utcnow()
    with transaction() as s:
        roles = accounts_of(s, who)
        accounts = [
            {"name": name, "role": role, "available": api.balance(s, name)["available"]}
            for name, role in sorted(roles.items())
        ]
        prices = api.load_price_table(s)
    gpu_types = [
        (gres, format_credits(price))
        for gres in prices.gpu_types()
        if (price := prices.price_at(gres, None, now)) is not None
    ]
    return render_template("pages/home.html", accounts=accounts, gpu_types=gpu_types)


@bp.route("/accounts/<account>")
@login_required
def dashboard(account: str) -> Any:
    who = principal()
    at_text = request.args.get("at", "").strip()
    at = form_time(at_text, "at")
    now = utcnow().replace(microsecond=0)  # the run-out date is shown to the second
    with transaction() as s:
        role = require_account(s, who, account)
        balance = api.balance(s, account)
        running = api.running_totals(s, account)
        balance_then = api.balance(s, account, at) if at is not None else None
        below = _subtree_rows(s, account) if role in ("manager", "admin") else []
    available = ucredits(balance["available"])
    run_out = run_out_at(available, running.rate_ucredits_per_hour, now)
    threshold = low_balance_ucredits()
    return render_template(
        "pages/dashboard.html",
        account=account,
        role=role,
        balance=balance,
        running=running,
        burn_rate=format_credits(running.rate_ucredits_per_hour),
        run_out=format_time(run_out),
        run_out_in=None if run_out is None else duration_words(int((run_out - now).total_seconds())),
        low_balance=available <= threshold,
        low_balance_threshold=format_credits(threshold),
        at_text=at_text,
        balance_then=balance_then,
        below=below,
    )


def _subtree_rows(s: Any, account: str) -> list[dict[str, Any]]:
    """The accounts below `account` in the tree, depth first, each with its own credit
    now: what a department's manager watches (they need not be a member of each)."""
    parents = api.account_parents(s)
    depth = dict(api.tree_order(parents))
    below = api.subtree(parents, account)[1:]
    used = api.pool_uses(s, below)
    month = utcnow().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    spent = {
        row["account"]: row["charged"]
        for row in api.usage_report(s, account=account, subtree=True, by="account", start=month)
    }
    rows = []
    for name in below:
        figures = api.balance(s, name)
        rows.append(
            {
                "name": name,
                "parent": parents[name],
                "depth": depth[name] - depth[account],
                "available": figures["available"],
                "held": figures["held"],
                "spent": spent.get(name, "0.00"),  # this month, running jobs so far included
                # what it used of its parent's pool (held or spent, not given back)
                "pool_draw": format_credits(used.get((parents[name] or "", name), 0)),
            }
        )
    return rows


@bp.route("/jobs")
@login_required
def jobs_index() -> Any:
    return _account_chooser("pages.jobs", "Jobs")


@bp.route("/usage")
@login_required
def usage_index() -> Any:
    return _account_chooser("pages.usage", "Usage")


@bp.route("/topup")
@login_required
def topup_index() -> Any:
    if not endpoint_exists("payments.topup"):
        raise NotFound("this portal takes no top-ups")
    return _account_chooser("payments.topup", "Top up")


def _account_chooser(endpoint: str, title: str) -> Any:
    """One account: straight to its page; several: pick one."""
    with transaction() as s:
        names = sorted(accounts_of(s, principal()))
    if len(names) == 1:
        return redirect(url_for(endpoint, account=names[0]))
    return render_template("pages/choose.html", names=names, endpoint=endpoint, title=title)
