"""What the portal tells Prometheus: the ledger's figures, read at each scrape, and the
portal's own requests.

Money stays integer micro-credits until here; a metric is a float by nature, so
credits become floats only as they are exposed (`_credits`). Names follow docs/design.md §5.6:
`gpucredit_*` in base units (credits, seconds), counters ending in `_total`.

Per scrape: two aggregate reads for every account's available/held/active holds, the
sacct cursor, the newest provisional charge of a running job, and the journal entries
committed since the previous scrape (`ledger.api.ChargeCounter`: Prometheus counters
never go down, and the journal only grows). Refusals and the daemon's latency live in
the daemon's process, which serves them itself (gpucredit.daemon.metrics).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from ledger import api
from ledger.jobs import jobruns
from ledger.money import format_credits
from ledger.timeutil import utcnow

__all__ = ["LedgerCollector", "PortalMetrics", "in_transaction"]

log = logging.getLogger("gpucredit.portal.metrics")

# The `cursors` row `gpucredit bridge sacct` moves to the end of each window it read
# (accounting_bridge.sacct.ingest.CURSOR_NAME; the portal does not import the bridge).
SACCT_CURSOR = "sacct"
# The row `gpucredit bridge meter` moves to each tick's time (accounting_bridge.meter.meter.METER_CURSOR).
METER_CURSOR = "meter"

Sessions = Callable[[], AbstractContextManager[Session]]


def _credits(ucredits: int) -> float:
    """Micro-credits as a float number of credits, through the exact decimal string."""
    return float(format_credits(ucredits))


class LedgerCollector:
    """A Prometheus collector that reads the ledger each time it is collected."""

    def __init__(self, sessions: Sessions, errors: Counter) -> None:
        self.sessions = sessions
        self.errors = errors
        self.charges = api.ChargeCounter()

    def collect(self) -> Iterator[Metric]:
        now = utcnow()
        try:
            with self.sessions() as s:
                accounts = api.account_totals(s, now)
                sacct_read_to = jobruns.read_cursor(s, SACCT_CURSOR)
                last_tick = jobruns.read_cursor(s, METER_CURSOR)
                charges = self.charges.read(s)
        except SQLAlchemyError as error:
            self.errors.inc()
            log.warning("reading the ledger for /metrics failed: %s", error)
            yield _gauge("gpucredit_ledger_up", "1 when this scrape could read the ledger.", [], [([], 0)])
            return
        yield _gauge("gpucredit_ledger_up", "1 when this scrape could read the ledger.", [], [([], 1)])
        yield _gauge(
            "gpucredit_credits_available",
            "Credits an account can spend now (negative: debt).",
            ["account"],
            [([a.account], _credits(a.available_ucredits)) for a in accounts],
        )
        yield _gauge(
            "gpucredit_credits_held",
            "Credits active holds keep for running jobs.",
            ["account"],
            [([a.account], _credits(a.held_ucredits)) for a in accounts],
        )
        yield _gauge(
            "gpucredit_active_holds",
            "Active holds (job runs reserved and not yet settled).",
            ["account"],
            [([a.account], a.active_holds) for a in accounts],
        )
        yield from self._charges(charges, [a.account for a in accounts])
        if sacct_read_to is not None:
            yield _gauge(
                "gpucredit_sacct_lag_seconds",
                "Seconds since the end of the last window `gpucredit bridge sacct` read.",
                [],
                [([], (now - sacct_read_to).total_seconds())],
            )
        if last_tick is not None:
            yield _gauge(
                "gpucredit_meter_lag_seconds",
                "Seconds since the meter's last tick; absent until the meter has ticked once.",
                [],
                [([], (now - last_tick).total_seconds())],
            )

    def _charges(self, charges: api.ChargeTotals, accounts: list[str]) -> Iterator[Metric]:
        if not charges.caught_up:  # partial sums would read as a burst of spending
            return
        spent = CounterMetricFamily(
            "gpucredit_credits_spent",
            "Credits charged to an account (provisional charges included), before returns.",
            labels=["account"],
        )
        returned = CounterMetricFamily(
            "gpucredit_credits_returned",
            "Credits given back to an account after a charge: settles below a provisional "
            "charge, corrections, refunds. Net spend is spent minus returned.",
            labels=["account"],
        )
        for name in sorted(set(accounts) | set(charges.accounts)):
            sums = charges.accounts.get(name)
            spent.add_metric([name], _credits(sums.charged_ucredits) if sums else 0.0)
            returned.add_metric([name], _credits(sums.returned_ucredits) if sums else 0.0)
        by_gres = CounterMetricFamily(
            "gpucredit_charged_credits",
            "Credits charged, by GPU type and partition (gres/partition none: outside any job run).",
            labels=["gres", "partition"],
        )
        gpu_seconds = CounterMetricFamily(
            "gpucredit_charged_gpu_seconds",
            "GPU-seconds charged for, by GPU type and partition.",
            labels=["gres", "partition"],
        )
        for (gres, partition), charged in sorted(charges.gres.items()):
            by_gres.add_metric([gres, partition], _credits(charged.charged_ucredits))
            if gres != "none":
                gpu_seconds.add_metric([gres, partition], float(charged.gpu_seconds))
        yield from (spent, returned, by_gres, gpu_seconds)


Samples = list[tuple[list[str], float]]


def _gauge(name: str, documentation: str, labels: list[str], samples: Samples) -> Metric:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


class PortalMetrics:
    """One registry per app: the ledger collector and the portal's request metrics."""

    def __init__(self, sessions: Sessions) -> None:
        self.registry = CollectorRegistry()
        self.ledger_errors = Counter(
            "gpucredit_ledger_errors",
            "Database errors the portal met (requests, scrapes and health checks).",
            registry=None,
        )
        # Collected in this order: a scrape that fails counts itself in the same exposition.
        self.registry.register(LedgerCollector(sessions, self.ledger_errors))
        self.registry.register(self.ledger_errors)
        self.requests = Counter(
            "gpucredit_http_requests",
            "HTTP requests the portal answered, by endpoint and status.",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "gpucredit_http_request_duration_seconds",
            "Time the portal took to answer one HTTP request.",
            ["endpoint"],
            registry=self.registry,
        )

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.duration.labels(endpoint).observe(seconds)


def in_transaction(sessions: Any) -> Sessions:
    """`sessions` (a sessionmaker) as a factory of sessions, each in one transaction."""

    @contextmanager
    def transaction() -> Iterator[Session]:
        with sessions() as s, s.begin():
            yield s

    return transaction
