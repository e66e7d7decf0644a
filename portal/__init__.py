"""Flask portal: web pages, the JSON API (/api/v1) and /metrics.

`create_app(config)` builds it (the Flask tutorial's factory): settings in layers
(`portal.settings`), one store per app (`portal.store`), who is asking
(`portal.auth`), the safety nets every response gets (`portal.security`), then one
blueprint per area. Money is read and changed only through `ledger.api`.
"""

from __future__ import annotations

from typing import Any

from flask import Flask

__all__ = ["create_app"]


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """The portal app. `config` overrides Flask keys; its `GPUCREDIT` key, when given,
    replaces the gpucredit TOML configuration (tests pass a database URL that way)."""
    from portal import auth, errors, security, settings, store

    app = Flask(__name__)
    settings.configure(app, config or {})
    store.init_app(app)
    auth.init_app(app)  # before security: the per-token rate limit needs the principal loaded
    security.init_app(app)
    errors.init_app(app)
    _register_blueprints(app)
    return app


def _register_blueprints(app: Flask) -> None:
    """One blueprint per area, each registered by its module's init_app."""
    from portal import admin, api, ops, pages
    from portal.payments import views as payments

    for area in (pages, admin, payments, api, ops):
        area.init_app(app)
