"""The Slurm box for another Slurm version: Debian's packages of a newer suite, in a chroot.

    python -m slurmbox up --slurm 24.11      (make slurm-up SLURM=24.11)
    python -m slurmbox run --slurm 24.11 -- sinfo
    python -m slurmbox run --slurm 24.11 -u alice -- sbatch -A physics --gres=gpu:h100:1 --wrap 'sleep 5'
    python -m slurmbox down --slurm 24.11    (make slurm-down SLURM=24.11)

The same cluster as the host box (slurmbox/box.py: its templates, partitions, accounts,
users and fake GPUs), inside the version's root filesystem (slurmbox/rootfs.py), with
its own ports, munged and accounting database (versions.py), so it runs beside the
host box. MariaDB is the host's (127.0.0.1:3306; started as the host box starts it when
it does not answer); the network is the host's, so PostgreSQL at 127.0.0.1:5432 is
reachable from inside.

Process model: as the host box's, every daemon is a child of one supervisor
(`python -m slurmbox _supervise-chroot VERSION FD`), a child subreaper. The supervisor
first moves into a private mount namespace and mounts /proc, /sys, /dev and a fresh
/run into the root (rootfs.private_mounts): nothing is ever mounted in the host's
namespace, and the mounts vanish when the box's last process ends. The root is
mounted over the namespace's `/`, so daemons and commands enter the namespace (setns)
and have the root as their `/` with no chroot (a chrooted process gets no user
namespace, which rootless runc needs); the supervisor itself keeps the host's view.
The supervisor then installs gpucredit into the root's venv (when the checkout
changed), writes the configs, hooks and job_submit.lua
(`gpucredit slurm install`'s code, run by the root's python), starts munged,
slurmdbd, slurmctld and three slurmd, and at last gpucredit's side as `make
slurm-up` does on the host (slurmbox.gpucredit_site, run inside the root). SIGTERM
stops everything whose root is the box's root, drops the accounting database and
wipes Slurm's state; gpucredit's ledger and config in the root stay.

Paths inside the root are the host box's (/etc/slurm, /var/log/gpucredit-box,
/var/lib/gpucredit-box, /etc/gpucredit, /var/log/gpucredit); seen from the host they
are under the root (`status` prints it). The host-side run files are in
/run/gpucredit-box-<version>.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurm_hooks.admin import slurmconf
from slurmbox import containers, rootfs
from slurmbox.box import (
    _DETACHED,
    ACCOUNTS,
    BUNDLE_DIR,
    CONF_DIR,
    CPUS_PER_NODE,
    DB_PASSWORD,
    DB_USER,
    FAKE_GPUS,
    GRES_TYPES,
    NODES,
    PASSTHROUGH_LUA,
    REPO,
    USERS,
    BoxCommands,
    BoxError,
    _alive,
    _checked,
    _children,
    _cmdline,
    _ok,
    _read_json,
    _read_pid,
    _read_pipe,
    _render,
    _run_env,
    _tail,
    _wait_until,
    _write,
    run,
)
from slurmbox.versions import SlurmVersion

__all__ = ["ChrootBox", "supervise"]

# Paths inside the root: the host box's.
ETC_DIR = "/etc/slurm"
RUN_DIR = "/run/gpucredit-box"
STATE_DIR = "/var/lib/gpucredit-box"
LOG_DIR = "/var/log/gpucredit-box"
JOB_DIR = "/tmp/gpucredit-box-jobs"
FAKE_GPU_DIR = f"{STATE_DIR}/fakegpu"
CONFIG = "/etc/gpucredit/gpucredit.toml"
JWT_KEY = slurmconf.DEFAULT_JWT_KEY  # auth/jwt's key: slurmctld checks tokens, the submitter mints them
VENV_BIN = f"{rootfs.VENV}/bin"
# What commands in the box see; `run` adds TERM and the user's own extras.
ENV = {
    "PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/root",
    "GPUCREDIT_CONFIG": CONFIG,
}
_DAEMON_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# The client commands ChrootBox.client_dir offers the host.
CLIENTS = ("sacct", "sacctmgr", "sbatch", "scancel", "scontrol", "sinfo", "sprio", "squeue", "sshare", "srun")
_CLONE_NEWNS = 0x00020000
_PR_SET_CHILD_SUBREAPER = 36
_MUNGE_CHECK = "/usr/bin/munge -n </dev/null | /usr/bin/unmunge"
# slurmbox is not in the wheel the root's venv installs: its copy in rootfs.HARNESS is.
_GPUCREDIT_SITE = (
    f"import sys; sys.path.insert(0, {rootfs.HARNESS!r}); "
    "from slurmbox import gpucredit_site; print('\\n'.join(gpucredit_site.up(**{kwargs})))"
)


@dataclass(frozen=True)
class _Daemon:
    name: str
    argv: tuple[str, ...]
    log: str  # inside the root
    user: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # beside _DAEMON_ENV


def _daemons() -> dict[str, _Daemon]:
    daemons = [
        _Daemon("munged", ("/usr/sbin/munged", "-F", "--force"), f"{LOG_DIR}/munged.out", "munge"),
        _Daemon("slurmdbd", ("/usr/sbin/slurmdbd", "-D"), f"{LOG_DIR}/slurmdbd.log"),
        _Daemon("slurmctld", ("/usr/sbin/slurmctld", "-D"), f"{LOG_DIR}/slurmctld.log"),
    ]
    daemons += [
        _Daemon(f"slurmd-{n}", ("/usr/sbin/slurmd", "-D", "-N", n), f"{LOG_DIR}/slurmd.{n}.log")
        for n in NODES
    ]
    # Never as root or SlurmUser (it refuses); the address is the version's (spawn adds it).
    # SLURM_JWT=daemon: it speaks to slurmctld with each caller's token (auth/jwt), not
    # as itself (auth/munge rejects "thread config token"; Slurm's rest_quickstart).
    daemons.append(
        _Daemon(
            "slurmrestd",
            ("/usr/sbin/slurmrestd", "-a", "rest_auth/jwt"),
            f"{LOG_DIR}/slurmrestd.out",
            "slurmrestd",
            (("SLURM_JWT", "daemon"),),
        )
    )
    return {d.name: d for d in daemons}


DAEMONS = _daemons()


def _enter(namespace_pid: int | None, root: str, cwd: str) -> None:
    """In a child (or before exec): join the box's mount namespace (the supervisor's, or
    this process's own when None), whose `/` is the box's root (rootfs.private_mounts):
    setns makes it this process's root, no chroot; then chdir."""
    want = os.stat(root)
    fd = os.open(f"/proc/{namespace_pid or 'self'}/ns/mnt", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "setns into the box's mount namespace")
    finally:
        os.close(fd)
    got = os.stat("/")
    if (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino):  # a box started before roots were mounted so
        raise OSError(f"the box's / is not {root}: restart the box (make slurm-down slurm-up)")
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir("/")


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _passwd_ids(root: Path, user: str) -> tuple[int, int]:
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise BoxError(f"no user {user} in {root}/etc/passwd")


