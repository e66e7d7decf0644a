"""The pages a researcher or PI uses: their accounts and how to charge them, an
account's dashboard, its jobs, usage and GPU efficiency, and a quote calculator; and the
Slurm jobs a user submits from here (New job, My jobs, a job's page: portal.jobs.service,
the API's rules).

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
    from portal.pages import home, job_list, job_page, job_submit, jobs, nav, quote, usage  # noqa: F401

    app.register_blueprint(bp)
    app.context_processor(nav.nav_links)
    app.context_processor(lambda: {"verdict_words": VERDICT_WORDS})


# A routed job's partition verdicts (ledger/pricing/routing.py), in sbatch's words.
VERDICT_WORDS = {
    "allowed": "allowed",
    "cloud_not_allowed": "cloud not allowed",
    "other_region": "not the job's region",
    "over_limit": "over the limit",
    "over_cloud_budget": "over the account's cloud budget",
    "over_cap": "over a cap of the account or its member",
    "over_credit": "more than is available",
}
