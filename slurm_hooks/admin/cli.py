"""`gpucredit slurm ...`: wire gpucredit into a Slurm cluster.

Imports stay light (click and the stdlib): these commands run on Slurm
controllers where the ledger's dependencies need not be installed.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import click

from slurm_hooks.admin.slurmconf import (
    DEFAULT_ETC_DIR,
    DEFAULT_HOOK_DIR,
    DEFAULT_JWT_KEY,
    DEFAULT_RESUME_TIMEOUT_SECONDS,
    DEFAULT_SUSPEND_TIME_SECONDS,
    DEVICE_LINES,
    NotOurs,
    cloud_command,
    install,
    jwt_lines,
    launcher_command,
    power_saving_lines,
    prepare_folders,
    read_hook_settings,
    slurm_conf_lines,
    slurm_users,
)

DEFAULT_CONFIG = "/etc/gpucredit/gpucredit.toml"
DEFAULT_GRES = ("a100", "h100")


def _config_path(given: str | None = None) -> str:
    """The config file: --config, else GPUCREDIT_CONFIG, else the default. One that was
    named (not the default) must exist: a typo must not install the default settings."""
    named = given or os.environ.get("GPUCREDIT_CONFIG")
    if named and not os.path.isfile(named):
        what = "--config" if given else "GPUCREDIT_CONFIG"
        raise click.ClickException(f"{what} names {named}, which does not exist")
    return named or DEFAULT_CONFIG


def _read_config(config_path: str) -> dict[str, object]:
    try:
        with open(config_path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise click.ClickException(f"cannot read {config_path}: {e}") from e


def priced_gres_types() -> tuple[list[str], str]:
    """The GPU types the ledger prices (`gpucredit price set`), else a100 and h100 and
    why: AccountingStorageTRES must name every type billed, or Slurm records no seconds
    for it."""
    try:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import SQLAlchemyError

        from ledger import api
        from ledger.cli_support import transaction
        from ledger.config import load_config
        from ledger.errors import LedgerError
    except ImportError as exc:
        return list(DEFAULT_GRES), f"the ledger cannot be read here ({exc})"
    url = make_url(str(load_config()["database"]["url"]))
    if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
        # Reading would create the file (as whoever runs this, before `gpucredit init`).
        return list(DEFAULT_GRES), f"the ledger is not initialised yet ({url.database} does not exist)"
    try:
        with transaction() as s:
            types = list(dict.fromkeys(str(row["gres"]) for row in api.list_prices(s)))
    except (SQLAlchemyError, LedgerError, OSError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        return list(DEFAULT_GRES), f"the ledger's prices cannot be read ({reason})"
    if not types:
        return list(DEFAULT_GRES), "the ledger prices no GPU type yet"
    return types, ""


def scarcity_lines(config_path: str) -> str:
    """For each partition under [scarcity]: the QOS it needs, as comments to act on."""
    scarcity = _read_config(config_path).get("scarcity")
    partitions = scarcity.get("partitions") if isinstance(scarcity, dict) else None
    if not isinstance(partitions, list) or not partitions:
        return ""
    lines = ["# gpucredit: scarcity caps ([scarcity] partitions) need a QOS of each partition's own;"]
    lines.append("# create it before slurmctld reads the partition line (it will not start without it):")
    for partition in partitions:
        lines.append(f"#   sacctmgr -i add qos gpucredit-{partition}")
        lines.append(f"#   PartitionName={partition} ... QOS=gpucredit-{partition}")
    return "\n".join(lines) + "\n"


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
    help="GPU types to account for [default: the types the ledger prices, else a100,h100].",
)
@click.option(
    "--job-submit-dir",
    default=DEFAULT_ETC_DIR,
    show_default=True,
    help="Directory of slurm.conf, where Slurm loads job_submit.lua from.",
)
def config_command(hook_dir: str, gres: str | None, job_submit_dir: str) -> None:
    """Print the lines to add to slurm.conf."""
    config_path = _config_path()
    types = _parse_gres(gres)
    if types is None:
        types, fallback = priced_gres_types()
        if fallback:
            names = ",".join(types)
            click.echo(f"note: {fallback}: the lines name {names}; name yours with --gres", err=True)
    try:
        text = slurm_conf_lines(hook_dir, types, job_submit_dir)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    extra = scarcity_lines(config_path) + cloud_lines(config_path, hook_dir) + jobs_api_lines(config_path)
    click.echo(text + DEVICE_LINES + extra, nl=False)


def jobs_api_lines(config_path: str) -> str:
    """slurm.conf's auth/jwt lines when the portal's jobs go through slurmrestd
    (`[portal] jobs_backend = "slurmrestd"`), else ''."""
    portal = _read_config(config_path).get("portal")
    if not isinstance(portal, dict) or portal.get("jobs_backend") != "slurmrestd":
        return ""
    try:
        return jwt_lines(str(portal.get("jwt_key") or DEFAULT_JWT_KEY))
    except ValueError as e:
        raise click.ClickException(f"{config_path}: portal.{e}") from e


def _cloud_section(config_path: str) -> dict[str, object] | None:
    section = _read_config(config_path).get("cloud")
    return section if isinstance(section, dict) and section else None


def cloud_lines(config_path: str, hook_dir: str) -> str:
    """slurm.conf's power-saving lines when the config has a [cloud] section, else ''."""
    section = _cloud_section(config_path)
    if section is None:
        return ""
    try:
        suspend = section.get("suspend_time_seconds", DEFAULT_SUSPEND_TIME_SECONDS)
        resume = section.get("resume_timeout_seconds", DEFAULT_RESUME_TIMEOUT_SECONDS)
        return power_saving_lines(hook_dir, suspend_time_seconds=suspend, resume_timeout_seconds=resume)  # type: ignore[arg-type]
    except ValueError as e:
        raise click.ClickException(f"{config_path}: {e}") from e


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
@click.option(
    "--job-submit-to",
    default=None,
    metavar="PATH",
    help="Write gpucredit's job_submit.lua here, for a site whose own job_submit.lua calls it "
    "(`gpucredit example slurm/job_submit.lua`) [default: ETC_DIR/job_submit.lua].",
)
@click.option(
    "--slurm-user",
    default=None,
    metavar="USER",
    help="SlurmUser, who owns the hooks' log and outage spool [default: scontrol show config, "
    "else slurm.conf's SlurmUser, else root].",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace hook files and a job_submit.lua gpucredit did not write (each kept as NAME.bak-TIME).",
)
def install_command(
    etc_dir: str,
    hook_dir: str,
    gpucredit_exe: str | None,
    config_path: str | None,
    job_submit_to: str | None,
    slurm_user: str | None,
    force: bool,
) -> None:
    """Write the hook shims and job_submit.lua, and make the folders the hooks write (as
    root, on the controller and on each GPU node)."""
    import pwd

    path = _config_path(config_path)
    try:
        settings = read_hook_settings(path)
    except (OSError, ValueError) as e:
        raise click.ClickException(f"cannot read {path}: {e}") from e
    bin_dir = str(settings.get("slurm", {}).get("bin_dir") or "/usr/bin")
    found_user, slurmd_user, where = slurm_users(etc_dir, os.path.join(bin_dir, "scontrol"))
    user = slurm_user or found_user
    where = "--slurm-user" if slurm_user else where
    try:
        pwd.getpwnam(user)
        pwd.getpwnam(slurmd_user)
    except KeyError as e:
        raise click.ClickException(f"no such user {e} (SlurmUser from {where}); pass --slurm-user") from e
    try:
        command = [gpucredit_exe] if gpucredit_exe else launcher_command(sys.executable)
        cloud = None
        if _cloud_section(path) is not None:  # the power-saving shims run `gpucredit cloud ...`
            cloud = [gpucredit_exe] if gpucredit_exe else cloud_command(sys.executable)
        written = install(
            etc_dir, hook_dir, command, path, job_submit_to=job_submit_to, force=force, cloud=cloud
        )
        folders = prepare_folders(settings, user, slurmd_user)
    except NotOurs as e:
        raise click.ClickException(
            f"{', '.join(e.paths)}: not written by gpucredit (a site's own?); nothing was changed. "
            "Merge them (docs/admin-guide.md §2, A site's own hooks: --job-submit-to), "
            "or pass --force to replace them (each kept as NAME.bak-TIME)"
        ) from None
    except (ValueError, FileNotFoundError) as e:
        raise click.UsageError(str(e)) from e
    except PermissionError as e:
        raise click.ClickException(f"{e} (run as root)") from e
    for line in [*written, *folders]:
        click.echo(line)
    socket_user = _read_config(path).get("daemon", {})
    socket_user = socket_user.get("socket_user") if isinstance(socket_user, dict) else None
    if user != "root" and socket_user != user:
        click.echo(
            f"warning: SlurmUser is {user} ({where}) but daemon.socket_user is "
            f"{socket_user or 'not set'}: the controller's hooks cannot open the daemon's socket "
            f'(0600); set daemon.socket_user = "{user}" and restart the daemon',
            err=True,
        )
