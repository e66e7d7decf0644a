"""How much credit can be overspent during a ledger outage: the bound, per job, per
account and for the fleet, for each hold mode and outage policy (docs/outage.md).

Overspend is credit charged that the account did not have: a run's charge beyond the
credit held for it. Running runs hold credit (holds.mode `full`: their whole time
limit; `lease`: a window the meter renews); runs started during the outage hold none
(policy `reject` starts none; `accept` starts them up to the outage credit lines,
counted by the hooks in their spool, slurm_hooks/outage_spool.py).

For an outage of D seconds starting now, with the meter charging every I seconds:

    running run j   u_j = max(0, charge(r_j, e_j + min(R_j, D + I)) - max(A_j, C_j))
                    r_j its rate, e_j seconds run so far, R_j seconds left of its time
                    limit, A_j credit held, C_j charged so far. It cannot run past its
                    time limit, nor, once the ledger is back, past the meter's next tick
                    (which charges it and renews or cancels its lease). In full mode
                    A_j = charge(r_j, e_j + R_j), so u_j = 0.
    account a       B_a = sum of u_j over a's runs + L_a (accept; 0 under reject)
    fleet           B = sum of u_j + min(L_fleet, sum of L_a) (accept; 0 under reject)
    one new run     at most min(L_a, L_fleet) (accept), since the hooks admit a run only
                    while the spooled estimates (gpus x time limit x price) stay within
                    both lines, and a run costs at most its estimate.

A missing line is no cap: the accept part is then unbounded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from ledger.errors import InvalidInput
from ledger.money import charge_for, format_credits, parse_credits
from ledger.store.models import HoldStatus
from ledger.timeutil import parse_time

__all__ = [
    "HOLD_MODES",
    "OUTAGE_POLICIES",
    "OutageBound",
    "OutageConfig",
    "OutageLines",
    "RunningRun",
    "account_bound",
    "current_outage_bound",
    "outage_bound",
    "outage_prices",
    "parse_outage",
    "running_overspend",
]

HOLD_MODES = ("full", "lease")
OUTAGE_POLICIES = ("reject", "accept")
_DURATION = re.compile(r"^\s*(\d{1,9})\s*([smhd]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_outage(text: str | int) -> int:
    """An outage duration: seconds, or a number with s, m, h or d ("30m")."""
    match = _DURATION.match(str(text).lower())
    if match is None:
        raise InvalidInput(
            f"outage {text!r} is not a duration like 1800, 90s, 30m, 2h or 1d",
            code="invalid_duration",
            details={"field": "outage", "value": str(text)},
        )
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


@dataclass(frozen=True)
class OutageLines:
    """The outage credit lines in micro-credits; None is no line (no cap)."""

    per_account: int | None = None
    fleet: int | None = None
    accounts: Mapping[str, int] = field(default_factory=dict)

    def for_account(self, account: str) -> int | None:
        return self.accounts.get(account, self.per_account)

    def as_dict(self) -> dict[str, Any]:
        return {
            "per_account": _credits(self.per_account),
            "fleet": _credits(self.fleet),
            "accounts": {name: format_credits(line) for name, line in sorted(self.accounts.items())},
        }


@dataclass(frozen=True)
class OutageConfig:
    """What the bound depends on in the configuration, validated."""

    mode: str
    policy: str
    lines: OutageLines
    meter_interval_seconds: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> OutageConfig:
        """From a loaded configuration (ledger.config); bad values are refused by name."""
        holds, policy, meter = config.get("holds", {}), config.get("policy", {}), config.get("meter", {})
        mode = holds.get("mode", "full")
        if mode not in HOLD_MODES:
            raise _bad("holds.mode", mode, f"one of {', '.join(HOLD_MODES)}")
        outage_policy = policy.get("on_ledger_unreachable", "reject")
        if outage_policy not in OUTAGE_POLICIES:
            raise _bad("policy.on_ledger_unreachable", outage_policy, f"one of {', '.join(OUTAGE_POLICIES)}")
        interval = meter.get("interval_seconds", 30)
        if isinstance(interval, bool) or not isinstance(interval, int | float) or not 0 < interval <= 86400:
            raise _bad("meter.interval_seconds", interval, "a number of seconds in (0, 86400]")
        directory = policy.get("outage_spool_dir", "/var/spool/gpucredit/outage")
        if not isinstance(directory, str) or not directory.startswith("/"):
            raise _bad("policy.outage_spool_dir", directory, "an absolute path")
        return cls(mode, outage_policy, _lines(policy), int(-(-interval // 1)))


def _lines(policy: Mapping[str, Any]) -> OutageLines:
    def line(key: str, value: Any) -> int | None:
        if value is None:
            return None
        if not isinstance(value, str):
            raise _bad(key, value, 'a decimal credit string like "50"')
        return parse_credits(value, field=key, allow_zero=True)

    table = policy.get("outage_credit_lines") or {}
    if not isinstance(table, Mapping):
        raise _bad("policy.outage_credit_lines", table, 'a table of account = "credits"')
    accounts: dict[str, int] = {}
    for name, value in table.items():
        parsed = line(f"policy.outage_credit_lines.{name}", value)
        accounts[str(name)] = 0 if parsed is None else parsed
    return OutageLines(
        line("policy.outage_credit_line_per_account", policy.get("outage_credit_line_per_account")),
        line("policy.outage_credit_line_fleet", policy.get("outage_credit_line_fleet")),
        accounts,
    )


def _bad(key: str, value: Any, wanted: str) -> InvalidInput:
    return InvalidInput(
        f"{key} = {value!r}: expected {wanted}",
        code="invalid_setting",
        details={"field": key, "value": str(value)},
    )


@dataclass(frozen=True)
class RunningRun:
    """What the bound needs of a running run's hold."""

    account: str
    cluster: str
    job_id: int
    run: int
    rate_ucredits_per_hour: int
    limit_seconds: int
    held_ucredits: int
    charged_ucredits: int
    started_at: datetime


