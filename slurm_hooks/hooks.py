"""`gpucredit hook prolog-slurmctld | epilog-slurmctld | prolog | epilog`.

Thin, stdlib-only entry points that Slurm runs once per job (per node for
the node hooks). They read Slurm's environment (docs/slurm-facts.md §5: no PATH, no GPU
variables on the controller), ask squeue for what is billed (slurm_hooks/squeue.py:
ids, times, account and the allocated GPUs, never a field a user can write), the
node hooks ask `scontrol show job -d -o` for their node's GPU indices, and all talk
to the resident `gpucredit daemon` (client.py).

A heterogeneous job's parts are held together or not at all: PrologSlurmctld runs
once per part, and each run asks the daemon for every part's hold in one request
(`hold_together`); whichever runs first takes them all, the others find them taken.

Exit codes, and why (docs/slurm-facts.md §6):

    prolog-slurmctld  0  hold taken, no GPUs, or ledger down under policy accept
                         (within the outage credit lines: outage_spool.py)
                      1  refused (or ledger down under policy reject, or past an
                         outage credit line): the job is put on hold with a
                         reason first, because a bare non-zero exit only
                         requeues it and it would loop
    epilog-slurmctld  0  always (Slurm only logs its exit code; the bridge
                         reconciles from sacct whatever was not settled)
    prolog, epilog    0  always (a failing node hook drains the node)
    any               2  bad usage (unknown hook name)

Every run logs one line `gpucredit[<hook>] job=<id> run=<n>: ...` to stderr
and syslog. A run is `(cluster, SLURM_JOB_ID, SLURM_JOB_RESTART_COUNT)`; the
daemon is idempotent per run, so Slurm retrying a hook is harmless.

Slurm waits for PrologSlurmctld before it starts the job, so this module keeps
its imports to what that hook needs (the module-level ones below); the rest is
imported where it is used, with a comment saying so.
"""

from __future__ import annotations

import json
import os
import re
import select
import sys
import syslog
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, tzinfo

from slurm_hooks.client import (
    DEFAULT_SOCKET,
    DEFAULT_TIMEOUT_SECONDS,
    DaemonClient,
    DaemonRefused,
    DaemonUnreachable,
)
from slurm_hooks.jobinfo import JobInfo
from slurm_hooks.scontrol import parse_node_gpus
from slurm_hooks.squeue import parse_jobs, squeue_argv
from slurmtext import SlurmTextError, comment_text, expand_hostlist, expand_output_path

# `typing` costs milliseconds to import and is needed only by type checkers here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from slurm_hooks.outage_spool import OutageSettings

__all__ = [
    "DEFAULT_CONFIG",
    "HOOKS",
    "SETTINGS_VARIABLE",
    "CommandError",
    "HookConfig",
    "hold_job_with_reason",
    "hook_settings",
    "load_config",
    "main",
    "registry_path",
    "run_command",
]

DEFAULT_CONFIG = "/etc/gpucredit/gpucredit.toml"
DEFAULT_BIN_DIR = "/usr/bin"
DEFAULT_SPOOL_DIR = "/var/spool/gpucredit/jobs"
DEFAULT_COMMAND_TIMEOUT_SECONDS = 10.0
POLICIES = ("reject", "accept")

# The settings the hooks read, as (table, key) of the TOML config. `gpucredit slurm
# install` copies them into each hook shim as one JSON object in SETTINGS_VARIABLE,
# so that a hook does not parse TOML on every job (tomllib alone costs several ms).
SETTINGS_KEYS = (
    ("daemon", "socket"),
    ("daemon", "sockets"),
    ("daemon", "timeout_seconds"),
    ("policy", "on_ledger_unreachable"),
    ("policy", "outage_spool_dir"),
    ("policy", "outage_credit_line_per_account"),
    ("policy", "outage_credit_line_fleet"),
    ("policy", "outage_credit_lines"),
    ("slurm", "cluster"),
    ("slurm", "bin_dir"),
    ("agent", "spool_dir"),
    ("agent", "send_to"),
    ("agent", "munge_socket"),
    ("hooks", "log_file"),
    ("hooks", "stage_dir"),
    ("hooks", "stage_timeout_seconds"),
)
SETTINGS_VARIABLE = "GPUCREDIT_HOOK_SETTINGS"

HOOKS = ("prolog-slurmctld", "epilog-slurmctld", "prolog", "epilog")

# What a user sees in `squeue`/`scontrol show job` when the ledger is down
# and site policy holds GPU jobs.
UNREACHABLE_REASON = "ledger unreachable; job held by site policy, ask your admin to release it"

