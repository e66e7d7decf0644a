"""Each documented install works from the built wheel in a clean venv, as an admin makes
it (docs/admin-guide.md §1, §6, §10): no checkout, no editable install.

The wheel is built as a release would be (`pip wheel . --no-deps` on a clean copy of the
tree, no build/ left from before) and installed with `/usr/bin/python3 -m venv`:

- controller, `gpucredit[postgres]`: every command but the portal's runs (`init` against
  a fresh PostgreSQL database, the worked example's first steps, `slurm config`,
  `example`), and a portal command or the agent says in one line which extra it needs;
- portal host, `gpucredit[postgres,portal]`: `gpucredit serve` from the wheel answers
  /healthz with the newest migration and renders every page, logged in as a PI and as an
  admin, with its templates and stylesheet;
- GPU node, `gpucredit[nvml]`: the agent, on the fake NVML, with a config that names no
  database, sends its samples through MUNGE (a munged of the test's own) to the
  controller's `gpucredit daemon`, which writes them.

Needs pip's access to PyPI (or its cache), PostgreSQL and munged: a missing one FAILS
under CI and skips elsewhere. It takes a few minutes (marker `install`).
"""

from __future__ import annotations

import getpass
import http.cookiejar
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.support import REPO
from tests.support.munged import munged
from tests.support.served import Server, free_port
from tests.support.services import PG_ADMIN_URL, pg_admin, pg_database_url, require

pytestmark = pytest.mark.install

HEAD_REVISION = max(
    path.name.split("_")[0] for path in (REPO / "ledger" / "store" / "migrations" / "versions").glob("0*.py")
)
# What a clean copy of the tree leaves out: what a build or a run leaves behind.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".*_cache", "var", ".hypothesis"
)
TIMES: dict[str, float] = {}  # printed at the end: how long each step took


def python_for_venvs() -> str:
    """The guide's interpreter: /usr/bin/python3 when it can make venvs, else this one."""
    probe = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 11))"],
        capture_output=True,
        check=False,
    )
    return "/usr/bin/python3" if probe.returncode == 0 else sys.executable


def timed(what: str, argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False, cwd=cwd)
    TIMES[what] = time.monotonic() - began
    return done


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="gpucredit-install-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
    print("\ninstall test times: " + ", ".join(f"{what} {seconds:.1f} s" for what, seconds in TIMES.items()))


