"""The daemon's answer for a job that states a cost limit or may run in the cloud: where
it may run (on-premise first), what it is quoted, and why (docs/routing.md).

The money rules are the ledger's (`ledger.api.route`). This module prices the job in
each candidate partition from the in-memory snapshot (a partition's own time limit when
the job gives none, its own dearest type for untyped GPUs), skips partitions that lack
a GPU type the job names, and words the decision twice: the sbatch message, and the
comment job_submit.lua writes on the job ahead of the user's own text, which
`scontrol show job` and `sacct -o Comment` show later.

Where the site holds cloud partitions back (`[routing] burst_after_seconds`), a job
allowed both sites is given its on-premise partitions now and its cloud ones, with its
cost in each, in its AdminComment (job_submit/burst_mark.py), which only an operator can
set: the daemon's burst pass (gpucredit/daemon/burst_keeper.py) adds them once the job
has waited that long, if the account's cloud budget still has room. A task array is
never held back: its pending tasks share one record, which the pass would have to
re-partition while some tasks already run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from job_submit.burst_mark import BurstMark
from job_submit.pricing import PartitionTypes, credit_words, job_text, typed_gpus
from job_submit.request import JobRequest, parse_submit
from ledger.api import CostLimit, PartitionOption, Route, RoutingConfig, Snapshot, candidate_partitions, route
from ledger.errors import LedgerError
from ledger.money import format_credits
from slurmtext import routed_comment

TAG = "gpucredit"
ALLOW_CLOUD = "add gpucredit:cloud=yes to --comment"
# Why a partition was left out, by the ledger's verdict (ledger/pricing/routing.py).
LEFT_OUT = {
    "cloud_not_allowed": "cloud not allowed",
    "other_region": "not the job's region",
    "over_limit": "over the limit",
    "over_cloud_budget": "over the account's cloud budget",
    "over_credit": "more than is available",
}


class NoTimeLimit(Exception):
    """A candidate partition gives the job no time limit, so it cannot be priced."""


def answer_routed(
    snapshot: Snapshot,
    request: JobRequest,
    fields: Mapping[str, object],
    limit: CostLimit,
    config: RoutingConfig,
    *,
    top_up_hint: str,
    partition_types: PartitionTypes,
    now: datetime,
) -> dict[str, str]:
    """{"decision", "message"}; an accepted job also gets "partition" (the allowed list,
    unless it is the default partition) and "comment". Raises LedgerError (NotFound for
    an unknown account) and NoTimeLimit like the plain estimate's callers expect."""
    assert request.account is not None
    requested = [name.strip() for name in (request.partition or "").split(",") if name.strip()]
    options, texts, notes = _options(snapshot, request, fields, requested, config, partition_types, now)
    spend = None if limit.cloud_budget_ucredits is None else snapshot.cloud_spend(request.account)
    decision = route(
        options, limit=limit, cloud_permitted=limit.allow_cloud or bool(requested), cloud_spend=spend
    )
    refused_at = decision.refused_at
    if refused_at is not None:
        return _refusal(decision, refused_at, request.account, texts, notes, top_up_hint)
    quote = decision.quote
    assert quote is not None
    quoted = next(o for o in decision.allowed if o.estimate is quote)
    several = len(decision.allowed) > 1
    eligible = not requested and not request.is_array
    first, later = decision.burst_plan(config.burst_after_seconds, eligible=eligible)
    held = Held(first, later, config.burst_after_seconds) if later else None
    head = f"~{format_credits(quote.cost_ucredits)} credits{' at most' if several else ''}"
    message = (
        f"{TAG}: {head} ({texts[quoted.partition]}) {_placement(decision, held)}{notes[quoted.partition]}"
        f"{_limit_text(limit, request.account)}; "
        f"{format_credits(quote.available_ucredits)} available in {request.account}"
    )
    answer = {"decision": "accept", "message": message, "comment": _comment(decision, request, held)}
    if first:
        answer["partition"] = ",".join(first)
    if later:
        costs = {o.partition: o.estimate.cost_ucredits for o in decision.allowed if o.partition is not None}
        answer["admin_comment"] = BurstMark(sent=False, costs={name: costs[name] for name in later}).text
    return answer


