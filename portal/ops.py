"""Operations: GET /metrics for Prometheus and GET /healthz for load balancers and
systemd watchdogs; both without login.

/metrics shows every account's credit, so it is not served on the portal's port at all,
where a reverse proxy forwards whatever the internet asks (and, being on the same host,
arrives from loopback: no rule about addresses or forwarding headers on that port can
tell a scrape from a stranger; waitress even removes X-Forwarded-For before the portal
sees it). `gpucredit serve` serves it on a listener of its own, `portal.metrics_host`
:`portal.metrics_port` (127.0.0.1:9467 by default; 0 turns it off), as the daemon serves
its metrics, answering only peers in `portal.metrics_allow` (networks; default
loopback); no proxy is pointed at that port. `metrics_app(app)` is that listener's WSGI
application.

/healthz answers 200 {"status": "ok", "database": "ok", "revision": ...} when the
database answers and its schema is the one this code ships; else 503 with a code.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from typing import Any

from flask import Blueprint, Flask, Response, current_app, g, jsonify, request
from flask.signals import request_finished, request_started
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from werkzeug.wrappers import Request as WsgiRequest
from werkzeug.wrappers import Response as WsgiResponse

from portal.errors import error_response
from portal.metrics import PortalMetrics, in_transaction
from portal.settings import portal_settings
from portal.store import engine

__all__ = ["init_app", "metrics_app"]

log = logging.getLogger("gpucredit.portal.ops")
bp = Blueprint("ops", __name__)


def init_app(app: Flask) -> None:
    app.extensions["gpucredit.metrics"] = PortalMetrics(in_transaction(app.extensions["gpucredit.sessions"]))
    request_started.connect(_started, app)
    request_finished.connect(_finished, app)
    app.register_error_handler(SQLAlchemyError, _database_error)
    app.register_blueprint(bp)


def _metrics() -> PortalMetrics:
    metrics: PortalMetrics = current_app.extensions["gpucredit.metrics"]
    return metrics


# --- request metrics ---------------------------------------------------------------------


def _started(sender: Flask, **extra: Any) -> None:
    g.ops_started = time.perf_counter()


def _finished(sender: Flask, response: Response, **extra: Any) -> None:
    started = g.get("ops_started")
    seconds = time.perf_counter() - started if started is not None else 0.0
    _metrics().observe(request.endpoint or "none", response.status_code, seconds)


def _database_error(error: SQLAlchemyError) -> Any:
    """A database error anywhere in a request: counted, logged, answered 503 when the
    database cannot be reached (clients may retry), else 500."""
    _metrics().ledger_errors.inc()
    if isinstance(error, OperationalError):
        log.error("ledger database unavailable on %s: %s", request.path, error.orig or error)
        return error_response(503, "unavailable", "the ledger database is unavailable; retry shortly")
    log.exception("database error on %s %s", request.method, request.path)
    return error_response(500, "internal_error", "an unexpected error; it has been logged")


# --- /metrics, on its own listener -------------------------------------------------------


def metrics_app(app: Flask) -> Any:
    """The metrics listener's WSGI application: GET /metrics of `app`'s registry (the
    ledger read at each scrape, and the portal's requests) to peers in
    `portal.metrics_allow`; 404 to anyone else and for any other path."""
    registry = app.extensions["gpucredit.metrics"].registry
    allowed = portal_settings(app)["metrics_allow"]

    @WsgiRequest.application
    def serve(request: WsgiRequest) -> WsgiResponse:
        if request.path != "/metrics" or not _peer_allowed(request.remote_addr, allowed):
            return WsgiResponse("not found\n", status=404, mimetype="text/plain")
        if request.method not in ("GET", "HEAD"):
            return WsgiResponse("method not allowed\n", status=405, headers={"Allow": "GET, HEAD"})
        return WsgiResponse(generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return serve


def _peer_allowed(address: str | None, allowed: list[Any]) -> bool:
    try:
        peer = ipaddress.ip_address(address or "")
    except ValueError:
        return False
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    return any(peer in network for network in allowed)


# --- /healthz ----------------------------------------------------------------------------


@bp.get("/healthz")
def healthz() -> Any:
    try:
        with engine().connect() as connection:
            connection.exec_driver_sql("SELECT 1")
            revision = _revision(connection)
    except SQLAlchemyError as error:
        _metrics().ledger_errors.inc()
        log.warning("health check: database unavailable: %s", getattr(error, "orig", None) or error)
        return _unhealthy("unavailable", "the ledger database does not answer", "error")
    expected = _shipped_revision()
    if revision is None:
        return _unhealthy("not_initialised", "the database has no schema: run `gpucredit init`", "ok")
    if revision != expected:
        return _unhealthy(
            "schema_mismatch",
            f"the database is at revision {revision}, this code expects {expected}: run `gpucredit init`",
            "ok",
            {"revision": revision, "expected": expected},
        )
    return jsonify({"status": "ok", "database": "ok", "revision": revision})


def _revision(connection: Any) -> str | None:
    from sqlalchemy import inspect

    if not inspect(connection).has_table("alembic_version"):
        return None
    value = connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    return None if value is None else str(value)


def _shipped_revision() -> str:
    """The newest migration this code ships (read once per app)."""
    cached = current_app.extensions.get("gpucredit.schema_head")
    if cached is None:
        from alembic.script import ScriptDirectory

        from ledger.store.schema import alembic_config

        cached = str(ScriptDirectory.from_config(alembic_config()).get_current_head())
        current_app.extensions["gpucredit.schema_head"] = cached
    return cached


def _unhealthy(
    code: str, message: str, database: str, details: dict[str, Any] | None = None
) -> tuple[Any, int]:
    body = {
        "status": "error",
        "database": database,
        "error": {"code": code, "message": message, "details": details or {}},
    }
    return jsonify(body), 503
