"""The links in every page's header (base.html's `nav_links`) and an account's tabs.

Areas other modules own (top-ups, administration, account management) get a link
only once their endpoint exists in this app, so no page points at one that is not
there. Per-account areas are reached from the header through an account chooser.
"""

from __future__ import annotations

from typing import Any

from flask import current_app

from portal.auth import current

LINKS = [
    ("pages.home", "Home"),
    ("pages.my_jobs", "My jobs"),
    ("pages.new_job", "New job"),
    ("pages.jobs_index", "Jobs"),
    ("pages.usage_index", "Usage"),
    ("pages.quote", "Quote"),
]
# header link, label, the endpoint it leads to, only for admins
OPTIONAL_LINKS = [
    ("pages.topup_index", "Top up", "payments.topup", False),
    ("admin.index", "Admin", "admin.index", True),
]


def nav_links() -> dict[str, Any]:
    """Template context: `nav_links` for the header, `endpoint_exists` for the tabs."""
    who = current()
    links = list(LINKS) if who is not None else []
    for link, label, target, admins_only in OPTIONAL_LINKS:
        if who is not None and (who.is_admin or not admins_only) and endpoint_exists(target):
            links.append((link, label))
    return {"nav_links": links, "endpoint_exists": endpoint_exists}


def endpoint_exists(endpoint: str) -> bool:
    return endpoint in current_app.view_functions
