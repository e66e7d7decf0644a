"""A real nginx (Debian's nginx-light) in front of a served portal, for tests that meet
the portal as the documented deployment does: TLS at the proxy, the proxy's secret and
the client's address added by it, the sign-on header set by it.

The server block is gpucredit/examples/nginx/gpucredit.conf itself, the file the admin guide ships,
with this machine's ports and paths put in; `sso=True` turns on its single sign-on
lines (`#sso`), with nginx's basic auth standing in for the site's sign-on. nginx
listens on several loopback addresses (127.0.0.2, 127.0.0.3, ...: all loopback on
Linux), so tests can be clients from different addresses.

Needs /usr/sbin/nginx and openssl; without them a test fails under CI and skips
elsewhere (tests.conftest.require).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.support import REPO

SERVER_BLOCK = REPO / "gpucredit" / "examples" / "nginx" / "gpucredit.conf"
NGINX = "/usr/sbin/nginx"
START_SECONDS = 30.0
TEMP_KINDS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
CLIENT_ADDRESSES = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


def missing() -> str | None:
    """What this machine lacks to run nginx here, or None."""
    if not os.access(NGINX, os.X_OK):
        return f"nginx at {NGINX}"
    if shutil.which("openssl") is None:
        return "openssl"
    return None


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (the test's clients trust it)."""
    cert, key = directory / "portal.pem", directory / "portal.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return cert, key


class Nginx:
    """nginx -g 'daemon off;' with its own prefix, config, logs and temp files."""

    def __init__(
        self,
        directory: Path,
        *,
        portal_port: int,
        secret: str,
        sso_users: dict[str, str] | None = None,
    ) -> None:
        self.directory = directory
        self.port = _free_port()
        self.portal_port = portal_port
        self.secret = secret
        self.sso_users = sso_users
        self.process: subprocess.Popen[bytes] | None = None
        self.cert: Path | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> Nginx:
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        self.cert, key = self_signed(d)
        secret_include = d / "gpucredit-proxy-secret.conf"
        secret_include.write_text(f'proxy_set_header X-Gpucredit-Proxy-Secret "{self.secret}";\n')
        secret_include.chmod(0o600)
        block = SERVER_BLOCK.read_text()
        listens = "".join(f"    listen {address}:{self.port} ssl;\n" for address in CLIENT_ADDRESSES)
        replacements = {
            "    listen 443 ssl;\n": listens,
            "/etc/ssl/certs/gpucredit.example.org.pem": str(self.cert),
            "/etc/ssl/private/gpucredit.example.org.key": str(key),
            "http://127.0.0.1:8080": f"http://127.0.0.1:{self.portal_port}",
            "/etc/nginx/gpucredit-proxy-secret.conf": str(secret_include),
            "/etc/nginx/gpucredit.htpasswd": str(d / "htpasswd"),
        }
        for documented, here in replacements.items():
            if documented not in block:
                raise AssertionError(f"{SERVER_BLOCK} no longer has {documented!r}")
            block = block.replace(documented, here)
        if self.sso_users is not None:
            block = block.replace("#sso ", "")
            users = "".join(f"{user}:{{PLAIN}}{password}\n" for user, password in self.sso_users.items())
            (d / "htpasswd").write_text(users)
        (d / "gpucredit.conf").write_text(block)
        temp = d / "temp"
        temp.mkdir(exist_ok=True)
        (d / "nginx.conf").write_text(
            ("user root;\n" if os.geteuid() == 0 else "")
            + f"worker_processes 1;\npid {d / 'nginx.pid'};\nerror_log {d / 'error.log'} info;\n"
            "events { worker_connections 256; }\n"
            "http {\n"
            f"  access_log {d / 'access.log'};\n"
            + "".join(f"  {kind}_temp_path {temp / kind};\n" for kind in TEMP_KINDS)
            + f"  include {d / 'gpucredit.conf'};\n"
            "}\n"
        )
        self.process = subprocess.Popen(
            [
                NGINX,
                "-p",
                str(d),
                "-c",
                str(d / "nginx.conf"),
                "-e",
                str(d / "error.log"),
                "-g",
                "daemon off;",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + START_SECONDS
        while not _listening(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nginx did not start:\n{self.errors()}")
            time.sleep(0.05)
        return self

    def errors(self) -> str:
        log = self.directory / "error.log"
        return log.read_text() if log.exists() else ""

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # graceful: let workers finish
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