# AdminComment (users cannot edit it) of a job held for credit or a limit; the daemon
# releases such a job once a hold for it would be taken (docs/design.md §3.2).
HOLD_ADMIN_COMMENT = "gpucredit-hold"
# AdminComment of a job whose request could not be read: never released by the daemon
# (it would be read, and held, again); an admin looks, and releases it by hand.
UNREADABLE_ADMIN_COMMENT = "gpucredit-unreadable"
# What a refusal's reason adds when the job breaks a cap on its own (details "alone").
# Short: the comment holds 240 characters, and the refusal before it ~150.
NEVER_FITS = " Alone over the cap: it cannot start until the cap is raised (or scancel it)."

Runner = Callable[[Sequence[str]], str]
LogSink = Callable[[str], None]


class CommandError(Exception):
    """A Slurm command failed; carries the argv, exit status and stderr."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str) -> None:
        status = "timed out" if returncode is None else f"exited {returncode}"
        super().__init__(f"{' '.join(argv)} {status}: {stderr.strip()[:200]}")
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr


def run_command(argv: Sequence[str], timeout: float = DEFAULT_COMMAND_TIMEOUT_SECONDS) -> str:
    """Run a Slurm command (argv list, no shell); return stdout or raise CommandError.

    stdin is /dev/null, stdout and stderr are captured, and the command is killed
    after `timeout` seconds, as `subprocess.run` would do; but importing subprocess
    (threading, signal, locale...) costs ~5 ms in every hook process, so this is
    os.posix_spawn and poll. argv[0] must be a path: there is no PATH search (Slurm
    gives hooks no PATH anyway). The descriptors Python opens are not inheritable
    (PEP 446), so the command does not see our socket or files without close_fds.
    It does inherit Python's ignored SIGPIPE, which subprocess would reset; harmless
    here, as both pipes are read until the command closes them.
    """
    argv = list(argv)
    deadline = time.monotonic() + timeout
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        try:
            pid = os.posix_spawn(
                argv[0],
                argv,
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, out_write, 1),
                    (os.POSIX_SPAWN_DUP2, err_write, 2),
                ],
            )
        except OSError as e:  # missing or not executable
            raise CommandError(argv, None, str(e)) from e
        finally:
            os.close(out_write)
            os.close(err_write)
        finished, (stdout, stderr) = _read_until_closed((out_read, err_read), deadline)
        if not finished:
            import signal  # here: only a command that hangs needs it

            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise CommandError(argv, None, stderr)
        returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    finally:
        os.close(out_read)
        os.close(err_read)
    if returncode != 0:
        raise CommandError(argv, returncode, stderr)
    return stdout


def _read_until_closed(fds: tuple[int, int], deadline: float) -> tuple[bool, list[str]]:
    """What is written to the pipes `fds`, and whether both closed before `deadline`."""
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    open_fds = len(fds)
    while open_fds:
        remaining = deadline - time.monotonic()
        events = poller.poll(remaining * 1000) if remaining > 0 else []
        if not events:
            break
        for fd, _ in events:
            data = os.read(fd, 65536)
            if data:
                chunks[fd].append(data)
            else:  # closed (POLLHUP reads as b"")
                poller.unregister(fd)
                open_fds -= 1
    return open_fds == 0, [b"".join(chunks[fd]).decode(errors="replace") for fd in fds]


class HookConfig:
    """The hooks' settings (immutable by convention).

    A plain class rather than a dataclass: `dataclasses` imports `inspect`,
    which costs several milliseconds in every hook process.
    """

    __slots__ = (
        "bin_dir", "cluster", "log_file", "munge_socket", "on_ledger_unreachable", "send_to",
        "socket_path", "socket_paths", "spool_dir", "stage_dir", "stage_timeout_seconds", "timeout_seconds",
    )  # fmt: skip

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        on_ledger_unreachable: str = "reject",
        cluster: str | None = None,
        bin_dir: str = DEFAULT_BIN_DIR,
        spool_dir: str = DEFAULT_SPOOL_DIR,
        # Slurm discards what hooks print; one line per hook run goes here too.
        log_file: str | None = None,
        # Daemons to try in order within one deadline (two controllers); default [socket_path].
        socket_paths: Sequence[str] | None = None,
        # A cloud node's stage-in (stage_in.py): where jobs' data go, and the daemons asked.
        stage_dir: str | None = None,
        send_to: Sequence[str] = (),
        munge_socket: str | None = None,
        stage_timeout_seconds: float = 600.0,
    ) -> None:
        self.socket_path = socket_path
        self.socket_paths = tuple(socket_paths) if socket_paths else (socket_path,)
        self.timeout_seconds = timeout_seconds
        self.on_ledger_unreachable = on_ledger_unreachable
        self.cluster = cluster
        self.bin_dir = bin_dir
        self.spool_dir = spool_dir
        self.log_file = log_file
        self.stage_dir = stage_dir
        self.send_to = tuple(send_to)
        self.munge_socket = munge_socket
        self.stage_timeout_seconds = stage_timeout_seconds

    @property
    def scontrol(self) -> str:
        return os.path.join(self.bin_dir, "scontrol")

    @property
    def squeue(self) -> str:
        return os.path.join(self.bin_dir, "squeue")

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HookConfig):
            return NotImplemented
        return self._values() == other._values()

    def __repr__(self) -> str:
        return "HookConfig(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__) + ")"


def _table(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = data.get(name, {})
    return value if isinstance(value, Mapping) else {}


def hook_settings(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The part of a parsed config the hooks read (SETTINGS_KEYS), tables kept.

    Only these keys: the result goes into the hook shims, which any local user can
    read, and the config may hold secrets (`database.url`).
    """
    settings: dict[str, dict[str, Any]] = {}
    for table, key in SETTINGS_KEYS:
        values = _table(data, table)
        if key in values:
            settings.setdefault(table, {})[key] = values[key]
    return settings


