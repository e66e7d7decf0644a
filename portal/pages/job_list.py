"""My jobs: the Slurm jobs the viewer may see (the API's rule, `portal.jobs.service`):
queued ones with Slurm's reason in plain words (the backend words it, as for the API),
running ones with their cost so far, finished ones with their final cost, all from the
ledger; and a Cancel button on each job the viewer may cancel (its own, or any in an
account they manage, while it is queued or running), which posts with the form's CSRF
token.
"""

from __future__ import annotations

from typing import Any

from flask import flash, redirect, render_template, request, url_for

from ledger.timeutil import utcnow
from portal.auth import accounts_of, login_required, principal
from portal.jobs import service
from portal.pages import bp
from portal.pages.common import page_size
from portal.store import transaction

MAX_JOB_ID = service.MAX_JOB_ID


@bp.route("/my-jobs")
@login_required
def my_jobs() -> Any:
    """Queued and running jobs all shown; finished ones the newest page_size."""
    who = principal()
    account = request.args.get("account") or None
    now = utcnow()
    with transaction() as s:
        roles = accounts_of(s, who)
        names = sorted(roles)
        jobs = service.visible_jobs(s, who, account)
        live = [job for job in jobs if job.state in service.LIVE_STATES]
        ended = [job for job in jobs if job.state not in service.LIVE_STATES]
        page = [*live, *ended[: page_size()]]
        retries = service.retries_of(s, page)
        shown = [service.job_view(s, job, now, retries) for job in page]
    cancellable = {job.job_id for job in live if service.may_cancel(who, job, roles.get(job.account))}
    return render_template(
        "pages/my_jobs.html",
        names=names,
        account=account,
        queued=[view for view in shown if view["state"] == "queued"],
        running=[view for view in shown if view["state"] == "running"],
        finished=[view for view in shown if view["state"] not in service.LIVE_STATES],
        more_finished=len(ended) > page_size(),
        cancellable=cancellable,
    )


@bp.route(f"/my-jobs/<int(min=1, max={MAX_JOB_ID}):job_id>/cancel", methods=["POST"])
@login_required
def cancel_job(job_id: int) -> Any:
    """scancel as the job's user, for its user, a manager of its account or an admin (one
    they may not see is a 404: the API's answers); back to where the button was."""
    job = service.cancel(principal(), job_id, utcnow())
    flash(f"Job {job_id} cancelled; it is now {job['state']}.")
    if request.form.get("back") == "job":
        return redirect(url_for("pages.slurm_job", job_id=job_id))
    return redirect(url_for("pages.my_jobs"))
