"""The CLI root (gpucredit/cli.py) assembles every package's commands in one table, and
edits no package's groups: building it leaves each module's click objects as they were.
"""

from __future__ import annotations

import click

from gpucredit.cli import _build

# Every command of `gpucredit`, the public contract the docs and tests/test_cli*.py use.
COMMAND_TEXT = """
account account/create account/import-slurm account/list account/show adjust agent
audit audit/checkpoint audit/verify balance bridge bridge/meter bridge/reconcile bridge/sacct
consume daemon export export/ood-balance fairshare fairshare/show fairshare/sync grant
hold hold/create hold/list hold/release hold/settle hold/show hold/usage init
limits limits/set limits/show limits/sync passwd policy policy/bound policy/readback
policy/spool price price/list price/set quote report serve slurm slurm/check
slurm/config slurm/install sweep token token/create token/list token/revoke topup user user/add
"""
COMMANDS = COMMAND_TEXT.split()


def command_paths(group: click.Group, prefix: str = "") -> list[str]:
    paths = []
    for name, command in sorted(group.commands.items()):
        paths.append(prefix + name)
        if isinstance(command, click.Group):
            paths += command_paths(command, f"{prefix}{name}/")
    return paths


def test_the_root_holds_every_command_of_the_contract() -> None:
    assert command_paths(_build()) == sorted(COMMANDS)


def test_building_the_root_edits_no_package_group() -> None:
    from ledger.cli import account_group, limits_group
    from slurm_hooks.admin.cli import slurm

    before = {group.name: dict(group.commands) for group in (account_group, limits_group, slurm)}
    root = _build()
    _build()
    assert {group.name: dict(group.commands) for group in (account_group, limits_group, slurm)} == before
    assert "import-slurm" not in account_group.commands and "check" not in slurm.commands
    assert "sync" not in limits_group.commands
    joined = root.commands["limits"]
    assert isinstance(joined, click.Group) and joined is not limits_group
    # `limits show` is the bridge's: the ledger's view, and with --slurm what Slurm enforces
    assert "--slurm" in options(joined.commands["show"])
    assert "--slurm" not in options(limits_group.commands["show"])


def options(command: click.Command) -> set[str]:
    return {option for param in command.params for option in param.opts}
