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
import shutil
import stat
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_hooks.hooks import hook_settings
from slurmtext import SlurmTextError
from slurmtext.show_config import parse_show_config

__all__ = [
    "DEFAULT_ETC_DIR",
    "DEFAULT_HOOK_DIR",
    "DEFAULT_JWT_KEY",
    "HOOKS",
    "HOOK_LAUNCHER",
    "PACKAGED_JOB_SUBMIT_LUA",
    "NotOurs",
    "install",
    "is_ours",
    "jwt_lines",
    "launcher_command",
    "prepare_folders",
    "read_hook_settings",
    "render_shim",
    "shim_name",
    "slurm_conf_lines",
    "slurm_users",
]

DEFAULT_ETC_DIR = "/etc/slurm"
DEFAULT_HOOK_DIR = "/etc/slurm/gpucredit"
DEFAULT_JWT_KEY = "/etc/slurm/jwt_hs256.key"  # Slurm's own example name for auth/jwt's key

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
# `gpucredit cloud <act>` -> the slurm.conf key that runs it (power saving, State=CLOUD nodes).
CLOUD_PROGRAMS: dict[str, str] = {
    "resume": "ResumeProgram",
    "suspend": "SuspendProgram",
    "resume-fail": "ResumeFailProgram",
}
# Slurm runs each with one argument, the hostlist, as SlurmUser and with no PATH.
_CLOUD_SHIM_TEMPLATE = """#!/bin/sh
# gpucredit cloud @act@ (slurm.conf @key@), written by `gpucredit slurm install`.
# slurmctld runs it with the nodes' hostlist and no PATH: every path here is absolute.
# The provider's credentials come from boto3's own chain (SlurmUser's ~/.aws, or the
# controller's instance role), never from gpucredit.toml; slurmctld passes its own
# environment on to none of its power-saving programs.
exec /usr/bin/env \\
    GPUCREDIT_CONFIG=@config@ \\@environment@
    @command@ cloud @act@ "$@"
"""
# Defaults for the power-saving timers, seconds: a cloud GPU node idle 10 minutes is
# ended; one not up 15 minutes after its launch has failed (GPU instances boot slowly).
DEFAULT_SUSPEND_TIME_SECONDS = 600
DEFAULT_RESUME_TIMEOUT_SECONDS = 900
_GRES_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_PLACEHOLDER = re.compile(r"@[a-z_]+@")


def shim_name(hook: str) -> str:
    """File name of the shim for `hook`: prolog-slurmctld -> prolog_slurmctld.sh."""
    if hook not in HOOKS:
        raise ValueError(f"unknown hook {hook!r}; expected one of {', '.join(HOOKS)}")
    return hook.replace("-", "_") + ".sh"


def cloud_shim_name(act: str) -> str:
    """File name of the shim for `gpucredit cloud <act>`: resume-fail -> cloud_resume_fail.sh."""
    if act not in CLOUD_PROGRAMS:
        raise ValueError(f"unknown cloud program {act!r}; expected one of {', '.join(CLOUD_PROGRAMS)}")
    return "cloud_" + act.replace("-", "_") + ".sh"


def cloud_command(python: str) -> list[str]:
    """`python` running this installation's `gpucredit cloud ...`: unlike the hooks'
    launcher it keeps `site`, where boto3 (the cloud extra) is installed."""
    return [_require_absolute("python", python), "-I", str(HOOK_LAUNCHER)]


def render_cloud_shim(
    act: str, command: Sequence[str], config_path: str, environment: Mapping[str, str] | None = None
) -> str:
    """The text of the shell shim slurmctld runs as `<key> HOSTLIST`; `environment`: more
    variables for the program (the Slurm box: where moto's dummy credentials are)."""
    if not command:
        raise ValueError("the cloud command is empty")
    cloud_shim_name(act)  # validates the name
    values = {
        "act": act,
        "key": CLOUD_PROGRAMS[act],
        "command": shlex.join([_require_absolute("the cloud command", command[0]), *command[1:]]),
        "config": shlex.quote(_require_absolute("config_path", config_path)),
        "environment": "".join(
            f"\n    {name}={shlex.quote(value)} \\" for name, value in sorted((environment or {}).items())
        ),
    }
    text = _CLOUD_SHIM_TEMPLATE
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


