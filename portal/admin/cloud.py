"""/admin/cloud: the month's cloud report, and the same table as a CSV.

The report is `ledger.api.cloud_report`'s (one function; `gpucredit cloud report`
renders it too); this page only renders it. Its inputs from outside the ledger (the
instance journal at the configured prices, the cloud nodes, the cloud partitions) belong
to accounting_bridge.cloud, which the portal may not import
(tests/architecture/test_boundaries.py): whoever builds the app hands them over as a
source in `app.extensions[CLOUD_SOURCE]` (`set_cloud_source`; the CLI root does it for
`gpucredit serve`, gpucredit/portal_serve.py). Without one, or with a journal it cannot
read, the page says so (503), rather than showing an empty bill.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

from flask import Flask, current_app, render_template, request

from ledger import api
from ledger.errors import LedgerError
from ledger.timeutil import utcnow
from portal.admin.blueprints import admin_bp
from portal.csv_out import csv_response
from portal.store import transaction

__all__ = ["CLOUD_SOURCE", "CloudInputs", "set_cloud_source"]

CLOUD_SOURCE = "gpucredit.cloud_report_inputs"
NOT_WIRED = (
    "This portal has no cloud instance journal: it is handed over by `gpucredit serve` on a "
    "host with the [cloud] configuration. `gpucredit cloud report` prints the same table."
)


class CloudInputs(Protocol):
    """What the report needs from outside the ledger (accounting_bridge.cloud.report.ReportInputs)."""

    @property
    def instances(self) -> Sequence[api.InstanceSpan]: ...
    @property
    def cloud_nodes(self) -> Collection[str]: ...
    @property
    def cloud_partitions(self) -> Collection[str]: ...


def set_cloud_source(app: Flask, source: Callable[[], CloudInputs]) -> None:
    """Where the page reads its inputs from, once per request (the journal grows)."""
    app.extensions[CLOUD_SOURCE] = source


def _report(month: str) -> api.CloudReport | tuple[str, int]:
    """The report, or the page that refuses it: a bad month (422, invalid_month) or no
    source of inputs (503)."""
    try:
        api.month_bounds(month)  # a bad month is refused before the journal is read
    except LedgerError as error:
        return _refusal(month, error.message), error.http_status
    source: Callable[[], CloudInputs] | None = current_app.extensions.get(CLOUD_SOURCE)
    if source is None:
        return _refusal(month, NOT_WIRED), 503
    try:
        inputs = source()
    except (ValueError, OSError, LedgerError) as error:  # a config or journal it cannot read
        return _refusal(month, f"The cloud instance journal cannot be read: {error}"), 503
    with transaction() as s:
        return api.cloud_report(
            s,
            month=month,
            instances=inputs.instances,
            cloud_nodes=inputs.cloud_nodes,
            cloud_partitions=inputs.cloud_partitions,
            now=utcnow(),
        )


def _refusal(month: str, message: str) -> str:
    return render_template("admin/cloud.html", month=month, report=None, error=message)


def _month() -> str:
    return request.args.get("month") or utcnow().strftime("%Y-%m")


@admin_bp.get("/cloud")
def cloud() -> Any:
    """The chosen month's table (this month's by default)."""
    month = _month()
    report = _report(month)
    if not isinstance(report, api.CloudReport):
        return report
    return render_template(
        "admin/cloud.html", month=month, report=report, columns=api.CLOUD_REPORT_COLUMNS, error=None
    )


@admin_bp.get("/cloud.csv")
def cloud_csv() -> Any:
    """The same table, every row then the total, as a spreadsheet opens it safely."""
    report = _report(_month())
    if not isinstance(report, api.CloudReport):
        return report
    columns = api.CLOUD_REPORT_COLUMNS
    return csv_response(
        columns, ([row[c] for c in columns] for row in report.table()), f"cloud-report-{report.month}.csv"
    )
