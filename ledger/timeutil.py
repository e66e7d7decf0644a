"""Times are aware UTC datetimes inside the ledger; ISO 8601 strings at the edges."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from ledger.errors import InvalidInput
from ledger.money import MAX_JOB_SECONDS

# Far enough to cover any grant window a site would enter; beyond it an input is a typo.
MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIME = datetime(9000, 1, 1, tzinfo=UTC)

_SLURM_DURATION = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")


def utcnow() -> datetime:
    return datetime.now(UTC)


def parse_time(text: str | datetime, *, field: str = "time") -> datetime:
    """ISO 8601 to an aware UTC datetime; a time without an offset is UTC."""
    if isinstance(text, datetime):
        value = text
    else:
        raw = str(text).strip()
        if raw.lower() == "now":
            return utcnow()
        try:
            value = datetime.fromisoformat(raw.replace("z", "Z"))
        except ValueError:
            raise InvalidInput(
                f"{field} {raw!r} is not an ISO 8601 time",
                code="invalid_time",
                details={"field": field, "value": raw},
            ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    value = value.astimezone(UTC)
    if not MIN_TIME <= value < MAX_TIME:
        raise InvalidInput(
            f"{field} {value.isoformat()} is out of range",
            code="invalid_time",
            details={"field": field, "value": str(text)},
        )
    return value


def format_time(value: datetime | None) -> str | None:
    """ISO 8601 UTC with a Z: the one spelling used in JSON, CSV and hashes."""
    if value is None:
        return None
    if value.tzinfo is not UTC:
        value = as_utc(value)
    # isoformat writes "YYYY-MM-DDTHH:MM:SS[.ffffff]", as strftime did at twice the cost
    # (years below 1000 aside, which the ledger never stores: MIN_TIME).
    return value.replace(tzinfo=None).isoformat() + "Z"


def as_utc(value: datetime) -> datetime:
    """Database drivers hand back naive UTC (SQLite) or aware values (PostgreSQL)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


# Both stores keep times as naive UTC. The two conversions below use `combine` (the date
# fields of a datetime, its time, a zone or none): ~6x faster than `replace(tzinfo=...)`,
# whose keyword parsing dominates. The meter converts three times per running job per
# tick, the bridge one per hold it reads, the daemon's writer every time it binds.


def aware_utc(naive: datetime) -> datetime:
    """A stored naive UTC time as aware UTC."""
    return datetime.combine(naive, naive.time(), UTC)


def naive_utc(value: datetime) -> datetime:
    """An aware time as it is stored: naive UTC. A naive one is refused (whose time is it?)."""
    if value.tzinfo is UTC:
        return datetime.combine(value, value.time())
    if value.tzinfo is None:
        raise ValueError("naive datetime given to the ledger; use aware UTC")
    return value.astimezone(UTC).replace(tzinfo=None)


def parse_seconds(text: str | int, *, field: str = "seconds") -> int:
    """A non-negative whole number of seconds."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise InvalidInput(
            f"{field} {text!r} is not a whole number of seconds",
            code="invalid_duration",
            details={"field": field, "value": str(text)},
        ) from None
    if value < 0 or value > MAX_JOB_SECONDS:
        raise InvalidInput(
            f"{field} {value} must be between 0 and {MAX_JOB_SECONDS}",
            code="invalid_duration",
            details={"field": field, "value": value, "cap": MAX_JOB_SECONDS},
        )
    return value


def parse_slurm_duration(text: str, *, field: str = "time") -> int:
    """Slurm's [D-]HH:MM:SS (also MM:SS) into seconds."""
    raw = str(text).strip()
    match = _SLURM_DURATION.match(raw)
    if not match:
        raise InvalidInput(
            f"{field} {raw!r} is not [D-]HH:MM:SS",
            code="invalid_duration",
            details={"field": field, "value": raw},
        )
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    if seconds >= 60 or (match.group(2) is not None and minutes >= 60):
        raise InvalidInput(
            f"{field} {raw!r} has minutes or seconds out of range",
            code="invalid_duration",
            details={"field": field, "value": raw},
        )
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return parse_seconds(total, field=field)


def day_bounds(at: datetime) -> tuple[datetime, datetime]:
    """The UTC calendar day containing `at`, as [start, end)."""
    start = as_utc(at).replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + timedelta(days=1)
