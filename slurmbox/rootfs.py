"""Root filesystems for the chroot boxes: made with debootstrap, cached, with gpucredit in a venv.

    /var/cache/gpucredit-box/<version>/rootfs        the root (GPUCREDIT_BOX_CACHE moves the cache)
    /var/cache/gpucredit-box/<version>/rootfs.json   what it was built from (its key), when, how long, size
    /var/cache/gpucredit-box/<version>/build.log     debootstrap's and apt's output

A root is rebuilt only when it is missing or its key (suite, variant, package lists)
changed, so a machine that built it once does not build it again. A build goes to
`rootfs.new` and is renamed into place only when complete. debootstrap, and every
later step that needs /proc, /sys or /dev in the root, runs in a private mount
namespace (`unshare -m`), so nothing stays mounted on the host when it ends or fails.
The host's apt sources are never touched: the suite is named to debootstrap only.

gpucredit goes into `/opt/gpucredit/venv` inside the root, made with the suite's own
python3: a wheel built from this checkout (`pip wheel . --no-deps`), its dependencies
from PyPI. It is reinstalled when the checkout's package files change
(`/opt/gpucredit/installed.json` keeps their hash).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from slurmbox.versions import SlurmVersion

__all__ = [
    "CACHE_DIR",
    "HARNESS",
    "OPTIONAL_PACKAGES",
    "PACKAGES",
    "VENV",
    "RootfsError",
    "build_key",
    "copy_harness",
    "ensure_gpucredit",
    "ensure_rootfs",
    "private_mounts",
    "rootfs_dir",
]

CACHE_DIR = Path(os.environ.get("GPUCREDIT_BOX_CACHE", "/var/cache/gpucredit-box"))
MIRROR = os.environ.get("GPUCREDIT_BOX_MIRROR", "http://deb.debian.org/debian")
VARIANT = "minbase"
DEBOOTSTRAP_TRIES = 2
# What the box runs, as in slurmbox.box.PACKAGES less MariaDB (the box uses the host's)
# and the metapackage: the daemons, the clients, munge, lua-socket for job_submit.lua,
# and the suite's python3 with venv for gpucredit. procps: `ps`/`pkill` for whoever debugs.
PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurm-client",
    "slurmdbd",
    "slurm-wlm-mysql-plugin",
    "munge",
    "lua-socket",
    "python3",
    "python3-venv",
    "ca-certificates",
    "procps",
    "runc",  # containers (slurmbox/containers.py): rootless runc and a busybox bundle
    "busybox-static",
)
# Installed when the suite has them (later issues need slurmrestd with auth/jwt).
OPTIONAL_PACKAGES = ("slurmrestd", "slurm-wlm-jwt-plugin")
_KEY_FORMAT = 1  # bump when the build steps change in a way the package lists do not show

VENV = "/opt/gpucredit/venv"
_GPUCREDIT_DIR = "/opt/gpucredit"
# postgres: the e2e ledger is PostgreSQL on the host's 127.0.0.1:5432. portal: the
# `gpucredit` command imports portal.cli (flask) whatever the subcommand, so without it
# even `gpucredit init` fails (ModuleNotFoundError: flask), as it would for an admin who
# installs only 'gpucredit[postgres]' as docs/admin-guide.md says.
_WHEEL_EXTRAS = "postgres,portal"
_REPO = Path(__file__).resolve().parent.parent
# The checkout's files that go into the wheel (setup.cfg [options.packages.find]).
_PACKAGE_DIRS = (
    "gpucredit",
    "ledger",
    "accounting_bridge",
    "slurm_hooks",
    "job_submit",
    "portal",
    "slurmtext",
)
# The box's own code, which the wheel does not carry (it is a root-only test harness, not
# the product): the checkout's slurmbox/ is copied here, and what runs inside the root puts
# this directory on sys.path (chroot._GPUCREDIT_SITE).
HARNESS = f"{_GPUCREDIT_DIR}/harness"
_CHROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
_CLONE_NEWNS = 0x00020000
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18


class RootfsError(RuntimeError):
    """A root filesystem could not be built or prepared; the message says where the log is."""


def rootfs_dir(version: SlurmVersion) -> Path:
    return CACHE_DIR / version.name / "rootfs"


def build_key(version: SlurmVersion) -> dict[str, object]:
    """What a root is built from: a different key rebuilds it."""
    return {
        "format": _KEY_FORMAT,
        "suite": version.suite,
        "variant": VARIANT,
        "packages": sorted(PACKAGES),
        "optional_packages": sorted(OPTIONAL_PACKAGES),
    }


def _read_json(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _du_bytes(path: Path) -> int:
    out = subprocess.run(["du", "-sxb", str(path)], capture_output=True, text=True, check=False).stdout
    return int(out.split()[0]) if out.strip() else 0


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"({path}: {e})"


def _logged(argv: Sequence[str], log: Path, what: str, timeout: float = 1800) -> None:
    """Run argv with output appended to `log`; raise RootfsError with its tail on failure."""
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        try:
            proc = subprocess.run(
                list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout
            )
        except subprocess.TimeoutExpired as e:
            raise RootfsError(f"{what}: timed out after {timeout:.0f} s; see {log}") from e
    if proc.returncode != 0:
        raise RootfsError(f"{what}: exit {proc.returncode}; see {log}:\n{_tail(log)}")


def ensure_rootfs(version: SlurmVersion, log: Path | None = None) -> dict[str, object]:
    """The version's root, built if missing or stale; returns its rootfs.json (plus "cached")."""
    if not version.chroot:
        raise ValueError(f"Slurm {version.name} runs on the host, not in a chroot")
    root = rootfs_dir(version)
    stamp = root.with_name("rootfs.json")
    info = _read_json(stamp)
    if root.is_dir() and info.get("key") == build_key(version):
        return {**info, "cached": True}
    if shutil.which("debootstrap") is None:
        raise RootfsError(
            "debootstrap is missing: apt-get install -y --no-install-recommends debootstrap "
            f"(it builds the Debian {version.suite} root for Slurm {version.name})"
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    log = log or root.with_name("build.log")
    log.write_text(f"building {root} for Slurm {version.name} (Debian {version.suite})\n")
    new = root.with_name("rootfs.new")
    started = time.monotonic()
    # A private mount namespace: debootstrap mounts /proc and /sys in the target and,
    # when it fails, can leave them mounted; here they go with the namespace. Tried
    # twice from scratch: trixie's once stopped at "Tried to extract package, but file
    # already exists" (tzdata) and went through on the next try.
    for attempt in range(DEBOOTSTRAP_TRIES):
        shutil.rmtree(new, ignore_errors=True)
        try:
            _logged(
                [
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "debootstrap",
                    f"--variant={VARIANT}",
                    f"--include={','.join(PACKAGES)}",
                    str(version.suite),
                    str(new),
                    MIRROR,
                ],
                log,
                f"debootstrap {version.suite}",
            )
            break
        except RootfsError:
            if attempt + 1 == DEBOOTSTRAP_TRIES:
                raise
            with log.open("a") as out:
                out.write(f"debootstrap failed (try {attempt + 1} of {DEBOOTSTRAP_TRIES}): again\n")
    # Nothing in the root starts a service when a package is installed into it.
    policy = new / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    _install_optional(new, log)
    _chroot_logged(new, ["apt-get", "clean"], log, "apt-get clean")
    key = new / "etc/munge/munge.key"
    if not key.exists() or key.stat().st_size == 0:
        _chroot_logged(new, ["mungekey", "-c", "-f", "-k", "/etc/munge/munge.key"], log, "mungekey")
        _chroot_logged(new, ["chown", "munge:munge", "/etc/munge/munge.key"], log, "chown munge.key")
        _chroot_logged(new, ["chmod", "0400", "/etc/munge/munge.key"], log, "chmod munge.key")
    seconds = time.monotonic() - started
    versions = subprocess.run(
        [
            "chroot",
            str(new),
            "dpkg-query",
            "-W",
            "-f",
            "${Package} ${Version}\n",
            *PACKAGES,
            *OPTIONAL_PACKAGES,
        ],
        capture_output=True,
        text=True,
        env=_CHROOT_ENV,
        check=False,
    ).stdout
    shutil.rmtree(root, ignore_errors=True)
    os.replace(new, root)
    info = {
        "key": build_key(version),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(seconds, 1),
        "size_bytes": _du_bytes(root),
        "installed": dict(line.split(" ", 1) for line in versions.splitlines() if " " in line),
        "mirror": MIRROR,
    }
    stamp.write_text(json.dumps(info, indent=1) + "\n")
    return {**info, "cached": False}


def _chroot_logged(root: Path, argv: Sequence[str], log: Path, what: str) -> None:
    _logged(
        ["env", "-i", *(f"{k}={v}" for k, v in _CHROOT_ENV.items()), "chroot", str(root), *argv], log, what
    )


def _install_optional(root: Path, log: Path) -> None:
    """apt-get install the OPTIONAL_PACKAGES the suite has (debootstrap left its package lists)."""
    present = []
    for package in OPTIONAL_PACKAGES:
        proc = subprocess.run(
            ["chroot", str(root), "apt-cache", "show", "--no-all-versions", package],
            capture_output=True,
            env=_CHROOT_ENV,
            check=False,
        )
        if proc.returncode == 0 and proc.stdout.strip():
            present.append(package)
    with open(log, "a") as out:
        out.write(f"optional packages in the suite: {' '.join(present) or 'none'}\n")
    if present:
        shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")
        script = (
            "mount -t proc proc {r}/proc && mount --rbind /dev {r}/dev && mount --rbind /sys {r}/sys && "
            "exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "
            "chroot {r} apt-get install -y --no-install-recommends {p}"
        ).format(r=root, p=" ".join(present))
        _logged(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script], log, "apt-get install"
        )


