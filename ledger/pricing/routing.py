"""Routing a GPU job between on-premise and cloud partitions under a cost limit.

A user may cap what one run of a job can cost (`--comment=gpucredit:max_cost=25`, or
the account's default in `[routing.accounts.NAME]`) and may let gpucredit send it to
the cloud (`cloud=yes`). job_submit then gives Slurm every partition the limit allows,
on-premise first, and Slurm starts the job wherever it can start first (slurm.conf's
PriorityTier prefers on-premise). This module holds the money rules of that choice; the
daemon gathers the inputs (an `Estimate` per candidate partition) and job_submit/ words
the answer (docs/routing.md).

Partitions are tagged in the config (`[partitions.NAME] site = "onprem"|"cloud"`); an
untagged partition counts as on-premise. Cloud prices are per-partition prices in the
ledger (`gpucredit price set h100 5.40 --partition cloud`), never a multiplier applied
here: a hold, a quote and the bridge then all read one versioned price.

Each candidate partition gets the first verdict that matches:

    site permitted?  one run <= limit?  within cloud budget?  no cap broken?  affordable?  verdict
    no                                                                                  cloud_not_allowed
    not its region                                                                      other_region
    yes              no                                                                 over_limit
    yes              yes                no                                              over_cloud_budget
    yes              yes                yes                   no                        over_cap
    yes              yes                yes                   yes             no        over_credit
    yes              yes                yes                   yes             yes       allowed

A cloud partition may name its provider's region (`[partitions.NAME] region`). A job
that prefers a region (`gpucredit:region=us-west-2`, or the account's default) runs in
the cloud only there: a cloud partition elsewhere, or with no region, is `other_region`.
On-premise partitions have no region and are never left out for one.

"Within cloud budget" asks only of a cloud partition of an account with a monthly
`cloud_budget`: the month's cloud spend (ledger.pricing.cloud_budget: charged, net of
refunds, plus open cloud holds) plus this job's quote there (every task) must not pass
the budget; exactly the budget fits. An on-premise partition always is.

A site may hold cloud partitions back (`[routing] burst_after_seconds`): a job allowed
both on-premise and cloud partitions, that did not name its partitions itself, is given
the on-premise ones at submit and the cloud ones once it has waited that long
(`Route.burst_plan`; the daemon adds them). Its quote is still the dearest allowed run.

A cloud partition is permitted when the job allows cloud or names its partitions itself
(`-p` is the user's own choice). The job may run in the allowed partitions and is quoted
at the dearest of them: its hold can be no more, wherever Slurm starts it. With none
allowed it is refused for the verdict of the option that got furthest down the table's
columns (a partition within the limit but beyond the credit makes it a refusal for
credit), naming the cheapest option with that verdict.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ledger.errors import InvalidInput, LimitExceeded
from ledger.money import parse_credits
from ledger.pricing.cloud_budget import CloudBudgetScope, CloudSpend, cloud_budget_breach
from ledger.pricing.quotes import Estimate

__all__ = [
    "ALLOWED",
    "CLOUD",
    "CLOUD_NOT_ALLOWED",
    "ONPREM",
    "OTHER_REGION",
    "OVER_CAP",
    "OVER_CLOUD_BUDGET",
    "OVER_CREDIT",
    "OVER_LIMIT",
    "CostLimit",
    "PartitionOption",
    "Route",
    "RoutingConfig",
    "candidate_partitions",
    "route",
]

ONPREM = "onprem"
CLOUD = "cloud"
SITES = (ONPREM, CLOUD)

ALLOWED = "allowed"
CLOUD_NOT_ALLOWED = "cloud_not_allowed"
OTHER_REGION = "other_region"
OVER_LIMIT = "over_limit"
OVER_CLOUD_BUDGET = "over_cloud_budget"
OVER_CAP = "over_cap"
OVER_CREDIT = "over_credit"
# the table's order
_STAGES = (CLOUD_NOT_ALLOWED, OTHER_REGION, OVER_LIMIT, OVER_CLOUD_BUDGET, OVER_CAP, OVER_CREDIT, ALLOWED)

# What `[routing.accounts.NAME]` may set, and `[routing]` itself.
ACCOUNT_KEYS = frozenset({"max_cost", "cloud", "cloud_budget", "region"})
PARTITION_KEYS = frozenset({"site", "region"})
REGION = re.compile(r"[a-z][a-z0-9-]{0,31}")  # a provider's region name: us-west-2
ROUTING_KEYS = frozenset({"accounts", "burst_after_seconds"})

# Where a limit came from, for the message.
FROM_JOB = "job"
FROM_ACCOUNT = "account"


@dataclass(frozen=True)
class CostLimit:
    """What a job may cost per run (None: no limit) and whether gpucredit may add cloud
    partitions; `max_cost_from` says who set the limit (FROM_JOB or FROM_ACCOUNT);
    `cloud_budget_ucredits` is the account's monthly cloud budget (None: none); `region`
    the only region whose cloud partitions it may use (None: any)."""

    max_cost_ucredits: int | None = None
    allow_cloud: bool = False
    max_cost_from: str = FROM_JOB
    cloud_budget_ucredits: int | None = None
    region: str | None = None


@dataclass(frozen=True)
class RoutingConfig:
    """Partition sites and regions, accounts' default limits and how long a job waits
    on-premise before its cloud partitions are added (0: none held back), read once from
    the config."""

    sites: Mapping[str, str]
    account_defaults: Mapping[str, CostLimit]
    burst_after_seconds: int = 0
    regions: Mapping[str, str] = field(default_factory=dict)  # cloud partition -> its region

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RoutingConfig:
        """`[partitions.NAME] site, region` and `[routing.accounts.NAME] max_cost, cloud,
        cloud_budget, region`; a bad value raises InvalidInput naming the key."""
        sites: dict[str, str] = {}
        regions: dict[str, str] = {}
        for name, table in dict(config.get("partitions") or {}).items():
            table = dict(table or {})
            site = table.get("site", ONPREM)
            if site not in SITES:
                raise InvalidInput(
                    f"partitions.{name}.site must be one of {', '.join(SITES)}, not {site!r}",
                    code="invalid_config",
                )
            sites[str(name)] = site
            if "region" in table:
                if site != CLOUD:
                    raise InvalidInput(
                        f'partitions.{name}.region is for a cloud partition (site = "cloud")',
                        code="invalid_config",
                    )
                regions[str(name)] = _region(table["region"], f"partitions.{name}.region")
        defaults: dict[str, CostLimit] = {}
        routing = dict(config.get("routing") or {})
        unknown = sorted(set(routing) - ROUTING_KEYS)
        if unknown:
            raise InvalidInput(
                f"routing.{unknown[0]} is not a routing setting (known: {', '.join(sorted(ROUTING_KEYS))})",
                code="invalid_config",
            )
        burst_after = routing.get("burst_after_seconds", 0)
        if isinstance(burst_after, bool) or not isinstance(burst_after, int) or burst_after < 0:
            raise InvalidInput(
                f"routing.burst_after_seconds must be whole seconds, 0 or more, not {burst_after!r}",
                code="invalid_config",
            )
        accounts = dict(routing.get("accounts") or {})
        for account, table in accounts.items():
            table = dict(table or {})
            unknown = sorted(set(table) - ACCOUNT_KEYS)
            if unknown:  # a misspelt budget must not pass silently as "no budget"
                raise InvalidInput(
                    f"routing.accounts.{account}.{unknown[0]} is not a routing setting "
                    f"(known: {', '.join(sorted(ACCOUNT_KEYS))})",
                    code="invalid_config",
                )
            cloud = table.get("cloud", False)
            if not isinstance(cloud, bool):
                raise InvalidInput(
                    f"routing.accounts.{account}.cloud must be true or false, not {cloud!r}",
                    code="invalid_config",
                )
            region = table.get("region")
            if region is not None:
                field_name = f"routing.accounts.{account}.region"
                _known_region(_region(region, field_name), regions.values(), field_name, "invalid_config")
            defaults[str(account)] = CostLimit(
                _credits_or_none(table, "max_cost", account),
                cloud,
                FROM_ACCOUNT,
                _credits_or_none(table, "cloud_budget", account, allow_zero=True),  # "0": no cloud
                region,
            )
        return cls(sites, defaults, burst_after, regions)

    def cloud_partitions(self) -> frozenset[str]:
        return frozenset(name for name, site in self.sites.items() if site == CLOUD)

    def cloud_budget_of(self, account: str) -> int | None:
        """The account's monthly cloud budget in micro-credits (None: it has none)."""
        default = self.account_defaults.get(account)
        return None if default is None else default.cloud_budget_ucredits

    def budget_scope(self) -> CloudBudgetScope | None:
        """The cloud partitions and the accounts with a cloud budget, for the snapshot to
        read the month's spend of; None when no account has one."""
        budgeted = frozenset(
            a for a, d in self.account_defaults.items() if d.cloud_budget_ucredits is not None
        )
        if not budgeted:
            return None
        return CloudBudgetScope(self.cloud_partitions(), budgeted)

    def names_cloud(self, partitions: Sequence[str]) -> bool:
        return any(self.site(name) == CLOUD for name in partitions)

    def site(self, partition: str | None) -> str:
        return self.sites.get(partition or "", ONPREM)

    def region(self, partition: str | None) -> str | None:
        return self.regions.get(partition or "")

    def limit_for(
        self,
        account: str,
        max_cost: str | None,
        cloud: bool | None,
        *,
        names_cloud: bool = False,
        region: str | None = None,
    ) -> CostLimit | None:
        """The job's own `max_cost` (credits), `cloud` and `region`, each else the
        account's default; None when the job neither has a limit nor may go to the cloud
        (no routing). A job that names a cloud partition itself (`names_cloud`, `-p cloud`)
        of an account with a cloud budget, or with a region, is routed too: the budget
        and the region bind whoever chose the cloud. A region no cloud partition is in
        raises InvalidInput: a misspelt region must not quietly keep a job on-premise."""
        if region is not None:
            _known_region(region, self.regions.values(), "region")
        default = self.account_defaults.get(account)
        if default is None:
            if max_cost is None and not cloud and not (names_cloud and region):  # a site without routing
                return None
            default = CostLimit(max_cost_from=FROM_ACCOUNT)
        limit = CostLimit(
            default.max_cost_ucredits if max_cost is None else parse_credits(max_cost, field="max_cost"),
            default.allow_cloud if cloud is None else cloud,
            default.max_cost_from if max_cost is None else FROM_JOB,
            default.cloud_budget_ucredits,
            default.region if region is None else region,
        )
        binds = names_cloud and (limit.cloud_budget_ucredits is not None or limit.region is not None)
        if limit.max_cost_ucredits is None and not limit.allow_cloud and not binds:
            return None
        return limit