def power_saving_lines(
    hook_dir: str,
    *,
    suspend_time_seconds: int = DEFAULT_SUSPEND_TIME_SECONDS,
    resume_timeout_seconds: int = DEFAULT_RESUME_TIMEOUT_SECONDS,
) -> str:
    """slurm.conf's power-saving lines for a site with a `[cloud]` section: Slurm launches
    State=CLOUD nodes through `gpucredit cloud resume` and ends them idle through
    `gpucredit cloud suspend` (the shims `gpucredit slurm install` writes)."""
    hook_dir = _require_absolute("hook_dir", hook_dir)
    for name, value in (
        ("suspend_time_seconds", suspend_time_seconds),
        ("resume_timeout_seconds", resume_timeout_seconds),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"cloud.{name}: a whole number of seconds, at least 1, got {value!r}")
    shims = {key: os.path.join(hook_dir, cloud_shim_name(act)) for act, key in CLOUD_PROGRAMS.items()}
    lines = [
        "# gpucredit: cloud nodes (State=CLOUD in their NodeName lines) launched and ended through the",
        "# provider's API ([cloud] in gpucredit.toml; `gpucredit cloud instances` shows what they cost)",
        f"ResumeProgram={shims['ResumeProgram']}",
        f"SuspendProgram={shims['SuspendProgram']}",
        f"ResumeFailProgram={shims['ResumeFailProgram']}",
        f"ResumeTimeout={resume_timeout_seconds}",
        f"SuspendTime={suspend_time_seconds}",
        "# powered-down cloud nodes stay visible to sinfo and scontrol (`gpucredit cloud reconcile`)",
        "PrivateData=cloud",
        "# a node whose launch failed is DOWN with the provider's reason; to offer it again once it is",
        "# powered down, add idle_on_node_suspend to your SlurmctldParameters (Slurm 21.08 and later)",
    ]
    return "\n".join(lines) + "\n"


def jwt_lines(key_path: str) -> str:
    """slurm.conf's lines for the portal's jobs API through slurmrestd (Slurm 24.11 and
    later, Debian's slurm-wlm-jwt-plugin): slurmctld accepts a token signed with the key
    as its user's word, so the key is as secret as root on the cluster."""
    key_path = _require_absolute("jwt_key", key_path)
    lines = [
        "# gpucredit: the portal's jobs API acts for each user through slurmrestd with a short-lived",
        f"# token it signs with {key_path} (owned by SlurmUser, mode 0600; the portal reads a copy)",
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={key_path}",
    ]
    return "\n".join(lines) + "\n"


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
        "# gpucredit: keep a job's comment in sacct (the meter's reason when it cancels a job)",
        "AccountingStoreFlags=job_comment",
        "# gpucredit: fairshare from credit and usage (`gpucredit fairshare sync` sets the shares)",
        "PriorityType=priority/multifactor",
        "PriorityWeightFairshare=10000",
    ]
    return "\n".join(lines) + "\n"


# Printed after slurm_conf_lines as comments: they belong in cgroup.conf, and slurm.conf's
# TaskPlugin line is the site's own (the box runs without cgroups).
DEVICE_LINES = """\
# gpucredit: bill only the GPUs a job was given. Confine each job to its devices, or a job that
# asked for no GPU can open /dev/nvidia* and use one unbilled (`gpucredit slurm check` says
# when they are not). In slurm.conf:
#   TaskPlugin=task/cgroup,task/affinity
#   ProctrackType=proctrack/cgroup
# and in cgroup.conf (every GPU node reads it):
#   ConstrainDevices=yes
# All these lines are the same for Slurm 22.05, 24.11 and 26.05.
"""


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


# The first line of every job_submit.lua `install` writes: how a later install knows the
# file is its own to replace (the shims say the same in their comment).
WRITTEN_BY = "-- Written by `gpucredit slurm install`: run it again rather than editing this copy.\n"
# What marks a file as gpucredit's: the line above, the shims' comment, and the first lines
# of the scripts installs wrote before that line existed (gpucredit's, the box's pass-through).
_OURS = (
    "written by `gpucredit slurm install`",
    "--[[\ngpucredit job_submit.lua",
    "-- Pass-through job_submit.lua",
)


