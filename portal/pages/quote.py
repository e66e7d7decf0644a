"""What will a job cost? The ledger's quote for a job spec, and the sbatch line for it."""

from __future__ import annotations

import re
from typing import Any

from flask import render_template, request

from ledger import api
from ledger.errors import InvalidInput
from ledger.timeutil import parse_slurm_duration, utcnow
from portal.auth import accounts_of, login_required, principal, require_account
from portal.pages import bp
from portal.pages.figures import slurm_duration
from portal.store import transaction

# Slurm partition names as sbatch -p takes them; anything else is refused, not echoed.
PARTITION = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@bp.route("/quote")
@login_required
def quote() -> Any:
    who = principal()
    form = {
        key: request.args.get(key, "").strip() for key in ("account", "gres", "count", "time", "partition")
    }
    result = None
    error = None
    with transaction() as s:
        names = sorted(accounts_of(s, who))
        prices = api.load_price_table(s)
        if form["account"]:
            require_account(s, who, form["account"])
            try:
                if form["partition"] and not PARTITION.match(form["partition"]):
                    raise InvalidInput(f"partition {form['partition']!r} is not a Slurm partition name")
                seconds = parse_slurm_duration(form["time"], field="time limit")
                result = api.quote(
                    s,
                    form["account"],
                    f"{form['gres']}:{form['count'] or '1'}",
                    seconds,
                    partition=form["partition"] or None,
                )
            except InvalidInput as refused:
                error = refused.message
    return render_template(
        "pages/quote.html",
        names=names,
        gpu_types=priced_gpu_types(prices),
        form=form,
        result=result,
        sbatch=_sbatch_line(result) if result else None,
        error=error,
    ), (422 if error else 200)


def priced_gpu_types(prices: api.PriceTable) -> list[str]:
    """The GPU types the ledger has a price for now (a form's choices)."""
    now = utcnow()
    return [gres for gres in prices.gpu_types() if prices.price_at(gres, None, now) is not None]


def _sbatch_line(quoted: dict[str, Any]) -> str:
    """The submission the quote priced, from the ledger's own reading of the spec."""
    partition = f" -p {quoted['partition']}" if quoted["partition"] else ""
    return (
        f"sbatch -A {quoted['account']}{partition} --gres=gpu:{quoted['gpus']}"
        f" -t {slurm_duration(quoted['seconds'])} job.sh"
    )
