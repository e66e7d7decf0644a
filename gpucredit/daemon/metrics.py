"""The daemon's own metrics: what it refused, by code, and how long it took to answer.

They happen in this process, where the portal cannot count them, so the daemon serves
them itself on 127.0.0.1:`daemon.metrics_port` (default 9466; 0: not served), and
Prometheus scrapes it beside the portal's /metrics. prometheus-client comes with the
`portal` extra: a daemon installed without it answers as before, unmeasured, and says
so once at start. Hook processes never import this module (tests/architecture/test_runtimes.py).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("gpucredit.daemon")

DEFAULT_PORT = 9466
# Healthy answers take a few milliseconds; job_submit.lua waits 1 s at most, the hooks
# daemon.timeout_seconds (2 s by default).
LATENCY_BUCKETS_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

__all__ = ["DEFAULT_PORT", "DaemonMetrics", "for_daemon", "metrics_port"]


class DaemonMetrics:
    """A counter and a histogram in a registry of their own (a test reads one daemon's)."""

    def __init__(self, operations: Iterable[str]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.operations = frozenset(operations)
        self.registry = CollectorRegistry()
        self.refusals = Counter(
            "gpucredit_refusals",
            "Requests the daemon answered with an error, by its code; job_submit refusals are code=rejected.",
            ["code", "operation"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "gpucredit_daemon_request_duration_seconds",
            "Time the daemon took to answer one request.",
            ["operation"],
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=self.registry,
        )
        # Each operation's series, looked up once (labels() takes a lock and builds a key
        # on every call, on the path every quote takes); made on first use, so only
        # operations that happened are exported, as before.
        self._durations: dict[str, Any] = {}

    def observe(self, operation: Any, seconds: float, reply: dict[str, Any]) -> None:
        """Count one answered request; unknown operations share one label, so a client
        cannot grow the number of series."""
        label = operation if isinstance(operation, str) and operation in self.operations else "unknown"
        series = self._durations.get(label)
        if series is None:
            series = self._durations[label] = self.duration.labels(label)
        series.observe(seconds)
        if not reply.get("ok"):
            self.refusals.labels(str(reply.get("error", {}).get("code", "error")), label).inc()
        elif isinstance(reply.get("result"), dict) and reply["result"].get("decision") == "reject":
            self.refusals.labels("rejected", label).inc()

    def serve(self, port: int, host: str = "127.0.0.1") -> Callable[[], None]:
        """Serve the exposition on host:port from a thread; returns what stops it. A port
        already taken is logged, not fatal: answering Slurm matters more."""
        from prometheus_client import start_http_server

        try:
            server, thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as error:
            log.warning("daemon metrics not served on %s:%s: %s", host, port, error)
            return lambda: None
        log.info("daemon metrics on http://%s:%s/metrics", host, server.server_port)

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

        return stop


def metrics_port(config: dict[str, Any]) -> int:
    return int(config.get("daemon", {}).get("metrics_port", DEFAULT_PORT))


def for_daemon(config: dict[str, Any], operations: Iterable[str]) -> DaemonMetrics | None:
    """The daemon's metrics, or None when they are off (`metrics_port = 0`) or
    prometheus-client is not installed. Off means not counted either: the count and the
    histogram are a good part of a quote's own work, and no one would read them."""
    if not metrics_port(config):
        return None
    if importlib.util.find_spec("prometheus_client") is None:
        log.warning("daemon metrics off: prometheus-client is not installed (gpucredit[portal])")
        return None
    return DaemonMetrics(operations)
