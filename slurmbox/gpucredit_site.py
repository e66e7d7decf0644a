"""gpucredit on the Slurm box, for people trying it: `python -m slurmbox up` runs this after the box.

Writes /etc/gpucredit/gpucredit.toml (unless one exists), creates the ledger,
mirrors Slurm's accounts, sets the demo prices when none are set, installs the
hooks and starts two `gpucredit daemon`s in the background, as on a site with a
backup controller (docs/admin-guide.md "Two controllers"): the hooks list both
sockets and fail over; kill one (`kill $(cat /run/gpucredit/daemon.pid)`) and jobs
still hold and settle through the other. It also starts the portal (on PORTAL_PORT on
the host's 22.05 box, the job submitter behind it; on a chroot box its own port, jobs
through the box's slurmrestd: docs/admin-guide.md §4b), with MUNGE sign-on, so a
user's `gpucredit job ...` needs no token. Then:

    gpucredit topup physics 100
    runuser -u alice -- sbatch -D /tmp -A physics --gres=gpu:h100:2 -t 10 --wrap 'sleep 30'
    gpucredit hold list; gpucredit balance physics
    runuser -u alice -- .venv/bin/gpucredit job list

The ledger is the embedded SQLite file: trying gpucredit needs no database
server. Point `[database] url` at PostgreSQL for anything more (the tests' box
ledger does, see tests/slurm/conftest.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from slurm_hooks.admin.slurmconf import DEFAULT_JWT_KEY
from slurmbox.box import BoxError

# The gpucredit next to this interpreter (the venv's in a clone: `make slurm-up`).
GPUCREDIT = str(Path(sys.executable).with_name("gpucredit"))
CONFIG = Path(os.environ.get("GPUCREDIT_CONFIG", "/etc/gpucredit/gpucredit.toml"))
PID_FILE = Path("/run/gpucredit/daemon.pid")
SOCKET = Path("/run/gpucredit/daemon.sock")
# The backup controller's daemon; on a real site it runs on the other host (its socket
# forwarded here), on the box both run on one host.
BACKUP_PID_FILE = Path("/run/gpucredit/backup.pid")
BACKUP_SOCKET = Path("/run/gpucredit/backup.sock")
LOG_DIR = Path("/var/log/gpucredit")
LEDGER = Path("/var/lib/gpucredit/gpucredit.db")  # the embedded ledger CONFIG_TEXT names
# The portal (as root here; a site runs it as its own user) and the root submitter that
# answers that uid alone.
PORTAL_PORT = 8088
PORTAL_PID_FILE = Path("/run/gpucredit/portal.pid")
SUBMITTER_PID_FILE = Path("/run/gpucredit/submitter.pid")
SUBMITTER_SOCKET = Path("/run/gpucredit/submitter.sock")
AGENT_PORT = 9468  # the daemon's agent_listen: the nodes' stage-ins
STAGE_DIR = Path("/var/spool/gpucredit/stage")  # a cloud job's data, per node
DEMO_PRICES = {"a100": "2.00", "h100": "3.60"}  # credits per GPU-hour, as in the README
# In the cloud partitions (docs/routing.md): each region its own prices.
DEMO_CLOUD_PRICES = {"cloud": {"a100": "3.00", "h100": "5.40"}, "burst": {"a100": "2.80", "h100": "4.80"}}
# The box's sites: `--comment=gpucredit:cloud=yes` may take `cloud` (node3, us-east-1) or,
# when the box runs its cloud, `burst` (cloud1, launched on demand in us-west-2), once
# on-premise has had 5 s; `gpucredit:region=us-west-2` keeps the job to `burst`.
ROUTING_TEXT = """
[partitions.onprem]
site = "onprem"
[partitions.cloud]
site = "cloud"
region = "us-east-1"
[partitions.burst]
site = "cloud"
region = "us-west-2"

