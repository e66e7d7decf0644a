"""Administration pages (/admin, admins only) and account managers' pages for their own
account (/accounts/<account>/manage). Money moves only through `ledger.api`; every
change form carries a CSRF token and an idempotency key, so a double submit changes
nothing twice.
"""

from __future__ import annotations

from flask import Flask

from portal.admin import accounts, cloud, manage, site
from portal.admin.blueprints import admin_bp, manage_bp

__all__ = ["init_app"]

VIEWS = (accounts, cloud, manage, site)  # imported for their routes


def init_app(app: Flask) -> None:
    app.register_blueprint(admin_bp)
    app.register_blueprint(manage_bp)
