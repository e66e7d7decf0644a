"""The HA database box for the failover tests (tests/support/ha.py): `make ha-up` once per
module, `make ha-down` after it; every test here is marked `ha`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.ha import HACluster, ha_cluster_up


@pytest.fixture(scope="module")
def ha_cluster() -> Iterator[HACluster]:
    yield from ha_cluster_up()