def _processes_in(root: Path) -> list[int]:
    """Every process whose root directory is `root` (daemons, job steps, gpucredit's daemons)."""
    # Compared by inode, not by readlink: a process in the box's mount namespace may
    # name its root differently from the host.
    found = []
    want = os.stat(root)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                got = os.stat(entry / "root")
                if (got.st_dev, got.st_ino) == (want.st_dev, want.st_ino) and _alive(int(entry.name)):
                    found.append(int(entry.name))
    return found


@dataclass
class ChrootBox(BoxCommands):
    """Handle on the box of one chroot Slurm version; cheap to create (no I/O here).

    hooks: "gpucredit" (gpucredit installed in the root, its hooks, job_submit.lua and
    daemons), "passthrough" (the shims run /bin/true, the pass-through job_submit.lua;
    gpucredit is still installed), or "auto" (= gpucredit).
    """

    version: SlurmVersion
    hooks: str = field(default_factory=lambda: os.environ.get("GPUCREDIT_BOX_HOOKS", "auto"))
    timeout_s: float = 60.0
    config_path: str = CONFIG  # inside the root: the gpucredit config the hooks are installed with

    def __post_init__(self) -> None:
        if not self.version.chroot:
            raise BoxError(f"Slurm {self.version.name} is the host's box (slurmbox.box.SlurmBox)")
        self._supervisor: subprocess.Popen[bytes] | None = None

    # ---- places ----

    @property
    def root(self) -> Path:
        return rootfs.rootfs_dir(self.version)

    @property
    def run_dir(self) -> Path:
        """Host-side run files: supervisor.pid, daemons.json, ready, lock."""
        return Path(f"/run/gpucredit-box-{self.version.name}")

    def inside(self, path: str) -> Path:
        """A path inside the root, as the host sees it."""
        return self.root / path.lstrip("/")

    @property
    def has_rest(self) -> bool:
        """Whether the root has slurmrestd and auth/jwt (24.11's and 26.05's suites do;
        bookworm's 22.05 has no auth_jwt plugin)."""
        return (self.root / "usr/sbin/slurmrestd").exists() and any(
            self.root.glob("usr/lib/*/slurm-wlm/auth_jwt.so")
        )

    @property
    def rest_url(self) -> str | None:
        """slurmrestd's address (the host's network), or None where the root has none."""
        return f"http://127.0.0.1:{self.version.ports['slurmrestd']}" if self.has_rest else None

    def passwd(self, user: str) -> tuple[int, str]:
        """(uid, home) of `user` as the root's passwd has it; KeyError if it has none (a
        portal on the box's host acts for the box's users: portal.jobs.rest)."""
        for line in self.inside("/etc/passwd").read_text().splitlines():  # the root's own users
            fields = line.split(":")
            if len(fields) >= 7 and fields[0] == user:
                return int(fields[2]), fields[5]
        raise KeyError(user)

    @property
    def portal_port(self) -> int:
        """The portal's port (the host box's is 8088): where the root has slurmrestd."""
        return self.version.port_base + 88

    def resolved_hooks(self) -> str:
        mode = "gpucredit" if self.hooks == "auto" else self.hooks
        if mode not in ("gpucredit", "passthrough"):
            raise BoxError(f"hooks must be gpucredit, passthrough or auto, not {mode!r}")
        return mode

    # ---- configuration ----

    def _ports(self, text: str, what: str) -> str:
        """The host box's 68xx ports as this version's."""
        ports = self.version.ports
        host = {6817: ports["slurmctld"], 6818: ports["node1"], 6819: ports["slurmdbd"]}
        host |= {6828: ports["node2"], 6838: ports["node3"]}

        def swap(match: re.Match[str]) -> str:
            number = int(match.group(1))
            if number in host:
                return str(host[number])
            if 6800 <= number < 6900:
                raise BoxError(f"{what}: unexpected Slurm port {number}")
            return match.group(1)  # not Slurm's (MariaDB's StoragePort)

        text = re.sub(r"(?<=Port=)(\d+)\b", swap, text)
        if re.search(r"\b68[1-3]\d\b", text):
            raise BoxError(f"{what}: a host box port is left after rendering")
        return text

    def render_slurm_conf(self) -> str:
        text = _render(
            CONF_DIR / "slurm.conf.in",
            {
                "gpucredit_lines": slurmconf.slurm_conf_lines(
                    slurmconf.DEFAULT_HOOK_DIR, list(GRES_TYPES), ETC_DIR
                ).rstrip("\n"),
                "state_dir": STATE_DIR,
                "run_dir": RUN_DIR,
                "log_dir": LOG_DIR,
                "cpus": str(CPUS_PER_NODE),
                "cloud_lines": "",  # the box's cloud runs on the host's 22.05 box only
            },
        )
        if self.has_rest:
            text += slurmconf.jwt_lines(JWT_KEY)
        return self._ports(text, "slurm.conf")

    def render_slurmdbd_conf(self) -> str:
        text = _render(
            CONF_DIR / "slurmdbd.conf.in",
            {"log_dir": LOG_DIR, "run_dir": RUN_DIR, "db_password": DB_PASSWORD},
        )
        text = re.sub(r"(?m)^StorageLoc=.*$", f"StorageLoc={self.version.db_name}", text)
        return self._ports(text, "slurmdbd.conf")

    # ---- lifecycle ----

    def cannot_start_reason(self) -> str | None:
        if sys.platform != "linux":
            return "the Slurm box needs Linux"
        if os.geteuid() != 0:
            return "the Slurm box needs root (chroot, mounts)"
        if not self.root.is_dir() and shutil.which("debootstrap") is None:
            return "debootstrap is missing: apt-get install -y --no-install-recommends debootstrap"
        return None

    def supervisor_pid(self) -> int | None:
        pid = _read_pid(self.run_dir / "supervisor.pid")
        return pid if pid and _alive(pid) else None

    def is_up(self) -> bool:
        return self.supervisor_pid() is not None and (self.run_dir / "ready").exists()

    def status(self) -> dict[str, object]:
        info = _read_json(self.run_dir / "daemons.json")
        daemons = info.get("daemons", {}) if isinstance(info, dict) else {}
        built = _read_json(self.root.with_name("rootfs.json"))
        return {
            "slurm": self.version.name,
            "suite": self.version.suite,
            "root": str(self.root),
            "up": self.is_up(),
            "supervisor": self.supervisor_pid(),
            "daemons": {name: (pid if _alive(pid) else None) for name, pid in daemons.items()},
            "ports": self.version.ports,
            "slurmrestd": self.rest_url,
            "portal": f"http://127.0.0.1:{self.portal_port}/" if self.has_rest else None,
            "hooks": info.get("hooks") if isinstance(info, dict) else None,
            "installed": built.get("installed") if isinstance(built, dict) else None,
        }

    def up(self, *, detach: bool = False) -> dict[str, object]:
        """Build the root if needed, start the box (or reuse a running one).

        Returns {"seconds", "rootfs" (rootfs.json plus "cached"), "said" (gpucredit's lines)}.
        """
        started = time.monotonic()
        problem = self.cannot_start_reason()
        if problem:
            raise BoxError(problem)
        with self._lock():
            if self.is_up():
                return {
                    "seconds": time.monotonic() - started,
                    "rootfs": {"cached": True},
                    "said": [],
                    "reused": True,
                }
            self._stop_locked()
            try:
                built = rootfs.ensure_rootfs(self.version)
            except rootfs.RootfsError as e:
                raise BoxError(str(e)) from e
            self.run_dir.mkdir(parents=True, exist_ok=True)
            read_fd, write_fd = os.pipe()
            log = self.run_dir / "supervisor.log"
            out = open(log, "ab")  # noqa: SIM115 (handed to the child)
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "slurmbox", "_supervise-chroot", self.version.name, str(write_fd)],
                    cwd=REPO,
                    env={**os.environ, "GPUCREDIT_BOX_SPEC": json.dumps(self._spec())},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    pass_fds=(write_fd,),
                    start_new_session=detach,
                )
            finally:
                out.close()
                os.close(write_fd)
            # The first start installs gpucredit from PyPI inside the root: allow for it.
            message = _read_pipe(read_fd, self.timeout_s + 600)
            lines = message.splitlines()
            if not lines or lines[0] != "ready":
                if proc.poll() is None:
                    proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=60)
                raise BoxError(
                    message.strip() or f"box supervisor exited ({proc.poll()}); see {log}:\n{_tail(log)}"
                )
            if detach:
                # It outlives this process; dropped, its Popen would warn "still running"
                # (an error under pytest, when a test rebuilds a `make slurm-up` box).
                _DETACHED.append(proc)
            else:
                self._supervisor = proc
        return {"seconds": time.monotonic() - started, "rootfs": built, "said": lines[1:], "reused": False}

    def _spec(self) -> dict[str, object]:
        spec = asdict(self)
        spec["version"] = self.version.name
        return spec

    def down(self) -> float:
        started = time.monotonic()
        with self._lock():
            self._stop_locked()
        return time.monotonic() - started

    def _stop_locked(self) -> None:
        supervisor = self.supervisor_pid()
        if supervisor:
            os.kill(supervisor, signal.SIGTERM)
            _wait_until(
                lambda: not _alive(supervisor), 90, f"Slurm {self.version.name} box supervisor did not stop"
            )
        if self._supervisor is not None:  # ours (up() without detach): reap it
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._supervisor.wait(timeout=10)
            self._supervisor = None
        # Whatever a dead supervisor left behind (normally nothing).
        leftovers = _processes_in(self.root) if self.root.is_dir() else []
        if leftovers:
            _kill_all(leftovers)
            _drop_database(self.version)
        for name in ("supervisor.pid", "daemons.json", "ready"):
            (self.run_dir / name).unlink(missing_ok=True)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    # ---- hooks ----

    def hooks_argv(self, mode: str) -> list[str]:
        """The command, run in the root, that installs the hook shims and job_submit.lua for
        `mode` ("gpucredit" or "passthrough"): `gpucredit slurm install`'s own code
        (slurmconf.install) by the root's python, as the host box runs it."""
        python = f"{VENV_BIN}/python"
        if mode == "gpucredit":
            call = (
                f"s.install({ETC_DIR!r}, s.DEFAULT_HOOK_DIR, s.launcher_command({python!r}), "
                f"{self.config_path!r}, force=True, backup=False)"
            )
        elif mode == "passthrough":
            lua = f"{ETC_DIR}/job_submit.passthrough.lua"
            shutil.copyfile(PASSTHROUGH_LUA, self.inside(lua))
            true = ["/bin/true"]
            call = (
                f"s.install({ETC_DIR!r}, s.DEFAULT_HOOK_DIR, {true!r}, {self.config_path!r}, "
                f"job_submit_lua={lua!r}, force=True, backup=False)"
            )
        else:
            raise BoxError(f"hooks must be gpucredit or passthrough, not {mode!r}")
        return [python, "-c", f"from slurm_hooks.admin import slurmconf as s; {call}"]

    def use_hooks(self, mode: str | None = None) -> str:
        """Install the hooks for `mode` into the running box; returns the mode used."""
        if mode is not None:
            self.hooks = mode
        resolved = self.resolved_hooks()
        proc = self.run(self.hooks_argv(resolved), cwd="/")
        if proc.returncode != 0:
            raise BoxError(f"installing the {resolved} hooks: {proc.stderr.strip() or proc.stdout.strip()}")
        return resolved

    # ---- commands in the box ----

    def command_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(ENV)
        if "TERM" in os.environ:
            env["TERM"] = os.environ["TERM"]
        return {**env, **(extra or {})}

    def _argv(self, argv: Sequence[str], user: str | None) -> list[str]:
        if not argv:
            raise BoxError("no command given")
        if user and user != "root":
            return ["/usr/sbin/runuser", "-u", user, "--", *argv]
        return list(argv)

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        timeout: float = 60,
        input: str | None = None,
        cwd: str = JOB_DIR,
        env: dict[str, str] | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the running box (its namespace and root); never raises on
        its exit code unless `check`."""
        supervisor = self.supervisor_pid()
        if supervisor is None:
            raise BoxError(
                f"the Slurm {self.version.name} box is not up (make slurm-up SLURM={self.version.name})"
            )
        root = str(self.root)
        try:
            proc = _run_env(
                self._argv(argv, user),
                timeout=timeout,
                input=input,
                env=self.command_env(env),
                preexec_fn=lambda: _enter(supervisor, root, cwd),
            )
        except BoxError as e:
            raise BoxError(f"{e} in the {self.version.name} box") from e
        except subprocess.SubprocessError as e:  # _enter failed in the child: Python keeps its words
            raise BoxError(
                f"cannot enter the {self.version.name} box ({e}): its / must be its root; a box started "
                f"before that must be restarted (make slurm-down slurm-up SLURM={self.version.name})"
            ) from e
        return _checked(proc, argv) if check else proc

    def client_dir(self) -> str:
        """Slurm's client commands of this box for gpucredit on the host (its daemon and CLI
        in a test, as `slurm.bin_dir`): each a script that runs the box's own command in
        the box's mount namespace and root, with the caller's arguments and environment."""
        bin_dir = self.run_dir / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        pid_file = self.run_dir / "supervisor.pid"
        down = f'{{ echo "the Slurm {self.version.name} box is not up" >&2; exit 1; }}'
        for name in CLIENTS:
            _write(
                bin_dir / name,
                "#!/bin/sh\n"
                f"# Slurm {self.version.name}'s {name}, in its box (slurmbox.chroot.ChrootBox.client_dir)\n"
                f"pid=$(cat {pid_file} 2>/dev/null) || {down}\n"
                f'exec /usr/bin/nsenter -t "$pid" -m /usr/bin/{name} "$@"\n',  # its / is the root
                0o755,
            )
        return str(bin_dir)

    def exec(self, argv: Sequence[str], *, user: str | None = None, cwd: str = JOB_DIR) -> None:
        """Replace this process by a command inside the running box (`python -m slurmbox run`)."""
        supervisor = self.supervisor_pid()
        if supervisor is None:
            raise BoxError(
                f"the Slurm {self.version.name} box is not up (make slurm-up SLURM={self.version.name})"
            )
        full = self._argv(argv, user)
        env = self.command_env()
        _enter(supervisor, str(self.root), cwd)
        os.execvpe(full[0], full, env)


def _older_config(text: str) -> bool:
    """A config from before the box ran slurmrestd (no jobs_backend), or from when its
    portal signed tokens itself (`jwt_key`: the submitter signs them now)."""
    return "jobs_backend" not in text or re.search(r"(?m)^jwt_key\s*=", text) is not None


def _kill_all(pids: Sequence[int], grace_s: float = 10) -> list[int]:
    """SIGTERM, then SIGKILL what is alive after `grace_s`; returns the pids killed so."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = [pid for pid in pids if _alive(pid)]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return killed