def _options(
    snapshot: Snapshot,
    request: JobRequest,
    fields: Mapping[str, object],
    requested: list[str],
    config: RoutingConfig,
    partition_types: PartitionTypes,
    now: datetime,
) -> tuple[list[PartitionOption], dict[str | None, str], dict[str | None, str]]:
    """An estimate per candidate partition the job can run in, with its description and
    untyped-GPU note; LedgerError when it can run in none."""
    assert request.account is not None
    options: list[PartitionOption] = []
    texts: dict[str | None, str] = {}
    notes: dict[str | None, str] = {}
    skipped: LedgerError | None = None
    for name in candidate_partitions(requested, config, request.offered_partitions):
        job = request if name == request.partition else parse_submit({**fields, "partition": name})
        if job.time_limit_seconds is None:
            raise NoTimeLimit(name)
        offered = partition_types(name)
        named_types = [gres for gres in job.gpus if gres is not None]
        if name is not None and offered is not None and not set(named_types) <= set(offered):
            skipped = LedgerError(
                f"no partition this job may use offers {', '.join(sorted(named_types))}", code="unknown_gres"
            )
            continue
        try:
            gpus, notes[name] = typed_gpus(snapshot, job, now, partition_types)
        except LedgerError as error:  # no priced type here for untyped GPUs
            skipped = error
            continue
        seconds = job.time_limit_seconds
        estimate = snapshot.estimate(
            request.account, gpus, seconds, user=job.user, partition=name, at=now, tasks=job.array_tasks
        )
        options.append(PartitionOption(name, config.site(name), estimate, config.region(name)))
        texts[name] = job_text(gpus, seconds, job.array_tasks)
    if not options:
        assert skipped is not None
        raise skipped
    return options, texts, notes


def _where(option: PartitionOption) -> str:
    return option.partition or "the default partition"


def _run_cost(option: PartitionOption) -> str:
    """One run's cost (one task of an array): what the limit is compared with."""
    return f"~{format_credits(option.estimate.cost_per_task_ucredits)}"


@dataclass(frozen=True)
class Held:
    """Cloud partitions held back: the job gets `now`, the burst pass adds `later` once
    it has waited `seconds`."""

    now: tuple[str, ...]
    later: tuple[str, ...]
    seconds: int


def _placement(decision: Route, held: Held | None) -> str:
    """`in onprem` or `in onprem (~1.00) or cloud (~1.50), where Slurm can start it first`
    (held back: `in onprem (~1.00), or cloud (~1.50) if it has not started within 30 s`),
    then the partitions left out and why."""
    allowed = decision.allowed
    if len(allowed) == 1:
        text = f"in {_where(allowed[0])}"
    elif held is not None:
        first, then = (
            " or ".join(f"{_where(o)} ({_run_cost(o)})" for o in allowed if o.partition in names)
            for names in (held.now, held.later)
        )
        text = f"in {first}, or {then} if it has not started within {held.seconds} s"
    else:
        listed = " or ".join(f"{_where(o)} ({_run_cost(o)})" for o in allowed)
        text = f"in {listed}, where Slurm can start it first"
    left_out = [
        f"not {_where(o)} ({_run_cost(o)}, {_left_out_reason(o, decision)})"
        for o in decision.options
        if decision.verdict(o) != "allowed"
    ]
    return "; ".join([text, *left_out])


def _left_out_reason(option: PartitionOption, decision: Route) -> str:
    verdict = decision.verdict(option)
    if verdict == "over_cap" and option.estimate.limit_breach is not None:
        return option.estimate.limit_breach.code
    if verdict == "other_region":
        return f"{_region_of(option)}, not {decision.limit.region}"
    return LEFT_OUT.get(verdict, verdict)


