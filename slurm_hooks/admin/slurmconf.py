"""The slurm.conf lines gpucredit needs, and the hook shims those lines name.

Pure and stdlib-only. `gpucredit slurm config` prints `slurm_conf_lines()`,
`gpucredit slurm install` calls `install()`, and the Slurm box
(`slurmbox/box.py`) renders its slurm.conf with the same function, so the
box runs exactly what admins are told to add.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_hooks.hooks import hook_settings

__all__ = [
    "DEFAULT_ETC_DIR",
    "DEFAULT_HOOK_DIR",
    "HOOKS",
    "HOOK_LAUNCHER",
    "PACKAGED_JOB_SUBMIT_LUA",
    "install",
    "launcher_command",
    "read_hook_settings",
    "render_shim",
    "shim_name",
    "slurm_conf_lines",
]

DEFAULT_ETC_DIR = "/etc/slurm"
DEFAULT_HOOK_DIR = "/etc/slurm/gpucredit"

# `gpucredit hook <command>` -> the slurm.conf key that runs it.
HOOKS: dict[str, str] = {
    "prolog-slurmctld": "PrologSlurmctld",
    "epilog-slurmctld": "EpilogSlurmctld",
    "prolog": "Prolog",
    "epilog": "Epilog",
}

# The real job_submit.lua, shipped as package data of `job_submit`
# (a sibling package, both in a source checkout and once installed).
PACKAGED_JOB_SUBMIT_LUA = Path(__file__).resolve().parents[2] / "job_submit" / "job_submit.lua"

# `gpucredit hook` for an interpreter run without `site` (that file says why).
HOOK_LAUNCHER = Path(__file__).resolve().parents[2] / "gpucredit" / "hook_launcher.py"

# One shim per hook; the @name@ placeholders are filled by render_shim.
_SHIM_TEMPLATE = """#!/bin/sh
# gpucredit @hook@ hook, written by `gpucredit slurm install`.
# Slurm runs hooks with no PATH, so every path here is absolute.
# GPUCREDIT_HOOK_SETTINGS is a copy of the config's hook settings (daemon socket and
# timeout, policy, cluster, bin_dir, spool_dir, log_file) taken at install time, so
# that no hook parses TOML on every job. To change them, edit the config and then
# run `gpucredit slurm install` again (job_submit.lua needs that too). Without
# GPUCREDIT_HOOK_SETTINGS the hook reads GPUCREDIT_CONFIG on every run.
exec /usr/bin/env \\
    GPUCREDIT_CONFIG=@config@ \\
    GPUCREDIT_HOOK_SETTINGS=@settings@ \\
    @command@ hook @hook@
"""
_GRES_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_PLACEHOLDER = re.compile(r"@[a-z_]+@")


def shim_name(hook: str) -> str:
    """File name of the shim for `hook`: prolog-slurmctld -> prolog_slurmctld.sh."""
    if hook not in HOOKS:
        raise ValueError(f"unknown hook {hook!r}; expected one of {', '.join(HOOKS)}")
    return hook.replace("-", "_") + ".sh"


def _require_absolute(what: str, path: str) -> str:
    # Slurm runs hooks with no PATH and from its own working directory.
    if not os.path.isabs(path):
        raise ValueError(f"{what} must be an absolute path, got {path!r}")
    return os.path.normpath(path)


def slurm_conf_lines(hook_dir: str, gres_types: list[str], job_submit_dir: str) -> str:
    """The lines an admin adds to slurm.conf, each group under a `#` comment.

    `gres_types` are the priced GPU types (`a100`, `h100`): Slurm records
    GPU-seconds per type only for types named in AccountingStorageTRES, and enforces
    a GPU limit only on a TRES it tracks (docs/limits-sync.md).
    `job_submit_dir` is where job_submit.lua is installed; Slurm 22.05 loads it
    from the directory that holds slurm.conf and has no setting to move it.
    """
    hook_dir = _require_absolute("hook_dir", hook_dir)
    job_submit_dir = _require_absolute("job_submit_dir", job_submit_dir)
    if not gres_types:
        raise ValueError("gres_types is empty: name at least one GPU type, e.g. a100")
    for gres in gres_types:
        if not _GRES_TYPE.fullmatch(gres):
            raise ValueError(f"invalid GPU type {gres!r}")
    types = list(dict.fromkeys(gres_types))  # keep order, drop repeats
    tres = ",".join(["gres/gpu", *(f"gres/gpu:{t}" for t in types)])
    lua = os.path.join(job_submit_dir, "job_submit.lua")
    hooks = {key: os.path.join(hook_dir, shim_name(hook)) for hook, key in HOOKS.items()}
    lines = [
        f"# gpucredit: quote and refuse jobs at submit time ({lua})",
        "JobSubmitPlugins=lua",
        "# gpucredit: hold credit before a job starts, settle it when the job ends",
        f"PrologSlurmctld={hooks['PrologSlurmctld']}",
        f"EpilogSlurmctld={hooks['EpilogSlurmctld']}",
        "# gpucredit: start and stop GPU sampling on each node",
        f"Prolog={hooks['Prolog']}",
        f"Epilog={hooks['Epilog']}",
        "# gpucredit: account GPU-seconds per GPU type; every job needs an account (it pays); Slurm enforces",
        "# the GPU limits and blocks of `gpucredit limits sync` (safe: only jobs a GrpTRESMins can finish)",
        f"AccountingStorageTRES={tres}",
        "AccountingStorageEnforce=associations,limits,safe",
        "# gpucredit: fairshare from credit and usage (`gpucredit fairshare sync` sets the shares)",
        "PriorityType=priority/multifactor",
        "PriorityWeightFairshare=10000",
    ]
    return "\n".join(lines) + "\n"


def read_hook_settings(config_path: str) -> dict[str, dict[str, Any]]:
    """The settings the hooks read from the config file; {} when there is no file.

    A file that is not valid TOML raises ValueError, as it does for job_submit.lua.
    """
    if not Path(config_path).is_file():
        return {}
    with open(config_path, "rb") as f:
        return hook_settings(tomllib.load(f))


def launcher_command(python: str) -> list[str]:
    """`python` running this installation's `gpucredit hook` without `site`: 3-9 ms less
    at every hook's start (gpucredit/hook_launcher.py says why that is safe)."""
    return [_require_absolute("python", python), "-I", "-S", str(HOOK_LAUNCHER)]