def _read_settings(
    environ: Mapping[str, str], path: str, problems: list[str]
) -> tuple[Mapping[str, Any], str]:
    """The settings tables and where they came from: the shim's copy, else the TOML file."""
    baked = environ.get(SETTINGS_VARIABLE)
    if baked is not None:
        try:
            data = json.loads(baked)
        except ValueError:
            data = None
        if isinstance(data, dict):
            return data, f"{path} (as of `gpucredit slurm install`)"
        problems.append(f"{SETTINGS_VARIABLE} is not a JSON object: {baked[:80]!r}; reading {path}")
    # Imported here: a shim written by `gpucredit slurm install` carries the settings
    # above, so a hook parses TOML only when run some other way.
    import tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f), path
    except FileNotFoundError:
        return {}, path
    except (OSError, tomllib.TOMLDecodeError) as e:
        problems.append(f"cannot read {path} ({e}); using defaults")
        return {}, path


def load_config(environ: Mapping[str, str]) -> tuple[HookConfig, list[str]]:
    """The hook settings, and any problems found.

    They come from SETTINGS_VARIABLE, the copy of the config's hook settings that
    `gpucredit slurm install` puts in the shims, else from GPUCREDIT_CONFIG (TOML).
    A missing file means defaults. An unreadable file or a bad value also
    falls back to the default (policy `reject`, the safe one) and is reported,
    so a typo never silently turns the credit check off.
    """
    path = environ.get("GPUCREDIT_CONFIG") or DEFAULT_CONFIG
    problems: list[str] = []
    data, source = _read_settings(environ, path, problems)
    daemon, policy = _table(data, "daemon"), _table(data, "policy")
    slurm, agent = _table(data, "slurm"), _table(data, "agent")
    defaults = HookConfig()

    def pick(table: Mapping[str, Any], key: str, default: Any, valid: Callable[[Any], bool]) -> Any:
        if key not in table:
            return default
        if valid(table[key]):
            return table[key]
        problems.append(f"{source}: bad value {table[key]!r} for {key}; using {default!r}")
        return default

    def is_path(value: Any) -> bool:
        return isinstance(value, str) and os.path.isabs(value)

    def is_timeout(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 60

    def is_path_list(value: Any) -> bool:
        return isinstance(value, list) and 0 < len(value) <= 8 and all(is_path(v) for v in value)

    def is_seconds(value: Any, most: float) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= most

    def is_address_list(value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) and ":" in v for v in value)

    cluster = pick(slurm, "cluster", None, lambda v: isinstance(v, str) and v != "")
    # daemon.sockets (two controllers) names every daemon to try, primary first.
    sockets = pick(daemon, "sockets", None, is_path_list)
    socket_path = sockets[0] if sockets else pick(daemon, "socket", defaults.socket_path, is_path)
    return (
        HookConfig(
            socket_path=socket_path,
            socket_paths=sockets,
            timeout_seconds=float(pick(daemon, "timeout_seconds", defaults.timeout_seconds, is_timeout)),
            on_ledger_unreachable=pick(policy, "on_ledger_unreachable", "reject", lambda v: v in POLICIES),
            cluster=cluster,
            bin_dir=pick(slurm, "bin_dir", defaults.bin_dir, is_path),
            spool_dir=pick(agent, "spool_dir", defaults.spool_dir, is_path),
            log_file=pick(_table(data, "hooks"), "log_file", None, is_path),
            stage_dir=pick(_table(data, "hooks"), "stage_dir", None, is_path),
            send_to=pick(agent, "send_to", (), is_address_list),
            munge_socket=pick(agent, "munge_socket", None, is_path),
            stage_timeout_seconds=float(
                pick(_table(data, "hooks"), "stage_timeout_seconds", 600, lambda v: is_seconds(v, 86400))
            ),
        ),
        problems,
    )


