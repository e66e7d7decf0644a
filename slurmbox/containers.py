"""Slurm's OCI containers on the boxes: oci.conf with rootless runc, and a busybox bundle
per user, so `sbatch --container=BUNDLE` (and the jobs API's `container`) runs a real
container with no network. The chroot boxes' roots have runc and busybox-static too
(rootfs.PACKAGES), and their root is the `/` of their mount namespace, not a chroot's:
the kernel gives a user namespace to no chrooted process (rootfs.private_mounts).

Rootless runc maps only its caller's uid into the container, and Slurm (22.05's
slurmstepd, container.c) passes the bundle's config.json through with its own mounts
and args but no uid mappings; so a bundle is its user's, made as that user with
`runc spec --rootless` (Slurm's containers page says the same). crun, Debian's other
runtime, refuses this host's hybrid cgroups ("cgroups in hybrid mode not supported").
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

RUNC = "/usr/bin/runc"
RUNUSER = "/usr/sbin/runuser"
BUSYBOX = "/bin/busybox"  # busybox-static's, statically linked: the rootfs needs nothing else
COMMANDS = ("sh", "echo", "cat", "id", "hostname", "sleep", "ls", "env", "true", "false")
# Slurm's own example for runc with the run operation (containers.html); %n.%u.%j.%s.%t
# names the container after node, user, job, step and task.
OCI_CONF = """\
# The box's containers (slurmbox/containers.py): rootless runc, the run operation.
RunTimeQuery="runc --rootless=true --root=/tmp/ state %n.%u.%j.%s.%t"
RunTimeKill="runc --rootless=true --root=/tmp/ kill -a %n.%u.%j.%s.%t"
RunTimeDelete="runc --rootless=true --root=/tmp/ delete --force %n.%u.%j.%s.%t"
RunTimeRun="runc --rootless=true --root=/tmp/ run %n.%u.%j.%s.%t -b %b"
"""


def missing(root: Path = Path("/")) -> str | None:
    """Why the box (its files under `root`) runs no containers, or None."""
    absent = [path for path in (RUNC, BUSYBOX) if not os.access(_under(root, path), os.X_OK)]
    if absent:
        return f"no {' or '.join(absent)}: apt-get install -y --no-install-recommends runc busybox-static"
    return None


def _under(root: Path, path: str | Path) -> Path:
    return root / str(path).lstrip("/")


def _host_ids(user: str) -> tuple[int, int]:
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


def _run_here(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def prepare(
    etc_dir: Path,
    bundles: Path,
    users: Iterable[str],
    *,
    root: Path = Path("/"),
    ids: Callable[[str], tuple[int, int]] = _host_ids,
    run: Callable[[list[str]], None] = _run_here,
) -> str:
    """oci.conf in `etc_dir` and a busybox bundle for each user under `bundles` (kept
    once made); what to log. Without runc or busybox, no oci.conf: Slurm refuses
    --container then. A chroot box's paths are its own, its files under `root`; its
    users' ids are its own (`ids`), and `run` runs a command in it."""
    oci_conf = _under(root, etc_dir) / "oci.conf"
    why = missing(root)
    if why is not None:
        oci_conf.unlink(missing_ok=True)
        return f"containers: off ({why})"
    oci_conf.write_text(OCI_CONF)
    _under(root, bundles).mkdir(parents=True, exist_ok=True)
    _under(root, bundles).chmod(0o755)
    for user in users:
        bundle = bundles / user
        if (_under(root, bundle) / "config.json").exists():
            continue
        _fill(_under(root, bundle), _under(root, BUSYBOX), ids(user))
        # runc writes the uid mappings of whoever runs it: the user's own.
        spec = f"{RUNUSER} -u {shlex.quote(user)} -- {RUNC} spec --rootless"
        run(["/bin/sh", "-c", f"cd {shlex.quote(str(bundle))} && exec {spec}"])
    return f"containers: rootless runc; a busybox bundle per user in {bundles}/USER"


def _fill(bundle: Path, busybox: Path, ids: tuple[int, int]) -> None:
    """A bundle's rootfs: busybox and its commands, owned by the bundle's user."""
    shutil.rmtree(bundle, ignore_errors=True)
    bin_dir = bundle / "rootfs" / "bin"
    bin_dir.mkdir(parents=True)
    (bundle / "rootfs" / "tmp").mkdir()
    (bundle / "rootfs" / "tmp").chmod(0o1777)
    shutil.copy2(busybox, bin_dir / "busybox")
    for command in COMMANDS:
        (bin_dir / command).symlink_to("busybox")
    for path in [bundle, *bundle.rglob("*")]:
        os.lchown(path, *ids)
