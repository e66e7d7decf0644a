"""The files an admin copies to set gpucredit up, shipped in the wheel beside the code:
`gpucredit example` lists them, `gpucredit example NAME` prints one, and
`gpucredit example NAME... --to DIR` copies them (docs/admin-guide.md §1).

The units run `/opt/gpucredit/bin/gpucredit`, the guide's installation; printed or
copied from another installation they run that one's executable instead, so a copy
never names a program that is not there.
"""

from __future__ import annotations

import os
import sys
import tempfile
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import click

__all__ = ["EXAMPLES", "example_command", "example_text"]

# Every file here, and what it is for (tests/install/test_install.py checks the list is whole).
EXAMPLES: dict[str, str] = {
    "gpucredit.toml": "/etc/gpucredit/gpucredit.toml: every setting, safe defaults",
    "systemd/gpucredit-daemon.service": "the daemon (controller, root, before slurmctld)",
    "systemd/gpucredit-bridge-sacct.service": "sacct ingestion (controller, root)",
    "systemd/gpucredit-meter.service": "the meter (controller, root)",
    "systemd/gpucredit-sweep.service": "hold and grant expiry (root)",
    "systemd/gpucredit-sweep.timer": "... every 5 minutes",
    "systemd/gpucredit-fairshare.service": "fairshare sync (controller, root)",
    "systemd/gpucredit-fairshare.timer": "... every 15 minutes",
    "systemd/gpucredit-portal.service": "the portal (user gpucredit)",
    "systemd/gpucredit-ood-balance.service": "Open OnDemand's balance file (user gpucredit)",
    "systemd/gpucredit-ood-balance.timer": "... every 5 minutes",
    "systemd/gpucredit-agent.service": "the NVML agent (every GPU node, root)",
    "systemd/gpucredit-cloud-reconcile.service": "end leaked cloud instances (controller, SlurmUser)",
    "systemd/gpucredit-cloud-reconcile.timer": "... every 10 minutes",
    "nginx/gpucredit.conf": "the TLS proxy in front of the portal",
    "grafana/gpucredit.json": "the Grafana dashboard",
    "slurm/job_submit.lua": "a site's own job_submit.lua calling gpucredit's (admin guide §2)",
}
GUIDE_EXECUTABLE = "/opt/gpucredit/bin/gpucredit"


def _root() -> Traversable:
    return resources.files(__name__)


def _executable() -> str:
    """This installation's `gpucredit` (the script beside its interpreter), else the guide's."""
    here = Path(sys.executable).parent / "gpucredit"
    return str(here) if here.is_file() else GUIDE_EXECUTABLE


def example_text(name: str) -> str:
    """The example `name` as this installation would copy it. KeyError: no such example."""
    if name not in EXAMPLES:
        raise KeyError(name)
    node = _root()
    for part in name.split("/"):
        node = node / part
    text = node.read_text(encoding="utf-8")
    return text.replace(GUIDE_EXECUTABLE, _executable())


def _names(wanted: str) -> list[str]:
    """The examples `wanted` names: one file, or every file of a folder (`systemd`)."""
    wanted = wanted.strip("/")
    if wanted in EXAMPLES:
        return [wanted]
    inside = [name for name in EXAMPLES if name.startswith(wanted + "/")]
    if not inside:
        raise click.BadParameter(f"no example {wanted!r}; `gpucredit example` lists them", param_hint="NAME")
    return inside


def _write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@click.command("example")
@click.argument("names", nargs=-1, metavar="[NAME]...")
@click.option(
    "--to",
    "to",
    default=None,
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Copy the files (a folder name: all of it) into DIR, mode 0644, instead of printing one.",
)
@click.option("--force", is_flag=True, help="With --to: replace files that differ (else refused).")
def example_command(names: tuple[str, ...], to: str | None, force: bool) -> None:
    """The example config, units and proxy files: list, print or copy them."""
    if not names:
        width = max(len(name) for name in EXAMPLES)
        for name, what in EXAMPLES.items():
            click.echo(f"{name.ljust(width)}  {what}")
        return
    chosen = [name for wanted in names for name in _names(wanted)]
    if to is None:
        if len(chosen) != 1:
            raise click.UsageError(
                f"{' '.join(names)} names {len(chosen)} files: print one, or copy them with --to DIR"
            )
        click.echo(example_text(chosen[0]), nl=False)
        return
    target = Path(to)
    if not target.is_dir():
        raise click.UsageError(f"--to {to}: no such folder")
    texts = {target / Path(name).name: example_text(name) for name in chosen}
    differ = [str(path) for path, text in texts.items() if path.exists() and path.read_text() != text]
    if differ and not force:
        raise click.ClickException(
            f"{', '.join(differ)}: already there and not the example's text: nothing copied "
            "(compare them, or pass --force to replace)"
        )
    for path, text in texts.items():
        if path.exists() and path.read_text() == text:
            click.echo(f"{path} (unchanged)")
            continue
        _write(path, text)
        click.echo(str(path))
