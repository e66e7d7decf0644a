"""A chroot Slurm box for the tests of one version: the running box, started (and stopped
after) when it was not up. Only the versions GPUCREDIT_BOX_VERSIONS names ("24.11 26.05")
run: a box needs root, debootstrap and Debian's registry on its first start."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from slurmbox import versions
from slurmbox.chroot import ChrootBox

WANTED = os.environ.get("GPUCREDIT_BOX_VERSIONS", "").split()


@contextmanager
def running_box(name: str) -> Iterator[ChrootBox]:
    if name not in WANTED:
        pytest.skip("set GPUCREDIT_BOX_VERSIONS='24.11 26.05' to run Slurm in their chroot boxes")
    box = ChrootBox(versions.get(name))
    reason = box.cannot_start_reason()
    if reason:
        pytest.fail(reason) if os.environ.get("CI") else pytest.skip(reason)
    was_up = box.is_up()
    box.up()
    try:
        yield box
    finally:
        if not was_up:
            box.down()