# --------------------------------------------------------------------------- mounts


def private_mounts(root: Path) -> None:
    """Move this process into its own mount namespace, mount /proc, /sys, /dev and a fresh
    /run into `root`, and `root` (with those) over the namespace's `/`. The mounts are
    seen only by this process, its children and whoever enters the namespace
    (`/proc/PID/ns/mnt`); they vanish with the last of them.

    This process keeps the host's view (a process's root is not moved by a mount over
    it); one that enters the namespace (setns) gets `root` as its `/`, and that root is
    the namespace's own, not a chroot's: the kernel gives a user namespace (rootless
    runc's, for `sbatch --container`) to no chrooted process."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise RootfsError(f"unshare(CLONE_NEWNS): errno {ctypes.get_errno()} (needs root)")
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise RootfsError(f"mount --make-rprivate /: errno {ctypes.get_errno()}")
    for argv in (
        ["mount", "-t", "proc", "proc", f"{root}/proc"],
        ["mount", "--rbind", "/sys", f"{root}/sys"],
        ["mount", "--rbind", "/dev", f"{root}/dev"],
        ["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", f"{root}/run"],
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RootfsError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    (root / "run/lock").mkdir(mode=0o1777, exist_ok=True)
    if libc.mount(str(root).encode(), b"/", None, _MS_BIND | _MS_REC, None) != 0:
        raise RootfsError(f"mount --rbind {root} /: errno {ctypes.get_errno()}")
    # Names and TLS as on the host: `localhost` for Slurm, the resolver and the CA bundle
    # the host's pip trusts (a site proxy's CA may be in it) for pip inside the root.
    for name in ("hosts", "resolv.conf"):
        shutil.copyfile(f"/etc/{name}", root / "etc" / name)
    shutil.copyfile(host_ca_bundle(), root / "etc/gpucredit-box-ca.crt")


def host_ca_bundle() -> str:
    """The CA bundle the host's pip uses: PIP_CERT, pip.conf's cert, SSL_CERT_FILE, or Debian's."""
    candidates = [os.environ.get("PIP_CERT"), _pip_conf_cert(), os.environ.get("SSL_CERT_FILE")]
    for path in [*candidates, "/etc/ssl/certs/ca-certificates.crt"]:
        if path and Path(path).is_file():
            return path
    raise RootfsError("no CA bundle on the host for pip inside the root (/etc/ssl/certs/ca-certificates.crt)")


