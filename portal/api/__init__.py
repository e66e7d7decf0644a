"""The JSON API under /api/v1: bearer tokens only, per-token rate limits, JSON errors
`{"error": {"code", "message", "details"}}`, and an OpenAPI 3 document generated from
the routes (GET /api/v1/openapi.json). docs/api.md says how to use it.

Each operation is declared once with `portal.api.registry.endpoint`; the modules below
hold them by subject. A cross-site form cannot ride on a token, so the API is exempt
from CSRF.
"""

from __future__ import annotations

from flask import Flask, Response

from portal.api import accounts, holds, jobs, prices, transfers  # noqa: F401  (each declares its routes)
from portal.api.registry import bp
from portal.security import api_limit, csrf, limiter

__all__ = ["init_app"]

csrf.exempt(bp)
# One budget per token over the whole API (a limit per operation would let a token
# spend it again on each one).
limiter.shared_limit(api_limit, scope="api")(bp)


@bp.after_request
def _challenge(response: Response) -> Response:
    if response.status_code == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="gpucredit"'
    return response


def init_app(app: Flask) -> None:
    app.register_blueprint(bp)
