"""`python -m slurmbox up|down|status|rootfs [--slurm V]`, `... run [--slurm V] [-u USER] -- CMD...`.

up: start the box (detached; it outlives the command) and gpucredit on it.
down: stop gpucredit's daemon and the box; the box's Slurm state and accounting
database go (job ids restart at 1), gpucredit's ledger and config stay.
status: the box as JSON; exit 1 when it is not up.
run: run CMD against the running box with that version's clients and environment
(GPUCREDIT_CONFIG, gpucredit's venv first on PATH); for a chroot version inside its
root. Exits with CMD's status. -u USER runs it as USER (runuser), e.g. to sbatch as alice.
rootfs: build (or find cached) a chroot version's root filesystem; prints rootfs.json.

--slurm: 22.05 (the default: the host's Slurm, slurmbox.box), 24.11 or 26.05 (Debian
trixie and sid in a chroot, slurmbox.chroot); 22.05-chroot is Debian 12's own in a
chroot. GPUCREDIT_BOX_SLURM sets the default.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from slurmbox import gpucredit_site, versions
from slurmbox.box import LOG_DIR, BoxError, SlurmBox, supervise

USAGE = (
    "usage: python -m slurmbox up|down|status|rootfs [--slurm VERSION]\n"
    "       python -m slurmbox run [--slurm VERSION] [-u USER] -- CMD [ARGS...]\n"
    f"VERSION: {' | '.join(versions.VERSIONS)} (default {versions.DEFAULT})"
)


def _options(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """--slurm V / -u U before `--`; the rest after `--` (or after the options)."""
    options: dict[str, str] = {}
    args = list(argv)
    while args:
        if args[0] == "--":
            return options, args[1:]
        if args[0] in ("--slurm", "-u", "--user") and len(args) >= 2:
            options["user" if args[0] != "--slurm" else "slurm"] = args[1]
            args = args[2:]
        elif args[0].startswith("--slurm="):
            options["slurm"] = args[0].split("=", 1)[1]
            args = args[1:]
        else:
            return options, args
    return options, args


def _host_run(command: Sequence[str], user: str | None) -> None:
    """Exec a command against the host box: its clients, gpucredit's venv and config."""
    env = {
        **os.environ,
        "GPUCREDIT_CONFIG": os.environ.get("GPUCREDIT_CONFIG", str(gpucredit_site.CONFIG)),
        "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin:{os.environ.get('PATH', '')}",
    }
    argv = list(command)
    if user and user != "root":
        argv = ["/usr/sbin/runuser", "-u", user, "--", *argv]
    if Path("/tmp/gpucredit-box-jobs").is_dir():
        os.chdir("/tmp/gpucredit-box-jobs")  # as SlurmBox.run_as: job output lands there
    os.execvpe(argv[0], argv, env)


def main(argv: Sequence[str]) -> int:
    if len(argv) == 2 and argv[0] == "_supervise":
        return supervise(int(argv[1]))
    if argv == ["_cloud_boot"]:
        from slurmbox import box_cloud
        from slurmbox.box import _DAEMON_ENV

        return box_cloud.boot_main(LOG_DIR, _DAEMON_ENV)
    if len(argv) == 3 and argv[0] == "_supervise-chroot":
        from slurmbox import chroot

        return chroot.supervise(argv[1], int(argv[2]))
    if not argv or argv[0] not in ("up", "down", "status", "run", "rootfs"):
        print(USAGE, file=sys.stderr)
        return 2
    verb = argv[0]
    options, rest = _options(argv[1:])
    if (verb == "run") != bool(rest) or ("user" in options and verb != "run"):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        version = versions.get(
            options.get("slurm") or os.environ.get("GPUCREDIT_BOX_SLURM") or versions.DEFAULT
        )
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    try:
        if version.chroot:
            return _chroot_main(verb, version, rest, options.get("user"))
        return _host_main(verb, rest, options.get("user"))
    except BoxError as e:
        print(e, file=sys.stderr)
        return 1


def _host_main(verb: str, command: Sequence[str], user: str | None) -> int:
    box = SlurmBox()
    if verb == "up":
        was_up = box.is_up()
        seconds = box.up(detach=True)
        state = "already up" if was_up else f"up in {seconds:.1f} s"
        print(f"Slurm box {state}; hooks: {box.status()['hooks']}; logs in {LOG_DIR}")
        if box.resolved_hooks() == "gpucredit":
            print("\n".join(gpucredit_site.up(portal=True)))
    elif verb == "down":
        gpucredit_site.down()
        print(f"Slurm box down in {box.down():.1f} s")
    elif verb == "status":
        print(json.dumps(box.status(), indent=1))
        return 0 if box.is_up() else 1
    elif verb == "run":
        if not box.is_up():
            raise BoxError("the Slurm 22.05 box is not up (make slurm-up)")
        _host_run(command, user)
    else:
        raise BoxError("Slurm 22.05 is the host's own: it has no root filesystem to build")
    return 0


def _chroot_main(verb: str, version: versions.SlurmVersion, command: Sequence[str], user: str | None) -> int:
    from slurmbox import rootfs
    from slurmbox.chroot import LOG_DIR as BOX_LOG_DIR
    from slurmbox.chroot import ChrootBox

    box = ChrootBox(version)
    name = f"Slurm {version.name} box (Debian {version.suite})"
    if verb == "up":
        got = box.up(detach=True)
        built = got["rootfs"]
        assert isinstance(built, dict)
        if got["reused"]:
            print(f"{name} already up")
        else:
            how = "cached" if built.get("cached") else f"built in {built.get('build_seconds')} s"
            size = int(built.get("size_bytes") or 0) / 1e6
            print(f"{name} up in {got['seconds']:.1f} s (root filesystem {how}, {size:.0f} MB: {box.root})")
            print(f"hooks: {box.resolved_hooks()}; logs in {box.root}{BOX_LOG_DIR} and {box.run_dir}")
            said = got["said"]
            assert isinstance(said, list)
            print("\n".join(str(line) for line in said))
            print(f"commands in it: python -m slurmbox run --slurm {version.name} [-u alice] -- CMD")
    elif verb == "down":
        print(f"{name} down in {box.down():.1f} s")
    elif verb == "status":
        print(json.dumps(box.status(), indent=1))
        return 0 if box.is_up() else 1
    elif verb == "rootfs":
        try:
            print(json.dumps(rootfs.ensure_rootfs(version), indent=1))
        except rootfs.RootfsError as e:
            raise BoxError(str(e)) from e
    else:
        try:
            box.exec(command, user=user)
        except FileNotFoundError:
            print(f"{command[0]}: command not found in the Slurm {version.name} box", file=sys.stderr)
            return 127
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
