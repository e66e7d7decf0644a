"""/healthz while logins are sprayed at the portal from one address (issue 27, P5).

`gpucredit serve` (one waitress process, its default 8 threads) on an embedded SQLite
ledger with a few portal logins. One client measures GET /healthz, one request at a
time on its own keep-alive connection: first with the portal idle, then while 16
threads in another process, all from one address, each post logins as fast as they are
answered, every one a new user name with a wrong password (the spray that once took
/healthz from ~5 ms to ~1 s: every try was an argon2 check, ~64 MiB and a core for tens
of milliseconds, and the limit counted per user name only).

Arms:
- `nginx`: the documented deployment, gpucredit/examples/nginx/gpucredit.conf in front (Debian's
  nginx-light, TLS): nginx passes at most 60 logins a minute from one address, the
  portal's own limits stand behind it. /healthz is measured through nginx too.
- `portal`: the portal alone, its defaults. Failed logins are limited per client address
  (30 a minute) and per user name and address (10); a refused try costs no argon2 check;
  at most two checks run at once.
- `slots only`: the portal alone with the per-address limit raised out of reach (as if
  the spray came from ever new addresses), so every try reaches the password check:
  only the two argon2 slots keep the other threads free.

It prints /healthz p50/p99 for each arm, the spray's answers by status, and the ratio
of the p99 under spray to the idle p99 (goal <= 2) for the deployment and the portal.

    .venv/bin/python -m bench.portal_logins [--requests 400] [--sprayers 16]
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.goals import percentile, report
from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade

GPUCREDIT = str(Path(sys.executable).parent / "gpucredit")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STARTUP_SECONDS = 90.0
PASSWORD = "correct horse battery"
SPRAY_LEAD_SECONDS = 6.0  # the child imports, then bursts; measure the steady spray
PROXY_SECRET = "bench-" + "0123456789abcdef" * 4
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
Connect = Callable[[], http.client.HTTPConnection]


def seed(database: Path) -> None:
    from portal.auth import hash_password

    engine = make_engine(f"sqlite:///{database}")
    upgrade(engine)
    with make_sessionmaker(engine)() as s, s.begin():
        api.create_account(s, "physics")
        for user in ("alice", "bob", "carol"):
            api.add_member(s, user, "physics")
            api.set_portal_user(s, user, password_hash=hash_password(PASSWORD))
    engine.dispose()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serve(workdir: Path, database: Path, portal: dict[str, Any]) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    secret = workdir / "proxy-secret"
    secret.write_text(PROXY_SECRET + "\n")
    secret.chmod(0o600)
    config = workdir / "gpucredit.toml"
    settings = {
        "secret_key_file": str(workdir / "key"),
        "metrics_port": 0,
        "trusted_proxies": ["127.0.0.1"],
        "proxy_secret_file": str(secret),
        **portal,
    }
    lines = [f'[database]\nurl = "sqlite:///{database}"\n\n[portal]']
    lines += [f"{key} = {_toml(value)}" for key, value in settings.items()]
    config.write_text("\n".join(lines) + "\n")
    process = subprocess.Popen(
        [GPUCREDIT, "serve", "--host", "127.0.0.1", "--port", str(port)],
        env={"GPUCREDIT_CONFIG": str(config), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + STARTUP_SECONDS
    assert process.stdout is not None
    for line in process.stdout:
        if "Serving on http://" in line or time.monotonic() > deadline:
            break
    output = process.stdout
    threading.Thread(target=lambda: [None for _ in output], daemon=True).start()  # keep draining
    return process, port


def _toml(value: Any) -> str:
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return f'"{value}"'


def connector(url: str, cafile: str | None) -> Connect:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=cafile)
        return lambda: http.client.HTTPSConnection("127.0.0.1", parts.port, timeout=60, context=context)
    return lambda: http.client.HTTPConnection("127.0.0.1", parts.port, timeout=60)


def healthz_latencies(connect: Connect, count: int) -> list[float]:
    connection = connect()
    seconds = []
    for _ in range(count):
        started = time.perf_counter()
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        answer.read()
        seconds.append(time.perf_counter() - started)
        if answer.status != 200:
            raise RuntimeError(f"/healthz answered {answer.status}")
    connection.close()
    return seconds


def _spray_thread(connect: Connect, first: int, stop: Any, answers: Counter[int]) -> None:
    """Post logins with new names and wrong passwords until `stop`."""
    connection = connect()
    connection.request("GET", "/login")
    page = connection.getresponse()
    body = page.read().decode()
    cookie = (page.getheader("Set-Cookie") or "").split(";")[0]
    token = _CSRF.search(body)
    if token is None:
        raise RuntimeError(f"no CSRF token on /login ({page.status})")
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie}
    for n in range(first, first + 10_000_000):
        if stop.is_set():
            break
        form = urllib.parse.urlencode(
            {"username": f"sprayed{n}", "password": "guess", "csrf_token": token.group(1)}
        )
        connection.request("POST", "/login", body=form, headers=headers)
        answer = connection.getresponse()
        answer.read()
        answers[answer.status] += 1
        if (answer.getheader("Connection") or "").lower() == "close":
            connection.close()
            connection = connect()
    connection.close()


def sprayer(url: str, cafile: str | None, threads: int, stop: Any, results: Any, niceness: int) -> None:
    """The attacker: its own process (the client measuring /healthz shares no
    interpreter with it), `threads` threads, one address (127.0.0.1)."""
    os.nice(niceness)
    connect = connector(url, cafile)
    answers: Counter[int] = Counter()
    workers = [
        threading.Thread(target=_spray_thread, args=(connect, i * 10_000_000, stop, answers), daemon=True)
        for i in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    results.put(dict(answers))


@dataclass
class Run:
    """Who the CPU time of one measurement went to."""

    parties: dict[str, list[int]]  # name -> pids

    def seconds(self) -> dict[str, float]:
        return {name: sum(_cpu_seconds(pid) for pid in pids) for name, pids in self.parties.items()}


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def measure(
    name: str,
    url: str,
    cafile: str | None,
    requests: int,
    sprayers: int,
    servers: dict[str, list[int]],
    niceness: int,
) -> tuple[float, float]:
    """(idle p99, p99 under spray) of /healthz at `url`, in seconds."""
    connect = connector(url, cafile)
    healthz_latencies(connect, 50)  # warm: imports, the first connections
    idle = healthz_latencies(connect, requests)
    spawn = multiprocessing.get_context("spawn")
    stop, results = spawn.Event(), spawn.Queue()
    attacker = spawn.Process(target=sprayer, args=(url, cafile, sprayers, stop, results, niceness))
    attacker.start()
    time.sleep(SPRAY_LEAD_SECONDS)  # the spray under way, past its first burst
    assert attacker.pid is not None
    run = Run({**servers, "attacker": [attacker.pid], "measuring client": [os.getpid()]})
    before = run.seconds()
    started = time.perf_counter()
    loaded = healthz_latencies(connect, requests)
    seconds = time.perf_counter() - started
    used = {party: cpu - before[party] for party, cpu in run.seconds().items()}
    stop.set()
    answers: dict[int, int] = results.get(timeout=120)
    attacker.join(timeout=60)
    print(
        f"{name:<10}  /healthz idle {_ms(idle)}  | spray {_ms(loaded)}"
        f"  | {sum(answers.values())} logins ({seconds:.1f} s measured): "
        + ", ".join(f"{status} x{count}" for status, count in sorted(answers.items())),
        flush=True,
    )
    print(
        f"{'':<10}  CPU while measured ({seconds:.1f} s x {os.cpu_count()} cores): "
        + ", ".join(f"{party} {cpu:.1f} s" for party, cpu in used.items()),
        flush=True,
    )
    return percentile(idle, 0.99), percentile(loaded, 0.99)


def _ms(seconds: list[float]) -> str:
    return f"p50 {percentile(seconds, 0.5) * 1000:6.1f} ms, p99 {percentile(seconds, 0.99) * 1000:6.1f} ms"


def arm(
    name: str, portal: dict[str, Any], requests: int, sprayers: int, *, proxy: bool = False, niceness: int = 0
) -> float:
    """p99 under spray / idle p99 for one configuration."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-logins-"))
    nginx = None
    try:
        database = workdir / "ledger.db"
        seed(database)
        process, port = serve(workdir, database, portal)
        try:
            url, cafile = f"http://127.0.0.1:{port}", None
            servers = {"portal": [process.pid]}
            if proxy:
                from tests.support.nginx import (
                    Nginx,  # the tests' runner of gpucredit/examples/nginx/gpucredit.conf
                )

                nginx = Nginx(workdir / "nginx", portal_port=port, secret=PROXY_SECRET).start()
                url, cafile = nginx.url, str(nginx.cert)
                assert nginx.process is not None
                servers["nginx"] = [nginx.process.pid, *_children(nginx.process.pid)]
            idle, loaded = measure(name, url, cafile, requests, sprayers, servers, niceness)
        finally:
            if nginx is not None:
                nginx.stop()
            process.send_signal(signal.SIGINT)
            process.wait(timeout=30)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return loaded / idle


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1000, help="/healthz requests per phase")
    parser.add_argument("--sprayers", type=int, default=16, help="threads spraying logins")
    parser.add_argument(
        "--attacker-nice",
        type=int,
        default=0,
        help="niceness of the spraying process (on a host of few cores the attacker, which is "
        "elsewhere in life, otherwise takes a share of the portal's CPU)",
    )
    args = parser.parse_args()
    from tests.support.nginx import missing

    lacking = missing()
    deployed = None
    if lacking is None:
        deployed = arm("nginx", {}, args.requests, args.sprayers, proxy=True, niceness=args.attacker_nice)
    else:
        print(f"nginx arm skipped: no {lacking} (apt-get install nginx-light openssl)")
    alone = arm("portal", {}, args.requests, args.sprayers, niceness=args.attacker_nice)
    slots = arm(
        "slots only",
        {"login_address_rate_limit": "1000000 per minute"},
        args.requests,
        args.sprayers,
        niceness=args.attacker_nice,
    )
    print(f"(slots only: p99 under spray / idle = {slots:.2f})")
    if deployed is not None:
        report(
            "portal: /healthz p99, 16 threads spraying logins from one address ÷ idle (behind nginx)",
            deployed,
            goal=2.0,
            must=2.0,
            better="<=",
        )
    report(
        "portal: /healthz p99, 16 threads spraying logins from one address ÷ idle (portal alone)",
        alone,
        goal=2.0,
        must=2.0,
        better="<=",
    )


if __name__ == "__main__":
    main()