def hold_job_with_reason(
    job_spec: int | str,
    message: str,
    *,
    bin_dir: str = DEFAULT_BIN_DIR,
    run: Runner = run_command,
    admin_comment: str = HOLD_ADMIN_COMMENT,
) -> list[str]:
    """Hold a job that PrologSlurmctld refuses, and tell its owner why.

    Measured on 22.05 (the Slurm box): priority=0 then a non-zero prolog exit leaves
    the job PENDING with Reason=JobHeldAdmin, which its owner cannot release, so it
    does not loop through requeues (a bare exit 1 loops; requeuehold is releasable
    by the user). The reason is the job's comment, shown by `squeue -o %k` and
    `scontrol show job`; AdminComment, which users cannot edit, marks it for the
    daemon to release once a hold for it would be taken (`admin_comment` of another
    kind keeps it for an admin). For an array task `job_spec` must be ARRAYID_TASKID:
    the array's own id names the whole array; a heterogeneous job is held by its
    leader's id, which holds every part.
    """
    scontrol = os.path.join(bin_dir, "scontrol")
    argv = [
        scontrol,
        "update",
        f"jobid={job_spec}",
        "priority=0",
        f"comment={comment_text(message)}",
        f"admincomment={admin_comment}",
    ]
    try:
        run(argv)
    except CommandError as e:
        return [str(e)]
    return []


def registry_path(spool_dir: str, node: str, cluster: str, job_id: int, run: int) -> str:
    """`<spool_dir>/<cluster>_<job_id>_<run>.json`; `%n` in spool_dir is the node name.

    Several slurmd on one host (the test box, MULTIPLE_SLURMD) share a file
    system: a spool_dir with `%n`, like SlurmdSpoolDir, keeps them apart.
    """
    directory = spool_dir.replace("%n", node)
    safe_cluster = re.sub(r"[^A-Za-z0-9_.\-]", "_", cluster)
    return os.path.join(directory, f"{safe_cluster}_{job_id}_{run}.json")


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_env(environ: Mapping[str, str], key: str) -> int | None:
    value = environ.get(key, "").strip()
    return int(value) if value.isdigit() else None


def _gpu_text(gpus: Mapping[str, int]) -> str:
    return ",".join(f"{n}x{t}" for t, n in sorted(gpus.items()))


def _file_sink(path: str | None) -> LogSink:
    if path is None:
        return _stderr_and_syslog

    def sink(line: str) -> None:
        _stderr_and_syslog(line)
        try:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%S}Z {line}\n")
        except OSError:
            pass

    return sink