def _pip_conf_cert() -> str | None:
    for conf in (
        "/etc/pip.conf",
        os.path.expanduser("~/.config/pip/pip.conf"),
        os.path.expanduser("~/.pip/pip.conf"),
    ):
        with contextlib.suppress(OSError):
            for line in Path(conf).read_text().splitlines():
                name, sep, value = line.partition("=")
                if sep and name.strip() == "cert":
                    return value.strip()
    return None


# --------------------------------------------------------------------------- gpucredit


def source_hash() -> str:
    """Hash of the checkout's files that go into the wheel (a change reinstalls gpucredit)."""
    digest = hashlib.sha256()
    files = [_REPO / "setup.cfg", _REPO / "pyproject.toml", _REPO / "README.md"]
    for package in _PACKAGE_DIRS:
        files += sorted(
            p for p in (_REPO / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
    for path in files:
        digest.update(str(path.relative_to(_REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def copy_harness(root: Path) -> None:
    """The checkout's slurmbox/ into HARNESS inside `root`, afresh each time (it is small)."""
    target = root / HARNESS.lstrip("/") / "slurmbox"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(_REPO / "slurmbox", target, ignore=shutil.ignore_patterns("__pycache__"))


def ensure_gpucredit(root: Path, log: Path) -> dict[str, object]:
    """gpucredit from this checkout in VENV inside `root` (mounted: see private_mounts).

    Returns {"installed": bool (False when already current), "seconds": ..., "python": ...}.
    """
    started = time.monotonic()
    copy_harness(root)
    want = source_hash()
    stamp = root / _GPUCREDIT_DIR.lstrip("/") / "installed.json"
    venv_python = root / VENV.lstrip("/") / "bin/python"
    current = _read_json(stamp)
    if current.get("source") == want and venv_python.exists():
        return {"installed": False, "seconds": round(time.monotonic() - started, 2), **current}
    wheels = root / _GPUCREDIT_DIR.lstrip("/") / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    # setuptools builds in the checkout's build/ and packs whatever build/lib holds, so a
    # module moved or dropped since an earlier build would ride along: start clean.
    shutil.rmtree(_REPO / "build", ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        # Built by the host's interpreter: the wheel is pure Python, for any 3.11+.
        _logged(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp, str(_REPO)], log, "pip wheel"
        )
        built = sorted(Path(tmp).glob("gpucredit-*.whl"))
        if len(built) != 1:
            raise RootfsError(f"pip wheel made {len(built)} gpucredit wheels in {tmp}; see {log}")
        shutil.copy2(built[0], wheels / built[0].name)
    wheel = f"{_GPUCREDIT_DIR}/wheels/{built[0].name}"
    env = {**_CHROOT_ENV, "PIP_CERT": "/etc/gpucredit-box-ca.crt", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip = f"{VENV}/bin/pip"

    def chroot(*argv: str) -> None:
        _logged(
            ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "chroot", str(root), *argv],
            log,
            " ".join(argv[:3]),
        )

    if not venv_python.exists():
        chroot("python3", "-m", "venv", VENV)
    # The checkout's gpucredit over whatever is there (same version number: force), then
    # whatever dependency is missing, from PyPI.
    chroot(pip, "install", "-q", "--no-deps", "--force-reinstall", wheel)
    chroot(pip, "install", "-q", f"gpucredit[{_WHEEL_EXTRAS}] @ file://{wheel}")
    python = subprocess.run(
        ["chroot", str(root), f"{VENV}/bin/python", "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
        env=_CHROOT_ENV,
        check=False,
    ).stdout.strip()
    info = {"source": want, "wheel": built[0].name, "python": python}
    stamp.write_text(json.dumps(info, indent=1) + "\n")
    return {"installed": True, "seconds": round(time.monotonic() - started, 2), **info}