def _region_of(option: PartitionOption) -> str:
    return f"in {option.region}" if option.region else "no region"


def _limit_source(limit: CostLimit, account: str) -> str:
    return "your comment" if limit.max_cost_from == "job" else f"{account}'s default"


def _limit_text(limit: CostLimit, account: str) -> str:
    if limit.max_cost_ucredits is None:
        return ""
    return f"; limit {format_credits(limit.max_cost_ucredits)} a run ({_limit_source(limit, account)})"


def _comment(decision: Route, request: JobRequest, held: Held | None) -> str:
    """The decision and its reasons, for the job's comment (one line, no '=')."""
    where = ",".join(decision.partitions) or "the default partition"
    if held is not None:
        where = f"{','.join(held.now)}, then {','.join(held.later)} after {held.seconds} s"
    limit = decision.limit
    terms = []
    if limit.max_cost_ucredits is not None:
        terms.append(f"limit {format_credits(limit.max_cost_ucredits)} a run")
    if limit.allow_cloud:
        terms.append("cloud allowed")
    if limit.region is not None:
        terms.append(f"region {limit.region}")
    reasons = ", ".join(
        f"{_where(o)} {_run_cost(o)} "
        + ("allowed" if decision.verdict(o) == "allowed" else _left_out_reason(o, decision))
        for o in decision.options
    )
    why = f" ({', '.join(terms)})" if terms else ""
    return routed_comment(f"routed to {where}{why}: {reasons}", request.user_comment)


def _refusal(
    decision: Route,
    refused_at: PartitionOption,
    account: str,
    texts: Mapping[str | None, str],
    notes: Mapping[str | None, str],
    top_up_hint: str,
) -> dict[str, str]:
    verdict = decision.verdict(refused_at)
    estimate = refused_at.estimate
    what = f"{texts[refused_at.partition]} in {_where(refused_at)}{notes[refused_at.partition]}"
    if verdict == "cloud_not_allowed":
        message = f"this job can only run in the cloud ({what}, {_run_cost(refused_at)}); {ALLOW_CLOUD}"
    elif verdict == "other_region":
        message = (
            f"this job can only run in the cloud, and {_where(refused_at)} is {_region_of(refused_at)}, "
            f"not the job's region {decision.limit.region}: "
            "name a partition in that region, or change gpucredit:region in --comment"
        )
    elif verdict == "over_limit":
        limit = decision.limit
        assert limit.max_cost_ucredits is not None
        message = (
            f"this job would cost at least ~{format_credits(estimate.cost_per_task_ucredits)} credits a run "
            f"({what}) but its limit is {format_credits(limit.max_cost_ucredits)} "
            f"({_limit_source(limit, account)}). "
            "Raise gpucredit:max_cost in --comment, or ask for fewer GPUs or less time"
            + _cloud_would_fit(decision)
        )
    elif verdict in ("over_cap", "over_cloud_budget"):
        # A cap and the cloud budget are refused alike: the breach's code, its words, the job.
        breach = estimate.limit_breach if verdict == "over_cap" else decision.budget_breach(refused_at)
        assert breach is not None
        message = f"{breach.code}: {breach.message} (job: {what})"
    else:
        message = (
            f"this job would cost ~{format_credits(estimate.cost_ucredits)} credits ({what}) but only "
            f"{credit_words(estimate, account)[1]}. " + top_up_hint.replace("{account}", account)
        )
    return {"decision": "reject", "message": f"{TAG}: {message}"}


def _cloud_would_fit(decision: Route) -> str:
    """`; cloud (~0.09) is within it: add gpucredit:cloud=yes ...` when that is so."""
    limit = decision.limit.max_cost_ucredits
    fits = [
        o
        for o in decision.options
        if decision.verdict(o) == "cloud_not_allowed"
        and limit is not None
        and o.estimate.cost_per_task_ucredits <= limit
    ]
    if not fits:
        return ""
    return f"; {_where(fits[0])} ({_run_cost(fits[0])}) is within it: {ALLOW_CLOUD}"