def _stderr_and_syslog(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    try:
        syslog.openlog("gpucredit", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_INFO, line)
    except OSError:
        pass


class _Hook:
    """One hook invocation: its environment, settings and collaborators."""

    def __init__(
        self,
        *,
        name: str,
        environ: Mapping[str, str],
        config: HookConfig,
        run: Runner,
        now: Callable[[], datetime],
        sink: LogSink,
        tz: tzinfo | None,
        job_id: int,
        run_index: int,
        cluster: str,
    ) -> None:
        self.name = name
        self.environ = environ
        self.config = config
        self.run = run
        self.now = now
        self.sink = sink
        self.tz = tz
        self.job_id = job_id
        self.run_index = run_index
        self.cluster = cluster

    def log(self, message: str) -> None:
        self.sink(f"gpucredit[{self.name}] job={self.job_id} run={self.run_index}: {message}")

    def client(self) -> DaemonClient:
        return DaemonClient(self.config.socket_paths, self.config.timeout_seconds)

    def node_gpus(self) -> dict[str, dict[int, str]]:
        """The node hooks' read: `scontrol show job -d`, for each node's GPU indices."""
        text = self.run([self.config.scontrol, "show", "job", "-d", "-o", str(self.job_id)])
        return parse_node_gpus(text, self.job_id)

    def read_job(self) -> tuple[JobInfo, list[JobInfo]]:
        """This run's job as squeue has it, and the parts held with it: every part of
        a heterogeneous job (its leader's id lists them all), else the job alone."""
        mine = [job for job in self._squeue(str(self.job_id)) if job.job_id == self.job_id]
        if len(mine) != 1:
            raise SlurmTextError(f"squeue listed job {self.job_id} {len(mine)} times, not once")
        job = mine[0]
        if job.het_job_id is None:
            return job, [job]
        parts = sorted(self._squeue(str(job.het_job_id)), key=lambda part: part.het_offset or 0)
        if job not in parts or any(part.het_job_id != job.het_job_id for part in parts):
            raise SlurmTextError(f"squeue's parts of heterogeneous job {job.het_job_id} do not agree")
        return job, parts

    def _squeue(self, job_spec: str) -> list[JobInfo]:
        return parse_jobs(self.run(squeue_argv(self.config.squeue, job_spec)), tz=self.tz)

    def job_spec(self, job: JobInfo | None = None) -> str:
        if job is not None:
            return job.job_spec
        het_id = self.environ.get("SLURM_HET_JOB_ID")
        if het_id and het_id.isdigit():
            return het_id
        array_id = self.environ.get("SLURM_ARRAY_JOB_ID")
        task_id = self.environ.get("SLURM_ARRAY_TASK_ID")
        return f"{array_id}_{task_id}" if array_id and task_id else str(self.job_id)

    def hold_job(
        self, message: str, job: JobInfo | None = None, admin_comment: str = HOLD_ADMIN_COMMENT
    ) -> str:
        failures = hold_job_with_reason(
            self.job_spec(job),
            message,
            bin_dir=self.config.bin_dir,
            run=self.run,
            admin_comment=admin_comment,
        )
        return "job held" if not failures else "could not hold job: " + "; ".join(failures)

    # --- PrologSlurmctld -------------------------------------------------

    def prolog_slurmctld(self) -> int:
        try:
            job, parts = self.read_job()
        except SlurmTextError as e:
            # Never guess a GPU count or time limit: park the job for an admin instead.
            outcome = self.hold_job(
                f"cannot read this job's GPU request ({e}); ask your admin",
                admin_comment=UNREADABLE_ADMIN_COMMENT,
            )
            self.log(f"squeue output unreadable: {e}; {outcome}")
            return 1
        except CommandError as e:
            return self._ledger_unreachable(f"squeue failed: {e}")
        if not any(part.gpus for part in parts):
            self.log("no GPUs requested; nothing to hold")
            return 0
        request = self._hold_request(job)
        together = len(parts) > 1
        try:
            if together:
                requests = [request if part is job else self._hold_request(part) for part in parts]
                holds = self.client().call("hold_together", parts=[r for r in requests if r["gpus"]])["holds"]
                hold = next((h for h in holds if h.get("job_id") == self.job_id), {"id": None, "amount": "0"})
            else:
                hold = self.client().call("hold", **request)
        except DaemonRefused as e:
            reason = e.message + (NEVER_FITS if e.details.get("alone") else "")
            outcome = self.hold_job(reason, job)
            self.log(f"refused ({e.code}): {reason}; {outcome}")
            return 1
        except DaemonUnreachable as e:
            return self._ledger_unreachable(str(e), request, job)
        what = f" (with the other parts of heterogeneous job {job.het_job_id})" if together else ""
        self.log(
            f"hold {hold.get('id')} of {hold.get('amount')} credits for "
            f"{_gpu_text(job.gpus)} x {job.time_limit_seconds}s on account {request['account']}{what}"
        )
        return 0

    def _hold_request(self, job: JobInfo) -> dict[str, Any]:
        """The daemon's hold request for `job`: this run's, or a part held with it."""
        mine = job.job_id == self.job_id
        env = self.environ if mine else {}
        return {
            "cluster": self.cluster,
            "job_id": job.job_id,
            "run": self.run_index if mine else job.restarts,
            "account": env.get("SLURM_JOB_ACCOUNT") or job.account,
            "user": env.get("SLURM_JOB_USER") or job.user,
            "partition": env.get("SLURM_JOB_PARTITION") or job.partition,
            "gpus": dict(sorted(job.gpus.items())),
            "seconds": job.time_limit_seconds,
            "start": _iso(job.start_time) if job.start_time is not None else None,
            # With the run, this names the attempt: job ids are reused, SubmitTime is not.
            "submit": _iso(job.submit_time) if job.submit_time is not None else None,
            "nodes": job.num_nodes or _int_env(env, "SLURM_JOB_NUM_NODES") or 1,
            "stdout": self._stdout(job) if mine else None,  # the portal shows its owner the tail
        }

    def _stdout(self, job: JobInfo) -> str | None:
        """The batch output's path, from the hook's environment (the user's own text:
        never read out of a Slurm command's output, where it could pose as other fields)."""
        work_dir = self.environ.get("SLURM_JOB_WORK_DIR")
        user = self.environ.get("SLURM_JOB_USER") or job.user
        if not work_dir or not user:
            return None
        nodes = self.environ.get("SLURM_JOB_NODELIST") or job.node_list or ""
        return expand_output_path(
            self.environ.get("SLURM_JOB_STDOUT"),
            job_id=job.job_id,
            user=user,
            name=self.environ.get("SLURM_JOB_NAME", ""),
            work_dir=work_dir,
            node=next(iter(expand_hostlist(nodes)), ""),  # the batch step's node
            array_job_id=job.array_job_id,
            array_task_id=job.array_task_id,
        )

    def _ledger_unreachable(
        self, why: str, request: Mapping[str, Any] | None = None, job: JobInfo | None = None
    ) -> int:
        if self.config.on_ledger_unreachable == "accept":
            return self._accept_in_outage(why, request, job)
        outcome = self.hold_job(UNREACHABLE_REASON, job)
        self.log(f"ledger unreachable ({why}); site policy is reject; {outcome}")
        return 1

    def _outage(self) -> OutageSettings:
        # Imported here: only a hook that finds the ledger down counts runs.
        from slurm_hooks.outage_spool import OutageSettings

        problems: list[str] = []
        path = self.environ.get("GPUCREDIT_CONFIG") or DEFAULT_CONFIG
        data, source = _read_settings(self.environ, path, problems)
        settings = OutageSettings.from_policy(_table(data, "policy"))
        for problem in problems + settings.problems:
            self.log(f"config: {source}: {problem}")
        return settings

    def _accept_in_outage(self, why: str, request: Mapping[str, Any] | None, job: JobInfo | None) -> int:
        """Policy accept: admit the run within the outage credit lines, counted in the
        spool (outage_spool.py) for the ledger to charge when it returns."""
        admitted, note, detail = self._outage().admit(request, self.now())
        if admitted:
            self.log(f"ledger unreachable ({why}); job runs by site policy (accept); {note}")
            return 0
        outcome = self.hold_job(note, job)
        self.log(f"ledger unreachable ({why}); site policy is accept: {note}{detail}; {outcome}")
        return 1

    # --- EpilogSlurmctld -------------------------------------------------

    def epilog_slurmctld(self) -> int:
        start: datetime | None = None
        end: datetime | None = None
        submit: datetime | None = None
        note = ""
        try:
            mine = [job for job in self._squeue(str(self.job_id)) if job.job_id == self.job_id]
            if len(mine) != 1:
                raise SlurmTextError(f"squeue listed job {self.job_id} {len(mine)} times, not once")
            job = mine[0]
        except (CommandError, SlurmTextError) as e:
            note = f" (squeue failed: {e}; start left to the daemon)"
        else:
            if not job.gpus:
                self.log("no GPUs; nothing to settle")
                return 0
            start, end, submit = job.start_time, job.end_time, job.submit_time
        now = self.now()
        if end is not None and end > now and start is not None and start <= now:
            # After `scontrol requeue`, StartTime is the requeue moment and EndTime that
            # plus the time limit (docs/slurm-facts.md §11): the run ended at StartTime,
            # which equals sacct's End but for a rare second the bridge corrects. The
            # daemon measures from the start the prolog recorded with the hold.
            end, start = start, None
        elif end is None or end > now:
            # Never settle a run as ending in the future; Slurm's times are whole seconds.
            end = now.replace(microsecond=0)
        request = {
            "cluster": self.cluster,
            "job_id": self.job_id,
            "run": self.run_index,
            "start": _iso(start) if start is not None else None,
            "end": _iso(end),
            # Picks this job's hold if an old job with the same id left one active.
            "submit": _iso(submit) if submit is not None else None,
            # Where the daemon queues this settle (one account's requests go to one of its
            # writers); the charge is always to the hold's own account.
            "account": self.environ.get("SLURM_JOB_ACCOUNT"),
        }
        try:
            hold = self.client().call("settle", **request)
        except DaemonRefused as e:
            if e.code == "not_found":
                self.log(f"no hold for this run; nothing to settle{note}{self._end_outage_run(request)}")
            else:
                self.log(f"settle refused ({e.code}): {e.message}{note}")
            return 0
        except DaemonUnreachable as e:
            spooled = self._end_outage_run(request)
            self.log(f"ledger unreachable ({e}); the bridge will reconcile this run{note}{spooled}")
            return 0
        self.log(
            f"settled hold {hold.get('id')}: charged {hold.get('charged')} of "
            f"{hold.get('amount')} credits ({request['start']} .. {request['end']}){note}"
        )
        return 0

    def _end_outage_run(self, request: Mapping[str, Any]) -> str:
        """Note the end of a run admitted during an outage, for the ledger's read-back."""
        return self._outage().end(request)

    # --- node Prolog / Epilog --------------------------------------------

    def _node(self) -> str | None:
        return self.environ.get("SLURMD_NODENAME") or None

    def _record(self, node: str, gpus: Mapping[int, str]) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "job_id": self.job_id,
            "run": self.run_index,
            "node": node,
            "gpus": {str(index): gpus[index] for index in sorted(gpus)},
        }

    def prolog(self) -> int:
        node = self._node()
        if node is None:
            self.log("SLURMD_NODENAME not set; nothing registered")
            return 0
        self._register_gpus(node)
        if self.config.stage_dir and self.config.send_to:
            self._stage_in(node, self.config.stage_dir)
        return 0

    def _register_gpus(self, node: str) -> None:
        try:
            node_gpus = self.node_gpus()
        except (CommandError, SlurmTextError) as e:
            self.log(f"scontrol failed ({e}); GPUs of node {node} not registered")
            return
        # Index -> type from scontrol: node-hook SLURM_JOB_GPUS is wrong for
        # jobs with two GPU types in 22.05.
        gpus = node_gpus.get(node, {})
        if not gpus:
            self.log(f"no GPUs on node {node}; nothing registered")
            return
        record = self._record(node, gpus)
        path = registry_path(self.config.spool_dir, node, self.cluster, self.job_id, self.run_index)
        # The agent reads this file itself: a node talks to no daemon (compute nodes
        # reach no controller socket, and hold no ledger credentials).
        try:
            _write_json_atomically(path, record)
            written = f"registered {path}"
        except OSError as e:
            written = f"cannot write {path} ({e})"
        self.log(f"node {node} GPUs {_index_text(record['gpus'])}: {written}")

    def _stage_in(self, node: str, stage_dir: str) -> None:
        """The job's data, where it has some and runs in a cloud partition (stage_in.py)."""
        # Imported here: only a node that stages pays for it.
        from slurm_hooks import stage_in

        user = self.environ.get("SLURM_JOB_USER", "")
        job = {"cluster": self.cluster, "job_id": self.job_id, "user": user}
        ask = {
            "v": 1,
            "node": node,
            "stage": {**job, "run": self.run_index, "partition": self.environ.get("SLURM_JOB_PARTITION", "")},
        }
        deadline = time.monotonic() + stage_in.PENDING_WAIT_SECONDS
        try:
            plan = self._ask_daemon(stage_in, ask)
            while isinstance(plan, dict) and plan.get("pending") and time.monotonic() < deadline:
                time.sleep(0.5)  # its paths are kept, its id not bound yet: sbatch just answered
                plan = self._ask_daemon(stage_in, ask)
        except stage_in.StageError as e:
            self.log(f"stage-in not done: {e}")
            return
        if not isinstance(plan, dict) or not plan.get("paths"):
            return
        try:
            folder, files, size, milliseconds, error = stage_in.stage(
                stage_dir, node, self.job_id, user, plan["paths"], self.config.stage_timeout_seconds
            )
        except OSError as e:  # the stage folder: the job starts without its data
            self.log(f"stage-in into {stage_dir} failed: {e}")
            return
        said = f"failed: {error}" if error else "done"
        self.log(f"staged {files} files, {size} bytes in {milliseconds} ms to {folder}: {said}")
        staged = {**job, "data_id": plan.get("data_id"), "run": self.run_index, "files": files, "bytes": size}
        try:
            self._ask_daemon(
                stage_in,
                {"v": 1, "node": node, "staged": {**staged, "milliseconds": milliseconds, "error": error}},
            )
        except stage_in.StageError as e:
            self.log(f"stage-in done but not recorded: {e}")

    def _remove_stage(self, node: str, stage_dir: str) -> None:
        from slurm_hooks import stage_in  # only a node that stages pays for it

        try:
            stage_in.remove(stage_dir, node, self.job_id)
        except OSError as e:
            self.log(f"stage folder of job {self.job_id} not removed: {e}")

    def _ask_daemon(self, stage_in: Any, document: dict[str, Any]) -> Any:
        return stage_in.ask(
            self.config.send_to, self.config.munge_socket, document, self.config.timeout_seconds
        )

    def epilog(self) -> int:
        node = self._node()
        if node is None:
            self.log("SLURMD_NODENAME not set; nothing to unregister")
            return 0
        if self.config.stage_dir:
            self._remove_stage(node, self.config.stage_dir)
        # After a requeue the Epilog already sees the next run's SLURM_JOB_RESTART_COUNT
        # (measured on 22.05): the run that ended is the latest one registered here.
        path = registry_path(self.config.spool_dir, node, self.cluster, self.job_id, self.run_index)
        for run in range(self.run_index, -1, -1):
            candidate = registry_path(self.config.spool_dir, node, self.cluster, self.job_id, run)
            if os.path.exists(candidate):
                path = candidate
                break
        gpus: dict[int, str] | None = _read_registry(path)
        source = f"removed {path}"
        if gpus is None:
            source = "no registry file"
            try:
                gpus = self.node_gpus().get(node, {})
            except (CommandError, SlurmTextError) as e:
                self.log(f"no registry file and scontrol failed ({e}); nothing to unregister")
                return 0
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            source = f"cannot remove {path} ({e})"
        if not gpus:
            self.log(f"no GPUs on node {node}; nothing to unregister")
            return 0
        record = self._record(node, gpus)
        self.log(f"node {node} GPUs {_index_text(record['gpus'])}: {source}")
        return 0