@pytest.fixture(scope="module")
def wheel(workdir: Path) -> Path:
    source = workdir / "src"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    done = timed(
        "pip wheel",
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            ".",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(workdir / "dist"),
        ],
        cwd=source,
    )
    if done.returncode != 0:  # setuptools in this interpreter too old or missing: isolate
        done = timed(
            "pip wheel",
            [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-w", str(workdir / "dist")],
            cwd=source,
        )
    require(done.returncode == 0, "pip wheel (setuptools, or PyPI to fetch it)", done.stderr[-2000:])
    (built,) = (workdir / "dist").glob("gpucredit-*.whl")
    print(f"\nwheel {built.name}: {built.stat().st_size / 1024:.0f} KiB")
    return built


def make_venv(workdir: Path, wheel: Path, name: str, extras: str) -> Path:
    venv = workdir / name
    made = timed(f"venv {name}", [python_for_venvs(), "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    target = f"{wheel}[{extras}]" if extras else str(wheel)
    done = timed(f"pip install {name} [{extras}]", [str(venv / "bin" / "pip"), "install", "-q", target])
    require(done.returncode == 0, f"pip install {target} (PyPI, or pip's cache)", done.stderr[-2000:])
    return venv / "bin"


@pytest.fixture(scope="module")
def controller(workdir: Path, wheel: Path) -> Path:
    return make_venv(workdir, wheel, "controller", "postgres")


@pytest.fixture(scope="module")
def portal_host(workdir: Path, wheel: Path) -> Path:
    return make_venv(workdir, wheel, "portal-host", "postgres,portal")


@pytest.fixture(scope="module")
def gpu_node(workdir: Path, wheel: Path) -> Path:
    return make_venv(workdir, wheel, "gpu-node", "nvml")


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database: `gpucredit init` makes the schema."""
    admin = pg_admin()
    require(admin is not None, "PostgreSQL at " + PG_ADMIN_URL, "start it or set GPUCREDIT_TEST_PG_URL")
    assert admin is not None
    name = f"gpucredit_install_{uuid.uuid4().hex[:10]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield pg_database_url(name)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def config(workdir: Path, database: str) -> Path:
    """The controller's /etc/gpucredit/gpucredit.toml: the example, with this database."""
    path = workdir / "gpucredit.toml"
    path.write_text(f'[database]\nurl = "{database}"\n')
    return path


def gpucredit(bin_dir: Path, *args: str, config: Path | None = None, stdin: str | None = None, **env: str):
    environ = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), **env}
    if config is not None:
        environ["GPUCREDIT_CONFIG"] = str(config)
    return subprocess.run(
        [str(bin_dir / "gpucredit"), *args],
        capture_output=True,
        text=True,
        env=environ,
        input=stdin,
        cwd="/",
        timeout=300,
        check=False,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.args, done.stdout, done.stderr)
    return done.stdout


def test_the_wheel_carries_every_file_a_command_reads(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "portal/templates/base.html",
        "portal/templates/error.html",
        "portal/templates/pages/dashboard.html",
        "portal/templates/admin/prices.html",
        "portal/static/portal.css",
        "job_submit/job_submit.lua",
        f"ledger/store/migrations/versions/{HEAD_REVISION}_" + "",
        "gpucredit/examples/gpucredit.toml",
        "gpucredit/examples/systemd/gpucredit-portal.service",
        "gpucredit/examples/slurm/job_submit.lua",
    ):
        assert any(name.startswith(needed) for name in names), needed
    assert not any(name.startswith(("tests/", "slurmbox/", "bench/")) for name in names)


@pytest.mark.postgres  # the `database` fixture
def test_a_controller_runs_every_documented_command_without_the_portal(
    controller: Path, config: Path, database: str
) -> None:
    assert subprocess.run([str(controller / "python"), "-c", "import flask"], capture_output=True).returncode
    ok(gpucredit(controller, "--help", config=config))
    began = time.monotonic()
    assert ok(gpucredit(controller, "init", config=config)).endswith(f" at revision {HEAD_REVISION}\n")
    TIMES["init"] = time.monotonic() - began
    ok(gpucredit(controller, "account", "create", "physics", config=config))
    ok(gpucredit(controller, "user", "add", "alice", "physics", "--role", "manager", config=config))
    ok(gpucredit(controller, "price", "set", "h100", "3.60", config=config))
    again = gpucredit(controller, "price", "set", "h100", "3.60", config=config)
    assert again.returncode == 0 and "unchanged" in again.stderr
    ok(gpucredit(controller, "topup", "physics", "100", config=config))
    assert ok(gpucredit(controller, "balance", "physics", config=config)).startswith("account physics at ")
    assert "AccountingStoreFlags=job_comment\n" in ok(gpucredit(controller, "slurm", "config", config=config))
    unit = ok(gpucredit(controller, "example", "systemd/gpucredit-daemon.service"))
    assert f"ExecStart={controller / 'gpucredit'} daemon\n" in unit
    pip = controller / "pip"
    for command, extra, module in (
        ("serve", "portal", "flask"),
        ("passwd", "portal", "flask"),
        ("agent", "nvml", "pynvml"),
    ):
        refused = gpucredit(controller, command, *(["alice"] if command == "passwd" else []), config=config)
        assert (refused.returncode, refused.stdout) == (78, ""), refused.stderr
        assert refused.stderr == (
            f"error: missing_extra: gpucredit {command} needs the {extra} extra "
            f"(No module named '{module}'): {pip} install 'gpucredit[{extra}]'\n"
        )
    nope = config.with_name("nope.toml")
    missing = gpucredit(controller, "balance", config=nope)
    assert (missing.returncode, missing.stderr) == (
        2,
        f"error: config_missing: GPUCREDIT_CONFIG names {nope}, which does not exist\n",
    )


@pytest.mark.postgres  # the `database` fixture
def test_a_portal_host_serves_every_page_from_the_wheel(
    controller: Path, portal_host: Path, config: Path, workdir: Path
) -> None:
    ok(gpucredit(controller, "init", config=config))
    for account in ("physics",):
        gpucredit(controller, "account", "create", account, config=config)
    gpucredit(controller, "user", "add", "alice", "physics", "--role", "manager", config=config)
    ok(gpucredit(portal_host, "passwd", "alice", "--password-stdin", config=config, stdin="alice-password\n"))
    ok(
        gpucredit(
            portal_host,
            "passwd",
            "admin",
            "--admin",
            "--password-stdin",
            config=config,
            stdin="admin-password\n",
        )
    )
    state = workdir / "portal-state"  # what systemd's StateDirectory= gives the unit
    state.mkdir(mode=0o750, exist_ok=True)
    port = free_port()
    began = time.monotonic()
    server = Server(
        [str(portal_host / "gpucredit"), "serve", "--host", "127.0.0.1", "--port", str(port)],
        {
            "GPUCREDIT_CONFIG": str(config),
            "STATE_DIRECTORY": str(state),
            "GPUCREDIT_PORTAL_METRICS_PORT": "0",
        },
    ).start()
    TIMES["portal start"] = time.monotonic() - began
    base = f"http://127.0.0.1:{port}"
    try:
        health = json.loads(urllib.request.urlopen(f"{base}/healthz", timeout=30).read())
        assert health == {"status": "ok", "database": "ok", "revision": HEAD_REVISION}
        css = urllib.request.urlopen(f"{base}/static/portal.css", timeout=30)
        assert css.status == 200 and b"{" in css.read()
        assert (state / "portal-secret-key").stat().st_mode & 0o777 == 0o600
        alice = Browser(base)
        assert "<h1>Log in</h1>" in alice.get("/login")
        alice.log_in("alice", "alice-password")
        for path in (
            "/",
            "/accounts/physics",
            "/accounts/physics/jobs",
            "/accounts/physics/usage",
            "/accounts/physics/efficiency",
            "/accounts/physics/topup",
            "/accounts/physics/manage",
            "/jobs",
            "/usage",
            "/quote",
        ):
            page = alice.get(path)
            assert page.startswith("<!doctype html>") and "</html>" in page, path
        assert "physics" in alice.get("/accounts/physics")
        admin = Browser(base)
        admin.log_in("admin", "admin-password")
        for path in (
            "/admin/",
            "/admin/prices",
            "/admin/holds",
            "/admin/audit",
            "/admin/accounts/physics",
            "/admin/payments",
        ):
            page = admin.get(path)
            assert page.startswith("<!doctype html>") and "</html>" in page, path
        missing = admin.get("/no-such-page", expect=404)
        assert "<!doctype html>" in missing  # the error page's template, from the wheel
    finally:
        server.stop()
    assert "TemplateNotFound" not in server.output, server.output


class Browser:
    """Cookies and CSRF, as a browser keeps them."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def get(self, path: str, expect: int = 200) -> str:
        try:
            response = self.opener.open(self.base + path, timeout=30)
        except urllib.error.HTTPError as error:
            assert error.code == expect, (path, error.code, error.read()[:2000])
            return error.read().decode()
        assert response.status == expect, path
        return response.read().decode()

    def log_in(self, user: str, password: str) -> None:
        form = self.get("/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', form)
        assert token is not None
        body = urllib.parse.urlencode({"csrf_token": token.group(1), "username": user, "password": password})
        response = self.opener.open(self.base + "/login", body.encode(), timeout=30)
        assert response.status == 200 and "Log in</h1>" not in response.read().decode(), user


@pytest.mark.postgres  # the `database` fixture
def test_a_gpu_node_sends_its_samples_through_munge_to_the_controller(
    controller: Path, gpu_node: Path, config: Path, database: str, workdir: Path
) -> None:
    ok(gpucredit(controller, "init", config=config))
    port = free_port()
    with munged(workdir / "munge") as munge_socket:
        daemon_config = workdir / "controller.toml"
        daemon_config.write_text(
            config.read_text()
            + f'[daemon]\nsocket = "{workdir / "daemon.sock"}"\nagent_listen = "127.0.0.1:{port}"\n'
            f'munge_socket = "{munge_socket}"\nmetrics_port = 0\n'
            + (f'socket_user = "{getpass.getuser()}"\n' if os.geteuid() else "")
            + f'[slurm]\nbin_dir = "{workdir / "no-slurm"}"\n'
            f'[policy]\noutage_spool_dir = "{workdir / "outage"}"\n'
        )
        log = (workdir / "daemon.log").open("w")
        daemon = subprocess.Popen(
            [str(controller / "gpucredit"), "daemon", "--release-interval", "0"],
            env={"PATH": "/usr/bin:/bin", "GPUCREDIT_CONFIG": str(daemon_config)},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
        said = lambda: (workdir / "daemon.log").read_text()  # noqa: E731
        try:
            deadline = time.monotonic() + 60
            while "taking the agents' GPU usage" not in said():
                assert daemon.poll() is None, said()
                assert time.monotonic() < deadline, said()
                time.sleep(0.1)
            spool = workdir / "spool" / "gpu1"
            spool.mkdir(parents=True)
            (spool / "lab_77_0.json").write_text(
                json.dumps({"cluster": "lab", "job_id": 77, "run": 0, "node": "gpu1", "gpus": {"0": "h100"}})
            )
            node_config = workdir / "node.toml"  # no [database]: the node holds no credentials
            node_config.write_text(
                f'[agent]\nspool_dir = "{workdir / "spool" / "%n"}"\nsend_to = ["127.0.0.1:{port}"]\n'
                f'munge_socket = "{munge_socket}"\n'
            )
            began = time.monotonic()
            sent = ok(
                gpucredit(
                    gpu_node,
                    "agent",
                    "--once",
                    "--node",
                    "gpu1",
                    "--fake-nvml",
                    "h100:2@50",
                    config=node_config,
                )
            )
            TIMES["agent once"] = time.monotonic() - began
            assert json.loads(sent.splitlines()[-1])["rows_written"] == 1
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
            log.close()
    assert "refused" not in said(), said()
    engine = create_engine(database)
    with engine.connect() as c:
        rows = c.execute(
            text("SELECT node, job_id, gres, allocated_gpu_seconds, busy_gpu_seconds FROM gpu_usage")
        ).all()
    engine.dispose()
    assert [tuple(row) for row in rows] == [("gpu1", 77, "h100", 10, 5)]
