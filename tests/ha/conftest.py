"""The HA database box for the failover tests (tests/support/ha.py): `make ha-up` once per
module, `make ha-down` after it; every test here is marked `ha`."""

from __future__ import annotations

from tests.support.ha import ha_cluster as ha_cluster
