"""The Slurm versions a box can run (issue 31): the host's own, and Debian suites in a chroot.

    22.05          the host's Slurm (Debian 12's packages): `slurmbox.box`, ports 6817-6819, 6828, 6838
    24.11          Debian 13 (trixie) in a chroot: `slurmbox.chroot`, ports 7817-7819, 7828, 7838
    26.05          Debian sid in a chroot: ports 8817-8819, 8828, 8838
    22.05-chroot   Debian 12 (bookworm) in a chroot, ports 5817-...: the host's Slurm again, for
                   recording its fixtures without touching the host's box, and for checking that
                   the chroot itself changes nothing

Each chroot box mirrors the host box (slurmbox/box.py): the same slurm.conf, gres.conf and
slurmdbd.conf templates with its own ports and accounting database, so any box can run
beside the host's. What else a version needs is here, one field per difference, and
docs/slurm-facts.md §16 says which version was measured to need it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT", "HOST", "VERSIONS", "SlurmVersion", "get"]

HOST = "22.05"
DEFAULT = HOST


@dataclass(frozen=True)
class SlurmVersion:
    name: str  # what `make slurm-up SLURM=...` takes
    suite: str | None  # the Debian suite debootstrapped; None: the host's own packages
    port_base: int  # slurmctld base+17, slurmdbd base+19, slurmd nodeN base+8+10*N
    # cgroup.conf of the box; None writes none. 24.11 and 26.05's slurmd refuse to start
    # without a cgroup filesystem they can use ("disabled" since 24.05); 22.05
    # autodetects cgroup/v1 on this host and runs without one (docs/slurm-facts.md §8).
    cgroup_conf: str | None = None

    @property
    def chroot(self) -> bool:
        return self.suite is not None

    @property
    def ports(self) -> dict[str, int]:
        """The box's ports: 68xx of the host box becomes <base/100>xx."""
        return {
            "slurmctld": self.port_base + 17,
            "slurmdbd": self.port_base + 19,
            "node1": self.port_base + 18,
            "node2": self.port_base + 28,
            "node3": self.port_base + 38,
            "slurmrestd": self.port_base + 20,  # where the root has slurmrestd and auth/jwt
        }

    @property
    def db_name(self) -> str:
        """The accounting database on the host's MariaDB: one per version, since each
        slurmdbd converts (or refuses) another version's schema."""
        if not self.chroot:
            return "slurm_acct_db"
        return "slurm_acct_db_" + self.name.replace(".", "_").replace("-", "_")


_DISABLED_CGROUPS = (
    "# No cgroup plugin: the box has no cgroup filesystem slurmd may use.\nCgroupPlugin=disabled\n"
)

VERSIONS: dict[str, SlurmVersion] = {
    v.name: v
    for v in (
        SlurmVersion("22.05", None, 6800),
        SlurmVersion("24.11", "trixie", 7800, _DISABLED_CGROUPS),
        SlurmVersion("26.05", "sid", 8800, _DISABLED_CGROUPS),
        SlurmVersion("22.05-chroot", "bookworm", 5800),
    )
}


def get(name: str) -> SlurmVersion:
    """The version called `name`; ValueError naming the known ones otherwise."""
    try:
        return VERSIONS[name]
    except KeyError:
        raise ValueError(f"unknown Slurm version {name!r}; known: {', '.join(VERSIONS)}") from None
