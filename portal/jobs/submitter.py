"""The job submitter: a small root service that runs a user's own `sbatch` / `scancel`
as that user, for the portal's service user only (Slurm 22.05 has no JWT, and
slurmrestd refuses to run as root); on Slurm 24.11 and later, where the portal reaches
slurmrestd, it signs the user's token instead, so the cluster's JWT key never enters
the portal's process.

    gpucredit submitter serve --socket /run/gpucredit/submitter.sock --allow-uid 998
    gpucredit submitter serve ... --jwt-key /etc/slurm/jwt_hs256.key      (tokens too)

It listens on a Unix socket and answers one JSON request per connection (one line in,
one line out). Before reading a byte it asks the kernel who connected (SO_PEERCRED)
and hangs up on any uid but `allow_uid`: the portal, which has authenticated the
user and applied its access rule. So the submitter trusts the portal's word for *which*
user asks, and nothing else: every other field is data, checked here again, and put
into an argv list (never a shell string):

    runuser -u USER -- /usr/bin/env -i PATH=... [NAME=VALUE ...] sbatch --parsable
        --export=ALL -A ACCOUNT --gres=gpu:TYPE:N -t LIMIT [-J NAME] [-c N] [--mem M]
        [--comment=gpucredit:max_cost=C,cloud=yes|no] -D WORKING_DIR   (the script on stdin)
    runuser -u USER -- scancel JOB_ID

`env -i` runs after runuser dropped to the user, so no variable the request names ever
reaches a root process (an LD_PRELOAD for runuser would run as root), and names that
steer sbatch itself (SBATCH_*, SLURM_*) are refused. The job therefore runs as that
Unix user and passes job_submit.lua like any sbatch: the same quote, refusal and hold.
Users with a uid outside `min_uid`-`max_uid` (root, system users, Debian's SlurmUser at
64030, nobody) are refused.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import logging
import os
import pwd
import re
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("gpucredit.submitter")

MAX_REQUEST_BYTES = 1024 * 1024 + 64 * 1024  # the script cap (portal.jobs.spec) and its fields
COMMAND_TIMEOUT = 30.0  # seconds for one sbatch or scancel
PATH = "/usr/local/bin:/usr/bin:/bin"
USER_NAME = re.compile(r"^[a-z_][a-z0-9_.\-]{0,31}$")
ACCOUNT_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
GPU_SPEC = re.compile(r"^[a-z0-9_\-]{1,32}:[0-9]{1,3}$")
TIME_LIMIT = re.compile(r"^([0-9]{1,3}-)?[0-9]{1,2}:[0-9]{2}:[0-9]{2}$")
JOB_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
MAX_COST = re.compile(r"^[0-9]{1,13}(\.[0-9]{1,6})?$")
MEMORY = re.compile(r"^[0-9]{1,9}[KMGT]?$")
CLOUD = re.compile(r"^(yes|no)$")  # may job_submit route it to a cloud partition
REGION = re.compile(r"^[a-z][a-z0-9-]{0,31}$")  # the only cloud region it may run in
REQUEUE = re.compile(r"^yes$")  # a job with a retry policy: requeueable, for the daemon's retry pass
# Slurm puts the bundle's path into oci.conf's command lines (%b): plain characters only.
CONTAINER = re.compile(r"/[A-Za-z0-9._/\-]{0,4095}")
CONTAINER_WORDS = "must be an absolute path of letters, digits, '.', '_', '-' and '/'"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
TOKEN_SECONDS = 60  # a token for slurmrestd (Slurm 24.11 and later): one request's worth
REFUSED_ENV_PREFIXES = ("SBATCH_", "SLURM_", "LD_", "GPUCREDIT_")
MAX_ENV = 64
MAX_CPUS = 4096

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def user_token(key: bytes, user: str, now: float, lifetime: int = TOKEN_SECONDS) -> str:
    """A JWT slurmctld's auth/jwt accepts as `user`'s word until now + lifetime."""
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    issued = int(now)
    claims = {"iat": issued, "exp": issued + lifetime, "sun": user}
    payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(signature)}"


class BadRequest(ValueError):
    """A request the submitter will not run; `field` names what was wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (the kernel's word)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _user(request: Mapping[str, Any], min_uid: int, max_uid: int) -> pwd.struct_passwd:
    name = request.get("user")
    if not isinstance(name, str) or not USER_NAME.fullmatch(name):
        raise BadRequest("user", "is not a user name")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise BadRequest("user", f"{name} is not a user on this host") from None
    if not min_uid <= entry.pw_uid <= max_uid:
        raise BadRequest("user", f"{name} is a system user (uid outside {min_uid}-{max_uid})")
    return entry


def _text(
    spec: Mapping[str, Any], name: str, pattern: re.Pattern[str], *, required: bool = False
) -> str | None:
    value = spec.get(name)
    if value is None:
        if required:
            raise BadRequest(name, "is required")
        return None
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise BadRequest(name, f"{value!r} is not accepted")
    return value


def sbatch_options(spec: Mapping[str, Any]) -> list[str]:
    """sbatch's options for `spec`, checked field by field: the one builder of them, for
    the argv run here and for the command line the portal shows (portal.jobs.spec)."""
    account = _text(spec, "account", ACCOUNT_NAME, required=True)
    gpus = _text(spec, "gpus", GPU_SPEC, required=True)
    limit = _text(spec, "time_limit", TIME_LIMIT, required=True)
    name = _text(spec, "name", JOB_NAME)
    memory = _text(spec, "memory", MEMORY)
    max_cost = _text(spec, "max_cost", MAX_COST)
    cloud = _text(spec, "cloud", CLOUD)
    region = _text(spec, "region", REGION)
    requeue = _text(spec, "requeue", REQUEUE)
    cpus = spec.get("cpus")
    if cpus is not None and (
        not isinstance(cpus, int) or isinstance(cpus, bool) or not 1 <= cpus <= MAX_CPUS
    ):
        raise BadRequest("cpus", f"must be a whole number 1..{MAX_CPUS}")
    options = ["-A", str(account), f"--gres=gpu:{gpus}", "-t", str(limit)]
    if name is not None:
        options += ["-J", name]
    if cpus is not None:
        options += ["-c", str(cpus)]
    if memory is not None:
        options += ["--mem", memory]
    if requeue == "yes":
        options += ["--requeue"]
    container = spec.get("container")
    if container is not None:
        if not isinstance(container, str) or not CONTAINER.fullmatch(container):
            raise BadRequest("container", CONTAINER_WORDS)
        options += [f"--container={container}"]
    comment = directive_comment(max_cost, cloud, region)
    if comment is not None:
        options += [f"--comment={comment}"]
    return options


def _absolute(path: str) -> bool:
    return os.path.isabs(path) and "\0" not in path and "\n" not in path and len(path) <= 4096


def directive_comment(max_cost: str | None, cloud: str | None, region: str | None = None) -> str | None:
    """The job comment with job_submit's directives (slurmtext.comment_directives), one word."""
    pairs = (("max_cost", max_cost), ("cloud", cloud), ("region", region))
    directives = [f"{key}={value}" for key, value in pairs if value]
    return f"gpucredit:{','.join(directives)}" if directives else None


def sbatch_argv(spec: Mapping[str, Any], user: pwd.struct_passwd, sbatch: str = "sbatch") -> list[str]:
    """The argv that submits `spec` as `user` (checked field by field)."""
    options = sbatch_options(spec)
    working_dir = spec.get("working_dir") or user.pw_dir
    if not isinstance(working_dir, str) or not _absolute(working_dir):
        raise BadRequest("working_dir", "must be an absolute path")
    environment = spec.get("environment") or {}
    if not isinstance(environment, dict) or len(environment) > MAX_ENV:
        raise BadRequest("environment", f"must be an object of at most {MAX_ENV} variables")
    assignments = []
    for key, value in sorted(environment.items()):
        if not ENV_NAME.fullmatch(key) or key.startswith(REFUSED_ENV_PREFIXES):
            raise BadRequest("environment", f"{key!r} may not be set")
        if not isinstance(value, str) or "\0" in value:
            raise BadRequest("environment", f"{key} must be a string without NUL")
        assignments.append(f"{key}={value}")
    argv = ["/usr/sbin/runuser", "-u", user.pw_name, "--", "/usr/bin/env", "-i", f"PATH={PATH}"]
    argv += [f"HOME={user.pw_dir}", f"USER={user.pw_name}", *assignments]
    return [*argv, sbatch, "--parsable", "--export=ALL", *options, "-D", working_dir]


def _readable_dir(user: pwd.struct_passwd, path: str, run: Runner) -> bool:
    """Whether `user` (not root) can enter and read `path`: asked as the user."""
    check = [
        "/usr/sbin/runuser",
        "-u",
        user.pw_name,
        "--",
        "/usr/bin/test",
        "-d",
        path,
        "-a",
        "-r",
        path,
        "-a",
        "-x",
        path,
    ]
    return run(check, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, cwd="/").returncode == 0


class Submitter:
    """Answers requests (already read from an allowed peer) by running Slurm as the user."""

    def __init__(
        self,
        *,
        min_uid: int = 1000,
        max_uid: int = 59999,
        bin_dir: str = "/usr/bin",
        run: Runner = subprocess.run,
        jwt_key: str | None = None,
        slurm_user: str = "slurm",
    ) -> None:
        self.min_uid = min_uid
        self.max_uid = max_uid
        self.bin_dir = bin_dir
        self.run = run
        self.jwt_key = jwt_key
        self.slurm_user = slurm_user  # slurm.conf's SlurmUser: may act as anyone through slurmrestd

    def answer(self, request: Mapping[str, Any]) -> dict[str, Any]:
        try:
            op = request.get("op")
            user = _user(request, self.min_uid, self.max_uid)
            if op == "submit":
                return self._submit(request, user)
            if op == "cancel":
                return self._cancel(request, user)
            if op == "token":
                return self._token(user)
            raise BadRequest("op", f"{op!r} is not submit, cancel or token")
        except BadRequest as error:
            return {"ok": False, "error": "invalid_input", "field": error.field, "message": error.message}

    def _token(self, user: pwd.struct_passwd) -> dict[str, Any]:
        """A token slurmrestd takes as `user`'s, for TOKEN_SECONDS: the key stays here."""
        if self.jwt_key is None:
            raise BadRequest("op", "this submitter signs no tokens (serve it with --jwt-key)")
        if user.pw_name == self.slurm_user:  # whatever its uid: a site's may be in the range
            raise BadRequest("user", f"{user.pw_name} is SlurmUser: no token for it")
        try:
            with open(self.jwt_key, "rb") as key:  # read each time: a rotated key is used at once
                token = user_token(key.read(), user.pw_name, time.time())
        except OSError as error:
            log.error("cannot read the JWT key %s: %s", self.jwt_key, error)
            return {
                "ok": False,
                "error": "no_key",
                "message": f"the submitter cannot read its JWT key: {error}",
            }
        log.info("token for %s", user.pw_name)
        return {"ok": True, "token": token}

    def _submit(self, request: Mapping[str, Any], user: pwd.struct_passwd) -> dict[str, Any]:
        spec = request.get("spec")
        script = request.get("script")
        if not isinstance(spec, dict):
            raise BadRequest("spec", "must be an object")
        if not isinstance(script, str) or "\0" in script:
            raise BadRequest("script", "must be text")
        argv = sbatch_argv(spec, user, sbatch=os.path.join(self.bin_dir, "sbatch"))
        working_dir = argv[-1]
        if not _readable_dir(user, working_dir, self.run):
            raise BadRequest("working_dir", f"{user.pw_name} cannot read {working_dir}")
        container = spec.get("container")
        if container is not None and not _readable_dir(user, container, self.run):
            raise BadRequest("container", f"{user.pw_name} cannot read {container}")
        done = self.run(argv, input=script, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, cwd="/")
        log.info("sbatch as %s for %s: exit %s", user.pw_name, spec.get("account"), done.returncode)
        if done.returncode != 0:
            return {"ok": False, "error": "refused", "exit": done.returncode, "stderr": done.stderr}
        job_id = done.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            return {"ok": False, "error": "refused", "exit": 0, "stderr": f"sbatch printed {done.stdout!r}"}
        return {"ok": True, "job_id": int(job_id), "stderr": done.stderr}

    def _cancel(self, request: Mapping[str, Any], user: pwd.struct_passwd) -> dict[str, Any]:
        job_id = request.get("job_id")
        if not isinstance(job_id, int) or isinstance(job_id, bool) or not 1 <= job_id < 2**32:
            raise BadRequest("job_id", "must be a job id")
        argv = [
            "/usr/sbin/runuser",
            "-u",
            user.pw_name,
            "--",
            os.path.join(self.bin_dir, "scancel"),
            str(job_id),
        ]
        done = self.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, cwd="/")
        log.info("scancel %s as %s: exit %s", job_id, user.pw_name, done.returncode)
        return {"ok": done.returncode == 0, "exit": done.returncode, "stderr": done.stderr}