def is_ours(text: str) -> bool:
    """Whether an existing hook file or job_submit.lua was written by gpucredit (so an
    install may replace it), as against a site's own script."""
    head = text[:400]
    return any(mark.lower() in head.lower() for mark in _OURS)


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
    return source if source.startswith(WRITTEN_BY) else WRITTEN_BY + source


def _newer_than_any_load(path: Path) -> None:
    """slurmctld reloads job_submit.lua only when its mtime, in whole seconds, is later
    than the time it last loaded it (docs/slurm-facts.md §12); a script written in the
    same second as that load would be ignored until the next change. Dating it two
    seconds ahead makes the next submission load it (and any within those two seconds
    load it again, which is harmless)."""
    stamp = max(time.time(), path.stat().st_mtime) + 2
    os.utime(path, (stamp, stamp))


class NotOurs(Exception):
    """Files install would replace that gpucredit did not write (a site's own hooks)."""

    def __init__(self, paths: Sequence[str]) -> None:
        super().__init__(", ".join(paths))
        self.paths = list(paths)


def install(
    etc_dir: str,
    hook_dir: str,
    command: Sequence[str],
    config_path: str,
    *,
    job_submit_lua: str | None = None,
    job_submit_to: str | None = None,
    force: bool = False,
    backup: bool = True,
    now: float | None = None,
    cloud: Sequence[str] | None = None,
) -> list[str]:
    """Write the four hook shims into `hook_dir` and job_submit.lua into `etc_dir` (or
    `job_submit_to`, for a site whose own job_submit.lua calls gpucredit's).

    The shims run `<command> hook <name>` (see `render_shim`). `job_submit_lua` is
    the script to install; by default the one gpucredit ships. Both carry the
    settings they need from `config_path` as it is now, so run this again after
    changing the config. Returns the paths written. Files are replaced atomically.

    `cloud` (a site with a `[cloud]` section): the command of the three power-saving
    shims (`cloud_command(python)`, or a gpucredit executable), written beside the hooks'.

    A file in the way that gpucredit did not write and that differs from what would be
    written (a site's own job_submit.lua or Prolog) is never replaced silently: NotOurs,
    and nothing is written; with `force` it is kept as `<name>.bak-<UTC time>` first
    (`backup=False`: not kept, for the Slurm box, which replaces its own experiments).
    """
    etc = Path(_require_absolute("etc_dir", etc_dir))
    hooks = Path(_require_absolute("hook_dir", hook_dir))
    lua_source = Path(job_submit_lua) if job_submit_lua else PACKAGED_JOB_SUBMIT_LUA
    if not lua_source.is_file():
        raise FileNotFoundError(f"job_submit.lua not found at {lua_source}")
    settings = read_hook_settings(_require_absolute("config_path", config_path))
    lua_target = (
        Path(_require_absolute("job_submit_to", job_submit_to)) if job_submit_to else etc / "job_submit.lua"
    )
    texts = {hooks / shim_name(hook): render_shim(hook, command, config_path, settings) for hook in HOOKS}
    for act in CLOUD_PROGRAMS if cloud else ():  # a site with a [cloud] section: its command
        texts[hooks / cloud_shim_name(act)] = render_cloud_shim(act, cloud or (), config_path)
    texts[lua_target] = render_job_submit(lua_source.read_text(), config_path)

    in_the_way = [path for path, text in texts.items() if _foreign(path, text)]
    if in_the_way and not force:
        raise NotOurs([str(path) for path in in_the_way])
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    written = []
    for path in in_the_way if backup else []:
        copy = path.with_name(f"{path.name}.bak-{stamp}")
        shutil.copy2(path, copy)
        written.append(f"{copy} (a copy of the file replaced)")
    hooks.mkdir(mode=0o755, parents=True, exist_ok=True)
    etc.mkdir(mode=0o755, parents=True, exist_ok=True)
    lua_target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    for path, text in texts.items():
        mode = 0o644 if path == lua_target else 0o755
        _write_atomically(path, text.encode(), mode)
        written.append(str(path))
    _newer_than_any_load(lua_target)
    loaded = etc / "job_submit.lua"
    if lua_target != loaded and loaded.is_file():
        # slurmctld watches only the script it loads, the site's, which loads ours: date it
        # ahead too, so that the next submission loads both again (docs/slurm-facts.md §12).
        _newer_than_any_load(loaded)
    return written