[routing]
burst_after_seconds = 5
"""


def config_text(portal_port: int = PORTAL_PORT, slurmrestd: str | None = None) -> str:
    """The box's config: the portal's jobs through the submitter (22.05), or through
    `slurmrestd` with tokens the submitter signs with the box's JWT key (the chroot boxes).
    The host's box stages a cloud job's data (docs/api.md, "Data"): its nodes' Prolog asks
    the daemon over the agents' channel (the backup daemon finds the port taken, and says so)."""
    jobs = f'submitter_socket = "{SUBMITTER_SOCKET}"'
    listen = staging = send_to = ""
    if slurmrestd is not None:
        jobs += f'\njobs_backend = "slurmrestd"\nslurmrestd_url = "{slurmrestd}"'
    else:
        listen = f'agent_listen = "127.0.0.1:{AGENT_PORT}"\n'
        staging = f'stage_dir = "{STAGE_DIR}/%n"\n'
        send_to = f'send_to = ["127.0.0.1:{AGENT_PORT}"]\n'
    return f"""# gpucredit on the Slurm box (written by `make slurm-up`; edit freely, it is kept)
[database]
url = "sqlite:///{LEDGER}"

[daemon]
socket = "{SOCKET}"
sockets = ["{SOCKET}", "{BACKUP_SOCKET}"]
metrics_port = 0
{listen}
[policy]
on_ledger_unreachable = "reject"

[slurm]
cluster = "lab"

[hooks]
log_file = "{LOG_DIR / "hooks.log"}"
{staging}
[agent]
spool_dir = "/var/spool/gpucredit/%n"
{send_to}
[portal]
url = "http://127.0.0.1:{portal_port}/"
port = {portal_port}
{jobs}
munge_auth = true
{ROUTING_TEXT}"""


_DAEMON_START_S = 20
_DAEMONS = ((PID_FILE, SOCKET, "daemon.log"), (BACKUP_PID_FILE, BACKUP_SOCKET, "backup-daemon.log"))