def _index_text(gpus: Mapping[str, str]) -> str:
    return ",".join(f"{index}={gpu_type}" for index, gpu_type in gpus.items())


def _write_json_atomically(path: str, record: Mapping[str, Any]) -> None:
    # The node agent may read the spool while we write: it must see the whole
    # file or none. Rewriting the same file when Slurm retries is harmless.
    import tempfile  # here: only the node Prolog writes files, PrologSlurmctld never does

    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_registry(path: str) -> dict[int, str] | None:
    """The GPUs a node prolog registered, or None if there is no usable file."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    gpus = record.get("gpus") if isinstance(record, dict) else None
    if not isinstance(gpus, dict):
        return None
    try:
        return {int(index): str(gpu_type) for index, gpu_type in gpus.items()}
    except ValueError:
        return None


_HANDLERS: dict[str, Callable[[_Hook], int]] = {
    "prolog-slurmctld": _Hook.prolog_slurmctld,
    "epilog-slurmctld": _Hook.epilog_slurmctld,
    "prolog": _Hook.prolog,
    "epilog": _Hook.epilog,
}


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    runner: Runner | None = None,
    now: Callable[[], datetime] | None = None,
    log: LogSink | None = None,
    tz: tzinfo | None = None,
) -> int:
    """Run one hook; `argv` is `[hook_name]`. Returns the process exit code.

    The keyword arguments replace the process's environment, the Slurm
    command runner, the clock, the log sink and scontrol's time zone (tests).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    config, problems = load_config(env)
    sink = log or _file_sink(config.log_file)
    if len(args) != 1 or args[0] not in _HANDLERS:
        sink(f"gpucredit[hook]: usage: gpucredit hook {{{'|'.join(HOOKS)}}}, got {args!r}")
        return 2
    name = args[0]
    job_id = _int_env(env, "SLURM_JOB_ID")
    run_index = _int_env(env, "SLURM_JOB_RESTART_COUNT") or 0
    cluster = env.get("SLURM_CLUSTER_NAME") or config.cluster or "default"
    for problem in problems:
        sink(f"gpucredit[{name}] job={job_id} run={run_index}: config: {problem}")
    if job_id is None:
        sink(f"gpucredit[{name}] job=? run={run_index}: SLURM_JOB_ID not set; nothing to do")
        return 2 if name == "prolog-slurmctld" else 0
    hook = _Hook(
        name=name,
        environ=env,
        config=config,
        run=runner or (lambda argv: run_command(argv)),
        now=now or (lambda: datetime.now(UTC)),
        sink=sink,
        tz=tz,
        job_id=job_id,
        run_index=run_index,
        cluster=cluster,
    )
    try:
        return _HANDLERS[name](hook)
    except Exception as e:  # the process boundary: Slurm must get an exit code
        hook.log(f"internal error {type(e).__name__}: {e}")
        if name == "prolog-slurmctld":
            return hook._ledger_unreachable(f"internal error {type(e).__name__}: {e}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
