"""The ledger's side of the outage spool (docs/outage.md): the price sheet the hooks
estimate with, and the read-back that charges the runs they admitted without the ledger.

`gpucredit daemon` runs both while `policy.on_ledger_unreachable = "accept"` (or a spool
is left to read back), every `policy.outage_sheet_seconds` (its OutageKeeper,
gpucredit/daemon/outage_keeper.py): it rewrites sheet.json from the ledger's prices and
reads the spool back. Each admitted run that
ended is charged once, as `unreserved` (ledger.api.record_unreserved_run: at the prices
in force at its start, no credit check, debt allowed, idempotent on the run), for
Slurm's start .. the end EpilogSlurmctld noted, at most its time limit; the bridge's
sacct reconciliation later adjusts it to Slurm's own record like any settled run. A run
the ledger already has a hold for (the daemon answered after all, or the bridge charged
it from sacct first) is not charged again. Runs done are forgotten from the spool; a
run still running, or whose end was lost, keeps counting against the credit lines until
it ends or the bridge charges it. `gpucredit policy readback` runs one round by hand.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ledger import api
from ledger.errors import LedgerError
from ledger.money import format_credits
from ledger.timeutil import format_time, parse_time
from slurm_hooks.outage_spool import RUNS, Spool, SpooledRun, write_sheet

__all__ = ["ReadBack", "Sessions", "read_back", "refresh_sheet"]

# The daemon's logger: the daemon runs the read-back on its own (a refusal is its news);
# `gpucredit policy readback` prints what it did instead.
log = logging.getLogger("gpucredit.daemon")

Sessions = Callable[[], Any]


def refresh_sheet(sessions: Sessions, directory: str, now: datetime) -> str:
    """Rewrite the hooks' price sheet from the ledger's prices; returns its path."""
    with sessions() as s, s.begin():
        prices = api.outage_prices(s, now)
    return write_sheet(directory, {**prices, "written_at": format_time(now)})


@dataclass
class ReadBack:
    """One round of the read-back: each spooled run by what became of it."""

    charged: list[dict[str, Any]] = field(default_factory=list)  # charged now, as unreserved
    held: list[str] = field(default_factory=list)  # the ledger had a hold for it already
    waiting: list[str] = field(default_factory=list)  # not ended yet (or its end was lost)
    failed: list[str] = field(default_factory=list)  # the ledger refused: kept, tried again
    forgotten: int = 0


def _name(run: SpooledRun) -> str:
    cluster, job_id, number, _submit = run.key
    return f"{cluster}/{job_id}/{number}"


def read_back(sessions: Sessions, directory: str, now: datetime | None = None) -> ReadBack:
    """Charge every spooled run that ended, once, and forget what the ledger now has."""
    result = ReadBack()
    if not os.path.exists(os.path.join(directory, RUNS)):
        return result
    spool = Spool(directory)
    done = []
    for run in spool.runs():
        admit = run.admit
        cluster, job_id, number, submit_text = run.key
        submitted_at = parse_time(submit_text) if submit_text else None
        try:
            with sessions() as s, s.begin():
                existing = api.find_hold(s, cluster, job_id, number, submitted_at)
                if existing is not None:
                    result.held.append(_name(run))
                    done.append(run.key)
                    continue
                if run.end is None:
                    result.waiting.append(_name(run))
                    continue
                started_at = parse_time(admit.get("start") or admit["admitted_at"])
                elapsed = int((parse_time(run.end) - started_at).total_seconds())
                # Slurm stops a run at its time limit: a late epilog adds nothing.
                elapsed = min(max(0, elapsed), int(admit["seconds"]))
                hold = api.record_unreserved_run(
                    s,
                    str(admit["account"]),
                    user=str(admit["user"]),
                    cluster=cluster,
                    job_id=job_id,
                    run=number,
                    gpus={str(k): int(v) for k, v in admit["gpus"].items()},
                    started_at=started_at,
                    elapsed_seconds=elapsed,
                    partition=admit.get("partition"),
                    submitted_at=submitted_at,
                )
        except LedgerError as error:
            log.warning("outage read-back of %s refused: %s", _name(run), error)
            result.failed.append(f"{_name(run)}: {error}")
            continue
        result.charged.append(
            {
                "run": _name(run),
                "account": hold.account,
                "charged": format_credits(hold.charged_ucredits),
                "elapsed_seconds": elapsed,
                "estimate": format_credits(int(admit.get("estimate_ucredits") or 0)),
            }
        )
        done.append(run.key)
    result.forgotten = spool.forget(done)
    return result
