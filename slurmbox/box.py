"""A Slurm 22.05 cluster in a box: how an admin tries gpucredit, and its end-to-end test bed.

One host runs munged, (MariaDB,) slurmdbd, slurmctld and three slurmd (`node1`,
`node2`: partition onprem; `node3`: partition cloud; each with fake GPUs a100×2 and
h100×2) -- the recipe measured in
docs/slurm-facts.md §1-§3. Needs root and Debian 12's Slurm packages
(installed on first use).

    python -m slurmbox up | down | status      (make slurm-up / slurm-down / slurm-status)

Process model. The container's PID 1 does not reap orphans, and forking
daemons hide start-up failures (docs/slurm-facts.md §9), so every daemon runs in
the foreground as a child of one *supervisor* process (`python -m slurmbox
_supervise`). It is a child subreaper too: slurmstepd processes that slurmd
orphans are reaped there instead of piling up as zombies. The supervisor starts
the box, reports "ready" (or the error, with the log tail) through a pipe, then
waits; SIGTERM makes it stop the daemons in reverse order, drop the accounting
database and wipe Slurm's state, so job ids restart at 1 next time. SIGUSR1
makes it restart daemons that died (see `kill_daemon` / `start_daemons`).
`make slurm-up` detaches the supervisor (it outlives the command, its pid is
in RUN_DIR); the pytest fixture keeps it as its own child.

The gpucredit wiring in slurm.conf is `slurm_conf_lines()`, the hooks and
job_submit.lua are written by `install()`: the same code as
`gpucredit slurm config` / `gpucredit slurm install`. gpucredit's own side
(config, database, daemon) is `slurmbox.gpucredit_site`.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import pwd
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurm_hooks.admin import slurmconf
from slurmbox import box_cloud, containers

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = REPO / "conf" / "slurm"
PASSTHROUGH_LUA = CONF_DIR / "job_submit.passthrough.lua"

PACKAGES = (
    "slurm-wlm",
    "slurmdbd",
    "slurm-wlm-mysql-plugin",
    "munge",
    "mariadb-server",
    "lua-socket",
    "runc",  # containers: slurmbox/containers.py
    "busybox-static",
)
ETC_DIR = "/etc/slurm"
RUN_DIR = Path("/run/gpucredit-box")  # supervisor pid, daemons.json, ready flag, lock
STATE_DIR = Path("/var/lib/gpucredit-box")  # Slurm state (wiped by down), fake GPUs
LOG_DIR = Path("/var/log/gpucredit-box")
JOB_DIR = Path("/tmp/gpucredit-box-jobs")  # sbatch's cwd: job output lands here
FAKE_GPU_DIR = STATE_DIR / "fakegpu"  # must match conf/slurm/gres.conf
BUNDLE_DIR = STATE_DIR / "bundles"  # each user's OCI bundle (slurmbox/containers.py)
FAKE_GPUS = 16  # nvidia[12-15]: cloud1's (slurmbox/box_cloud.py)
# node3 alone is partition cloud (docs/routing.md): on-prem GPUs can be busy while cloud's are free.
NODES = ("node1", "node2", "node3")
# One CPU per GPU, so each GPU can run a one-GPU job at once (slurm.conf has config_overrides).
CPUS_PER_NODE = 4
GRES_TYPES = ("a100", "h100")
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
DB_PASSWORD = "slurmpw"  # a local test database; not a secret
# account -> parent; then user -> accounts (the first is the default account)
ACCOUNTS = {"research": "root", "physics": "research", "chemistry": "research"}
USERS = {
    "alice": ("physics",),
    "bob": ("physics", "chemistry"),
    "root": ("research", "physics", "chemistry"),
}
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)
SACCT_FIELDS = (
    "JobID",
    "JobIDRaw",
    "User",
    "Account",
    "Partition",
    "State",
    "ExitCode",
    "Submit",
    "Start",
    "End",
    "ElapsedRaw",
    "AllocTRES",
    "ReqTRES",
    "NodeList",
    "JobName",
    "Comment",
    "AdminComment",
)
_SACCT_DELIMITER = "\x1f"  # the tests' jobs never put it in a name or comment
# The provider's credentials (moto's dummies) as a site gives them to slurmctld: its
# power-saving programs inherit them.
_DAEMON_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", **box_cloud.CREDENTIALS}
_COMMAND_TIMEOUT_S = 30
_PR_SET_CHILD_SUBREAPER = 36
_MUNGE_CHECK = "/usr/bin/munge -n </dev/null | /usr/bin/unmunge"


class BoxError(RuntimeError):
    """The box could not start or stop; the message carries the log tail."""


@dataclass(frozen=True)
class Daemon:
    name: str
    argv: tuple[str, ...]
    log: Path  # the daemon's own log file (shown on failure)
    user: str | None = None
    cwd: str = "/"


def _daemons() -> dict[str, Daemon]:
    """Every daemon the box may start, in start order."""
    daemons = [
        Daemon("munged", ("/usr/sbin/munged", "-F", "--force"), LOG_DIR / "munged.out", "munge"),
        Daemon("mariadbd", ("/usr/sbin/mariadbd", "--user=mysql"), LOG_DIR / "mariadbd.out"),
        Daemon("slurmdbd", ("/usr/sbin/slurmdbd", "-D"), LOG_DIR / "slurmdbd.log"),
        Daemon("slurmctld", ("/usr/sbin/slurmctld", "-D"), LOG_DIR / "slurmctld.log"),
    ]
    daemons += [
        Daemon(f"slurmd-{n}", ("/usr/sbin/slurmd", "-D", "-N", n), LOG_DIR / f"slurmd.{n}.log") for n in NODES
    ]
    # The box's cloud (SlurmBox.cloud): the provider, and the instances' "boot".
    daemons += [
        Daemon("moto", box_cloud.moto_argv(), LOG_DIR / "moto.out"),
        Daemon(
            "cloud-boot",
            (sys.executable, "-m", "slurmbox", "_cloud_boot"),
            LOG_DIR / "cloud-boot.out",
            cwd=str(REPO),
        ),
    ]
    return {d.name: d for d in daemons}


DAEMONS = _daemons()


# --------------------------------------------------------------------------- helpers


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float = _COMMAND_TIMEOUT_S,
    input: str | None = None,
    cwd: str | Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command (argv list, no shell); on failure raise with its stderr."""
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            cwd=cwd,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise BoxError(f"{' '.join(argv)}: timed out after {timeout} s") from e
    if check and proc.returncode != 0:
        raise BoxError(
            f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc


def _ok(argv: Sequence[str], timeout: float = 5) -> bool:
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as e:
        return f"  ({path}: {e})"
    return "\n".join(f"  {line}" for line in text) or f"  ({path} is empty)"


def _proc_state(pid: int) -> str | None:
    """'R', 'S', 'Z', ... from /proc, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[0]


def _alive(pid: int) -> bool:
    # kill -0 succeeds on zombies, which this container never reaps.
    state = _proc_state(pid)
    return state is not None and state != "Z"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0").split("\0")
    except OSError:
        return []


def _wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    logs: Iterable[Path] = (),
    alive: Callable[[], str | None] = lambda: None,
) -> None:
    """Poll `predicate` until true; raise with the logs' tails on timeout or death."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        died = alive()
        if died or time.monotonic() > deadline:
            reason = died or f"not after {timeout:.0f} s"
            tails = "\n".join(f"--- {log}\n{_tail(log)}" for log in logs)
            raise BoxError(f"{what}: {reason}\n{tails}")
        time.sleep(0.05)


def _render(template: Path, values: dict[str, str]) -> str:
    text = template.read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    if "@" in "".join(line.split("#")[0] for line in text.splitlines()):
        raise BoxError(f"{template}: placeholder left after rendering")
    return text


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


def missing_packages() -> list[str]:
    missing = []
    for package in PACKAGES:
        proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
        if proc.returncode != 0 or "install ok installed" not in proc.stdout:
            missing.append(package)
    return missing


def install_hint() -> str:
    return "run as root on Debian 12 (bookworm): apt-get install -y --no-install-recommends " + " ".join(
        PACKAGES
    )


# --------------------------------------------------------------------------- the box


_DETACHED: list[subprocess.Popen[bytes]] = []  # supervisors started with detach=True


class BoxCommands:
    """Jobs and Slurm commands against a running box, on whichever Slurm version it runs:
    every call goes through the box's own `run` (SlurmBox: the host's clients; ChrootBox:
    the version's clients inside its root), so the end-to-end tests run on any box."""

    hook_dir: str = slurmconf.DEFAULT_HOOK_DIR

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        timeout: float = 60,
        input: str | None = None,
        cwd: str = str(JOB_DIR),
        env: dict[str, str] | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def inside(self, path: str) -> Path:
        raise NotImplementedError

    def use_hooks(self, mode: str | None = None) -> str:
        raise NotImplementedError

    def sbatch(self, args: Sequence[str], user: str = "alice", timeout: float = 30) -> tuple[int, str, str]:
        """Run sbatch as `user` (runuser); returns (rc, stdout, stderr)."""
        proc = self.run(["sbatch", *args], user=user, timeout=timeout)
        return proc.returncode, proc.stdout, proc.stderr

    def run_as(self, user: str, argv: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a command as `user` (runuser) in JOB_DIR; never raises on its exit code."""
        return self.run(argv, user=user, timeout=timeout)

    def submit(self, args: Sequence[str], user: str = "alice") -> int:
        """sbatch --parsable; returns the job id, raises when sbatch refuses."""
        rc, out, err = self.sbatch(["--parsable", *args], user=user)
        if rc != 0:
            raise BoxError(f"sbatch {' '.join(args)} as {user}: exit {rc}: {err.strip()}")
        return int(out.strip().split(";")[0])

    def job_state(self, job_id: int | str, *, accounting: bool = False) -> str | None:
        """First word of the job's state: squeue's (live), or sacct's latest run."""
        if accounting:
            rows = self.sacct_rows(job_id, all_runs=False)
            # A job that ends within a second of starting can briefly show a
            # half-written record (JobName "allocation", no Partition/ReqTRES).
            if not rows or not rows[0]["Partition"] or not rows[0]["ReqTRES"]:
                return None
            return rows[0]["State"].split()[0]
        proc = self.run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T"])
        return proc.stdout.strip().split()[0] if proc.returncode == 0 and proc.stdout.strip() else None

    def wait_state(self, job_id: int | str, states: str | Iterable[str], timeout: float = 60) -> str:
        """Wait until the job is in one of `states`; returns the state reached.

        Only terminal states (COMPLETED, FAILED, ...): waits for sacct, so the
        accounting record the bridge reads is there. Otherwise polls squeue.
        """
        wanted = {states} if isinstance(states, str) else set(states)
        accounting = wanted <= TERMINAL_STATES
        state: str | None = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job_id, accounting=accounting)
            if state in wanted:
                return state
            time.sleep(0.1)
        job = self.run(["scontrol", "show", "job", str(job_id)]).stdout
        raise TimeoutError(f"job {job_id} not in {sorted(wanted)} after {timeout} s (last: {state})\n{job}")

    def sacct_rows(self, job_id: int | str, *, all_runs: bool = True) -> list[dict[str, str]]:
        """sacct allocation lines of the job (one per run with all_runs, -D)."""
        argv = [
            "sacct",
            "-j",
            str(job_id),
            "-X",
            "--noheader",
            "--parsable2",
            f"--delimiter={_SACCT_DELIMITER}",
            "-o",
            ",".join(SACCT_FIELDS),
        ]
        if all_runs:
            argv.append("-D")
        rows = []
        record = None
        # A job name or comment may hold line breaks of any kind: a record ends only once
        # it has all its delimiters (split on "\n" alone, never on what splitlines knows).
        for piece in self.run(argv, check=True).stdout.split("\n"):
            record = piece if record is None else record + "\n" + piece
            if record.count(_SACCT_DELIMITER) >= len(SACCT_FIELDS) - 1:
                rows.append(dict(zip(SACCT_FIELDS, record.split(_SACCT_DELIMITER), strict=True)))
                record = None
        return rows

    def scontrol_job(self, job_id: int | str) -> dict[str, str]:
        """`scontrol show job -o` as a dict (values with spaces kept whole)."""
        text = self.run(["scontrol", "show", "job", "-o", str(job_id)], check=True).stdout.strip()
        return parse_scontrol(text)

    def scontrol(self, *args: str) -> str:
        return self.run(["scontrol", *args], check=True).stdout

    @contextlib.contextmanager
    def custom_hook(self, hook: str, script: str) -> Iterator[Path]:
        """Replace one hook shim by `script` (for experiments); restore on exit. Returns
        the shim as this process sees it."""
        path = self.inside(self.hook_dir) / slurmconf.shim_name(hook)
        _write(path, script, 0o755)
        try:
            yield path
        finally:
            self.use_hooks()


def _run_env(
    argv: Sequence[str],
    *,
    timeout: float,
    input: str | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            cwd=cwd,
            env=env,
            preexec_fn=preexec_fn,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise BoxError(f"{' '.join(argv)}: timed out after {timeout} s") from e


def _checked(proc: subprocess.CompletedProcess[str], argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    if proc.returncode != 0:
        raise BoxError(
            f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc


@dataclass
class SlurmBox(BoxCommands):
    """Handle on the cluster in a box; cheap to create (no I/O here).

    hooks: "gpucredit" (shims run `gpucredit hook ...` as `gpucredit slurm install`
    writes them, by the interpreter beside `gpucredit_exe`; the real
    job_submit.lua when present), "passthrough" (shims run /bin/true, the
    pass-through job_submit.lua), or "auto" (gpucredit when `gpucredit_exe`
    and slurm_hooks/hooks.py exist). Switch at any time with `use_hooks()`: slurmctld re-reads the
    shims at each job and reloads job_submit.lua when it changes.
    """

    hooks: str = field(default_factory=lambda: os.environ.get("GPUCREDIT_BOX_HOOKS", "auto"))
    gpucredit_exe: str = str(Path(sys.executable).with_name("gpucredit"))  # the venv's, in a clone
    config_path: str = field(
        default_factory=lambda: os.environ.get("GPUCREDIT_CONFIG", "/etc/gpucredit/gpucredit.toml")
    )
    hook_dir: str = slurmconf.DEFAULT_HOOK_DIR
    timeout_s: float = 60.0
    cloud: bool = field(default_factory=lambda: os.environ.get("GPUCREDIT_BOX_CLOUD") == "1")

    def __post_init__(self) -> None:
        self._supervisor: subprocess.Popen[bytes] | None = None

    # ---- configuration -------------------------------------------------------

    def gpucredit_lines(self) -> str:
        return slurmconf.slurm_conf_lines(self.hook_dir, list(GRES_TYPES), ETC_DIR)

    def render_slurm_conf(self) -> str:
        return _render(
            CONF_DIR / "slurm.conf.in",
            {
                "gpucredit_lines": self.gpucredit_lines().rstrip("\n"),
                "state_dir": str(STATE_DIR),
                "run_dir": str(RUN_DIR),
                "log_dir": str(LOG_DIR),
                "cpus": str(CPUS_PER_NODE),
                "cloud_lines": (
                    box_cloud.slurm_conf_lines(self.hook_dir, CPUS_PER_NODE).rstrip("\n")
                    if self.cloud
                    else ""
                ),
            },
        )

    def render_slurmdbd_conf(self) -> str:
        return _render(
            CONF_DIR / "slurmdbd.conf.in",
            {"log_dir": str(LOG_DIR), "run_dir": str(RUN_DIR), "db_password": DB_PASSWORD},
        )

    def resolved_hooks(self) -> str:
        mode = self.hooks
        if mode == "auto":
            # `gpucredit hook` dispatches to slurm_hooks.hooks: both must exist.
            ready = os.access(self.gpucredit_exe, os.X_OK) and (REPO / "slurm_hooks" / "hooks.py").is_file()
            mode = "gpucredit" if ready else "passthrough"
        if mode not in ("gpucredit", "passthrough"):
            raise BoxError(f"hooks must be gpucredit, passthrough or auto, not {mode!r}")
        return mode

    def use_hooks(self, mode: str | None = None) -> str:
        """Install the hook shims and job_submit.lua for `mode`; returns the mode used."""
        if mode is not None:
            self.hooks = mode
        resolved = self.resolved_hooks()
        if resolved == "gpucredit":
            # As `gpucredit slurm install` writes them: the venv's interpreter without site.
            command = slurmconf.launcher_command(str(Path(self.gpucredit_exe).with_name("python")))
            lua = slurmconf.PACKAGED_JOB_SUBMIT_LUA
            if not lua.is_file():  # never bill through a pass-through script by accident
                raise BoxError(f"gpucredit's job_submit.lua is not at {lua}")
        else:
            command, lua = ["/bin/true"], PASSTHROUGH_LUA
        # The box owns this host's /etc/slurm: it replaces its own experiments (custom_hook,
        # the bench's wrapper) without the copies an admin's install keeps.
        slurmconf.install(
            ETC_DIR,
            self.hook_dir,
            command,
            self.config_path,
            job_submit_lua=str(lua),
            force=True,
            backup=False,
        )
        if self.cloud:
            box_cloud.write_shims(self.hook_dir, str(Path(self.gpucredit_exe).with_name("python")))
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        _write(RUN_DIR / "hooks", f"{resolved} {' '.join(command)} {lua}\n")
        return resolved

    # ---- lifecycle -----------------------------------------------------------

    def cannot_start_reason(self) -> str | None:
        """Why up() cannot work on this machine, or None."""
        if sys.platform != "linux":
            return "the Slurm box needs Linux"
        if os.geteuid() != 0:
            return f"the Slurm box needs root; {install_hint()}, then make slurm-up"
        if missing_packages() and shutil.which("apt-get") is None:
            return f"Slurm packages missing and no apt-get: {install_hint()}"
        return None

    def ensure_packages(self) -> None:
        missing = missing_packages()
        if not missing:
            return
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        argv = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
        if subprocess.run(argv, env=env).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, check=False)
            if subprocess.run(argv, env=env).returncode != 0:
                raise BoxError(f"could not install {' '.join(missing)}; {install_hint()}")

    def status(self) -> dict[str, object]:
        info = _read_json(RUN_DIR / "daemons.json")
        daemons = info.get("daemons", {}) if isinstance(info, dict) else {}
        supervisor = _read_pid(RUN_DIR / "supervisor.pid")
        hooks = (RUN_DIR / "hooks").read_text().split() if (RUN_DIR / "hooks").exists() else []
        return {
            "up": self.is_up(),
            "supervisor": supervisor if supervisor and _alive(supervisor) else None,
            "daemons": {name: (pid if _alive(pid) else None) for name, pid in daemons.items()},
            "external": info.get("external", []) if isinstance(info, dict) else [],
            "hooks": hooks[0] if hooks else None,
        }

    def is_up(self) -> bool:
        """True when the supervisor runs and reports every daemon healthy."""
        supervisor = _read_pid(RUN_DIR / "supervisor.pid")
        return bool(supervisor and _alive(supervisor) and (RUN_DIR / "ready").exists())

    def up(self, *, detach: bool = False) -> float:
        """Start the box (or reuse a running one); returns the seconds it took.

        detach=True: the daemons outlive this process (make slurm-up).
        """
        started = time.monotonic()
        problem = self.cannot_start_reason()
        if problem:
            raise BoxError(problem)
        with _lock():
            if self.is_up():
                self.use_hooks()
                return time.monotonic() - started
            self._stop_locked()  # leftovers of a box that died
            self.ensure_packages()
            for d in (RUN_DIR, LOG_DIR, STATE_DIR):
                d.mkdir(parents=True, exist_ok=True)
            read_fd, write_fd = os.pipe()
            out = open(LOG_DIR / "supervisor.log", "ab")  # noqa: SIM115 (handed to the child)
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "slurmbox", "_supervise", str(write_fd)],
                    cwd=REPO,
                    env={**os.environ, "GPUCREDIT_BOX_SPEC": json.dumps(asdict(self))},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    pass_fds=(write_fd,),
                    start_new_session=detach,
                )
            finally:
                out.close()
                os.close(write_fd)
            if detach:
                # It outlives this process; dropped, its Popen would warn "still running"
                # (an error under pytest, when a test rebuilds a `make slurm-up` box).
                _DETACHED.append(proc)
            else:
                self._supervisor = proc
            message = _read_pipe(read_fd, self.timeout_s + 30)
            if message.strip() != "ready":
                if proc.poll() is None:
                    proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=60)
                self._supervisor = None
                raise BoxError(
                    message.strip()
                    or f"box supervisor exited ({proc.poll()}); see {LOG_DIR}/supervisor.log:\n"
                    + _tail(LOG_DIR / "supervisor.log")
                )
        return time.monotonic() - started

    def down(self) -> float:
        """Stop the box, drop its accounting database, wipe Slurm's state."""
        started = time.monotonic()
        with _lock():
            self._stop_locked()
        return time.monotonic() - started

    def _stop_locked(self) -> None:
        supervisor = _read_pid(RUN_DIR / "supervisor.pid")
        if supervisor and _alive(supervisor):
            os.kill(supervisor, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while _alive(supervisor) and time.monotonic() < deadline:
                if self._supervisor is not None and self._supervisor.pid == supervisor:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._supervisor.wait(timeout=0.1)
                else:
                    time.sleep(0.05)
            if _alive(supervisor):
                os.kill(supervisor, signal.SIGKILL)
        if self._supervisor is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._supervisor.wait(timeout=10)
            self._supervisor = None
        # Whatever a dead supervisor left behind (normally nothing).
        info = _read_json(RUN_DIR / "daemons.json")
        if isinstance(info, dict) and any(_alive(p) for p in info.get("daemons", {}).values()):
            _stop_daemons(info["daemons"])
            _drop_database()
        _wipe_state()

    # ---- daemons (for fault tests) ---------------------------------------------

    def daemon_pid(self, name: str) -> int | None:
        info = _read_json(RUN_DIR / "daemons.json")
        pid = info.get("daemons", {}).get(name) if isinstance(info, dict) else None
        return pid if pid and _alive(pid) else None

    def kill_daemon(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill one daemon (e.g. "slurmd-node1"); it stays down until start_daemons()."""
        pid = self.daemon_pid(name)
        if pid is None:
            raise BoxError(f"{name} is not running")
        os.kill(pid, sig)
        # Until the supervisor has noticed, so that is_up() is False on return.
        _wait_until(lambda: not (RUN_DIR / "ready").exists(), 30, f"{name} did not exit")

    def start_daemons(self) -> None:
        """Restart every daemon that died, and wait until the box is ready again."""
        supervisor = _read_pid(RUN_DIR / "supervisor.pid")
        if not supervisor or not _alive(supervisor):
            raise BoxError("the box is not running (python -m slurmbox up)")
        (RUN_DIR / "ready").unlink(missing_ok=True)
        os.kill(supervisor, signal.SIGUSR1)
        _wait_until(self.is_up, self.timeout_s, "box did not recover", [LOG_DIR / "box.log"])

    # ---- commands ------------------------------------------------------------

    def inside(self, path: str) -> Path:
        """A path as the box's daemons and hooks see it, as this process sees it: the same
        path on the host's box (a chroot box's is under its root)."""
        return Path(path)

    def client_dir(self) -> str:
        """Where gpucredit on this host (its daemon and CLI, `slurm.bin_dir`) finds this
        box's Slurm client commands."""
        return "/usr/bin"

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        timeout: float = 60,
        input: str | None = None,
        cwd: str = str(JOB_DIR),
        env: dict[str, str] | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command against the box: a bare name is Slurm's client of this box (here
        /usr/bin's); as `user` (runuser) when given. Never raises on its exit code unless
        `check`."""
        full = list(argv)
        if full and "/" not in full[0]:
            full[0] = shutil.which(full[0], path=_DAEMON_ENV["PATH"]) or full[0]
        if user and user != "root":
            full = ["/usr/sbin/runuser", "-u", user, "--", *full]
        proc = _run_env(full, timeout=timeout, input=input, cwd=cwd, env={**os.environ, **(env or {})})
        return _checked(proc, argv) if check else proc


def parse_scontrol(line: str) -> dict[str, str]:
    """Parse one `scontrol show ... -o` line: Key=Value pairs split on spaces.

    A value may contain spaces (Reason, Comment): a token without '=' is glued
    to the value before it. The first occurrence of a key wins.
    """
    fields: dict[str, str] = {}
    key = None
    for token in line.split(" "):
        name, sep, value = token.partition("=")
        if sep and name and (name.replace("/", "").replace(":", "").replace("_", "").isalnum()):
            key = name
            if key not in fields:
                fields[key] = value
            else:
                key = None
        elif key is not None:
            fields[key] += " " + token
    return fields


# --------------------------------------------------------------------------- run files


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """Serialize up/down between processes (two test sessions, make + pytest)."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    with open(RUN_DIR / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _read_pipe(fd: int, timeout: float) -> str:
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                data = os.read(fd, 65536)
                if not data:
                    break
                chunks.append(data)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _stop_daemons(pids: dict[str, int], reap: Callable[[int, float], None] | None = None) -> None:
    """SIGTERM in reverse start order; SIGKILL what is still alive after 15 s."""
    for name in reversed(list(pids)):
        pid = pids[name]
        if not _alive(pid) or _cmdline(pid)[:1] != [DAEMONS[name].argv[0]]:
            continue  # gone, or the pid was reused
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _alive(pid) and time.monotonic() < deadline:
            if reap:
                reap(pid, 0.05)
            else:
                time.sleep(0.05)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            if reap:
                reap(pid, 1.0)


def _drop_database() -> None:
    if _ok(["/usr/bin/mysqladmin", "ping"]):
        run(["/usr/bin/mysql", "-e", f"DROP DATABASE IF EXISTS {DB_NAME}"], check=False)


def _wipe_state() -> None:
    # Without this, job ids continue from slurmctld's saved state.
    for d in (STATE_DIR / "slurmctld", STATE_DIR / "slurmd"):
        shutil.rmtree(d, ignore_errors=True)
    for name in ("supervisor.pid", "daemons.json", "ready"):
        (RUN_DIR / name).unlink(missing_ok=True)


# --------------------------------------------------------------------------- supervisor


class _Stop(Exception):
    """SIGTERM/SIGINT arrived: stop the box."""


class _Supervisor:
    """Parent of every daemon of the box; see the module docstring."""

    def __init__(self, box: SlurmBox) -> None:
        self.box = box
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.pids: dict[str, int] = {}
        self.external: list[str] = []
        self.stopping = False
        self.heal = False

    def log(self, message: str) -> None:
        now = time.time()
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
        print(f"{stamp} box: {message}", file=sys.stderr, flush=True)

    # ---- signals and bookkeeping ----

    def _on_stop(self, signum: int, frame: object) -> None:
        if not self.stopping:
            self.stopping = True
            raise _Stop

    def _on_heal(self, signum: int, frame: object) -> None:
        self.heal = True

    def save(self) -> None:
        _write(
            RUN_DIR / "daemons.json",
            json.dumps({"daemons": self.pids, "external": self.external}, indent=1) + "\n",
        )

    def spawn(self, name: str) -> subprocess.Popen[bytes]:
        daemon = DAEMONS[name]
        out = open(LOG_DIR / f"{name}.out", "ab")  # noqa: SIM115 (handed to the child)
        try:
            kwargs: dict[str, object] = {}
            if daemon.user:
                # Not `runuser -u munge -- munged`: stopping runuser orphans munged.
                kwargs = {"user": daemon.user, "group": daemon.user, "extra_groups": []}
            proc = subprocess.Popen(
                daemon.argv,
                env=_DAEMON_ENV,
                cwd=daemon.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                **kwargs,  # type: ignore[call-overload]
            )
        finally:
            out.close()
        self.procs[name] = proc
        self.pids[name] = proc.pid
        self.save()
        self.log(f"started {name} (pid {proc.pid})")
        return proc

    def died(self, *names: str) -> Callable[[], str | None]:
        def check() -> str | None:
            for name in names:
                proc = self.procs.get(name)
                if proc is not None and proc.poll() is not None:
                    return f"{name} exited with {proc.returncode}"
            return None

        return check

    def logs(self, *names: str) -> list[Path]:
        paths = []
        for name in names:
            paths += [DAEMONS[name].log, LOG_DIR / f"{name}.out"]
        return list(dict.fromkeys(paths))

    # ---- start ----

    def prepare(self) -> None:
        """Config files, hooks, fake GPUs, Unix users, directories."""
        box = self.box
        # Job ids restart at 1 with Slurm's state wiped: an old slurm-N.out of another user
        # in the sticky job directory would make job N fail to launch (JobLaunchFailure).
        shutil.rmtree(JOB_DIR, ignore_errors=True)
        # The accounting database is made anew at each start (start_mariadb); state a box
        # killed before its stop left would name the old cluster id: slurmctld refuses to
        # start ("fatal: CLUSTER ID MISMATCH").
        for d in (STATE_DIR / "slurmctld", STATE_DIR / "slurmd"):
            shutil.rmtree(d, ignore_errors=True)
        for d in (STATE_DIR / "slurmctld", *(STATE_DIR / "slurmd" / n for n in NODES), JOB_DIR):
            d.mkdir(parents=True, exist_ok=True)
        if box.cloud:  # a fresh provider (moto keeps nothing) and a fresh journal
            shutil.rmtree(STATE_DIR / "cloud", ignore_errors=True)
            for n in box_cloud.CLOUD_NODES:
                (STATE_DIR / "slurmd" / n).mkdir(parents=True, exist_ok=True)
            box_cloud.CONFIG.parent.mkdir(parents=True, exist_ok=True)
            _write(box_cloud.CONFIG, box_cloud.config_text(STATE_DIR / "cloud"))
        JOB_DIR.chmod(0o1777)
        Path(ETC_DIR).mkdir(parents=True, exist_ok=True)
        _write(Path(ETC_DIR) / "slurm.conf", box.render_slurm_conf())
        shutil.copyfile(CONF_DIR / "gres.conf", Path(ETC_DIR) / "gres.conf")
        _write(Path(ETC_DIR) / "slurmdbd.conf", box.render_slurmdbd_conf(), 0o600)
        for daemon in DAEMONS.values():  # this run's logs only, for the failure tails
            for log in {daemon.log, LOG_DIR / f"{daemon.name}.out"}:
                log.unlink(missing_ok=True)
        self.log(f"hooks: {box.use_hooks()}")
        FAKE_GPU_DIR.mkdir(parents=True, exist_ok=True)
        for i in range(FAKE_GPUS):
            dev = FAKE_GPU_DIR / f"nvidia{i}"
            if not dev.is_char_device():
                dev.unlink(missing_ok=True)
                os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null
        for user in USERS:
            try:
                pwd.getpwnam(user)
            except KeyError:
                # 9: made a moment ago by another (a test beside the box's, as root)
                made = run(["/usr/sbin/useradd", "-m", "-s", "/bin/bash", user], check=False)
                if made.returncode not in (0, 9):
                    raise BoxError(f"useradd {user}: {made.stderr.strip()}") from None
        self.log(containers.prepare(Path(ETC_DIR), BUNDLE_DIR, USERS))

    def start_munge(self) -> None:
        if _ok(["/bin/sh", "-c", _MUNGE_CHECK]):
            self.external.append("munged")
            return
        munge = pwd.getpwnam("munge")
        run_munge = Path("/run/munge")
        run_munge.mkdir(mode=0o755, exist_ok=True)
        os.chown(run_munge, munge.pw_uid, munge.pw_gid)
        key = Path("/etc/munge/munge.key")
        if not key.exists() or key.stat().st_size == 0:
            run(["/usr/sbin/mungekey", "-c", "-k", str(key)])
            os.chown(key, munge.pw_uid, munge.pw_gid)
            key.chmod(0o400)
        self.spawn("munged")
        _wait_until(
            lambda: _ok(["/bin/sh", "-c", _MUNGE_CHECK]),
            10,
            "munged did not answer",
            [*self.logs("munged"), Path("/var/log/munge/munged.log")],
            self.died("munged"),
        )

    def start_mariadb(self) -> None:
        if _ok(["/usr/bin/mysqladmin", "ping"]):
            self.external.append("mariadbd")
        else:
            mysql = pwd.getpwnam("mysql")
            Path("/run/mysqld").mkdir(mode=0o755, exist_ok=True)
            os.chown("/run/mysqld", mysql.pw_uid, 0)
            self.spawn("mariadbd")
            _wait_until(
                lambda: _ok(["/usr/bin/mysqladmin", "ping"]),
                30,
                "MariaDB did not answer",
                self.logs("mariadbd"),
                self.died("mariadbd"),
            )
        grants = " ".join(
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'{host}' IDENTIFIED BY '{DB_PASSWORD}';"
            f" GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'{host}';"
            for host in ("localhost", "127.0.0.1")
        )
        run(["/usr/bin/mysql", "-e", f"DROP DATABASE IF EXISTS {DB_NAME}; {grants}"])

    def sacctmgr(self, *args: str) -> str:
        return run(["/usr/bin/sacctmgr", "-i", *args]).stdout

    def start_slurm(self) -> None:
        self.spawn("slurmdbd")
        _wait_until(
            lambda: _ok(["/usr/bin/sacctmgr", "-n", "show", "cluster"]),
            30,
            "slurmdbd did not answer",
            self.logs("slurmdbd"),
            self.died("slurmdbd"),
        )
        # All associations exist before slurmctld starts: ones added while it
        # registers can be lost ("Can't find parent id 3 for assoc 4"), and
        # sshare then shows a broken tree.
        self.add_associations()
        self.add_partition_qos()
        self.log("associations added")
        if self.box.cloud:
            self.spawn("moto")
            _wait_until(
                box_cloud.provider_answers,
                30,
                "moto did not answer",
                self.logs("moto"),
                self.died("moto"),
            )
        self.spawn("slurmctld")
        for node in NODES:
            self.spawn(f"slurmd-{node}")
        if self.box.cloud:
            self.spawn("cloud-boot")
        self.wait_ready()

    def add_associations(self) -> None:
        """Cluster, accounts and users in one `sacctmgr load` (~0.5 s per separate command)."""
        lines = ["Cluster - 'lab'"]
        for parent in ["root", *ACCOUNTS]:
            children = [a for a, p in ACCOUNTS.items() if p == parent]
            users = [u for u, accounts in USERS.items() if parent in accounts]
            if not children and not users:
                continue
            lines.append(f"Parent - '{parent}'")
            lines += [f"Account - '{a}':Description='{a}':Organization='lab'" for a in children]
            lines += [f"User - '{u}':DefaultAccount='{USERS[u][0]}'" for u in users]
        flat = RUN_DIR / "associations.cfg"
        _write(flat, "\n".join(lines) + "\n")
        run(["/usr/bin/sacctmgr", "-i", "load", f"file={flat}"])

    def add_partition_qos(self) -> None:
        """The QOS slurm.conf's partitions name (scarcity caps, docs/limits-sync.md):
        slurmctld will not start while a partition names a QOS slurmdbd lacks."""
        names = {
            word.removeprefix("QOS=")
            for line in self.box.render_slurm_conf().splitlines()
            if line.startswith("PartitionName=")
            for word in line.split()
            if word.startswith("QOS=")
        }
        if names:
            run(["/usr/bin/sacctmgr", "-i", "add", "qos", ",".join(sorted(names))])

    def wait_ready(self) -> None:
        names = ["slurmdbd", "slurmctld", *(f"slurmd-{n}" for n in NODES)]
        _wait_until(
            lambda: "is UP" in run(["/usr/bin/scontrol", "ping"], check=False).stdout,
            self.box.timeout_s,
            "slurmctld did not come up",
            self.logs("slurmctld"),
            self.died(*names),
        )
        _wait_until(
            _nodes_ready,
            self.box.timeout_s,
            "nodes did not become idle",
            self.logs(*(f"slurmd-{n}" for n in NODES), "slurmctld"),
            self.died(*names),
        )

    def start(self) -> None:
        began = time.monotonic()
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        _write(RUN_DIR / "supervisor.pid", f"{os.getpid()}\n")
        self.prepare()
        self.start_munge()
        self.start_mariadb()
        self.start_slurm()
        _write(RUN_DIR / "ready", "")
        self.log(f"ready in {time.monotonic() - began:.1f} s")

    # ---- run and stop ----

    def reap(self, pid: int = -1, timeout: float = 0.0) -> None:
        """Reap children (adopted orphans too); note daemons that died."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                got, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if got == 0:
                if pid != -1 and _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
                return
            for name, known in list(self.pids.items()):
                if known == got:
                    self.procs[name].returncode = os.waitstatus_to_exitcode(status)
                    if not self.stopping:
                        self.log(f"{name} (pid {got}) exited: {self.procs[name].returncode}")
                        (RUN_DIR / "ready").unlink(missing_ok=True)

    def serve(self) -> None:
        while True:
            self.reap()
            if self.heal:
                self.heal = False
                self.restart_dead()
            time.sleep(0.2)

    def restart_dead(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc.returncode is not None:
                self.spawn(name)
        try:
            self.wait_ready()
        except BoxError as e:
            self.log(str(e))
            return
        _write(RUN_DIR / "ready", "")
        self.log("ready again")

    def stop(self) -> None:
        self.stopping = True
        (RUN_DIR / "ready").unlink(missing_ok=True)
        slurm = {n: p for n, p in self.pids.items() if n.startswith("slurm")}
        _stop_daemons(slurm, self.reap)
        # Job steps orphaned by slurmd were adopted by us: end them too.
        for pid in _children(os.getpid()):
            if _alive(pid) and pid not in self.pids.values():
                os.kill(pid, signal.SIGKILL)
        self.reap(timeout=1.0)
        _drop_database()
        others = {n: p for n, p in self.pids.items() if n not in slurm}
        _stop_daemons(others, self.reap)
        self.reap()
        _wipe_state()
        self.log("stopped")


def _nodes_ready() -> bool:
    out = run(["/usr/bin/sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
    states = dict(line.split() for line in out.splitlines() if line.strip())
    ok = {"idle", "mixed", "allocated", "completing"}
    # The box's cloud nodes are powered down (idle~) until a job needs one.
    on_premise = {node: state for node, state in states.items() if node not in box_cloud.CLOUD_NODES}
    return set(on_premise) == set(NODES) and all(s in ok for s in on_premise.values())


def supervise(ready_fd: int) -> int:
    """The supervisor process's main (`python -m slurmbox _supervise FD`)."""
    box = SlurmBox(**json.loads(os.environ["GPUCREDIT_BOX_SPEC"]))
    sup = _Supervisor(box)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sup.log(f"cannot become a child subreaper (errno {ctypes.get_errno()})")
    signal.signal(signal.SIGTERM, sup._on_stop)
    signal.signal(signal.SIGINT, sup._on_stop)
    signal.signal(signal.SIGUSR1, sup._on_heal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    report = None
    try:
        sup.start()
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
        ready_fd = -1
        sup.serve()
    except _Stop:
        report = "Slurm box start interrupted"
    except BoxError as e:
        report = f"Slurm box failed to start: {e}"
    except Exception as e:  # report any start-up bug to the waiting caller, then re-raise
        report = f"Slurm box failed to start: {e!r} (traceback in {LOG_DIR}/supervisor.log)"
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # already stopping
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if report and ready_fd >= 0:
            sup.log(report)
        sup.stop()
        if ready_fd >= 0:
            os.write(ready_fd, (report or "Slurm box stopped").encode())
            os.close(ready_fd)
    return 0 if ready_fd < 0 or report is None else 1