def render_shim(hook: str, command: Sequence[str], config_path: str, settings: Mapping[str, Any]) -> str:
    """The text of the shell shim that runs `<command> hook <hook>`.

    `command` is the gpucredit executable, or `launcher_command(python)`.
    `settings` (from `read_hook_settings`) go into the shim, so the hook need
    not parse the config file on every job.
    """
    shim_name(hook)  # validates the name
    if not command:
        raise ValueError("the hook command is empty")
    try:
        settings_json = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    except TypeError as e:  # a TOML date where the hooks want a string or number
        raise ValueError(f"{config_path}: a hook setting is not a string or number: {e}") from e
    values = {
        "hook": hook,
        "command": shlex.join([_require_absolute("the hook command", command[0]), *command[1:]]),
        "config": shlex.quote(_require_absolute("config_path", config_path)),
        "settings": shlex.quote(settings_json),
    }
    text = _SHIM_TEMPLATE
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    left = _PLACEHOLDER.search(text)
    if left:
        raise ValueError(f"the shim template has an unknown placeholder {left.group()}")
    return text


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    # Slurm may run a hook while we rewrite it: it must see the old file or the
    # new one, never half of one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        old_mtime = path.stat().st_mtime if path.exists() else 0.0
        # slurmctld reloads job_submit.lua only when its mtime, in whole seconds,
        # is newer than that of the copy it loaded: make every rewrite newer.
        new_mtime = max(os.stat(tmp).st_mtime, int(old_mtime) + 1)
        os.utime(tmp, (new_mtime, new_mtime))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# job_submit.lua runs inside slurmctld under its locks: never wait on the daemon longer than this.
MAX_JOB_SUBMIT_TIMEOUT_SECONDS = 1.0


def _lua_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def render_job_submit(source: str, config_path: str) -> str:
    """Bake the daemon's socket, the unreachable-ledger policy and a timeout into the script
    (slurmctld gives job_submit.lua no way to read a config file cheaply)."""
    from ledger.config import load_config

    path = Path(config_path)
    config = load_config(path if path.is_file() else Path("/dev/null"))
    timeout = min(float(config["daemon"]["timeout_seconds"]), MAX_JOB_SUBMIT_TIMEOUT_SECONDS)
    sockets = [str(path) for path in config["daemon"].get("sockets") or [config["daemon"]["socket"]]]
    if any(not path or any(c.isspace() for c in path) for path in sockets):
        raise ValueError(f"daemon.sockets: a socket path may not be empty or hold spaces: {sockets!r}")
    values = {
        # Several daemons (two controllers) are tried in this order, within one timeout.
        "@SOCKET@": " ".join(sockets),
        "@POLICY@": str(config["policy"]["on_ledger_unreachable"]),
        "@TIMEOUT@": f"{timeout:g}",
    }
    for placeholder, value in values.items():
        source = source.replace(f'"{placeholder}"', f'"{_lua_string(value)}"')
    return source


def _newer_than_any_load(path: Path) -> None:
    """slurmctld reloads job_submit.lua only when its mtime, in whole seconds, is later
    than the time it last loaded it (docs/slurm-facts.md §12); a script written in the
    same second as that load would be ignored until the next change. Dating it two
    seconds ahead makes the next submission load it (and any within those two seconds
    load it again, which is harmless)."""
    stamp = max(time.time(), path.stat().st_mtime) + 2
    os.utime(path, (stamp, stamp))


def install(
    etc_dir: str,
    hook_dir: str,
    command: Sequence[str],
    config_path: str,
    *,
    job_submit_lua: str | None = None,
) -> list[str]:
    """Write the four hook shims into `hook_dir` and job_submit.lua into `etc_dir`.

    The shims run `<command> hook <name>` (see `render_shim`). `job_submit_lua` is
    the script to install; by default the one gpucredit ships. Both carry the
    settings they need from `config_path` as it is now, so run this again after
    changing the config. Returns the paths written. Files are replaced atomically.
    """
    etc = Path(_require_absolute("etc_dir", etc_dir))
    hooks = Path(_require_absolute("hook_dir", hook_dir))
    lua_source = Path(job_submit_lua) if job_submit_lua else PACKAGED_JOB_SUBMIT_LUA
    if not lua_source.is_file():
        raise FileNotFoundError(f"job_submit.lua not found at {lua_source}")
    settings = read_hook_settings(_require_absolute("config_path", config_path))
    shims = {hook: render_shim(hook, command, config_path, settings) for hook in HOOKS}

    hooks.mkdir(mode=0o755, parents=True, exist_ok=True)
    etc.mkdir(mode=0o755, parents=True, exist_ok=True)
    written = []
    for hook, text in shims.items():
        path = hooks / shim_name(hook)
        _write_atomically(path, text.encode(), 0o755)
        written.append(str(path))
    lua_target = etc / "job_submit.lua"
    _write_atomically(lua_target, render_job_submit(lua_source.read_text(), config_path).encode(), 0o644)
    _newer_than_any_load(lua_target)
    written.append(str(lua_target))
    return written
