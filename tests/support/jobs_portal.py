"""The jobs backend of a chroot box's portal (tests/slurm/conftest.py's `portal`)."""

from __future__ import annotations

from portal.jobs.rest import RestBackend
from slurmbox.chroot import JWT_KEY, ChrootBox

__all__ = ["rest_backend"]


def rest_backend(box: ChrootBox) -> RestBackend:
    """The chroot box's slurmrestd, and its squeue/sacct for reading."""
    assert box.rest_url is not None, f"the Slurm {box.version.name} box's root has no slurmrestd"
    return RestBackend(box.rest_url, str(box.inside(JWT_KEY)), box.client_dir(), passwd=box.passwd)
