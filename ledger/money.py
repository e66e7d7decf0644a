"""Credits as integers: 1 credit = 1,000,000 micro-credits; decimal strings at the edges.

Floats never touch money. Charges are computed from a rate in micro-credits per
GPU-hour and a cumulative number of seconds, rounded half-up once, so a series of
provisional charges always ends exactly at the final one.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from ledger.errors import InvalidInput

UCREDITS_PER_CREDIT = 1_000_000
SECONDS_PER_HOUR = 3600

# --- Bounds ---------------------------------------------------------------------------
# Every figure the ledger stores is a 64-bit integer (BIGINT on PostgreSQL, INTEGER on
# SQLite), and SQLite fails a whole statement when a SUM passes 2**63 - 1 micro-credits
# (~9.2 * 10**12 credits). So every amount, and every product of amounts, is bounded
# here, far below that, and refused above its bound with the bound named
# (docs/admin-guide.md, "Security"). No site enters figures near these; beyond them an
# input is a typo or an attack.
UCREDITS_CEILING = 2**63 - 1
# One amount: a top-up, grant, consumption, transfer, adjustment, cap or credit line.
MAX_CREDITS = 10**12
MAX_UCREDITS = MAX_CREDITS * UCREDITS_PER_CREDIT
# Everything ever granted to one account (top-ups, grants, transfers in, refunds), spent
# or not: every sum a query takes over one account's grants is at most this.
MAX_ACCOUNT_UCREDITS = MAX_UCREDITS
# One job's rate: its GPUs' prices per GPU-hour times their counts (10**8 credits an
# hour), and so also one price. With a time limit of at most MAX_JOB_SECONDS (366 days)
# one run's charge stays below MAX_CHARGE_UCREDITS, itself below MAX_UCREDITS.
MAX_RATE_UCREDITS_PER_HOUR = 10**14
MAX_PRICE_UCREDITS_PER_GPU_HOUR = MAX_RATE_UCREDITS_PER_HOUR
MAX_GPUS_PER_JOB = 100_000  # a job's GPUs of every type together
MAX_JOB_SECONDS = 366 * 24 * 3600
MAX_CHARGE_UCREDITS = -(-MAX_RATE_UCREDITS_PER_HOUR * MAX_JOB_SECONDS // SECONDS_PER_HOUR)
if not (MAX_CHARGE_UCREDITS <= MAX_UCREDITS and MAX_UCREDITS <= MAX_ACCOUNT_UCREDITS < UCREDITS_CEILING // 2):
    raise RuntimeError("the ledger's bounds no longer nest; see ledger/money.py")


def parse_credits(
    text: str | Decimal,
    *,
    field: str = "amount",
    allow_zero: bool = False,
    allow_negative: bool = False,
) -> int:
    """Parse a decimal credit amount ("12.5") into micro-credits, refusing anything inexact.

    Numbers are refused, ints included: inside the ledger an int is micro-credits, so
    an int meaning credits here would be off by a million somewhere else.
    """
    if not isinstance(text, (str, Decimal)):
        raise InvalidInput(
            f"{field} must be a decimal string, not {type(text).__name__}",
            code="invalid_amount",
            details={"field": field},
        )
    raw = str(text).strip()
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise InvalidInput(
            f"{field} {raw!r} is not a decimal number",
            code="invalid_amount",
            details={"field": field, "value": raw},
        ) from None
    if not value.is_finite():
        raise InvalidInput(
            f"{field} {raw!r} is not a finite number",
            code="invalid_amount",
            details={"field": field, "value": raw},
        )
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -6:
        scaled = value.normalize()
        exp2 = scaled.as_tuple().exponent
        if isinstance(exp2, int) and exp2 < -6:
            raise InvalidInput(
                f"{field} {raw!r} has more than 6 decimals",
                code="invalid_amount",
                details={"field": field, "value": raw},
            )
    if abs(value) > MAX_CREDITS:
        raise InvalidInput(
            f"{field} {raw!r} exceeds the maximum of {MAX_CREDITS} credits",
            code="invalid_amount",
            details={"field": field, "value": raw, "cap": str(MAX_CREDITS)},
        )
    if value < 0 and not allow_negative:
        raise InvalidInput(
            f"{field} {raw!r} must not be negative",
            code="invalid_amount",
            details={"field": field, "value": raw},
        )
    if value == 0 and not allow_zero:
        raise InvalidInput(
            f"{field} must be greater than zero",
            code="invalid_amount",
            details={"field": field, "value": raw},
        )
    return int(value * UCREDITS_PER_CREDIT)


def format_credits(ucredits: int) -> str:
    """Micro-credits as a decimal string with at least two decimals: 14400000 -> '14.40'."""
    sign = "-" if ucredits < 0 else ""
    whole, frac = divmod(abs(ucredits), UCREDITS_PER_CREDIT)
    digits = f"{frac:06d}".rstrip("0")
    if len(digits) < 2:
        digits = digits.ljust(2, "0")
    return f"{sign}{whole}.{digits}"


def div_round_half_up(numerator: int, denominator: int) -> int:
    """Integer division rounded half away from zero."""
    if denominator <= 0:
        raise ValueError("denominator must be positive")
    q, r = divmod(abs(numerator), denominator)
    if 2 * r >= denominator:
        q += 1
    return q if numerator >= 0 else -q


def charge_for(rate_ucredits_per_hour: int, seconds: int) -> int:
    """The charge for running `seconds` at a combined rate, rounded once, half-up."""
    return div_round_half_up(rate_ucredits_per_hour * seconds, SECONDS_PER_HOUR)


def format_rate(rate_ucredits_per_hour: int) -> str:
    """A burn rate as credits per second, to the micro-credit: 7200000/h -> '0.002'."""
    per_second = div_round_half_up(rate_ucredits_per_hour, SECONDS_PER_HOUR)
    return format_credits(per_second).rstrip("0").rstrip(".") if per_second else "0"
