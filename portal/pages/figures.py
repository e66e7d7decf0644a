"""The few figures the pages derive from the ledger's: run-out date, cost so far.

Pure functions on integer micro-credits; the charge rule itself is the ledger's
(`api.charge_for`), so a running job's cost so far is what the meter would charge.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ledger import api
from ledger.timeutil import as_utc

SECONDS_PER_HOUR = 3600


def run_out_at(available_ucredits: int, rate_ucredits_per_hour: int, now: datetime) -> datetime | None:
    """When the available credit is gone at this burn rate; None when nothing burns."""
    if rate_ucredits_per_hour <= 0:
        return None
    if available_ucredits <= 0:
        return now
    return now + timedelta(seconds=available_ucredits * SECONDS_PER_HOUR // rate_ucredits_per_hour)


def elapsed_seconds(hold: api.HoldState, now: datetime) -> int:
    """Seconds the run has held its GPUs, within its time limit."""
    seconds = int((now - as_utc(hold.started_at)).total_seconds())
    return max(0, min(seconds, hold.limit_seconds))


def cost_so_far(hold: api.HoldState, now: datetime) -> int:
    """What the run has cost by `now`: the charge for its elapsed seconds (up to where the
    meter last saw it running), or what was already posted when that is more."""
    return api.cost_so_far(hold, now)


def slurm_duration(seconds: int) -> str:
    """Seconds as sbatch's --time: H:MM:SS, or D-HH:MM:SS from a day on."""
    days, rest = divmod(seconds, 24 * SECONDS_PER_HOUR)
    hours, rest = divmod(rest, SECONDS_PER_HOUR)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours}:{minutes:02d}:{secs:02d}"


def duration_words(seconds: int) -> str:
    """A span to the minute, as a person reads it: '1 day 3 h 46 min'."""
    days, rest = divmod(seconds, 24 * SECONDS_PER_HOUR)
    hours, rest = divmod(rest, SECONDS_PER_HOUR)
    parts = [f"{days} day{'' if days == 1 else 's'}"] if days else []
    if hours:
        parts.append(f"{hours} h")
    parts.append(f"{rest // 60} min")
    return " ".join(parts)
