"""`gpucredit`: one click group, assembled here from the commands each package defines.

`gpucredit hook ...` runs inside Slurm's prolog/epilog, where start-up time matters,
so it is dispatched before click (or anything heavier) is imported.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not typing's: a hook process imports neither typing nor click
if TYPE_CHECKING:
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
    cli(args=args, prog_name="gpucredit")


def _build() -> click.Group:
    """The root group, from the table below: each top-level command and where it is defined.

    Three groups take commands from a second package: the ledger's `account` and `limits`,
    and `slurm` (slurm_hooks/admin/, which imports neither ledger nor bridge), each gain
    commands of the bridge's association sync. The root builds each as a copy of its
    owner's group with those added (`_joined`), so no package edits another's group and
    building the CLI changes no module's objects.
    """
    import click

    from accounting_bridge.cli import bridge
    from accounting_bridge.nvml.agent import agent_command
    from accounting_bridge.outage.cli import policy
    from accounting_bridge.sync.associations import import_slurm_command
    from accounting_bridge.sync.fairshare_cli import fairshare
    from accounting_bridge.sync.limits_cli import limits_show_command, limits_sync_command
    from accounting_bridge.sync.slurm_check import slurm_check_command
    from ledger.cli import COMMANDS as LEDGER_COMMANDS
    from ledger.cli import account_group, limits_group
    from portal.cli import COMMANDS as PORTAL_COMMANDS
    from slurm_hooks.admin.cli import slurm

    # The owner's group (ledger/cli.py, slurm_hooks/admin/cli.py) + accounting_bridge/sync/'s:
    joined = {
        "account": _joined(account_group, import_slurm_command),  # Slurm's accounts into the ledger
        "limits": _joined(limits_group, limits_sync_command, limits_show_command),  # show: + --slurm
        "slurm": _joined(slurm, slurm_check_command),  # Slurm's associations against the ledger
    }
    commands: list[click.Command] = [
        *LEDGER_COMMANDS,  # ledger/cli.py: init, account, user, price, limits, topup, grant, hold, ...
        *PORTAL_COMMANDS,  # portal/cli.py: serve, token, passwd, export
        slurm,  # slurm_hooks/admin/cli.py: slurm config | install (| check, above)
        bridge,  # accounting_bridge/cli.py: bridge sacct | reconcile | meter
        fairshare,  # accounting_bridge/sync/fairshare_cli.py: fairshare sync | show
        policy,  # accounting_bridge/outage/cli.py: policy bound | spool | readback
        agent_command,  # accounting_bridge/nvml/agent.py: agent
        _daemon_command(),  # below; what it runs: gpucredit/daemon/__init__.py
    ]

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    def root() -> None:
        """Prepaid GPU credits for Slurm clusters."""

    for command in commands:
        root.add_command(joined.get(command.name or "", command))
    return root


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
