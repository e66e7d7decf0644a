"""The HA ledger database in a box: Patroni with etcd, a primary and a synchronous standby.

    python -m slurmbox.ha up | failover [--no-wait] | down [--wipe] | status
    (make ha-up / ha-failover / ha-down / ha-status)

What a site runs in production, on one host: Debian 12's `etcd-server` (3.4, one
member) and `patroni` (3.0.2) running two PostgreSQL 15 nodes (Debian's binaries in
/usr/lib/postgresql/15/bin) on loopback ports of their own, apart from the system
cluster on 5432, with `synchronous_mode: true` and `synchronous_commit = on`: a commit
is acknowledged only once the standby has it on disk, so a crash of the primary loses
no acknowledged write. Everything lives under var/ha/ (GPUCREDIT_HA_DIR): etcd's data,
each node's data directory (owned by postgres, which refuses to run as root), the
Patroni configurations, the logs, and `database.url`, the cluster's multi-host URL
(`target_session_attrs=read-write`: a client connects to whichever node is primary).

`up` starts a *supervisor* (`python -m slurmbox.ha _supervise`, detached, it outlives
the command): a child subreaper (the container's PID 1 reaps no orphans) that runs etcd
and both Patroni nodes as its children. Run again, `up` asks it (SIGUSR1) to start any
node that is down -- a crashed leader comes back as a standby (pg_rewind) -- and waits
until there is a leader and a synchronous standby again. `failover` crashes the leader
as a power loss would: SIGKILL of its Patroni, its postmaster and every backend together,
all stopped first (killing the postmaster alone only makes Patroni restart it in place),
then waits until the standby is the read-write leader and prints the timings as JSON.
`down` stops the supervisor, which stops everything; `--wipe` also removes var/ha.

Root only (it starts processes as postgres); stdlib only, so it runs under any python3.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HA_DIR = Path(os.environ.get("GPUCREDIT_HA_DIR", str(REPO / "var" / "ha")))
PG_BIN = Path("/usr/lib/postgresql/15/bin")
PATRONI = "/usr/bin/patroni"
ETCD = "/usr/bin/etcd"
PACKAGES = ("patroni", "etcd-server")
SCOPE = "gpucredit-ha"
DATABASE = "gpucredit"
ETCD_CLIENT_PORT = 12379
ETCD_PEER_PORT = 12380
# Patroni's timing: the leader key lives `ttl` seconds and is renewed every `loop_wait`;
# a crashed leader's key expires within ttl, then the synchronous standby promotes.
# (loop_wait + 2 × retry_timeout must not exceed ttl.)
TTL_SECONDS = 10
LOOP_WAIT_SECONDS = 2
RETRY_TIMEOUT_SECONDS = 4
UP_TIMEOUT_SECONDS = 120.0
FAILOVER_TIMEOUT_SECONDS = 60.0
_PR_SET_CHILD_SUBREAPER = 36


class HAError(Exception):
    """The HA box failed to do what it was asked; the message says what and where to look."""


@dataclass(frozen=True)
class Node:
    name: str
    pg_port: int
    api_port: int

    @property
    def dir(self) -> Path:
        return HA_DIR / self.name

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def config(self) -> Path:
        return self.dir / "patroni.yml"

    @property
    def log(self) -> Path:
        return self.dir / "patroni.log"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"


# Below the kernel's ephemeral range (32768-60999): a port in it can be taken at any moment
# as the local end of some client's connection, and a node then fails to bind (seen).
NODES = (Node("node1", 15431, 18431), Node("node2", 15432, 18432))
SUPERVISOR_PID = HA_DIR / "supervisor.pid"
SUPERVISOR_LOG = HA_DIR / "supervisor.log"
STATE = HA_DIR / "state.json"  # the supervisor's children: {"etcd": pid, "node1": pid, ...}
URL_FILE = HA_DIR / "database.url"


def database_url(database: str = DATABASE) -> str:
    """The cluster's multi-host SQLAlchemy URL: psycopg tries the hosts in turn and keeps
    the one that accepts writes; connect_timeout bounds a host that does not answer."""
    hosts = "&".join(f"host=127.0.0.1:{node.pg_port}" for node in NODES)
    return (
        f"postgresql+psycopg://postgres@/{database}?{hosts}&target_session_attrs=read-write&connect_timeout=2"
    )


def installed() -> list[str]:
    """The packages this box needs that are missing (empty: all there)."""
    missing = [p for p, path in zip(PACKAGES, (PATRONI, ETCD), strict=True) if not Path(path).exists()]
    if not (PG_BIN / "postgres").exists():
        missing.append("postgresql-15")
    return missing


# --- configuration -----------------------------------------------------------------


def patroni_config(node: Node) -> dict[str, Any]:
    """One node's Patroni configuration (written as JSON, which YAML reads)."""
    return {
        "scope": SCOPE,
        "namespace": "/gpucredit/",
        "name": node.name,
        "restapi": {"listen": f"127.0.0.1:{node.api_port}", "connect_address": f"127.0.0.1:{node.api_port}"},
        "etcd3": {"hosts": [f"127.0.0.1:{ETCD_CLIENT_PORT}"]},
        "bootstrap": {
            "dcs": {
                "ttl": TTL_SECONDS,
                "loop_wait": LOOP_WAIT_SECONDS,
                "retry_timeout": RETRY_TIMEOUT_SECONDS,
                "maximum_lag_on_failover": 1048576,
                # Promote only the synchronous standby, which has every acknowledged commit.
                "synchronous_mode": True,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {
                        "synchronous_commit": "on",
                        "wal_level": "replica",
                        "hot_standby": "on",
                        "wal_log_hints": "on",
                        "max_wal_senders": 5,
                        "max_replication_slots": 5,
                        "max_connections": 100,
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}, "data-checksums"],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{node.pg_port}",
            "connect_address": f"127.0.0.1:{node.pg_port}",
            "data_dir": str(node.data_dir),
            "bin_dir": str(PG_BIN),
            "pgpass": str(node.dir / "pgpass"),
            "authentication": {
                # Trust on loopback (pg_hba below): a local test cluster, not a secret.
                "superuser": {"username": "postgres", "password": "postgres"},
                "replication": {"username": "replicator", "password": "replicator"},
                "rewind": {"username": "postgres", "password": "postgres"},
            },
            "pg_hba": [
                "local all all trust",
                "host all all 127.0.0.1/32 trust",
                "host replication all 127.0.0.1/32 trust",
            ],
            "parameters": {"unix_socket_directories": str(node.dir), "shared_buffers": "32MB"},
            # A crashed leader rejoins as a standby: pg_rewind, else a fresh copy.
            "remove_data_directory_on_rewind_failure": True,
            "remove_data_directory_on_diverged_timelines": True,
        },
        "watchdog": {"mode": "off"},
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
    }


