"""`gpucredit`: one click group, assembled here from the commands each package defines.

`gpucredit hook ...` runs inside Slurm's prolog/epilog, where start-up time matters,
so it is dispatched before click (or anything heavier) is imported.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: a hook process imports neither typing nor click
if TYPE_CHECKING:
    from typing import NoReturn

    import click


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["hook"]:
        import os

        from slurm_hooks.hooks import main as hook_main

        code = hook_main(args[1:])
        if argv is None:  # this process is the hook: Slurm waits for it to exit
            # Skip the interpreter's teardown (~3 ms of freeing modules): the hook has
            # closed its socket and files, and it registers no atexit handlers.
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except (OSError, ValueError):  # closed or broken stdio: nothing left to lose
                pass
            os._exit(code)
        raise SystemExit(code)
    try:
        cli(args=args, prog_name="gpucredit")
    except ModuleNotFoundError as error:
        extra = EXTRA_OF.get((error.name or "").split(".")[0])
        if extra is None:
            raise
        missing_extra(f"gpucredit {' '.join(args[:1])}".strip(), extra, error)
    except (OSError, ValueError) as error:
        problem = config_problem(error)
        if problem is None:
            raise
        message, code = problem
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(code) from None


def config_problem(error: BaseException) -> tuple[str, int] | None:
    """One line and an exit status for a configuration file a command could not read
    (`GPUCREDIT_CONFIG` naming a missing file, a file this user may not read, a file that
    is not TOML), or None when `error` is about something else."""
    import os
    import tomllib

    from ledger.config import DEFAULT_CONFIG_PATH

    named = os.environ.get("GPUCREDIT_CONFIG")
    path = named or str(DEFAULT_CONFIG_PATH)
    if isinstance(error, tomllib.TOMLDecodeError):
        return f"config_invalid: {path} is not valid TOML: {error}", 2
    if not isinstance(error, OSError) or error.filename not in (path, str(DEFAULT_CONFIG_PATH)):
        return None
    if isinstance(error, FileNotFoundError) and named:
        return f"config_missing: GPUCREDIT_CONFIG names {named}, which does not exist", 2
    if isinstance(error, PermissionError):
        import getpass

        return (
            f"config_forbidden: user {getpass.getuser()} may not read {error.filename} (it holds the "
            "ledger's settings and database password, for root and the gpucredit group): "
            "see balances in the portal, or ask an admin",
            1,
        )
    return f"config_unreadable: {error.filename}: {error.strerror}", 2


# Commands whose package needs an optional extra, loaded only when one of them runs, so
# that `pip install 'gpucredit[postgres]'` (a controller without the portal) runs every
# other command. name: (module, attribute, extra, the line `gpucredit --help` shows).
LAZY: dict[str, tuple[str, str, str, str]] = {
    # gpucredit/portal_serve.py: portal/cli.py's serve, handed the cloud report's journal
    "serve": (
        "gpucredit.portal_serve",
        "serve_command",
        "portal",
        "Serve the portal and the JSON API (waitress).",
    ),
    "token": ("portal.cli", "token_group", "portal", "API tokens (Authorization: Bearer ...)."),
    "passwd": ("portal.cli", "passwd_command", "portal", "Set a portal login's password (argon2)."),
    "export": ("portal.cli", "export_group", "portal", "Files other systems read (Open OnDemand)."),
    "submitter": (
        "portal.cli",
        "submitter_group",
        "portal",
        "Run portal users' sbatch/scancel (root service).",
    ),
}
OUR_PACKAGES = (
    "accounting_bridge",
    "gpucredit",
    "job_submit",
    "ledger",
    "portal",
    "slurm_hooks",
    "slurmtext",
)
# What an optional module is installed with: a command that meets one missing says which
# extra to install (the portal's commands before they are even loaded: LAZY).
EXTRA_OF = {
    "psycopg": "postgres",
    "flask": "portal",
    "flask_wtf": "portal",
    "flask_limiter": "portal",
    "argon2": "portal",
    "waitress": "portal",
    "stripe": "portal",
    "pynvml": "nvml",
    "boto3": "cloud",
    "botocore": "cloud",
}
# The exit status of a command whose extra is not installed (sysexits' EX_CONFIG): the
# units name it in RestartPreventExitStatus=, so systemd does not restart it in a loop.
EXIT_MISSING_EXTRA = 78


def _build() -> click.Group:
    """The root group, from the table below: each top-level command and where it is defined.

    Three groups take commands from a second package: the ledger's `account` and `limits`,
    and `slurm` (slurm_hooks/admin/, which imports neither ledger nor bridge), each gain
    commands of the bridge's association sync. The root builds each as a copy of its
    owner's group with those added (`_joined`), so no package edits another's group and
    building the CLI changes no module's objects; `balance` is a copy of the ledger's that
    asks the portal's API where this user has no database (gpucredit/user_balance.py).
    The portal's commands (LAZY) are imported only when one runs.
    """
    from accounting_bridge.cli import bridge
    from accounting_bridge.cloud.cli import cloud
    from accounting_bridge.nvml.agent import agent_command
    from accounting_bridge.outage.cli import policy
    from accounting_bridge.sync.associations import import_slurm_command
    from accounting_bridge.sync.fairshare_cli import fairshare
    from accounting_bridge.sync.limits_cli import limits_show_command, limits_sync_command
    from accounting_bridge.sync.slurm_check import slurm_check_command
    from gpucredit.examples import example_command
    from gpucredit.job_cli import job_group
    from gpucredit.user_balance import with_portal
    from ledger.cli import COMMANDS as LEDGER_COMMANDS
    from ledger.cli import account_group, limits_group
    from slurm_hooks.admin.cli import slurm

    # The owner's group (ledger/cli.py, slurm_hooks/admin/cli.py) + accounting_bridge/sync/'s:
    joined = {
        "account": _joined(account_group, import_slurm_command),  # Slurm's accounts into the ledger
        "limits": _joined(limits_group, limits_sync_command, limits_show_command),  # show: + --slurm
        "slurm": _joined(slurm, slurm_check_command),  # Slurm's associations against the ledger
    }
    # The owner's command, asking the portal's API for a user with no database (a login node):
    wrapped = {"balance": with_portal}
    commands: list[click.Command] = [
        *LEDGER_COMMANDS,  # ledger/cli.py: init, account, user, price, limits, topup, grant, hold, ...
        slurm,  # slurm_hooks/admin/cli.py: slurm config | install (| check, above)
        bridge,  # accounting_bridge/cli.py: bridge sacct | reconcile | meter
        cloud,  # accounting_bridge/cloud/cli.py: cloud resume | suspend | resume-fail | instances | reconcile
        fairshare,  # accounting_bridge/sync/fairshare_cli.py: fairshare sync | show
        policy,  # accounting_bridge/outage/cli.py: policy bound | spool | readback
        agent_command,  # accounting_bridge/nvml/agent.py: agent
        example_command,  # gpucredit/examples/: the config, units and proxy files to copy
        job_group,  # gpucredit/job_cli.py: job submit | list | show | cancel | output (the portal's API)
        _daemon_command(),  # below; what it runs: gpucredit/daemon/__init__.py
    ]  # + LAZY: portal/cli.py: serve, token, passwd, export

    root = _root_class()(
        context_settings={"help_option_names": ["-h", "--help"]},
        help="Prepaid GPU credits for Slurm clusters.",
    )
    for command in commands:
        name = command.name or ""
        root.add_command(joined.get(name) or wrapped.get(name, lambda same: same)(command))
    return root


def _root_class() -> type[click.Group]:
    import importlib

    import click

    class Root(click.Group):
        """The root group; LAZY's commands are imported when one runs (or its --help)."""

        def list_commands(self, ctx: click.Context) -> list[str]:
            return sorted({*self.commands, *LAZY})

        def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
            if cmd_name in self.commands or cmd_name not in LAZY:
                return super().get_command(ctx, cmd_name)
            module, attribute, extra, _ = LAZY[cmd_name]
            try:
                command: click.Command = getattr(importlib.import_module(module), attribute)
            except ModuleNotFoundError as error:
                if (error.name or "").split(".")[0] in OUR_PACKAGES:  # a broken install, not an extra
                    raise
                missing_extra(f"gpucredit {cmd_name}", extra, error)
            return command

        def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
            rows = []
            for name in self.list_commands(ctx):
                if name in LAZY and name not in self.commands:
                    rows.append((name, LAZY[name][3]))
                    continue
                command = self.commands[name]
                if not command.hidden:
                    rows.append((name, command.get_short_help_str(formatter.width - 6 - len(name))))
            if rows:
                with formatter.section("Commands"):
                    formatter.write_dl(rows)

    return Root


