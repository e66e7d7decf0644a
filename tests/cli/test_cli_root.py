"""The CLI root (gpucredit/cli.py) assembles every package's commands in one table, and
edits no package's groups: building it leaves each module's click objects as they were.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from gpucredit.cli import EXIT_MISSING_EXTRA, _build

# Every command of `gpucredit`, the public contract the docs and tests/cli/test_cli*.py use.
COMMAND_TEXT = """
account account/create account/import-slurm account/list account/pool account/set-parent account/show
account/tree adjust agent
audit audit/checkpoint audit/verify balance bridge bridge/gpu-usage bridge/meter bridge/reconcile bridge/sacct
cloud cloud/instances cloud/reconcile cloud/report cloud/resume cloud/resume-fail cloud/suspend
consume daemon example export export/ood-balance fairshare fairshare/show fairshare/sync grant
hold hold/create hold/list hold/release hold/settle hold/show hold/usage init
job job/cancel job/list job/output job/show job/submit
limits limits/set limits/show limits/sync passwd policy policy/bound policy/readback
policy/spool price price/list price/set quote report serve slurm slurm/check
slurm/config slurm/install submitter submitter/serve sweep token token/create token/list token/revoke
topup transfer user user/add
"""
COMMANDS = COMMAND_TEXT.split()


def command_paths(group: click.Group, prefix: str = "") -> list[str]:
    ctx = click.Context(group)
    paths = []
    for name in group.list_commands(ctx):  # the root's LAZY commands are listed and loaded too
        command = group.get_command(ctx, name)
        assert command is not None, name
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


# --------------------------------------------------------------- what a controller without extras runs


def run_gpucredit(*args: str, block: str = "", env: dict[str, str] | None = None, user: str | None = None):
    """`gpucredit ARGS` in a fresh interpreter; `block` names modules to make unimportable
    (as on a host without that extra), and the run prints which of ours it imported."""
    code = (
        "import sys\n"
        f"for name in {block.split()!r}: sys.modules[name] = None\n"
        "import atexit\n"
        "atexit.register(lambda: print('imported:', ' '.join(sorted({m.split('.')[0] for m in sys.modules} "
        "& {'flask', 'portal', 'waitress', 'argon2'})), file=sys.stderr))\n"
        "from gpucredit.cli import main\n"
        "main()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        user=user,
        cwd="/",
        timeout=120,
        check=False,
    )


def test_the_root_imports_no_portal_until_a_portal_command_runs(tmp_path: Path) -> None:
    env = {"GPUCREDIT_DATABASE_URL": f"sqlite:///{tmp_path / 'l.db'}", "GPUCREDIT_CONFIG": "/dev/null"}
    assert run_gpucredit("--help", env=env).stderr.endswith("imported: \n")
    done = run_gpucredit("init", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.endswith("imported: \n")
    assert "imported: flask portal" in run_gpucredit("passwd", "--help", env=env).stderr


@pytest.mark.parametrize("command", ["serve", "token", "passwd", "export"])
def test_a_portal_command_without_the_portal_extra_says_which_extra(tmp_path: Path, command: str) -> None:
    """`pip install 'gpucredit[postgres]'` (no flask): every other command runs, and a
    portal command says in one line what to install, with a status systemd will not
    restart in a loop (EXIT_MISSING_EXTRA, the units' RestartPreventExitStatus=)."""
    env = {"GPUCREDIT_DATABASE_URL": f"sqlite:///{tmp_path / 'l.db'}", "GPUCREDIT_CONFIG": "/dev/null"}
    assert run_gpucredit("init", env=env, block="flask").returncode == 0
    done = run_gpucredit(command, env=env, block="flask")
    pip = Path(sys.executable).parent / "pip"
    assert (done.returncode, done.stdout) == (EXIT_MISSING_EXTRA, "")
    assert done.stderr.splitlines()[0] == (
        f"error: missing_extra: gpucredit {command} needs the portal extra "
        f"(import of flask halted; None in sys.modules): {pip} install 'gpucredit[portal]'"
    )


def test_a_config_file_that_is_missing_or_forbidden_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    done = run_gpucredit("balance", env={"GPUCREDIT_CONFIG": str(missing)})
    assert (done.returncode, done.stderr.splitlines()[0]) == (
        2,
        f"error: config_missing: GPUCREDIT_CONFIG names {missing}, which does not exist",
    )
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon\n")
    done = run_gpucredit("balance", env={"GPUCREDIT_CONFIG": str(bad)})
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: config_invalid: {bad} is not valid TOML: ")


def test_a_researcher_who_may_not_read_the_config_gets_one_line(tmp_path: Path) -> None:
    """/etc/gpucredit is root:gpucredit 0750 (it holds the database password): a user's
    `gpucredit balance` on the controller says so in one line, never a traceback."""
    if os.geteuid() != 0:
        pytest.skip("runs `gpucredit balance` as nobody: needs root")
    etc = tmp_path / "etc-gpucredit"
    etc.mkdir(mode=0o750)
    (etc / "gpucredit.toml").write_text('[database]\nurl = "postgresql+psycopg://u:secret@db/gpucredit"\n')
    os.chmod(tmp_path, 0o755)
    done = run_gpucredit("balance", env={"GPUCREDIT_CONFIG": str(etc / "gpucredit.toml")}, user="nobody")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.splitlines()[0] == (
        f"error: config_forbidden: user nobody may not read {etc / 'gpucredit.toml'} (it holds the "
        "ledger's settings and database password, for root and the gpucredit group): "
        "see balances in the portal, or ask an admin"
    )
