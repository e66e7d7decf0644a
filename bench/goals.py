"""One line per figure of the performance table (issue "Performance"), in one format.

Every bench ends by calling :func:`report` for each figure it measures, so `make bench`
prints the table's rows as they come and `grep '^goal '` on its output is the table:

    goal  ledger: daemon cycles/s ÷ pgbench tps  0.512  (goal >= 1.0, must >= 0.5)  reached

A figure is "reached" when it meets the must-reach bar; "goal" when it meets the goal too.
"""

from __future__ import annotations

import operator

_COMPARE = {">=": operator.ge, "<=": operator.le}


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, nearest rank; NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(path: str, value: float, *, goal: float, must: float, better: str = ">=", unit: str = "") -> bool:
    """Print one row; returns whether the must-reach bar is met.

    `better` is ">=" when more is better (throughput, ratios of rates) and "<=" when
    less is (latency, seconds, ratios of durations).
    """
    meets = _COMPARE[better]
    verdict = "goal" if meets(value, goal) else "reached" if meets(value, must) else "MISSED"
    shown = f"{value:.3f}" if abs(value) < 100 else f"{value:,.0f}"
    suffix = f" {unit}" if unit else ""
    print(
        f"goal  {path}  {shown}{suffix}  (goal {better} {_num(goal)}, must {better} {_num(must)})  {verdict}",
        flush=True,
    )
    return meets(value, must)


def _num(value: float) -> str:
    return f"{value:g}" if abs(value) < 100 else f"{value:,.0f}"
