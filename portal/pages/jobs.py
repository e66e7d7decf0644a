"""An account's jobs, and one job's money: cost so far, final cost, adjustments.

A job run is shown from its hold (the hooks reserve one for every run), beside
Slurm's record once the bridge has ingested it. Pending jobs hold nothing, so they
are not here: `squeue` shows them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import render_template, request

from ledger import api
from ledger.errors import NotFound
from ledger.money import format_credits
from ledger.timeutil import format_time, utcnow
from portal.auth import login_required, own_user, principal, require_account
from portal.pages import bp
from portal.pages.common import choice, page_size, row_id
from portal.pages.figures import cost_so_far, elapsed_seconds, slurm_duration
from portal.pages.output import output_tail
from portal.store import transaction

# Statuses a user can filter by (ledger.views.history): running, Slurm's final states once
# ingested, else how the hold resolved.
STATUSES = (
    "running",
    "completed",
    "failed",
    "cancelled",
    "timeout",
    "node_fail",
    "out_of_memory",
    "settled",
    "released",
    "expired",
)
ENTRY_KINDS = {
    "hold": "credit held",
    "usage": "provisional charge",
    "settle": "final charge",
    "release": "hold released",
    "expire": "hold expired",
    "adjust": "adjustment",
}
NODE_FAIL_REFUND = "node_fail_refund"  # the bridge's job_runs flag


@bp.route("/accounts/<account>/jobs")
@login_required
def jobs(account: str) -> Any:
    who = principal()
    status = choice(request.args.get("state"), STATUSES, "state")
    before = row_id(request.args.get("before"), "before")
    size = page_size()
    now = utcnow()
    with transaction() as s:
        role = require_account(s, who, account)
        records = api.job_history(
            s, account, user=own_user(role, who), status=status, before_id=before, limit=size + 1
        )
    shown = [job_row(record, now) for record in records[:size]]
    return render_template(
        "pages/jobs.html",
        account=account,
        role=role,
        jobs=shown,
        status=status,
        statuses=STATUSES,
        next_before=shown[-1]["hold_id"] if len(records) > size else None,
    )


@bp.route("/accounts/<account>/jobs/<int(min=1, max=2147483647):hold_id>")
@login_required
def job(account: str, hold_id: int) -> Any:
    who = principal()
    now = utcnow()
    with transaction() as s:
        role = require_account(s, who, account)
        record = api.job_record(s, hold_id)
        user = own_user(role, who)
        if record.hold.account != account or (user is not None and record.hold.user != user):
            raise NotFound(f"hold {hold_id} does not exist", details={"hold_id": hold_id})
        entries = api.hold_entries(s, hold_id)
    tail = output_tail(record.hold.output_path, who.user) if who.user == record.hold.user else None
    for entry in entries:
        entry["label"] = _entry_label(entry)
    return render_template(
        "pages/job.html",
        account=account,
        role=role,
        job=job_row(record, now),
        entries=entries,
        now=format_time(now),
        output_path=record.hold.output_path if tail is not None else None,
        output_tail=tail,
    )


def job_row(record: api.JobRecord, now: datetime) -> dict[str, Any]:
    """What the pages show of one job run; credit figures as decimal strings."""
    hold = record.hold
    running = record.status == "running"
    return {
        "hold_id": hold.id,
        "job_id": hold.job_id,
        "run": hold.run,
        "cluster": hold.cluster,
        "user": hold.user,
        "gpus": hold.gpus,
        "partition": hold.partition,
        "status": record.status,
        "refunded": NODE_FAIL_REFUND in record.flags.split(","),
        "started_at": format_time(hold.started_at),
        "ended_at": None if running else format_time(hold.resolved_at),
        "time_limit": slurm_duration(hold.limit_seconds),
        "elapsed": elapsed_seconds(hold, now) if running else _ran_seconds(record),
        "rate": format_credits(hold.rate_ucredits_per_hour),
        "held": format_credits(hold.amount_ucredits),
        "cost": format_credits(cost_so_far(hold, now) if running else hold.charged_ucredits),
        "estimate": format_credits(hold.amount_ucredits) if running else None,
    }


def _ran_seconds(record: api.JobRecord) -> int:
    """Slurm's elapsed once ingested, else the seconds the run was charged for."""
    if record.slurm_elapsed_seconds is not None:
        return record.slurm_elapsed_seconds
    return record.hold.charged_seconds


def _entry_label(entry: dict[str, Any]) -> str:
    if entry["kind"] == "adjust" and (entry["reason"] or "").startswith("NODE_FAIL"):
        return "NODE_FAIL refund"
    if entry["kind"] == "adjust" and entry["charge"].startswith("-"):
        return "refund"
    return ENTRY_KINDS.get(entry["kind"], entry["kind"])
