"""The simulator's verdict: the ledger's books against an independent recomputation.

* Exactness. Every run Slurm recorded (the simulated sacct) is priced here, without
  the ledger's pricing code: GPUs x the price per GPU-hour in force at the run's start
  (the simulation's own price schedule), x elapsed seconds / 3600, rounded half up to
  the micro-credit once; a NODE_FAIL run is refunded (0), a run that never started or
  ran 0 s costs 0. Per account, the sum must equal what the ledger's journal says the
  account was charged (revenue postings, `api.fairness_inputs`), to the micro-credit;
  per run, each hold's charge must equal the run's price. Every change the bridge
  made after the hooks and the meter is listed by kind, and every adjustment must be
  linked to the charge it corrects (`links_entry_id`, `api.hold_entries`).
* Overspend. The most negative available credit sampled per account, against the
  bound for the mode and policy (full + reject: 0, plus what Slurm's record showed
  after the fact: upward corrections of a run's charge).
* Fairness. Jain's index of GPU-seconds per account divided by the account's mean
  share of the fairshare formula's shares over the run.
* Throughput: ledger operations, the seconds spent in ledger calls, wall time.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from accounting_bridge.slurm.records import SacctRun
from bench.sim.engine import MONEY_MOVES, Books, Simulation
from bench.sim.workload import PRICE_CHANGE, PRICES_UCREDITS_PER_HOUR, T0
from ledger import api
from ledger.money import format_credits

SECONDS_PER_HOUR = 3600


def price_at(gpu_type: str, when: datetime, days: int) -> int:
    """The simulation's price schedule: the base prices, one change halfway through."""
    changed_type, changed_price = PRICE_CHANGE
    if gpu_type == changed_type and when >= T0 + timedelta(seconds=days * 86_400 // 2):
        return changed_price
    return PRICES_UCREDITS_PER_HOUR[gpu_type]


def expected_charge(run: SacctRun, days: int, refund_node_fail: bool = True) -> int:
    """What the run should cost, from Slurm's record alone."""
    if run.start is None or run.elapsed_seconds <= 0 or not run.gpus:
        return 0
    if run.state == "NODE_FAIL" and refund_node_fail:
        return 0
    rate = sum(count * price_at(t, run.start, days) for t, count in run.gpus.items())
    # Half up, once, on the whole run: floor(x + 1/2) with x = rate x seconds / 3600.
    return (2 * rate * run.elapsed_seconds + SECONDS_PER_HOUR) // (2 * SECONDS_PER_HOUR)


def jain(values: list[float]) -> float:
    if not values or not any(values):
        return 0.0
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def _ledger_runs(s: Session) -> dict[tuple[int, int], tuple[int, int]]:
    """(job id, run) -> (hold id, charge) for every hold, paged newest first."""
    runs: dict[tuple[int, int], tuple[int, int]] = {}
    before: int | None = None
    while True:
        page = api.holds_page(s, before_id=before, limit=5000)
        if not page:
            return runs
        for hold in page:
            runs[(hold.job_id, hold.run)] = (hold.id, hold.charged_ucredits)
        before = page[-1].id


def check(sim: Simulation, factory: sessionmaker[Session], wall_seconds: float) -> dict[str, Any]:
    """Read the ledger after a run and compare; returns the report as plain data."""
    books: Books = sim.books
    config = sim.config
    days = config.days
    expected: Counter[str] = Counter()
    expected_run: dict[tuple[int, int], int] = {}
    gpu_seconds: Counter[str] = Counter()
    for run in books.runs:
        charge = expected_charge(run, days)
        expected[run.account] += charge
        expected_run[(run.job_id, run.run)] = charge
        gpu_seconds[run.account] += run.gpu_count * run.elapsed_seconds
    with factory() as s, s.begin():
        inputs = api.fairness_inputs(
            s, books.end, funded_since=T0 - timedelta(days=60), spent_since=T0 - timedelta(days=60)
        )
        ledger_runs = _ledger_runs(s)
        linked = unlinked = 0
        for _account, outcome in books.reconcile_outcomes:
            if outcome.counter not in ("adjusted", "refunded") or outcome.hold_id is None:
                continue
            for entry in api.hold_entries(s, outcome.hold_id):
                if entry["kind"] == "adjust":
                    if entry["links_entry_id"] is None:
                        unlinked += 1
                    else:
                        linked += 1
        verify = api.verify(s)
    charged = {row.account: row.spent_ucredits for row in inputs}
    accounts = sorted(a.name for a in sim.workload.accounts)

    per_run_wrong = []
    for key, want in sorted(expected_run.items()):
        got = ledger_runs.get(key, (None, 0))[1]
        if got != want:
            per_run_wrong.append(
                f"job {key[0]} run {key[1]}: ledger {format_credits(got)}, sacct {format_credits(want)}"
            )
    lines: list[dict[str, Any]] = []
    for account in accounts:
        changes = books.reconcile_changes.get(account, Counter())
        bridge = sum(changes.values())
        lines.append(
            {
                "account": account,
                "expected": expected[account],
                "ledger": charged.get(account, 0),
                "hooks_and_meter": charged.get(account, 0) - bridge,
                "bridge": {k: changes[k] for k in MONEY_MOVES if changes[k]},
                "difference": charged.get(account, 0) - expected[account],
            }
        )
    wrong_accounts = [line for line in lines if line["difference"] != 0]

    # Overspend against the bound.
    upward: Counter[str] = Counter()
    for account, outcome in books.reconcile_outcomes:
        if outcome.counter == "adjusted" and outcome.change_ucredits > 0:
            upward[account] += outcome.change_ucredits
    overspend: list[dict[str, Any]] = []
    for account in accounts:
        debt = max(0, -books.min_available.get(account, 0))
        outage = books.outage_bounds.get(account, 0 if config.policy == "reject" else None)
        bound = None if outage is None else outage + upward[account]
        overspend.append({"account": account, "debt": debt, "bound": bound})
    over_bound = [o for o in overspend if o["bound"] is not None and o["debt"] > o["bound"]]
    worst = sorted(overspend, key=lambda o: -o["debt"])[:5]

    shares = {a: books.share_sums.get(a, 0.0) / books.share_samples for a in accounts if books.share_samples}
    fair_values = [gpu_seconds[a] / shares[a] for a in accounts if shares.get(a, 0) > 0]
    fairness = jain(fair_values)

    ledger_ops = sum(v for k, v in books.ops.items() if k not in ("setup", "read"))
    problems: list[str] = []
    if wrong_accounts:
        problems.append(f"{len(wrong_accounts)} accounts' charges differ from sacct's record")
    if per_run_wrong:
        problems.append(f"{len(per_run_wrong)} runs charged differently from sacct's record")
    if unlinked:
        problems.append(f"{unlinked} adjustments not linked to the charge they correct")
    if books.recheck_moves:
        problems.append(f"reconciling every run again moved money on {books.recheck_moves} runs")
    if books.reconcile_failures:
        problems.append(f"{len(books.reconcile_failures)} runs failed reconciliation")
    if over_bound:
        problems.append(f"{len(over_bound)} accounts overspent past the bound")
    if books.epilog_failures:
        problems.append(f"{len(books.epilog_failures)} epilog settles refused: {books.epilog_failures[:3]}")
    if books.duplicate_epilog_mismatches:
        problems.append(f"{len(books.duplicate_epilog_mismatches)} repeated epilogs charged differently")
    if not verify.ok:
        problems.append(f"audit verify: {len(verify.problems)} problems")
    return {
        "config": {
            "name": config.name,
            "nodes": sum(config.nodes.values()),
            "gpus": config.gpus,
            "gpu_types": dict(config.nodes),
            "accounts": config.accounts,
            "jobs": config.jobs,
            "days": days,
            "policy": config.policy,
            "hold_mode": config.mode,
            "lease_seconds": config.lease_window_seconds,
            "meter_interval_seconds": config.meter_interval_seconds,
            "bridge_interval_seconds": config.bridge_interval_seconds,
        },
        "ok": not problems,
        "problems": problems,
        "scale": {
            "runs": len(books.runs),
            "peak_running_jobs": books.peak_running_jobs,
            "peak_running_gpus": books.peak_running_gpus,
            "simulated_days": round((books.end - T0).total_seconds() / 86_400, 2),
        },
        "events": dict(sorted(books.events.items())),
        "exactness": {
            "accounts_exact": len(accounts) - len(wrong_accounts),
            "accounts": len(accounts),
            "expected_total": format_credits(sum(expected.values())),
            "ledger_total": format_credits(sum(charged.get(a, 0) for a in accounts)),
            "bridge_changes": {
                k: format_credits(sum(c[k] for c in books.reconcile_changes.values())) for k in MONEY_MOVES
            },
            "adjustments_linked": linked,
            "adjustments_unlinked": unlinked,
            "runs_wrong": len(per_run_wrong),
            "runs_wrong_first": per_run_wrong[:5],
            "recheck_moves": books.recheck_moves,
            "reconcile_failures": books.reconcile_failures[:5],
            "accounts_wrong": [
                {
                    **line,
                    "expected": format_credits(line["expected"]),
                    "ledger": format_credits(line["ledger"]),
                    "difference": format_credits(line["difference"]),
                }
                for line in wrong_accounts[:10]
            ],
        },
        "overspend": {
            "bound_rule": f"{books.outage_bound_source or 'no outage'}; plus upward corrections "
            "(usage Slurm reported after the epilog)",
            "accounts_in_debt": sum(1 for o in overspend if o["debt"] > 0),
            "accounts_over_bound": len(over_bound),
            "max_debt": format_credits(max((o["debt"] for o in overspend), default=0)),
            "worst": [
                {
                    "account": o["account"],
                    "debt": format_credits(o["debt"]),
                    "bound": None if o["bound"] is None else format_credits(o["bound"]),
                }
                for o in worst
            ],
        },
        "fairness": {"jain_gpu_time_per_share": round(fairness, 4), "accounts": len(fair_values)},
        "throughput": {
            "ledger_ops": ledger_ops,
            "ops": dict(sorted(books.ops.items())),
            "ledger_seconds": round(books.ledger_seconds, 2),
            "ledger_ops_per_second": round(ledger_ops / books.ledger_seconds, 1)
            if books.ledger_seconds
            else 0,
            "wall_seconds": round(wall_seconds, 2),
        },
        "audit": {
            "ok": verify.ok,
            "accounts": verify.accounts,
            "entries": verify.entries,
            "problems": verify.problems[:5],
        },
        "meter_errors": books.meter_errors[:5],
    }


def render(report: dict[str, Any]) -> str:
    """The report as text: a verdict first, then one section per figure."""
    c = report["config"]
    scale = report["scale"]
    ex = report["exactness"]
    over = report["overspend"]
    thr = report["throughput"]
    audit = report["audit"]
    out = [
        f"gpucredit fleet simulation: {c['name']} ({c['nodes']} nodes, {c['gpus']} GPUs "
        f"{c['gpu_types']}, {c['accounts']} accounts, {c['jobs']} jobs over {c['days']} days, "
        f"holds {c['hold_mode']}, policy {c['policy']}, store {c.get('store', '?')}, "
        f"seed {c.get('seed', '?')})",
        f"verdict: {'OK' if report['ok'] else 'FAILED'}" + "".join(f"\n  - {p}" for p in report["problems"]),
        f"scale: {scale['runs']} runs, peak {scale['peak_running_jobs']} running jobs on "
        f"{scale['peak_running_gpus']} GPUs, {scale['simulated_days']} simulated days",
        "events: " + ", ".join(f"{k} {v}" for k, v in report["events"].items()),
        f"exactness: {ex['accounts_exact']}/{ex['accounts']} accounts exact to the micro-credit; "
        f"charged {ex['ledger_total']} vs sacct {ex['expected_total']}; "
        f"runs wrong {ex['runs_wrong']}; re-reconciling every run moved {ex['recheck_moves']}",
        "  bridge changes after hooks and meter: "
        + ", ".join(f"{k} {v}" for k, v in ex["bridge_changes"].items())
        + f"; adjustments linked {ex['adjustments_linked']}, unlinked {ex['adjustments_unlinked']}",
    ]
    out += [f"  wrong: {line}" for line in ex["accounts_wrong"]]
    out += [f"  wrong run: {line}" for line in ex["runs_wrong_first"]]
    out += [
        f"overspend: {over['accounts_in_debt']} accounts ever in debt, max {over['max_debt']}, "
        f"{over['accounts_over_bound']} over the bound ({over['bound_rule']})",
        "  worst: " + "; ".join(f"{w['account']} debt {w['debt']} bound {w['bound']}" for w in over["worst"]),
        f"fairness: Jain's index of GPU time per share {report['fairness']['jain_gpu_time_per_share']} "
        f"over {report['fairness']['accounts']} accounts",
        f"ledger: {thr['ledger_ops']} operations in {thr['ledger_seconds']} s of ledger calls = "
        f"{thr['ledger_ops_per_second']} ops/s; wall time {thr['wall_seconds']} s",
        "  ops: " + ", ".join(f"{k} {v}" for k, v in thr["ops"].items()),
        f"audit verify: {'ok' if audit['ok'] else 'FAILED'} ({audit['accounts']} accounts, "
        f"{audit['entries']} entries)",
    ]
    return "\n".join(out)