def running_overspend(
    run: RunningRun, outage_seconds: int, meter_interval_seconds: int, now: datetime
) -> int:
    """u_j: what run j can charge beyond the credit held for it during the outage
    (micro-credits); 0 for a run whose hold covers its whole time limit (full mode)."""
    elapsed = min(max(0, int((now - run.started_at).total_seconds())), run.limit_seconds)
    remaining = run.limit_seconds - elapsed
    cost = charge_for(
        run.rate_ucredits_per_hour, elapsed + min(remaining, outage_seconds + meter_interval_seconds)
    )
    return max(0, cost - max(run.held_ucredits, run.charged_ucredits))


@dataclass(frozen=True)
class AccountBound:
    account: str
    running_runs: int
    running_ucredits: int
    line_ucredits: int | None  # the accept part; None: unbounded
    policy: str

    @property
    def bound_ucredits(self) -> int | None:
        if self.policy == "reject":
            return self.running_ucredits
        return None if self.line_ucredits is None else self.running_ucredits + self.line_ucredits

    def as_dict(self) -> dict[str, Any]:
        return {
            "account": self.account,
            "running_runs": self.running_runs,
            "running": format_credits(self.running_ucredits),
            "outage_line": format_credits(0) if self.policy == "reject" else _credits(self.line_ucredits),
            "bound": _credits(self.bound_ucredits),
        }


@dataclass(frozen=True)
class OutageBound:
    """The bound for one outage duration, configuration and set of running runs."""

    outage_seconds: int
    config: OutageConfig
    accounts: list[AccountBound]
    other_accounts: AccountBound  # any account without a running run or a line of its own
    fleet_running_ucredits: int
    fleet_line_ucredits: int | None
    running_job_max_ucredits: int
    running_job_max: RunningRun | None
    new_job_max_ucredits: int | None
    running_runs: int

    @property
    def fleet_ucredits(self) -> int | None:
        if self.config.policy == "reject":
            return self.fleet_running_ucredits
        if self.fleet_line_ucredits is None:
            return None
        return self.fleet_running_ucredits + self.fleet_line_ucredits

    def as_dict(self) -> dict[str, Any]:
        largest = self.running_job_max
        reject = self.config.policy == "reject"
        return {
            "outage_seconds": self.outage_seconds,
            "mode": self.config.mode,
            "policy": self.config.policy,
            "meter_interval_seconds": self.config.meter_interval_seconds,
            "lines": self.config.lines.as_dict(),
            "per_job": {
                "running": format_credits(self.running_job_max_ucredits),
                "running_job": None
                if largest is None
                else f"{largest.cluster}/{largest.job_id}/{largest.run}",
                "started_during_outage": format_credits(0) if reject else _credits(self.new_job_max_ucredits),
            },
            "accounts": [row.as_dict() for row in self.accounts],
            "other_accounts": self.other_accounts.as_dict(),
            "fleet": {
                "running_runs": self.running_runs,
                "running": format_credits(self.fleet_running_ucredits),
                "outage_line": format_credits(0) if reject else _credits(self.fleet_line_ucredits),
                "bound": _credits(self.fleet_ucredits),
            },
        }