def _region(value: Any, field_name: str) -> str:
    if not isinstance(value, str) or not REGION.fullmatch(value):
        raise InvalidInput(
            f"{field_name} must be a region name like us-west-2, not {value!r}", code="invalid_config"
        )
    return value


def _known_region(region: str, known: Collection[str], field_name: str, code: str = "invalid_input") -> None:
    if region not in known:
        listed = ", ".join(sorted(set(known))) or "none: no [partitions.NAME] has a region"
        raise InvalidInput(
            f"{field_name}: no cloud partition is in region {region} (regions: {listed})",
            code=code,
            details={"field": field_name},
        )


def _credits_or_none(
    table: Mapping[str, Any], key: str, account: str, *, allow_zero: bool = False
) -> int | None:
    value = table.get(key)
    field = f"routing.accounts.{account}.{key}"
    return None if value is None else parse_credits(value, field=field, allow_zero=allow_zero)


def candidate_partitions(
    requested: Sequence[str], config: RoutingConfig, offered: Collection[str]
) -> list[str | None]:
    """The partitions a routed job is priced in: those it names (-p), else every tagged
    partition Slurm offers it (`offered`, its part_list; empty: not known), else the
    default partition (None)."""
    if requested:
        return list(dict.fromkeys(requested))
    tagged = [name for name in config.sites if not offered or name in offered]
    return sorted(tagged, key=lambda name: (SITES.index(config.site(name)), name)) or [None]


