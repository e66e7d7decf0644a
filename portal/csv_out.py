"""CSV downloads a spreadsheet can open safely: every cell goes through
`ledger.cli_support.spreadsheet_safe` (the CLI's `--format csv` does the same), so a
name that starts like a formula (`=HYPERLINK(...)`) is text when a PI opens the file.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any

from flask import Response

from ledger.cli_support import spreadsheet_safe as safe_cell

__all__ = ["csv_response"]


def csv_response(columns: Iterable[str], rows: Iterable[Iterable[Any]], filename: str) -> Response:
    """A CSV attachment: a header row, then `rows`, every cell through `safe_cell`."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([safe_cell(column) for column in columns])
    for row in rows:
        writer.writerow([safe_cell(cell) for cell in row])
    return Response(
        out.getvalue(),
        mimetype="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
