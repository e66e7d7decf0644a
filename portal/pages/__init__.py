"""The pages a researcher or PI uses: their accounts and how to charge them, an
account's dashboard, its jobs, usage and GPU efficiency, and a quote calculator.

Server-rendered HTML that reads without JavaScript. Every figure comes from
`ledger.api` and sits in a tag with a `data-testid`, so tests and the browser test
find it. A user sees the accounts they belong to; a member sees their own jobs and
usage, a manager (PI) and an admin the whole account's; any other account answers 404.
"""

from __future__ import annotations

from flask import Blueprint, Flask

bp = Blueprint("pages", __name__)


def init_app(app: Flask) -> None:
    # The view modules attach their routes to `bp` when imported, before it is registered.
    from portal.pages import home, jobs, nav, quote, usage  # noqa: F401

    app.register_blueprint(bp)
    app.context_processor(nav.nav_links)
