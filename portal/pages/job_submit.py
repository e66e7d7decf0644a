"""The New job page: a form for one batch job, the ledger's quote and the sbatch command
line for it while it is filled in, and submission as the user through the job backend.

Everything goes the API's way (`portal.jobs.spec` checks the fields and names the one
that is wrong; `portal.jobs.service.submit` submits as the user, after the same membership
check and quote); the page only turns form text into the API's body. A refusal (the
ledger's code, sbatch's words) re-shows the form and submits nothing. The form carries a
request key made when it was drawn, the API's Idempotency-Key: a double click or a
re-sent POST returns the first job instead of submitting a second.

The live quote is a small script (static/job_form.js, allowed by the portal's
`script-src 'self'`) that fetches the preview fragment as fields change; without it the
"Price it" button draws the same preview.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from flask import current_app, flash, redirect, render_template, request, url_for
from werkzeug.datastructures import MultiDict

from ledger import api
from ledger.errors import InvalidInput, LedgerError
from portal.auth import Principal, accounts_of, login_required, principal
from portal.jobs import service
from portal.jobs.backend import JobSpec
from portal.jobs.spec import check_spec, member_of, quote_spec, routing_of, sbatch_line
from portal.pages import bp
from portal.pages.quote import priced_gpu_types
from portal.store import transaction

TEXT_FIELDS = (
    "account",
    "gres",
    "count",
    "time_limit",
    "name",
    "cpus",
    "memory",
    "max_cost",
    "cloud",
    "region",
    "retry_max",
    "retry_on",
    "retry_backoff_seconds",
)
REQUEST_KEY = re.compile(r"^[0-9a-f]{32}$")
SCRIPT = "#!/bin/bash\n"
DEFAULTS = {"count": "1", "time_limit": "01:00:00", "script": SCRIPT}
# The site choice: job_submit's gpucredit:cloud= directive (docs/routing.md); "" leaves
# it to the account's default.
SITES = (("", "the account's default"), ("no", "on-premise only"), ("yes", "on-premise or cloud"))


def _form(source: MultiDict[str, str]) -> dict[str, str]:
    """The form's text; a browser sends a textarea's lines ending in CRLF, a script's in LF."""
    form = {key: (source.get(key) or "").strip() for key in TEXT_FIELDS}
    form["script"] = (source.get("script") or "").replace("\r\n", "\n")
    return form


def _body(form: dict[str, str], *, script: bool) -> dict[str, Any]:
    """The API's body for the form (its checks are check_spec's): GPU type and count make
    `gpus`; an empty optional field is absent; cpus that are not digits reach check_spec
    as text, which refuses them on the cpus field."""
    body: dict[str, Any] = {
        "account": form["account"],
        "gpus": f"{form['gres']}:{form['count'] or '1'}",
        "time_limit": form["time_limit"],
    }
    if script:
        body["script"] = form["script"]
    for key in ("name", "memory", "max_cost", "cloud", "region"):
        if form[key]:
            body[key] = form[key]
    if form["cpus"]:
        body["cpus"] = _whole(form["cpus"])
    if form["retry_max"] or form["retry_on"]:  # the ledger's rule checks it (retry.max, retry.on)
        body["retry"] = {"max": _whole(form["retry_max"]), "on": form["retry_on"].replace(",", " ").split()}
        if form["retry_backoff_seconds"]:
            body["retry"]["backoff_seconds"] = _whole(form["retry_backoff_seconds"])
    return body


def _whole(text: str) -> int | str:
    """A number field's value: digits as an int, anything else as text for the check to refuse."""
    return int(text) if text.isdigit() and len(text) <= 6 else text


def _preview(who: Principal, body: dict[str, Any], *, script: bool) -> tuple[JobSpec, int, dict[str, Any]]:
    """The checked spec, its seconds and the ledger's quote; InvalidInput naming a field."""
    spec, seconds = check_spec(body, script=script)
    with transaction() as s:
        member_of(s, who, spec.account)
        quote = quote_spec(s, spec, seconds)
    return spec, seconds, quote


def _choices() -> tuple[list[str], list[str]]:
    """The viewer's accounts and the GPU types priced now: the form's selects."""
    with transaction() as s:
        return sorted(accounts_of(s, principal())), priced_gpu_types(api.load_price_table(s))


def _render(form: dict[str, str], status: int = 200, **shown: Any) -> Any:
    names, gpu_types = _choices()
    return render_template(
        "pages/job_new.html",
        form=form,
        names=names,
        gpu_types=gpu_types,
        sites=SITES,
        regions=sorted(set(routing_of(current_app).regions.values())),
        request_key=secrets.token_hex(16),
        **shown,
    ), status


def _field_error(error: InvalidInput) -> dict[str, Any]:
    return {"error": error.message, "error_field": error.details.get("field")}


@bp.route("/my-jobs/new")
@login_required
def new_job() -> Any:
    """The empty form, with the quote of its defaults already shown."""
    form = {key: request.args.get(key, DEFAULTS.get(key, "")).strip() for key in TEXT_FIELDS}
    form["script"] = SCRIPT
    names, gpu_types = _choices()
    form["account"] = form["account"] or (names[0] if names else "")
    form["gres"] = form["gres"] or (gpu_types[0] if gpu_types else "")
    return _render(form, **_preview_context(form))


@bp.route("/my-jobs/new/preview")
@login_required
def job_preview() -> Any:
    """The quote and sbatch line of the fields as they are (no script): the live quote's fragment."""
    form = _form(request.args)
    shown = _preview_context(form)
    return render_template("pages/_job_preview.html", **shown), (422 if shown.get("error") else 200)


def _preview_context(form: dict[str, str]) -> dict[str, Any]:
    try:
        spec, _seconds, quote = _preview(principal(), _body(form, script=False), script=False)
    except InvalidInput as error:
        return _field_error(error)
    return {"result": quote, "sbatch": sbatch_line(spec)}


@bp.route("/my-jobs/new", methods=["POST"])
@login_required
def submit_job() -> Any:
    """Price it (draw the preview) or submit it; a refusal re-shows the form with its reason."""
    who = principal()
    form = _form(request.form)
    body = _body(form, script=True)
    try:
        spec, seconds, quote = _preview(who, body, script=True)
    except InvalidInput as error:
        return _render(form, 422, **_field_error(error))
    shown: dict[str, Any] = {"result": quote, "sbatch": sbatch_line(spec)}
    if request.form.get("action") != "submit":
        return _render(form, **shown)
    key = request.form.get("request_key", "")
    try:
        submitted = service.submit(who, spec, seconds, key if REQUEST_KEY.match(key) else None, body)
    except LedgerError as refused:
        if isinstance(refused, InvalidInput) and "field" in refused.details:
            return _render(form, 422, **_field_error(refused))
        return _render(form, refused.http_status, refusal=refused, **shown)
    flash(f"Submitted job {submitted['job_id']}. {submitted['message']}")
    return redirect(url_for("pages.slurm_job", job_id=submitted["job_id"]))
