"""Slurm's OCI containers on the host's box (22.05): oci.conf with rootless runc, and a
busybox bundle per user, so `sbatch --container=BUNDLE` (and the jobs API's
`container`) runs a real container with no network.

Rootless runc maps only its caller's uid into the container, and Slurm (22.05's
slurmstepd, container.c) passes the bundle's config.json through with its own mounts
and args but no uid mappings; so a bundle is its user's, made as that user with
`runc spec --rootless` (Slurm's containers page says the same). crun, Debian's other
runtime, refuses this host's hybrid cgroups ("cgroups in hybrid mode not supported").
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

RUNC = "/usr/bin/runc"
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


def missing() -> str | None:
    """Why the box runs no containers, or None."""
    absent = [path for path in (RUNC, BUSYBOX) if not os.access(path, os.X_OK)]
    if absent:
        return f"no {' or '.join(absent)}: apt-get install -y --no-install-recommends runc busybox-static"
    return None


def prepare(etc_dir: Path, bundles: Path, users: Iterable[str]) -> str:
    """oci.conf in `etc_dir` and a busybox bundle for each user under `bundles` (kept
    once made); what to log. Without runc or busybox, no oci.conf: Slurm refuses
    --container then."""
    oci_conf = etc_dir / "oci.conf"
    why = missing()
    if why is not None:
        oci_conf.unlink(missing_ok=True)
        return f"containers: off ({why})"
    oci_conf.write_text(OCI_CONF)
    bundles.mkdir(parents=True, exist_ok=True)
    bundles.chmod(0o755)
    for user in users:
        _bundle(bundles / user, user)
    return f"containers: rootless runc; a busybox bundle per user in {bundles}/USER"


def _bundle(bundle: Path, user: str) -> None:
    if (bundle / "config.json").exists():
        return
    shutil.rmtree(bundle, ignore_errors=True)
    bin_dir = bundle / "rootfs" / "bin"
    bin_dir.mkdir(parents=True)
    (bundle / "rootfs" / "tmp").mkdir()
    (bundle / "rootfs" / "tmp").chmod(0o1777)
    shutil.copy2(BUSYBOX, bin_dir / "busybox")
    for command in COMMANDS:
        (bin_dir / command).symlink_to("busybox")
    entry = pwd.getpwnam(user)
    for path in [bundle, *bundle.rglob("*")]:
        os.lchown(path, entry.pw_uid, entry.pw_gid)
    # runc writes the uid mappings of whoever runs it: the user's own.
    subprocess.run(
        ["/usr/sbin/runuser", "-u", user, "--", RUNC, "spec", "--rootless"],
        cwd=bundle,
        check=True,
        capture_output=True,
        timeout=30,
    )