@dataclass(frozen=True)
class PartitionOption:
    """One partition a job could run in (None: the default partition) and its estimate."""

    partition: str | None
    site: str
    estimate: Estimate
    region: str | None = None  # a cloud partition's provider region


@dataclass(frozen=True)
class Route:
    """The decision: every option with its verdict, on-premise first, then cheapest."""

    limit: CostLimit
    options: tuple[PartitionOption, ...]
    verdicts: tuple[str, ...]
    cloud_spend: CloudSpend | None = None  # the account's this month, when it has a budget

    @property
    def allowed(self) -> tuple[PartitionOption, ...]:
        return tuple(o for o, v in zip(self.options, self.verdicts, strict=True) if v == ALLOWED)

    @property
    def partitions(self) -> tuple[str, ...]:
        """The allowed partitions, for job_desc.partition (empty: leave Slurm's default)."""
        return tuple(o.partition for o in self.allowed if o.partition is not None)

    @property
    def quote(self) -> Estimate | None:
        """The dearest allowed run: the most its hold can be, wherever it starts."""
        allowed = self.allowed
        return max((o.estimate for o in allowed), key=lambda e: e.cost_ucredits) if allowed else None

    @property
    def refusal(self) -> str | None:
        """Why no partition is allowed: the verdict that got furthest; None when one is."""
        furthest = max(self.verdicts, key=_STAGES.index)
        return None if furthest == ALLOWED else furthest

    @property
    def refused_at(self) -> PartitionOption | None:
        """The cheapest option with the refusal's verdict: the figure a refusal names."""
        refusal = self.refusal
        if refusal is None:
            return None
        return min(
            (o for o, v in zip(self.options, self.verdicts, strict=True) if v == refusal),
            key=lambda o: o.estimate.cost_per_task_ucredits,
        )

    def verdict(self, option: PartitionOption) -> str:
        return self.verdicts[self.options.index(option)]

    def burst_plan(self, wait_seconds: int, *, eligible: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(the partitions to give the job now, the cloud ones to add once it has waited
        `wait_seconds`). Nothing is held back when the site holds nothing back, when
        the job is not `eligible` (it named its partitions itself: `-p` is the user's own
        choice), or unless both an on-premise and a cloud partition are allowed."""
        now = tuple(o.partition for o in self.allowed if o.site == ONPREM and o.partition is not None)
        later = tuple(o.partition for o in self.allowed if o.site == CLOUD and o.partition is not None)
        if wait_seconds <= 0 or not eligible or not now or not later:
            return self.partitions, ()
        return now, later

    def budget_breach(self, option: PartitionOption) -> LimitExceeded | None:
        """Why running `option` would pass the account's cloud budget (None: it would not)."""
        return _budget_breach(option, self.limit, self.cloud_spend)


def route(
    options: Sequence[PartitionOption],
    *,
    limit: CostLimit,
    cloud_permitted: bool,
    cloud_spend: CloudSpend | None = None,
) -> Route:
    """Give each option its verdict (see the module's table); `cloud_permitted` is the job's
    permission for cloud partitions (it allows cloud, or named its partitions itself);
    `cloud_spend` the account's cloud spend this month, needed when it has a budget."""
    if not options:
        raise ValueError("route() needs at least one partition option")
    if limit.cloud_budget_ucredits is not None and cloud_spend is None:
        raise ValueError("route() needs the month's cloud spend of an account with a cloud budget")
    ordered = tuple(
        sorted(
            options,
            key=lambda o: (SITES.index(o.site), o.estimate.cost_per_task_ucredits, o.partition or ""),
        )
    )
    verdicts = tuple(_verdict(o, limit, cloud_permitted, cloud_spend) for o in ordered)
    return Route(limit, ordered, verdicts, cloud_spend)


def _verdict(
    option: PartitionOption, limit: CostLimit, cloud_permitted: bool, cloud_spend: CloudSpend | None
) -> str:
    estimate = option.estimate
    if option.site == CLOUD and not cloud_permitted:
        return CLOUD_NOT_ALLOWED
    if option.site == CLOUD and limit.region is not None and option.region != limit.region:
        return OTHER_REGION
    if limit.max_cost_ucredits is not None and estimate.cost_per_task_ucredits > limit.max_cost_ucredits:
        return OVER_LIMIT
    if _budget_breach(option, limit, cloud_spend) is not None:
        return OVER_CLOUD_BUDGET
    if estimate.limit_breach is not None:
        return OVER_CAP
    if not estimate.affordable:
        return OVER_CREDIT
    return ALLOWED


def _budget_breach(
    option: PartitionOption, limit: CostLimit, cloud_spend: CloudSpend | None
) -> LimitExceeded | None:
    if option.site != CLOUD or limit.cloud_budget_ucredits is None or cloud_spend is None:
        return None
    return cloud_budget_breach(cloud_spend, limit.cloud_budget_ucredits, option.estimate.cost_ucredits)