def _read_request(conn: socket.socket) -> dict[str, Any]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            raise BadRequest("request", f"is over {MAX_REQUEST_BYTES} bytes")
    try:
        value = json.loads(data)
    except ValueError:
        raise BadRequest("request", "is not one JSON object") from None
    if not isinstance(value, dict):
        raise BadRequest("request", "is not one JSON object")
    return value


def handle(conn: socket.socket, submitter: Submitter, allow_uid: int) -> None:
    """One connection: refused unless the peer is `allow_uid`, then one request."""
    with conn:
        conn.settimeout(COMMAND_TIMEOUT)
        uid = peer_uid(conn)
        if uid != allow_uid:
            log.warning("refused a connection from uid %s (only uid %s may ask)", uid, allow_uid)
            conn.sendall(b'{"ok": false, "error": "forbidden", "message": "only the portal may ask"}\n')
            return
        try:
            answer = submitter.answer(_read_request(conn))
        except BadRequest as error:
            answer = {"ok": False, "error": "invalid_input", "field": error.field, "message": error.message}
        except subprocess.TimeoutExpired:
            answer = {
                "ok": False,
                "error": "timeout",
                "message": f"Slurm did not answer in {COMMAND_TIMEOUT} s",
            }
        conn.sendall(json.dumps(answer).encode() + b"\n")


def serve(
    path: str,
    allow_uid: int,
    submitter: Submitter,
    *,
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Listen on `path` (mode 0600 and owned by `allow_uid`, so only it can connect; the
    peer check stands behind that) until `stop` is set."""
    Path(path).unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)
    try:
        server.bind(path)
    finally:
        os.umask(old_mask)
    if os.geteuid() == 0:
        os.chown(path, allow_uid, -1)
    server.listen(16)
    server.settimeout(0.2)
    if ready is not None:
        ready.set()
    try:
        while stop is None or not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=handle, args=(conn, submitter, allow_uid), daemon=True).start()
    finally:
        server.close()
        Path(path).unlink(missing_ok=True)


def ask(path: str, request: Mapping[str, Any], timeout: float = COMMAND_TIMEOUT + 5) -> dict[str, Any]:
    """The client side (the portal): one request, its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        # It may answer without reading (a refusal) and close: the answer is still there to read.
        with contextlib.suppress(BrokenPipeError):
            conn.sendall(json.dumps(dict(request)).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    answer: dict[str, Any] = json.loads(data)
    return answer
