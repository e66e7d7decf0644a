"""Pytest plugin: the `slurm_box` session fixture (the cluster in a box).

Register with `pytest_plugins = ["tests.conftest_slurm"]` in tests/conftest.py.
Tests that use it are marked `@pytest.mark.slurm`. The fixture reuses a box
that is already up (`make slurm-up`) and leaves it running; otherwise it starts
one for the session and stops it at the end. A box that cannot start fails
the test in CI (env CI set) and skips it elsewhere, saying what to install.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from slurmbox import BoxError, SlurmBox


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"Slurm box unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"Slurm box unavailable: {reason}")


@pytest.fixture(scope="session")
def slurm_box() -> Iterator[SlurmBox]:
    box = SlurmBox()
    reused = box.is_up()
    if not reused:
        reason = box.cannot_start_reason()
        if reason:
            _unavailable(reason)
    try:
        box.up()  # reuses a running box (and reinstalls this box's hooks)
    except BoxError as e:
        _unavailable(str(e))
    try:
        yield box
    finally:
        if not reused:
            box.down()
