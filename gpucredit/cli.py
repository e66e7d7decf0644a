"""`gpucredit`: one click group whose sub-groups live with the package they drive.

`gpucredit hook ...` runs inside Slurm's prolog/epilog, where start-up time matters,
so it is dispatched before click (or anything heavier) is imported.
"""

from __future__ import annotations

import sys


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
    cli(args=args, prog_name="gpucredit")


def _build() -> object:
    """The root group: the ledger's commands, then each package's sub-group."""
    import click

    from accounting_bridge.meter.meter import meter_command
    from accounting_bridge.nvml.agent import agent_command
    from accounting_bridge.outage.cli import policy
    from accounting_bridge.sacct.cli import bridge
    from accounting_bridge.sync.associations import import_slurm_command
    from accounting_bridge.sync.fairshare_cli import fairshare
    from accounting_bridge.sync.limits_cli import limits_show_command, limits_sync_command
    from accounting_bridge.sync.slurm_check import slurm_check_command
    from ledger.cli import COMMANDS, account_group, limits_group
    from portal.cli import COMMANDS as PORTAL_COMMANDS
    from slurm_hooks.admin.cli import slurm

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    def root() -> None:
        """Prepaid GPU credits for Slurm clusters."""

    account_group.add_command(import_slurm_command)
    limits_group.add_command(limits_sync_command)
    limits_group.add_command(limits_show_command)  # the ledger's view, and with --slurm Slurm's
    slurm.add_command(slurm_check_command)
    bridge.add_command(meter_command)
    root.add_command(policy)
    for command in [*COMMANDS, *PORTAL_COMMANDS, slurm, bridge, fairshare, agent_command, _daemon_command()]:
        root.add_command(command)  # type: ignore[arg-type]
    return root


def cli(args: list[str], prog_name: str) -> None:
    root = _build()
    root(args=args, prog_name=prog_name)  # type: ignore[operator]


def _daemon_command() -> object:
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