def _drop_database(version: SlurmVersion) -> None:
    if _ok(["/usr/bin/mysqladmin", "ping"]):
        run(["/usr/bin/mysql", "-e", f"DROP DATABASE IF EXISTS {version.db_name}"], check=False)


# --------------------------------------------------------------------------- supervisor


class _Stop(Exception):
    """SIGTERM/SIGINT arrived: stop the box."""


class _Supervisor:
    """Parent of every daemon of a chroot box; see the module docstring."""

    def __init__(self, box: ChrootBox) -> None:
        self.box = box
        self.root = box.root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pids: dict[str, int] = {}
        self.external: list[str] = []
        self.stopping = False
        self.said: list[str] = []

    def log(self, message: str) -> None:
        now = time.time()
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
        print(f"{stamp} box {self.box.version.name}: {message}", file=sys.stderr, flush=True)

    def _on_stop(self, signum: int, frame: object) -> None:
        if not self.stopping:
            self.stopping = True
            raise _Stop

    def save(self) -> None:
        data = {"daemons": self.pids, "external": self.external, "hooks": self.box.resolved_hooks()}
        _write(self.box.run_dir / "daemons.json", json.dumps(data, indent=1) + "\n")

    # ---- commands in the root (the supervisor is already in the namespace) ----

    def crun(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float = 30,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        root = str(self.root)
        try:
            proc = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env or _DAEMON_ENV,
                preexec_fn=lambda: _enter(None, root, "/"),
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise BoxError(f"{' '.join(argv)}: timed out after {timeout} s") from e
        if check and proc.returncode != 0:
            raise BoxError(
                f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc

    def cok(self, argv: Sequence[str], timeout: float = 5) -> bool:
        try:
            return self.crun(argv, check=False, timeout=timeout).returncode == 0
        except BoxError:
            return False

    def spawn(self, name: str, *extra: str) -> None:
        daemon = DAEMONS[name]
        root = str(self.root)
        ids = _passwd_ids(self.root, daemon.user) if daemon.user else None

        def enter() -> None:
            _enter(None, root, "/")
            if ids:  # the user as the root's /etc/passwd knows it
                os.setgroups([])
                os.setgid(ids[1])
                os.setuid(ids[0])

        out = open(self.box.inside(f"{LOG_DIR}/{name}.out"), "ab")  # noqa: SIM115 (handed to the child)
        try:
            proc = subprocess.Popen(
                [*daemon.argv, *extra],
                env={**_DAEMON_ENV, **dict(daemon.env)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=enter,
            )
        finally:
            out.close()
        self.procs[name] = proc
        self.pids[name] = proc.pid
        self.save()
        self.log(f"started {name} (pid {proc.pid})")

    def died(self, *names: str) -> Callable[[], str | None]:
        def check() -> str | None:
            for name in names:
                proc = self.procs.get(name)
                if proc is not None and proc.poll() is not None:
                    return f"{name} exited with {proc.returncode}"
            return None

        return check

    def logs(self, *names: str) -> list[Path]:
        paths: list[Path] = []
        for name in names:
            paths += [self.box.inside(DAEMONS[name].log), self.box.inside(f"{LOG_DIR}/{name}.out")]
        return list(dict.fromkeys(paths))

    # ---- start ----

    def prepare(self) -> None:
        box = self.box
        rootfs.private_mounts(self.root)
        self.log("mounted /proc, /sys, /dev, /run in the root (private namespace)")
        installed = rootfs.ensure_gpucredit(self.root, box.run_dir / "install.log")
        what = "installed" if installed["installed"] else "kept"
        wheel, python = installed.get("wheel"), installed.get("python")
        self.log(f"{what} gpucredit ({wheel}, Python {python}) in {installed['seconds']} s")
        # A fresh accounting database each start (start_mariadb) needs fresh state: state a
        # killed box left names the old cluster id, and slurmctld refuses it (CLUSTER ID MISMATCH).
        for d in (JOB_DIR, f"{STATE_DIR}/slurmctld", f"{STATE_DIR}/slurmd"):
            shutil.rmtree(box.inside(d), ignore_errors=True)
        for d in (
            f"{STATE_DIR}/slurmctld",
            *(f"{STATE_DIR}/slurmd/{n}" for n in NODES),
            JOB_DIR,
            LOG_DIR,
            RUN_DIR,
        ):
            box.inside(d).mkdir(parents=True, exist_ok=True)
        box.inside(JOB_DIR).chmod(0o1777)
        etc = box.inside(ETC_DIR)
        etc.mkdir(parents=True, exist_ok=True)
        _write(etc / "slurm.conf", box.render_slurm_conf())
        shutil.copyfile(CONF_DIR / "gres.conf", etc / "gres.conf")
        _write(etc / "slurmdbd.conf", box.render_slurmdbd_conf(), 0o600)
        if box.version.cgroup_conf is not None:
            _write(etc / "cgroup.conf", box.version.cgroup_conf)
        else:
            (etc / "cgroup.conf").unlink(missing_ok=True)
        for daemon in DAEMONS.values():  # this run's logs only, for the failure tails
            for log in {daemon.log, f"{LOG_DIR}/{daemon.name}.out"}:
                box.inside(log).unlink(missing_ok=True)
        fake = box.inside(FAKE_GPU_DIR)
        fake.mkdir(parents=True, exist_ok=True)
        for i in range(FAKE_GPUS):
            dev = fake / f"nvidia{i}"
            if not dev.is_char_device():
                dev.unlink(missing_ok=True)
                os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null
        for user in USERS:
            if not self.cok(["/usr/bin/getent", "passwd", user]):
                self.crun(["/usr/sbin/useradd", "-m", "-s", "/bin/bash", user])

        def in_box(argv: list[str]) -> None:
            self.crun(argv)

        ids = functools.partial(_passwd_ids, self.root)  # the root's own users
        self.log(containers.prepare(Path(ETC_DIR), BUNDLE_DIR, USERS, root=self.root, ids=ids, run=in_box))
        if box.has_rest:
            if not self.cok(["/usr/bin/getent", "passwd", "slurmrestd"]):
                self.crun(["/usr/sbin/useradd", "-r", "-M", "-s", "/usr/sbin/nologin", "slurmrestd"])
            key = box.inside(JWT_KEY)
            if not key.exists():  # kept across starts: tokens minted before a restart stay good
                _write(key, os.urandom(32).hex(), 0o600)
            config = box.inside(CONFIG)  # kept across starts, unless an older box wrote it
            if config.exists() and _older_config(config.read_text()):
                config.replace(config.with_name("gpucredit.toml.before"))
                self.log(f"moved aside {CONFIG} (written by an older box); a new one follows")
        self.install_hooks()

    def install_hooks(self) -> None:
        mode = self.box.resolved_hooks()
        self.crun(self.box.hooks_argv(mode), env=ENV)
        self.log(f"hooks: {mode}")

    def start_munge(self) -> None:
        uid, gid = _passwd_ids(self.root, "munge")
        run_munge = self.box.inside("/run/munge")
        run_munge.mkdir(mode=0o755, exist_ok=True)
        os.chown(run_munge, uid, gid)
        self.spawn("munged")
        _wait_until(
            lambda: self.cok(["/bin/sh", "-c", _MUNGE_CHECK]),
            10,
            "munged did not answer",
            [*self.logs("munged"), self.box.inside("/var/log/munge/munged.log")],
            self.died("munged"),
        )

    def start_mariadb(self) -> None:
        """The host's MariaDB (as the host box uses it); this box's own database and grants.

        24.11's and 26.05's slurmdbd (MariaDB Connector/C 3.4) fail their first connection
        ("mysql_real_connect failed: 2026 TLS/SSL error: SSL is required, but the server
        does not support it") and succeed when they retry 5 s later: 5 s of every start.
        Neither the server's socket nor a [client] option file in the root changed that."""
        if not _ok(["/usr/bin/mysqladmin", "ping"]):
            raise BoxError(
                "MariaDB does not answer at 127.0.0.1:3306: the chroot boxes use the host's; "
                "start it (make slurm-up starts it for the host box) or "
                "apt-get install -y --no-install-recommends mariadb-server"
            )
        self.external.append("mariadbd")
        db = self.box.version.db_name
        grants = " ".join(
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'{host}' IDENTIFIED BY '{DB_PASSWORD}';"
            f" GRANT ALL ON {db}.* TO '{DB_USER}'@'{host}';"
            for host in ("localhost", "127.0.0.1")
        )
        run(["/usr/bin/mysql", "-e", f"DROP DATABASE IF EXISTS {db}; {grants}"])

    def start_slurm(self) -> None:
        self.spawn("slurmdbd")
        _wait_until(
            lambda: self.cok(["/usr/bin/sacctmgr", "-n", "show", "cluster"]),
            30,
            "slurmdbd did not answer",
            self.logs("slurmdbd"),
            self.died("slurmdbd"),
        )
        self.add_associations()
        self.add_partition_qos()
        self.log("associations added")
        self.spawn("slurmctld")
        for node in NODES:
            self.spawn(f"slurmd-{node}")
        self.wait_ready()
        if self.box.has_rest:
            self.start_slurmrestd()

    def start_slurmrestd(self) -> None:
        port = self.box.version.ports["slurmrestd"]
        self.spawn("slurmrestd", f"127.0.0.1:{port}")
        _wait_until(
            lambda: _listening(port),
            self.box.timeout_s,
            f"slurmrestd did not listen on 127.0.0.1:{port}",
            self.logs("slurmrestd"),
            self.died("slurmrestd"),
        )

    def add_associations(self) -> None:
        lines = ["Cluster - 'lab'"]
        for parent in ["root", *ACCOUNTS]:
            children = [a for a, p in ACCOUNTS.items() if p == parent]
            users = [u for u, accounts in USERS.items() if parent in accounts]
            if not children and not users:
                continue
            lines.append(f"Parent - '{parent}'")
            lines += [f"Account - '{a}':Description='{a}':Organization='lab'" for a in children]
            lines += [f"User - '{u}':DefaultAccount='{USERS[u][0]}'" for u in users]
        _write(self.box.inside(f"{RUN_DIR}/associations.cfg"), "\n".join(lines) + "\n")
        self.crun(["/usr/bin/sacctmgr", "-i", "load", f"file={RUN_DIR}/associations.cfg"])

    def add_partition_qos(self) -> None:
        names = {
            word.removeprefix("QOS=")
            for line in self.box.render_slurm_conf().splitlines()
            if line.startswith("PartitionName=")
            for word in line.split()
            if word.startswith("QOS=")
        }
        if names:
            self.crun(["/usr/bin/sacctmgr", "-i", "add", "qos", ",".join(sorted(names))])

    def nodes_ready(self) -> bool:
        out = self.crun(["/usr/bin/sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        ok = {"idle", "mixed", "allocated", "completing"}
        return set(states) == set(NODES) and all(s in ok for s in states.values())

    def wait_ready(self) -> None:
        names = ["slurmdbd", "slurmctld", *(f"slurmd-{n}" for n in NODES)]
        _wait_until(
            lambda: "is UP" in self.crun(["/usr/bin/scontrol", "ping"], check=False).stdout,
            self.box.timeout_s,
            "slurmctld did not come up",
            self.logs("slurmctld"),
            self.died(*names),
        )
        _wait_until(
            self.nodes_ready,
            self.box.timeout_s,
            "nodes did not become idle",
            self.logs(*(f"slurmd-{n}" for n in NODES), "slurmctld"),
            self.died(*names),
        )

    def start_gpucredit(self) -> None:
        """gpucredit's side, as `make slurm-up` sets it up on the host (slurmbox.gpucredit_site):
        config, ledger, accounts, prices, hooks again with the config's settings, two daemons.
        The daemons outlive the command; as this process is a subreaper, it adopts them."""
        box = self.box
        kwargs = {"portal": box.has_rest, "portal_port": box.portal_port, "slurmrestd": box.rest_url}
        site = _GPUCREDIT_SITE.replace("{kwargs}", repr(kwargs))
        proc = self.crun([f"{VENV_BIN}/python", "-c", site], env=ENV, timeout=120, check=False)
        if proc.returncode != 0:
            raise BoxError(
                f"gpucredit did not start in the box: {proc.stderr.strip() or proc.stdout.strip()}"
            )
        self.said = proc.stdout.splitlines()

    def start(self) -> None:
        began = time.monotonic()
        self.box.run_dir.mkdir(parents=True, exist_ok=True)
        _write(self.box.run_dir / "supervisor.pid", f"{os.getpid()}\n")
        self.prepare()
        self.start_munge()
        self.start_mariadb()
        self.start_slurm()
        self.log(f"Slurm ready in {time.monotonic() - began:.1f} s")
        if self.box.resolved_hooks() == "gpucredit":
            self.start_gpucredit()
        _write(self.box.run_dir / "ready", "")
        self.log(f"ready in {time.monotonic() - began:.1f} s")

    # ---- run and stop ----

    def reap(self) -> None:
        while True:
            try:
                got, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if got == 0:
                return
            for name, known in list(self.pids.items()):
                if known == got:
                    self.procs[name].returncode = os.waitstatus_to_exitcode(status)
                    if not self.stopping:
                        self.log(f"{name} (pid {got}) exited: {self.procs[name].returncode}")
                        (self.box.run_dir / "ready").unlink(missing_ok=True)

    def serve(self) -> None:
        while True:
            self.reap()
            time.sleep(0.2)

    def stopped(self, what: str, pids: Sequence[int], grace_s: float = 10) -> None:
        if not pids:
            return
        began = time.monotonic()
        killed = _kill_all(pids, grace_s)
        hard = f"; SIGKILL after {grace_s:.0f} s: {' '.join(map(str, killed))}" if killed else ""
        self.log(f"stopped {what} in {time.monotonic() - began:.1f} s{hard}")

    def stop(self) -> None:
        self.stopping = True
        (self.box.run_dir / "ready").unlink(missing_ok=True)
        in_root = _processes_in(self.root)
        # gpucredit's daemons first (they answer the hooks), then Slurm's in reverse
        # start order, then whatever else runs in the root (job steps), munged last.
        gpucredit = [p for p in in_root if any("gpucredit" in part for part in _cmdline(p)[:2])]
        self.stopped("gpucredit daemons", gpucredit)
        for name in reversed([n for n in self.pids if n.startswith("slurm")]):
            pid = self.pids[name]
            if _alive(pid) and _cmdline(pid)[:1] == [DAEMONS[name].argv[0]]:
                self.stopped(name, [pid], grace_s=15)
            self.reap()
        munged = self.pids.get("munged")
        self.stopped("the rest", [p for p in _processes_in(self.root) if p != munged])
        self.reap()
        # A container's processes have its bundle as their root, not the box's; left
        # without their runc they are this subreaper's children (busybox as pid 1 of its
        # namespace ignores SIGTERM: SIGKILL after the grace).
        self.stopped("orphans", [p for p in _children(os.getpid()) if p != munged and _alive(p)], grace_s=2)
        self.reap()
        _drop_database(self.box.version)
        if munged:
            _kill_all([munged])
        self.reap()
        for d in (f"{STATE_DIR}/slurmctld", f"{STATE_DIR}/slurmd"):
            shutil.rmtree(self.box.inside(d), ignore_errors=True)
        for name in ("supervisor.pid", "daemons.json", "ready"):
            (self.box.run_dir / name).unlink(missing_ok=True)
        self.log("stopped")


def supervise(version_name: str, ready_fd: int) -> int:
    """The supervisor process's main (`python -m slurmbox _supervise-chroot VERSION FD`)."""
    from slurmbox.versions import get

    spec = json.loads(os.environ["GPUCREDIT_BOX_SPEC"])
    spec["version"] = get(version_name)
    box = ChrootBox(**spec)
    sup = _Supervisor(box)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sup.log(f"cannot become a child subreaper (errno {ctypes.get_errno()})")
    signal.signal(signal.SIGTERM, sup._on_stop)
    signal.signal(signal.SIGINT, sup._on_stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    report = None
    try:
        sup.start()
        os.write(ready_fd, ("\n".join(["ready", *sup.said]) + "\n").encode())
        os.close(ready_fd)
        ready_fd = -1
        sup.serve()
    except _Stop:
        report = f"Slurm {version_name} box start interrupted"
    except (BoxError, rootfs.RootfsError) as e:
        report = f"Slurm {version_name} box failed to start: {e}"
    except Exception as e:  # report any start-up bug to the waiting caller, then re-raise
        report = (
            f"Slurm {version_name} box failed to start: {e!r} (traceback in {box.run_dir}/supervisor.log)"
        )
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if report and ready_fd >= 0:
            sup.log(report)
        sup.stop()
        if ready_fd >= 0:
            os.write(ready_fd, (report or f"Slurm {version_name} box stopped").encode())
            os.close(ready_fd)
    return 0 if ready_fd < 0 or report is None else 1