def _foreign(path: Path, text: str) -> bool:
    try:
        existing = path.read_text(errors="replace")
    except FileNotFoundError:
        return False
    return existing != text and not is_ours(existing)


# --------------------------------------------------------------------------- folders

# Who runs what (slurm.conf): PrologSlurmctld/EpilogSlurmctld and job_submit.lua as
# SlurmUser, the node Prolog/Epilog as SlurmdUser. Slurm's default for both is root.
DEFAULT_SLURM_USER = "root"


def slurm_users(etc_dir: str, scontrol: str | None = None) -> tuple[str, str, str]:
    """(SlurmUser, SlurmdUser, where they were read): from `scontrol show config` when
    slurmctld answers, else from `etc_dir`/slurm.conf, else Slurm's defaults (root)."""
    import subprocess

    if scontrol:
        try:
            out = subprocess.run(
                [scontrol, "show", "config"], capture_output=True, text=True, timeout=10, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        try:
            found = parse_show_config(out)
        except SlurmTextError:
            found = {}
        if "SlurmUser" in found:  # printed as `slurm(64030)`
            slurm_user = found["SlurmUser"].split("(")[0]
            slurmd_user = found.get("SlurmdUser", DEFAULT_SLURM_USER).split("(")[0]
            return slurm_user, slurmd_user, "scontrol show config"
    conf = Path(etc_dir) / "slurm.conf"
    try:
        text = conf.read_text(errors="replace")
    except OSError:
        return DEFAULT_SLURM_USER, DEFAULT_SLURM_USER, "Slurm's defaults"
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.split("#", 1)[0].partition("=")
        if key.strip().lower() in ("slurmuser", "slurmduser") and value.strip():
            values[key.strip().lower()] = value.strip()
    return (
        values.get("slurmuser", DEFAULT_SLURM_USER),
        values.get("slurmduser", DEFAULT_SLURM_USER),
        str(conf),
    )


def prepare_folders(
    settings: Mapping[str, Mapping[str, Any]], slurm_user: str, slurmd_user: str
) -> list[str]:
    """Make the folders the hooks write, owned by the user Slurm runs each writer as:

    - the hooks' log (`hooks.log_file`): its folder 0755 and the file 0640, SlurmUser's
      (PrologSlurmctld writes it; the node hooks run as root, who may write anything);
    - the outage spool (`policy.outage_spool_dir`): 0750, SlurmUser's (the controller's
      hooks append to it, the daemon, root, reads it back);
    - the agent's spool (`agent.spool_dir`, up to a `%n`): 0755, SlurmdUser's (the node
      Prolog writes it, the agent, root, reads it).

    Returns what it made or changed, each with its owner and mode; folders already right
    are left as they are.
    """
    import pwd

    done: list[str] = []

    def own(path: Path, user: str, mode: int, *, folder: bool) -> None:
        entry = pwd.getpwnam(user)
        made = False
        if folder and not path.is_dir():
            path.mkdir(mode=mode, parents=True, exist_ok=True)
            made = True
        elif not folder and not path.exists():
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode))
            made = True
        if made:
            os.chmod(path, mode)  # whatever the umask
        if path.stat().st_uid != entry.pw_uid:
            os.chown(path, entry.pw_uid, entry.pw_gid)
            made = True
        if made:
            done.append(f"{path} ({user}, {stat.filemode(path.stat().st_mode)})")

    log_file = settings.get("hooks", {}).get("log_file")
    if log_file:
        log_path = Path(_require_absolute("hooks.log_file", str(log_file)))
        own(log_path.parent, slurm_user, 0o755, folder=True)
        own(log_path, slurm_user, 0o640, folder=False)
    outage = settings.get("policy", {}).get("outage_spool_dir") or "/var/spool/gpucredit/outage"
    own(Path(_require_absolute("policy.outage_spool_dir", str(outage))), slurm_user, 0o750, folder=True)
    spool = str(settings.get("agent", {}).get("spool_dir") or "/var/spool/gpucredit/jobs")
    spool = spool.split("%n", 1)[0].rstrip("/") or "/"
    if spool.rstrip("/"):
        own(Path(_require_absolute("agent.spool_dir", spool)), slurmd_user, 0o755, folder=True)
    return done