def missing_extra(what: str, extra: str, error: ModuleNotFoundError) -> NoReturn:
    """Say in one line which extra `what` needs, and exit EXIT_MISSING_EXTRA."""
    from pathlib import Path

    pip = Path(sys.executable).parent / "pip"
    print(
        f"error: missing_extra: {what} needs the {extra} extra ({error}): {pip} install 'gpucredit[{extra}]'",
        file=sys.stderr,
    )
    raise SystemExit(EXIT_MISSING_EXTRA)


def _joined(group: click.Group, *commands: click.Command) -> click.Group:
    """A copy of `group` with `commands` added (one of the same name replaces the group's
    own); `group` itself is left as it was."""
    import copy

    copied = copy.copy(group)
    copied.commands = {**group.commands, **{command.name or "": command for command in commands}}
    return copied


def cli(args: list[str], prog_name: str) -> None:
    _build()(args=args, prog_name=prog_name)


def _daemon_command() -> click.Command:
    import click

    @click.command("daemon")
    @click.option("--socket", "socket_path", default=None, help="Default: daemon.socket from the config.")
    @click.option(
        "--release-interval",
        type=float,
        default=2.0,
        show_default=True,
        help="Seconds between checks for credit-held jobs to release (0: never).",
    )
    def daemon(socket_path: str | None, release_interval: float) -> None:
        """Controller-side service for job_submit.lua and the hooks (Unix socket)."""
        import logging

        from gpucredit.daemon import Daemon
        from ledger.config import load_config

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        config = load_config()
        Daemon(config).serve(
            socket_path or config["daemon"]["socket"], release_interval=release_interval or None
        )

    return daemon