def _postgres_ids() -> tuple[int, int]:
    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


def _prepare_dirs() -> None:
    uid, gid = _postgres_ids()
    HA_DIR.mkdir(parents=True, exist_ok=True)
    # Patroni and PostgreSQL run as postgres, which must pass through the folders above
    # their own. `var/` is 0700 once the embedded ledger made it (ledger.store.db): let
    # others through (x), never list it; its files keep their own modes (the ledger 0600).
    for folder in (HA_DIR.parent, HA_DIR):
        mode = folder.stat().st_mode
        if not mode & 0o001:
            folder.chmod(mode | 0o001)
    (HA_DIR / "etcd").mkdir(mode=0o700, exist_ok=True)
    for node in NODES:
        node.dir.mkdir(mode=0o700, exist_ok=True)
        os.chown(node.dir, uid, gid)
        node.config.write_text(json.dumps(patroni_config(node), indent=1) + "\n")
        os.chown(node.config, uid, gid)


# --- the supervisor ------------------------------------------------------------------


class _Supervisor:
    def __init__(self) -> None:
        self.children: dict[str, int] = {}
        self.stopping = False
        self.heal = False

    def log(self, message: str) -> None:
        with open(SUPERVISOR_LOG, "a") as out:
            out.write(f"{time.strftime('%H:%M:%S')} {message}\n")

    def _save(self) -> None:
        tmp = STATE.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.children))
        tmp.replace(STATE)

    def start_etcd(self) -> None:
        client = f"http://127.0.0.1:{ETCD_CLIENT_PORT}"
        peer = f"http://127.0.0.1:{ETCD_PEER_PORT}"
        argv = [
            ETCD,
            "--name=ha",
            f"--data-dir={HA_DIR / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=ha={peer}",
            "--logger=zap",
        ]
        with open(HA_DIR / "etcd.log", "ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.children["etcd"] = proc.pid
        self._save()
        deadline = time.monotonic() + 30
        while _http_json(f"{client}/health") is None:
            if time.monotonic() > deadline:
                raise HAError(f"etcd did not answer at {client} within 30 s; see {HA_DIR / 'etcd.log'}")
            time.sleep(0.1)
        self.log(f"etcd up, pid {proc.pid}")

    def start_node(self, node: Node) -> None:
        uid, gid = _postgres_ids()
        with open(node.log, "ab") as out:
            os.chown(node.log, uid, gid)
            proc = subprocess.Popen(
                [PATRONI, str(node.config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the failover kills it whole
                user=uid,
                group=gid,
                extra_groups=[],
                cwd=node.dir,
                env={"PATH": "/usr/bin:/bin", "HOME": str(node.dir), "LANG": "C.UTF-8"},
            )
        self.children[node.name] = proc.pid
        self._save()
        self.log(f"{node.name}: patroni pid {proc.pid}")

    def start_missing(self) -> None:
        for node in NODES:
            pid = self.children.get(node.name)
            if pid is None or not _alive(pid):
                self.start_node(node)

    def reap(self) -> None:
        """Reap every child that ended (its own and the orphans it adopted as subreaper)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for name, child in list(self.children.items()):
                if child == pid:
                    self.log(f"{name} (pid {pid}) ended: status {status}")
                    del self.children[name]
                    self._save()

    def stop(self) -> None:
        nodes = [self.children[n.name] for n in NODES if n.name in self.children]
        for pid in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # Patroni stops its PostgreSQL (fast) and leaves
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in nodes) and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.1)
        for node in NODES:
            _kill_node(node, self.children.get(node.name))
        etcd = self.children.get("etcd")  # its pid: reap() forgets it once it has ended
        if etcd is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(etcd, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _alive(etcd) and time.monotonic() < deadline:
                self.reap()
                time.sleep(0.05)
            if _alive(etcd):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(etcd, signal.SIGKILL)
        self.reap()
        self.log("stopped")


def supervise() -> int:
    """The supervisor process's main (`python -m slurmbox.ha _supervise`)."""
    sup = _Supervisor()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sup.log(f"cannot become a child subreaper (errno {ctypes.get_errno()})")

    def on_stop(_signum: int, _frame: Any) -> None:
        sup.stopping = True

    def on_heal(_signum: int, _frame: Any) -> None:
        sup.heal = True

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGUSR1, on_heal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        sup.start_etcd()
        sup.start_missing()
        while not sup.stopping:
            sup.reap()
            if sup.heal:
                sup.heal = False
                sup.start_missing()
            time.sleep(0.1)  # a reaping loop, not a synchronisation: signals interrupt it
    except Exception as error:
        sup.log(f"failed: {error!r}")
        raise
    finally:
        sup.stop()
        with contextlib.suppress(FileNotFoundError):
            SUPERVISOR_PID.unlink()
    return 0


# --- the front end -------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _supervisor_pid() -> int | None:
    try:
        pid = int(SUPERVISOR_PID.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _alive(pid) and "slurmbox.ha" in _cmdline(pid) else None


def _children() -> dict[str, int]:
    try:
        return {k: int(v) for k, v in json.loads(STATE.read_text()).items()}
    except (FileNotFoundError, ValueError):
        return {}


def _postmaster_pid(node: Node) -> int | None:
    """The node's running postmaster, checked against its command line (pids are reused)."""
    try:
        pid = int((node.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (FileNotFoundError, ValueError, PermissionError):
        return None
    return pid if _alive(pid) and str(node.data_dir) in _cmdline(pid) else None


def _kill_node(node: Node, patroni_pid: int | None) -> list[int]:
    """Crash a node as a power loss would: its Patroni, its postmaster and every process
    the postmaster forked (backends, the WAL sender, ...; each a process group of its own,
    PostgreSQL's children call setsid) are first all stopped (SIGSTOP: none runs on, so no
    backend commits or sends WAL after the "power" went), then all SIGKILLed. Killing
    the postmaster alone lets its backends run on for a moment: a COMMIT in flight then
    still completed on the dying primary (seen). Returns the pids killed."""
    patroni = (
        [patroni_pid]
        if patroni_pid is not None and _alive(patroni_pid) and str(node.config) in _cmdline(patroni_pid)
        else []
    )
    postmaster = _postmaster_pid(node)
    stopped: list[int] = []
    for group in patroni:  # Patroni runs in a session and process group of its own
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGSTOP)
    if postmaster is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster, signal.SIGSTOP)  # stopped, it forks nothing more
        stopped = [postmaster, *_children_of(postmaster)]
        for pid in stopped[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
    for group in patroni:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return patroni + stopped


def _children_of(parent: int) -> list[int]:
    """The processes whose parent is `parent` (from /proc)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == parent:
            children.append(int(entry.name))
    return children


def _http_json(url: str, timeout: float = 1.0) -> Any:
    """GET `url`'s JSON body (whatever the status), or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        with contextlib.suppress(ValueError):
            return json.loads(error.read() or b"null")
        return None
    except (OSError, ValueError):
        return None


def cluster() -> dict[str, Any] | None:
    """Patroni's view of the cluster (`GET /cluster` of the first node that answers)."""
    for node in NODES:
        found = _http_json(f"{node.api}/cluster")
        if isinstance(found, dict) and "members" in found:
            return found
    return None


def _roles(view: dict[str, Any] | None) -> dict[str, tuple[str, str]]:
    """name -> (role, state), e.g. {"node1": ("leader", "running"), "node2": ("sync_standby", ...)}."""
    if not view:
        return {}
    return {m["name"]: (m.get("role", ""), m.get("state", "")) for m in view.get("members", [])}


def _healthy(view: dict[str, Any] | None) -> str | None:
    """The leader's name when there is a running leader and a synchronous standby."""
    roles = _roles(view)
    leaders = [n for n, (role, state) in roles.items() if role in ("leader", "master") and state == "running"]
    syncs = [
        n
        for n, (role, state) in roles.items()
        if role == "sync_standby" and state in ("running", "streaming")
    ]
    return leaders[0] if len(leaders) == 1 and syncs else None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"({path} missing)"


def _psql(port: int, sql: str, database: str = "postgres") -> str:
    done = subprocess.run(
        [
            str(PG_BIN / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "postgres",
            "-d",
            database,
            "-tAc",
            sql,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        raise HAError(f"psql on port {port}: {sql}: {done.stderr.strip()}")
    return done.stdout.strip()


def _end_leftovers() -> None:
    """With no supervisor, end any process still running from this box (its command line
    names var/ha: a node or etcd that outlived a killed supervisor), and check the ports."""
    mine = str(HA_DIR) + "/"
    leftovers = [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and int(entry.name) != os.getpid() and mine in _cmdline(int(entry.name))
    ]
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in leftovers) and time.monotonic() < deadline:
        time.sleep(0.05)
    ports = [ETCD_CLIENT_PORT, ETCD_PEER_PORT] + [p for n in NODES for p in (n.pg_port, n.api_port)]
    for port in ports:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as error:
                raise HAError(f"port {port} is taken ({error}); is another HA box up?") from error


def _ready_leader() -> Node | None:
    name = _healthy(cluster())
    node = next((n for n in NODES if n.name == name), None)
    return node if node is not None and _read_write_leader(node) else None


def up(timeout: float = UP_TIMEOUT_SECONDS) -> dict[str, Any]:
    """Start the cluster (or the nodes of it that are down) and wait until it has a leader
    and a synchronous standby; create the database; write database.url."""
    if os.geteuid() != 0:
        raise HAError("the HA box needs root (it runs PostgreSQL as the postgres user)")
    missing = installed()
    if missing:
        raise HAError(f"missing packages: {' '.join(missing)} (apt-get install {' '.join(missing)})")
    started = time.monotonic()
    _prepare_dirs()
    supervisor = _supervisor_pid()
    if supervisor is None:
        _end_leftovers()
        with open(SUPERVISOR_LOG, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "slurmbox.ha", "_supervise"],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        SUPERVISOR_PID.write_text(f"{proc.pid}\n")
        supervisor = proc.pid
    else:
        os.kill(supervisor, signal.SIGUSR1)  # start whatever node is down
    deadline = time.monotonic() + timeout
    # Ready: Patroni names a running leader and a synchronous standby, and the leader's
    # PostgreSQL takes writes (Patroni's view can run a moment ahead of a restart).
    while (leader := _ready_leader()) is None:
        if not _alive(supervisor):
            raise HAError(f"the HA supervisor ended:\n{_tail(SUPERVISOR_LOG)}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {n.log}\n{_tail(n.log)}" for n in NODES)
            raise HAError(
                f"no leader with a synchronous standby within {timeout:.0f} s: {_roles(cluster())}\n{logs}"
            )
        time.sleep(0.2)
    port = leader.pg_port
    if _psql(port, f"SELECT count(*) FROM pg_database WHERE datname = '{DATABASE}'") == "0":
        _psql(port, f'CREATE DATABASE "{DATABASE}"')
    URL_FILE.write_text(database_url() + "\n")
    return {
        "leader": leader.name,
        "roles": {name: role for name, (role, _state) in _roles(cluster()).items()},
        "url": database_url(),
        "url_file": str(URL_FILE),
        "seconds": round(time.monotonic() - started, 1),
    }


def failover(wait: bool = True, timeout: float = FAILOVER_TIMEOUT_SECONDS) -> dict[str, Any]:
    """Crash the leader (SIGKILL of its Patroni and its postmaster together); with `wait`,
    wait until the synchronous standby is the read-write leader."""
    view = cluster()
    leader = _healthy(view)
    if leader is None:
        raise HAError(
            f"no leader with a synchronous standby to fail over to: {_roles(view)}; run `make ha-up` first"
        )
    roles = _roles(view)
    standby = next(name for name, (role, _state) in roles.items() if role == "sync_standby")
    node = next(n for n in NODES if n.name == leader)
    crashed_at = time.time()
    started = time.monotonic()
    killed = _kill_node(node, _children().get(leader))
    if not killed:
        raise HAError(f"found no process of the leader {leader} to kill")
    report: dict[str, Any] = {
        "crashed": leader,
        "killed_pids": killed,
        "crashed_at": crashed_at,
        "standby": standby,
    }
    if not wait:
        return report
    target = next(n for n in NODES if n.name == standby)
    deadline = started + timeout
    while not _read_write_leader(target):
        if time.monotonic() > deadline:
            raise HAError(
                f"{standby} did not become the read-write leader within {timeout:.0f} s:\n{_tail(target.log)}"
            )
        time.sleep(0.1)
    report["leader"] = standby
    report["read_write_after_seconds"] = round(time.monotonic() - started, 2)
    return report


def _read_write_leader(node: Node) -> bool:
    """Whether Patroni calls `node` the running leader and its PostgreSQL takes writes."""
    state = _http_json(f"{node.api}/patroni")
    if not isinstance(state, dict) or state.get("role") not in ("master", "primary"):
        return False
    if state.get("state") != "running":
        return False
    try:
        return _psql(node.pg_port, "SELECT pg_is_in_recovery()") == "f"
    except HAError:  # promoting: not answering yet
        return False


def down(wipe: bool = False) -> dict[str, Any]:
    """Stop everything (the supervisor stops its children); `wipe` removes var/ha too."""
    supervisor = _supervisor_pid()
    if supervisor is not None:
        os.kill(supervisor, signal.SIGTERM)
        deadline = time.monotonic() + 40
        while _alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.1)
    # Whatever outlived it (a killed supervisor): its recorded children, checked by command line.
    children = _children()
    for node in NODES:
        _kill_node(node, children.get(node.name))
    etcd = children.get("etcd")
    if etcd is not None and _alive(etcd) and str(HA_DIR / "etcd") in _cmdline(etcd):
        os.kill(etcd, signal.SIGKILL)
    if wipe and HA_DIR.exists():
        shutil.rmtree(HA_DIR)
    return {"stopped": True, "wiped": wipe}


def status() -> dict[str, Any]:
    view = cluster()
    return {
        "supervisor": _supervisor_pid(),
        "roles": {name: list(rs) for name, rs in _roles(view).items()},
        "leader": _healthy(view),
        "url": URL_FILE.read_text().strip() if URL_FILE.exists() else None,
    }


def main(argv: Sequence[str]) -> int:
    usage = "usage: python -m slurmbox.ha up | failover [--no-wait] | down [--wipe] | status"
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    command, options = argv[0], set(argv[1:])
    try:
        if command == "_supervise":
            return supervise()
        if command == "up" and not options:
            result = up()
        elif command == "failover" and options <= {"--no-wait"}:
            result = failover(wait="--no-wait" not in options)
        elif command == "down" and options <= {"--wipe"}:
            result = down(wipe="--wipe" in options)
        elif command == "status" and not options:
            result = status()
            print(json.dumps(result))
            return 0 if result["leader"] else 1
        else:
            print(usage, file=sys.stderr)
            return 2
    except HAError as error:
        print(f"ha: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
