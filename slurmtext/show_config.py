"""`scontrol show config`: Slurm's effective settings, and what billing needs of them.

The output is `Key = Value` lines: slurm.conf's settings, then sections such as
"Cgroup Support Configuration:" (cgroup.conf's, printed only when slurmctld read one).
Slurm writes every value; none is text a user wrote.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from slurmtext import SlurmTextError

# The releases gpucredit is tested on, each in a box of Debian's own packages
# (docs/slurm-facts.md §16; README "Supported Slurm").
SUPPORTED_RELEASES = ("22.05", "24.11", "26.05")

_SETTING = re.compile(r"([A-Za-z][A-Za-z0-9_]*(?:\[\d+\])?)\s*=\s?(.*)")
_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.\d+)?(?:-.*)?")


def parse_show_config(text: str) -> dict[str, str]:
    """Every `Key = Value` setting of every section; a key printed twice keeps its first."""
    settings: dict[str, str] = {}
    for line in text.splitlines():
        found = _SETTING.fullmatch(line.rstrip())
        if found:
            settings.setdefault(found[1], found[2].strip())
    if "SLURM_VERSION" not in settings:
        raise SlurmTextError("not `scontrol show config` output: no SLURM_VERSION")
    return settings


def release(version: str) -> str:
    """`22.05.8` -> `22.05`: the release a version belongs to."""
    found = _RELEASE.fullmatch(version.strip())
    if not found:
        raise SlurmTextError(f"not a Slurm version: {version!r}")
    return f"{int(found[1]):02d}.{int(found[2]):02d}"


def devices_constrained(settings: Mapping[str, str]) -> bool:
    """Whether a job can reach only the GPUs it was given: task/cgroup applies
    cgroup.conf's ConstrainDevices=yes. Without both, a job that asked for no GPU can
    open /dev/nvidia* and use one that nobody is billed for."""
    plugins = [p.strip() for p in settings.get("TaskPlugin", "").split(",")]
    return "task/cgroup" in plugins and settings.get("ConstrainDevices", "").lower() == "yes"


def billing_notes(settings: Mapping[str, str]) -> list[str]:
    """What an admin must know about this cluster's settings before trusting its bills."""
    notes = []
    version = settings["SLURM_VERSION"]
    if release(version) not in SUPPORTED_RELEASES:
        tested = ", ".join(SUPPORTED_RELEASES)
        notes.append(f"Slurm {version} is not a release gpucredit is tested on ({tested})")
    if not devices_constrained(settings):
        plugin, constrain = settings.get("TaskPlugin", "unset"), settings.get("ConstrainDevices", "unset")
        # No task plugin configured: 22.05 prints `task/none`, 24.11 and 26.05 `(null)`
        # (docs/slurm-facts.md §16). One name for it, so the note reads alike everywhere.
        plugin = "task/none" if plugin == "(null)" else plugin
        notes.append(
            f"devices are not constrained (TaskPlugin {plugin}, ConstrainDevices {constrain}):"
            " a job that asked for no GPU can use one unbilled; set TaskPlugin=task/cgroup and, in"
            " cgroup.conf, ConstrainDevices=yes"
        )
    return notes
