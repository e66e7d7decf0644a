"""`gpucredit slurm ...`: wire gpucredit into a Slurm cluster.

Imports stay light (click and the stdlib): these commands run on Slurm
controllers where the ledger's dependencies need not be installed.
"""

from __future__ import annotations

import os
import sys
import tomllib

import click

from slurm_hooks.admin.slurmconf import (
    DEFAULT_ETC_DIR,
    DEFAULT_HOOK_DIR,
    install,
    launcher_command,
    slurm_conf_lines,
)

DEFAULT_CONFIG = "/etc/gpucredit/gpucredit.toml"
DEFAULT_GRES = ("a100", "h100")


def _config_path() -> str:
    return os.environ.get("GPUCREDIT_CONFIG", DEFAULT_CONFIG)


def configured_gres_types(config_path: str) -> list[str]:
    """GPU types priced in the config file (`[prices]` keys), else a100 and h100."""
    try:
        with open(config_path, "rb") as f:
            prices = tomllib.load(f).get("prices")
    except FileNotFoundError:
        return list(DEFAULT_GRES)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise click.ClickException(f"cannot read {config_path}: {e}") from e
    if isinstance(prices, dict) and prices:
        return list(prices)
    return list(DEFAULT_GRES)


def _parse_gres(value: str | None) -> list[str] | None:
    if value is None:
        return None
    types = [t.strip() for t in value.split(",") if t.strip()]
    if not types:
        raise click.BadParameter("name at least one GPU type, e.g. a100,h100")
    return types


@click.group("slurm")
def slurm() -> None:
    """Wire gpucredit into slurm.conf (print the lines, install the hooks)."""


@slurm.command("config")
@click.option(
    "--hook-dir",
    default=DEFAULT_HOOK_DIR,
    show_default=True,
    help="Directory holding the hook shims (see `gpucredit slurm install`).",
)
@click.option(
    "--gres",
    "gres",
    default=None,
    metavar="TYPE[,TYPE...]",
    help="GPU types to account for [default: the config's prices, else a100,h100].",
)
@click.option(
    "--job-submit-dir",
    default=DEFAULT_ETC_DIR,
    show_default=True,
    help="Directory of slurm.conf, where Slurm loads job_submit.lua from.",
)
def config_command(hook_dir: str, gres: str | None, job_submit_dir: str) -> None:
    """Print the lines to add to slurm.conf."""
    types = _parse_gres(gres) or configured_gres_types(_config_path())
    try:
        text = slurm_conf_lines(hook_dir, types, job_submit_dir)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    click.echo(text, nl=False)


@slurm.command("install")
@click.option("--etc-dir", default=DEFAULT_ETC_DIR, show_default=True, help="Slurm's config dir.")
@click.option("--hook-dir", default=DEFAULT_HOOK_DIR, show_default=True)
@click.option(
    "--gpucredit-exe",
    default=None,
    help="Absolute path of a gpucredit executable for the hooks to run [default: this "
    "installation's, started by its interpreter without site-packages' start-up cost].",
)
@click.option(
    "--config",
    "config_path",
    default=None,
    help=f"Config file the hooks read [default: $GPUCREDIT_CONFIG or {DEFAULT_CONFIG}].",
)
def install_command(etc_dir: str, hook_dir: str, gpucredit_exe: str | None, config_path: str | None) -> None:
    """Write the hook shims and job_submit.lua (run as root on the controller)."""
    try:
        command = [gpucredit_exe] if gpucredit_exe else launcher_command(sys.executable)
        written = install(etc_dir, hook_dir, command, config_path or _config_path())
    except (ValueError, FileNotFoundError) as e:
        raise click.UsageError(str(e)) from e
    except PermissionError as e:
        raise click.ClickException(f"{e} (run as root)") from e
    for path in written:
        click.echo(path)