def gpucredit(*args: str) -> str:
    """Run `gpucredit ARGS` with the box's config; raises BoxError with its stderr."""
    argv = [GPUCREDIT, *args]
    env = {**os.environ, "GPUCREDIT_CONFIG": str(CONFIG)}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise BoxError(
            f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc.stdout


def running_pid(pid_file: Path = PID_FILE) -> int | None:
    try:
        pid = int(pid_file.read_text())
        status = Path(f"/proc/{pid}/status").read_text()
    except (OSError, ValueError):
        return None
    return None if "State:\tZ" in status else pid


def up(*, portal: bool = False, portal_port: int = PORTAL_PORT, slurmrestd: str | None = None) -> list[str]:
    """Set gpucredit up on the running box and start its daemons (`portal`: the portal
    too, and the submitter unless its jobs go through `slurmrestd`); returns what to
    tell the admin."""
    if not CONFIG.exists():
        CONFIG.parent.mkdir(parents=True, exist_ok=True)
        CONFIG.write_text(config_text(portal_port, slurmrestd))
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    said = [gpucredit("init").strip(), gpucredit("account", "import-slurm").strip()]
    make_private(LEDGER)
    if gpucredit("price", "list", "--format", "csv").count("\n") <= 1:
        for gres, price in DEMO_PRICES.items():
            gpucredit("price", "set", gres, price)
        for partition, prices in DEMO_CLOUD_PRICES.items():
            for gres, price in prices.items():
                gpucredit("price", "set", gres, price, "--partition", partition)
    gpucredit("slurm", "install", "--config", str(CONFIG))
    for pid_file, daemon_socket, log in _DAEMONS:
        if running_pid(pid_file) is None:
            _start_daemon(pid_file, daemon_socket, log)
    said += [
        f"gpucredit daemons running (pids {running_pid()}, {running_pid(BACKUP_PID_FILE)}); "
        f"config {CONFIG}; hook log {LOG_DIR / 'hooks.log'}",
        *(_start_portal(portal_port, slurmrestd) if portal else []),
        "try: gpucredit topup physics 100 && runuser -u alice -- sbatch -D /tmp -A physics "
        "--gres=gpu:h100:2 -t 10 --wrap 'sleep 30'",
    ]
    return said


def make_private(database: Path) -> None:
    """The box's embedded ledger readable by root alone, like the daemon's socket: its
    directory 0700, the file and its -wal/-shm 0600. A ledger made before gpucredit
    created them so (ledger.db) was world-readable; this tightens it on the next `up`."""
    if not database.exists():
        return
    database.parent.chmod(0o700)
    for path in (database, *(database.with_name(database.name + end) for end in ("-wal", "-shm"))):
        if path.exists():
            path.chmod(0o600)


def _start_daemon(pid_file: Path, socket: Path, log_name: str) -> None:
    pid = _background(["daemon", "--socket", str(socket)], pid_file, log_name, socket.exists)
    weigh_as_its_unit(pid)  # the box has no systemd to apply the unit's CPUWeight


def weigh_as_its_unit(pid: int) -> str:
    """Give the daemon three times a default process group's CPU share, as CPUWeight=300
    in gpucredit/examples/systemd/gpucredit-daemon.service does against slurmctld's default 100: its
    session's autogroup at nice -5 weighs 3121 against 1024. Says what it did."""
    autogroup = Path(f"/proc/{pid}/autogroup")
    try:
        autogroup.write_text("-5")
        return f"x3 ({autogroup.read_text().strip()}, as CPUWeight=300 under systemd)"
    except OSError as error:  # not root, or a kernel without autogroups
        return f"default: could not weigh it as its systemd unit does ({error})"


def _start_portal(port: int, slurmrestd: str | None) -> list[str]:
    """The submitter (which signs the users' tokens where jobs go through slurmrestd),
    then the portal, each once; what to tell the admin."""
    if running_pid(SUBMITTER_PID_FILE) is None:
        SUBMITTER_SOCKET.unlink(missing_ok=True)
        argv = ["submitter", "serve", "--socket", str(SUBMITTER_SOCKET), "--allow-uid", str(os.getuid())]
        if slurmrestd is not None:
            argv += ["--jwt-key", DEFAULT_JWT_KEY]
        _background(argv, SUBMITTER_PID_FILE, "submitter.log", SUBMITTER_SOCKET.exists)
    if running_pid(PORTAL_PID_FILE) is None:
        _background(["serve"], PORTAL_PID_FILE, "portal.log", lambda: _answers(port))
    submitter = f"the submitter (pid {running_pid(SUBMITTER_PID_FILE)})"
    jobs = f"slurmrestd at {slurmrestd}, tokens from {submitter}" if slurmrestd is not None else submitter
    return [
        f"portal on http://127.0.0.1:{port}/ (pid {running_pid(PORTAL_PID_FILE)}), jobs through {jobs}; "
        f"a user needs no token: runuser -u alice -- {GPUCREDIT} job list"
    ]


def _background(args: list[str], pid_file: Path, log_name: str, ready: Callable[[], bool]) -> int:
    """`gpucredit ARGS` in a session of its own (it outlives `make slurm-up`), logging to
    LOG_DIR/log_name; its pid once `ready()`."""
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with open(LOG_DIR / log_name, "ab") as log:
        proc = subprocess.Popen(
            [GPUCREDIT, *args],
            env={**os.environ, "GPUCREDIT_CONFIG": str(CONFIG)},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + _DAEMON_START_S
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise BoxError(f"gpucredit {args[0]} did not start; see {LOG_DIR / log_name}")
        time.sleep(0.1)
    return proc.pid


def _answers(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def down() -> None:
    """Stop the daemons; the ledger and the config stay (the next `up` reuses them)."""
    for pid_file in (PORTAL_PID_FILE, SUBMITTER_PID_FILE):
        pid = running_pid(pid_file)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
        pid_file.unlink(missing_ok=True)
    for pid_file, _socket, _log in _DAEMONS:
        pid = running_pid(pid_file)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
        pid_file.unlink(missing_ok=True)


__all__ = [
    "CONFIG",
    "GPUCREDIT",
    "LEDGER",
    "down",
    "gpucredit",
    "make_private",
    "running_pid",
    "up",
    "weigh_as_its_unit",
]
