"""One Slurm job's page: its state and timeline (submitted, started, ended), its attempts
with what each was charged or refunded, its cost (the ledger's figure: so far while it
runs, then final), and its output's tail for its own user (portal.pages.output's rule:
a regular file that user owns, never through a symlink).

While the job is queued or running the page reloads itself every REFRESH_SECONDS with a
`<meta http-equiv="refresh">`: no script, so the portal's Content-Security-Policy
(`script-src 'self'`, nothing inline) has nothing to allow.
"""

from __future__ import annotations

from typing import Any

from flask import render_template

from ledger.timeutil import utcnow
from portal.auth import accounts_of, login_required, principal
from portal.jobs import service
from portal.pages import bp
from portal.pages.output import TAIL_LINES
from portal.store import transaction

REFRESH_SECONDS = 15
MAX_JOB_ID = service.MAX_JOB_ID


@bp.route(f"/my-jobs/<int(min=1, max={MAX_JOB_ID}):job_id>")
@login_required
def slurm_job(job_id: int) -> Any:
    who = principal()
    now = utcnow()
    with transaction() as s:
        job = service.find_job(s, who, job_id)
        view = service.job_view(s, job, now)
        holds = service.job_holds(s, job)
        role = accounts_of(s, who).get(job.account)
    own = job.user == who.user
    live = job.state in service.LIVE_STATES
    return render_template(
        "pages/slurm_job.html",
        job=view,
        own=own,
        may_cancel=service.may_cancel(who, job, role),
        output=service.tail_of(who, job, holds, TAIL_LINES) if own else None,
        refresh_seconds=REFRESH_SECONDS if live else None,
    )
