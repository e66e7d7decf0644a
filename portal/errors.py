"""Errors in one shape. The API answers `{"error": {"code", "message", "details"}}`
with the ledger error's HTTP status; pages show the same message on an error page.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, jsonify, make_response, render_template, request
from flask_limiter.errors import RateLimitExceeded
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException

from ledger.errors import LedgerError

log = logging.getLogger("gpucredit.portal")

HTTP_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    429: "rate_limited",
}


def wants_json() -> bool:
    return request.path.startswith("/api/") or request.path in ("/healthz",)


def error_response(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> Any:
    if wants_json():
        body = {"error": {"code": code, "message": message, "details": details or {}}}
        return jsonify(body), status
    if status == 401:
        from portal.auth import to_login

        return to_login()
    return render_template("error.html", status=status, code=code, message=message), status


def init_app(app: Flask) -> None:
    @app.errorhandler(LedgerError)
    def _ledger(error: LedgerError) -> Any:
        return error_response(error.http_status, error.code, error.message, error.details)

    @app.errorhandler(CSRFError)
    def _csrf(error: CSRFError) -> Any:
        return error_response(400, "csrf", "the form expired or came from another site; reload and retry")

    @app.errorhandler(RateLimitExceeded)
    def _rate(error: RateLimitExceeded) -> Any:
        return error_response(
            429,
            "rate_limited",
            f"too many requests: the limit is {error.description}",
            {"limit": str(error.description)},
        )

    @app.errorhandler(HTTPException)
    def _http(error: HTTPException) -> Any:
        status = error.code or 500
        response = make_response(
            error_response(status, HTTP_CODES.get(status, "error"), error.description or error.name)
        )
        for name, value in error.get_headers():  # Allow on a 405 (RFC 9110), Retry-After, ...
            if name.lower() != "content-type":
                response.headers[name] = value
        return response

    @app.errorhandler(Exception)
    def _unexpected(error: Exception) -> Any:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(500, "internal_error", "an unexpected error; it has been logged")
