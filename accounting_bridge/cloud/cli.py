"""`gpucredit cloud ...`: Slurm's power-saving programs and the cloud bill, one group.

    gpucredit cloud resume HOSTLIST        ResumeProgram: launch the nodes' instances
    gpucredit cloud suspend HOSTLIST       SuspendProgram: terminate them (retried)
    gpucredit cloud resume-fail HOSTLIST   ResumeFailProgram: terminate what came up late
    gpucredit cloud instances [--format json]   each instance and its cost so far
    gpucredit cloud reconcile [--dry-run] [--format json]   end instances Slurm does not know
    gpucredit cloud report --month YYYY-MM [--format text|csv|json]   the month's bill

The group is complete here; the CLI root (gpucredit/cli.py) adds it as it is. boto3
(the `cloud` extra) is imported when a command first calls the provider.
"""

from __future__ import annotations

import json
import sys
import time

import click

from accounting_bridge.cloud.config import CloudConfigError, load_cloud_config
from accounting_bridge.cloud.plan import InstanceRow
from accounting_bridge.cloud.programs import CloudPrograms
from accounting_bridge.cloud.provider import ProviderError
from ledger.cli_support import emit, ledger_command, transaction
from ledger.config import load_config
from ledger.money import format_credits
from ledger.timeutil import utcnow
from slurmtext import SlurmTextError, expand_hostlist

__all__ = ["cloud"]


def _programs() -> CloudPrograms:
    from accounting_bridge.cloud.journal import Journal
    from accounting_bridge.cloud.provider import Ec2Provider
    from accounting_bridge.slurm.slurmcmd import SubprocessRunner

    config = load_config()
    try:
        cloud_config = load_cloud_config(config)
    except CloudConfigError as error:
        raise click.ClickException(f"config_invalid: {error}") from None
    return CloudPrograms(
        cloud_config,
        Ec2Provider(cloud_config),
        Journal(cloud_config.state_dir),
        SubprocessRunner(config["slurm"]["bin_dir"]),
        clock=utcnow,
        sleep=time.sleep,
        say=click.echo,
    )


def _nodes(hostlist: str) -> list[str]:
    try:
        nodes = expand_hostlist(hostlist)
    except SlurmTextError as error:
        raise click.BadParameter(str(error), param_hint="HOSTLIST") from None
    if not nodes:
        raise click.BadParameter("names no node", param_hint="HOSTLIST")
    return nodes


@click.group("cloud")
def cloud() -> None:
    """Cloud nodes through Slurm's power saving: launch, end, bill (docs/admin-guide.md)."""


@cloud.command("resume")
@click.argument("hostlist")
def resume_command(hostlist: str) -> None:
    """Launch the nodes' instances (slurm.conf ResumeProgram)."""
    sys.exit(_programs().resume(_nodes(hostlist)))


@cloud.command("suspend")
@click.argument("hostlist")
def suspend_command(hostlist: str) -> None:
    """Terminate the nodes' instances, retrying (slurm.conf SuspendProgram)."""
    sys.exit(_programs().suspend(_nodes(hostlist)))


@cloud.command("resume-fail")
@click.argument("hostlist")
def resume_fail_command(hostlist: str) -> None:
    """Terminate instances of nodes that did not come up (slurm.conf ResumeFailProgram)."""
    sys.exit(_programs().resume_fail(_nodes(hostlist)))


def _text_row(row: InstanceRow) -> str:
    cost = "no price" if row.cost_ucredits is None else format_credits(row.cost_ucredits)
    ended = row.terminated_at.isoformat() if row.terminated_at else "-"
    return (
        f"{row.id}  {row.node or '-'}  {row.instance_type}  {row.region}  {row.state}  "
        f"{row.launched_at.isoformat()}  {ended}  {cost}"
    )


@cloud.command("instances")
@click.option("--format", "output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def instances_command(output: str) -> None:
    """Each instance launched for this cluster, and its cost so far at the configured price."""
    try:
        rows = _programs().rows()
    except ProviderError as error:
        raise click.ClickException(f"provider: {error}") from None
    if output == "json":
        click.echo(json.dumps([row.as_dict() for row in rows], indent=2))
        return
    click.echo("id  node  type  region  state  launched_at  terminated_at  cost")
    for row in rows:
        click.echo(_text_row(row))


@cloud.command("reconcile")
@click.option("--dry-run", is_flag=True, help="Say what would be terminated; terminate nothing.")
@click.option("--format", "output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def reconcile_command(dry_run: bool, output: str) -> None:
    """Terminate instances the provider runs that Slurm does not know; report their cost."""
    from accounting_bridge.slurm.slurmcmd import SlurmCommandError

    try:
        result = _programs().reconcile(dry_run=dry_run)
    except ProviderError as error:
        raise click.ClickException(f"provider: {error}") from None
    except SlurmCommandError as error:  # without Slurm's view, nothing is known to be a leak
        raise click.ClickException(f"slurm: {error}; nothing terminated") from None
    verdicts = [
        {
            **result.rows[t.instance.id].as_dict(),
            "reason": t.reason,
            "terminated": not dry_run and not result.failed,
        }
        for t in result.terminated
    ]
    if output == "json":
        click.echo(json.dumps({"instances": verdicts, "error": result.failed}, indent=2))
    else:
        for verdict in verdicts:
            cost = verdict["cost_ucredits"]
            shown = "no price" if cost is None else format_credits(int(str(cost)))
            act = "terminated" if verdict["terminated"] else "to terminate"
            click.echo(
                f"{verdict['id']} ({verdict['node'] or 'untagged'}): {verdict['reason']}, {act}, cost {shown}"
            )
        if not verdicts:
            click.echo("no instance to terminate")
    if result.failed:
        raise click.ClickException(f"provider: {result.failed}; nothing terminated, try again")


@cloud.command("report")
@click.option("--month", required=True, metavar="YYYY-MM", help="The UTC calendar month.")
@click.option(
    "--format", "output", type=click.Choice(["text", "csv", "json"]), default="text", show_default=True
)
@ledger_command
def report_command(month: str, output: str) -> None:
    """The month's instance cost beside the credits charged to jobs on cloud nodes, per
    partition and account, boot and idle time as the site's overhead (docs/admin-guide.md)."""
    from accounting_bridge.cloud.journal import JournalError
    from accounting_bridge.cloud.report import month_report, report_inputs
    from ledger.api import CLOUD_REPORT_COLUMNS, month_bounds

    month_bounds(month)  # a bad month is refused (exit 2) before anything is read
    try:
        inputs = report_inputs(load_config())
    except CloudConfigError as error:
        raise click.ClickException(f"config_invalid: {error}") from None
    except JournalError as error:
        raise click.ClickException(f"journal_unreadable: {error}") from None
    with transaction() as s:
        report = month_report(s, inputs, month, utcnow())
    if output == "json":
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    if output == "csv":
        emit(report.table(), "csv", list(CLOUD_REPORT_COLUMNS))
        return
    click.echo(
        f"cloud report {report.month}: {report.start.isoformat()} to {report.end.isoformat()}, "
        f"running instances and jobs to {report.at.isoformat()}"
    )
    click.echo(f"provider_cost: {report.cost_unit}; charged: credits charged to the jobs (never added)")
    emit(report.table(), "table", list(CLOUD_REPORT_COLUMNS))
    if report.unpriced_instances:
        click.echo(
            f"warning: no price configured for {', '.join(report.unpriced_instances)}: "
            "their time is counted, their cost is not",
            err=True,
        )
