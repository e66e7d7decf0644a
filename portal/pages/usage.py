"""An account's usage (table, bar chart, CSV) and the GPU efficiency of its jobs.

The figures are `api.usage_report`'s, unchanged: what was charged in the range,
grouped by day, GPU type, user or partition. The CSV carries the same decimal
strings as the table, so a spreadsheet adds up to the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from flask import Response, render_template, request

from ledger import api
from ledger.timeutil import utcnow
from portal.auth import login_required, own_user, principal, require_account
from portal.csv_out import csv_response
from portal.pages import bp
from portal.pages.chart import bar_chart
from portal.pages.common import choice, form_time, ucredits
from portal.store import transaction

GROUPS = ("day", "gres", "user", "partition")
GROUP_NAMES = {"day": "Day", "gres": "GPU type", "user": "User", "partition": "Partition"}
DEFAULT_DAYS = 30  # a range left empty starts this many days back
CSV_COLUMNS = ("charged", "gpu_seconds", "jobs")


@dataclass(frozen=True)
class Range:
    """The report's range and grouping as the form sent them, and as times."""

    start_text: str
    end_text: str
    by: str
    start: datetime | None
    end: datetime | None

    def args(self) -> dict[str, str]:
        return {"from": self.start_text, "to": self.end_text, "by": self.by}


def _range(default_by: str) -> Range:
    start_text = request.args.get("from")
    if start_text is None:
        start_text = (utcnow() - timedelta(days=DEFAULT_DAYS)).strftime("%Y-%m-%d")
    end_text = request.args.get("to", "")
    by = choice(request.args.get("by"), GROUPS, "by") or default_by
    return Range(
        start_text.strip(),
        end_text.strip(),
        by,
        form_time(start_text, "from"),
        form_time(end_text, "to", end_of_day=True),
    )


def _report(account: str, span: Range) -> tuple[str, list[dict[str, Any]]]:
    who = principal()
    with transaction() as s:
        role = require_account(s, who, account)
        rows = api.usage_report(
            s, account=account, user=own_user(role, who), start=span.start, end=span.end, by=span.by
        )
    return role, rows


@bp.route("/accounts/<account>/usage")
@login_required
def usage(account: str) -> Any:
    span = _range("day")
    role, rows = _report(account, span)
    chart = bar_chart([(row[span.by], ucredits(row["charged"])) for row in rows])
    return render_template(
        "pages/usage.html",
        account=account,
        role=role,
        rows=rows,
        chart=chart,
        span=span,
        groups=GROUPS,
        group_names=GROUP_NAMES,
    )


@bp.route("/accounts/<account>/usage.csv")
@login_required
def usage_csv(account: str) -> Response:
    span = _range("day")
    _role, rows = _report(account, span)
    return csv_response(
        (span.by, *CSV_COLUMNS),
        ((row[span.by], *(row[column] for column in CSV_COLUMNS)) for row in rows),
        f"usage-{account}-by-{span.by}.csv",
    )


@bp.route("/accounts/<account>/efficiency")
@login_required
def efficiency(account: str) -> Any:
    span = _range("day")
    who = principal()
    with transaction() as s:
        role = require_account(s, who, account)
        rows = api.efficiency_report(
            s, by="job", account=account, user=own_user(role, who), start=span.start, end=span.end
        )
    return render_template("pages/efficiency.html", account=account, role=role, rows=rows, span=span)
