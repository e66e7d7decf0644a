"""The links in every page's header (base.html's `nav_links`).

Areas other modules own (top-ups, administration) get a link only once their
endpoint exists in this app, so the header never points at a page that is not there.
"""

from __future__ import annotations

from typing import Any

from flask import current_app

from portal.auth import current

LINKS = [
    ("pages.home", "Home"),
    ("pages.jobs_index", "Jobs"),
    ("pages.usage_index", "Usage"),
    ("pages.quote", "Quote"),
]
# endpoint, label, only for admins
OPTIONAL_LINKS = [
    ("payments.topup", "Top up", False),
    ("admin.index", "Admin", True),
]


def nav_links() -> dict[str, Any]:
    who = current()
    if who is None:
        return {"nav_links": []}
    links = list(LINKS)
    for endpoint, label, admins_only in OPTIONAL_LINKS:
        if (who.is_admin or not admins_only) and _links_without_arguments(endpoint):
            links.append((endpoint, label))
    return {"nav_links": links}


def _links_without_arguments(endpoint: str) -> bool:
    try:
        rules = list(current_app.url_map.iter_rules(endpoint))
    except KeyError:  # no such endpoint in this app
        return False
    return any(not rule.arguments for rule in rules)
