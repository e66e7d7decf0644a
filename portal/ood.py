"""Open OnDemand's balance file: each member's credit per account, in whole credits.

OnDemand's dashboard warns a user whose balance is at or below OOD_BALANCE_THRESHOLD;
it reads the files (or URLs) listed in OOD_BALANCE_PATH, in its "version 1" format.
The same document is served at GET /api/v1/ood/balance.json and written to a file by
`gpucredit export ood-balance PATH` (a systemd timer keeps it fresh).
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from ledger import api
from ledger.timeutil import utcnow

__all__ = ["ood_document", "write_atomically"]


def ood_document(s: Session, *, user: str | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Every (member, account) pair with the account's available credit at `now`
    (default: now), rounded down to whole credits; only `user`'s pairs when given."""
    now = now or utcnow()
    available = {t.account: t.available_whole_credits for t in api.account_totals(s, now)}
    return {
        "version": 1,
        "timestamp": int(now.timestamp()),
        "config": {"unit": "credits", "project_type": "account"},
        "balances": [
            {"user": member, "project": account, "value": available[account]}
            for member, account in api.memberships(s, user)
        ],
    }


def write_atomically(path: Path, document: dict[str, Any]) -> None:
    """Write `document` as JSON to `path` so that a reader sees the old file or the whole
    new one, never a part: a temporary file beside it, flushed to disk, then renamed."""
    path = path.resolve()
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)  # OnDemand's dashboard runs as each user: all must read it
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a crash
    finally:
        os.close(directory)