def account_bound(
    account: str, runs: Sequence[int], lines: OutageLines, policy: str, *, with_line: bool = True
) -> AccountBound:
    line = lines.for_account(account) if with_line else None
    return AccountBound(account, len(runs), sum(runs), line, policy)


def outage_bound(
    config: OutageConfig,
    outage_seconds: int,
    running: Iterable[RunningRun],
    account_names: Iterable[str],
    now: datetime,
) -> OutageBound:
    """The bound for an outage of `outage_seconds` starting at `now` (module docstring)."""
    if outage_seconds < 0:
        raise InvalidInput("an outage lasts zero seconds or more", code="invalid_duration")
    lines = config.lines
    by_account: dict[str, list[int]] = {}
    largest: tuple[int, RunningRun] | None = None
    count = 0
    for run in running:
        count += 1
        u = running_overspend(run, outage_seconds, config.meter_interval_seconds, now)
        by_account.setdefault(run.account, []).append(u)
        if largest is None or u > largest[0]:
            largest = (u, run)
    names = sorted(set(by_account) | set(lines.accounts))
    rows = [account_bound(name, by_account.get(name, []), lines, config.policy) for name in names]
    other = account_bound("(any other)", [], lines, config.policy)
    # Without a default line, an account with no line of its own is uncapped: so is the sum.
    summed: int | None = None
    per_account_max: int | None = None
    if lines.per_account is not None:
        every_account = set(account_names) | set(names)
        summed = sum(lines.for_account(name) or 0 for name in every_account)
        per_account_max = max([lines.per_account, *lines.accounts.values()])
    fleet_line = _min_known(lines.fleet, summed)
    new_job = _min_known(fleet_line, per_account_max) if config.policy == "accept" else 0
    return OutageBound(
        outage_seconds=outage_seconds,
        config=config,
        accounts=rows,
        other_accounts=other,
        fleet_running_ucredits=sum(sum(values) for values in by_account.values()),
        fleet_line_ucredits=fleet_line,
        running_job_max_ucredits=0 if largest is None else largest[0],
        running_job_max=None if largest is None or largest[0] == 0 else largest[1],
        new_job_max_ucredits=new_job,
        running_runs=count,
    )


def _min_known(*values: int | None) -> int | None:
    known = [value for value in values if value is not None]
    return min(known) if known else None


def _credits(ucredits: int | None) -> str:
    return "unbounded" if ucredits is None else format_credits(ucredits)


def outage_prices(s: Session, now: datetime) -> dict[str, dict[str, Any]]:
    """The prices the hooks estimate with during an outage, micro-credits per GPU-hour:
    per GPU type (`prices`) and per partition's own (`partition_prices`), each the
    highest of the version in force now and every version scheduled after now, so a
    price rise during the outage never makes an estimate low."""
    from ledger.pricing.prices import price_versions  # here: the bound itself needs no prices

    highest: dict[tuple[str, str | None], int] = {}
    for version in price_versions(s, now):
        if not version["in_force"] and parse_time(version["effective_at"]) <= now:
            continue  # superseded
        key = (version["gres"], version["partition"])
        price = parse_credits(version["credits_per_gpu_hour"], allow_zero=True)
        highest[key] = max(price, highest.get(key, 0))
    general: dict[str, int] = {}
    by_partition: dict[str, dict[str, int]] = {}
    for (gres, partition), price in sorted(highest.items(), key=lambda item: (item[0][0], item[0][1] or "")):
        if partition is None:
            general[gres] = price
        else:
            by_partition.setdefault(partition, {})[gres] = price
    return {"prices": general, "partition_prices": by_partition}


def current_outage_bound(
    s: Session, config: Mapping[str, Any], outage_seconds: int, now: datetime
) -> OutageBound:
    """The bound for an outage starting `now`, from the configuration, the ledger's
    accounts and its active holds (the runs running now)."""
    from ledger.books.accounts import account_names
    from ledger.holds.state import list_holds

    settings = OutageConfig.from_config(config)
    running = [
        RunningRun(
            account=hold.account,
            cluster=hold.cluster,
            job_id=hold.job_id,
            run=hold.run,
            rate_ucredits_per_hour=hold.rate_ucredits_per_hour,
            limit_seconds=hold.limit_seconds,
            held_ucredits=hold.amount_ucredits,
            charged_ucredits=hold.charged_ucredits,
            started_at=hold.started_at,
        )
        for hold in list_holds(s, state=HoldStatus.ACTIVE, limit=1_000_000)
    ]
    return outage_bound(settings, outage_seconds, running, account_names(s), now)
