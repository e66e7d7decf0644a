"""`gpucredit policy bound | spool | readback`: what a ledger outage can cost, and its spool.

`bound --outage 30m` prints the overspend bound (ledger/holds/bounds.py, docs/outage.md) for
the configured hold mode, outage policy and credit lines and the runs holding credit
now; `spool` lists the runs the hooks started without the ledger and what they count
against the lines; `readback` charges the ended ones now (the daemon does it on its own
every `policy.outage_sheet_seconds`).

Tests inject the clock through the click context object (`obj={"clock": ...}`).
"""

from __future__ import annotations

import json
from typing import Any

import click

from accounting_bridge.cli_support import clock
from accounting_bridge.outage.readback import read_back, refresh_sheet
from ledger import api
from ledger.cli_support import emit, engine_for, format_option, ledger_command, transaction
from ledger.config import load_config
from ledger.money import format_credits
from slurm_hooks.outage_spool import DEFAULT_SPOOL_DIR, Spool, lines_from_settings

__all__ = ["policy"]

ACCOUNT_COLUMNS = ["account", "running_runs", "running", "outage_line", "bound"]


def _duration_text(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@click.group("policy")
def policy() -> None:
    """What a ledger outage can cost (policy.on_ledger_unreachable), and its spool."""


@policy.command("bound")
@click.option("--outage", "outage", required=True, metavar="DURATION", help="e.g. 1800, 90s, 30m, 2h, 1d.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
@ledger_command
def bound_command(ctx: click.Context, outage: str, fmt: str) -> None:
    """The most credit an outage of DURATION starting now can overspend: per job, per
    account and for the fleet (docs/outage.md has the formulas)."""
    seconds = api.parse_outage(outage)
    config = load_config()
    api.OutageConfig.from_config(config)  # bad settings: a clear error before any query
    now = clock(ctx)()
    with transaction() as s:
        bound = api.current_outage_bound(s, config, seconds, now)
    document = bound.as_dict()
    if fmt == "json":
        click.echo(json.dumps(document, indent=2))
        return
    per_job = document["per_job"]
    click.echo(
        f"Overspend bound for an outage of {_duration_text(seconds)} ({seconds} s) from now: "
        f"holds.mode = {bound.config.mode}, policy.on_ledger_unreachable = {bound.config.policy}, "
        f"meter every {bound.config.meter_interval_seconds} s"
    )
    largest = f" (job {per_job['running_job']})" if per_job["running_job"] else ""
    click.echo(f"per running job:                 {per_job['running']} credits{largest}")
    click.echo(f"per job started in the outage:   {per_job['started_during_outage']} credits")
    fleet = document["fleet"]
    rows = [*document["accounts"], document["other_accounts"], {"account": "(fleet)", **fleet}]
    emit(rows, "table", ACCOUNT_COLUMNS)


@policy.command("spool")
@format_option
@ledger_command
def spool_command(fmt: str) -> None:
    """The runs the hooks started without the ledger, not yet charged, with their
    estimates, and each account's total against its outage credit line."""
    config = load_config()
    api.OutageConfig.from_config(config)
    settings = config["policy"]
    directory = settings.get("outage_spool_dir", DEFAULT_SPOOL_DIR)
    lines, _problems = lines_from_settings(settings)
    runs = Spool(directory).runs() if _exists(directory) else []
    rows: list[dict[str, Any]] = []
    for run in runs:
        cluster, job_id, number, _submit = run.key
        estimate = run.admit.get("estimate_ucredits")
        rows.append(
            {
                "run": f"{cluster}/{job_id}/{number}",
                "account": run.admit.get("account"),
                "gpus": ",".join(f"{t}:{n}" for t, n in sorted(run.admit.get("gpus", {}).items())),
                "seconds": run.admit.get("seconds"),
                "estimate": None if estimate is None else format_credits(int(estimate)),
                "start": run.admit.get("start"),
                "end": run.end,
            }
        )
    if fmt == "json":
        totals: dict[str, int] = {}
        for run in runs:
            account = str(run.admit["account"])
            totals[account] = totals.get(account, 0) + int(run.admit.get("estimate_ucredits") or 0)
        document = {
            "spool": str(Spool(directory).path),
            "runs": rows,
            "accounts": {
                name: {"spooled": format_credits(total), "line": _line(lines.for_account(name))}
                for name, total in sorted(totals.items())
            },
            "fleet": {"spooled": format_credits(sum(totals.values())), "line": _line(lines.fleet)},
        }
        click.echo(json.dumps(document, indent=2))
        return
    emit(rows, fmt, ["run", "account", "gpus", "seconds", "estimate", "start", "end"])


@policy.command("readback")
@format_option
@click.pass_context
@ledger_command
def readback_command(ctx: click.Context, fmt: str) -> None:
    """Rewrite the hooks' price sheet and charge, once each, the spooled runs that ended."""
    config = load_config()
    api.OutageConfig.from_config(config)
    directory = config["policy"].get("outage_spool_dir", DEFAULT_SPOOL_DIR)
    from ledger.store.db import make_sessionmaker

    sessions = make_sessionmaker(engine_for())
    now = clock(ctx)()
    refresh_sheet(sessions, directory, now)
    result = read_back(sessions, directory, now)
    if fmt == "json":
        click.echo(json.dumps(result.__dict__, indent=2))
        return
    emit(result.charged, fmt, ["run", "account", "charged", "elapsed_seconds", "estimate"])
    if fmt == "table":
        click.echo(
            f"{len(result.charged)} charged, {len(result.held)} already held, "
            f"{len(result.waiting)} still running, {len(result.failed)} refused; "
            f"{result.forgotten} forgotten from the spool"
        )
        for failure in result.failed:
            click.echo(f"refused: {failure}")


def _exists(directory: str) -> bool:
    import os

    return os.path.isdir(directory)


def _line(ucredits: int | None) -> str:
    return "none" if ucredits is None else format_credits(ucredits)
