"""The HA ledger database for tests: `make ha-up` once per module, `make ha-failover`
when a test crashes the leader, `make ha-down` at the end (slurmbox/ha.py).

Missing Debian packages (patroni, etcd-server) fail the tests in CI and skip them
elsewhere, naming what to install. One HA box runs per host (its ports are fixed), so
the fixture holds /tmp/gpucredit-ha.lock while it has one up; a cluster an admin
already had up is used and left running, with a database of each test's own.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from slurmbox import ha
from tests.support import REPO
from tests.support.services import require

LOCK = "/tmp/gpucredit-ha.lock"


@dataclass
class HACluster:
    """A running HA cluster: databases on it, and its crash and recovery."""

    was_up: bool
    failovers: list[dict[str, Any]] = field(default_factory=list)
    databases: list[str] = field(default_factory=list)

    def new_database(self) -> str:
        """A fresh database on the cluster; its multi-host URL."""
        name = f"gpucredit_ha_{uuid.uuid4().hex[:10]}"
        self._admin(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return ha.database_url(name)

    def drop_databases(self) -> None:
        for name in self.databases:
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.databases.clear()

    def _admin(self, sql: str) -> None:
        admin = create_engine(ha.database_url("postgres"), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as c:
                c.execute(text(sql))
        finally:
            admin.dispose()

    def failover(self) -> dict[str, Any]:
        """`make ha-failover`: crash the leader, wait for the standby to take writes."""
        report = _make_json("ha-failover")
        self.failovers.append(report)
        return report

    def crash_leader(self) -> dict[str, Any]:
        """Crash the leader and return at once (the test waits for what it needs)."""
        report = ha.failover(wait=False)
        self.failovers.append(report)
        return report

    def recover(self) -> dict[str, Any]:
        """`make ha-up` again: the crashed node rejoins as the synchronous standby."""
        return _make_json("ha-up")

    def leader_port(self) -> int:
        leader = ha.status()["leader"]
        return next(node.pg_port for node in ha.NODES if node.name == leader)


def _make_json(target: str) -> dict[str, Any]:
    done = subprocess.run(
        ["make", "--no-print-directory", target], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"make {target} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    reports = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert reports, done.stdout
    result: dict[str, Any] = json.loads(reports[0])
    return result


@pytest.fixture(scope="module")
def ha_cluster() -> Iterator[HACluster]:
    """The HA box for one test module: `make ha-up` once, `make ha-down` after it (a
    cluster that was up already is used and left up). Its tests are marked `ha`."""
    yield from ha_cluster_up()


def ha_cluster_up() -> Iterator[HACluster]:
    """The fixture's body: up once (under the host-wide lock), down at the end."""
    missing = ha.installed()
    require(
        not missing,
        f"the HA database box ({', '.join(missing)})",
        f"apt-get install {' '.join(ha.PACKAGES)} (Debian's Patroni and etcd; PostgreSQL 15's binaries)",
    )
    require(os.geteuid() == 0, "root for the HA database box", "run the HA tests as root")
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        was_up = ha.status()["supervisor"] is not None  # an admin's: used, then left running
        started = time.monotonic()
        cluster = HACluster(was_up=was_up)
        try:
            report = cluster.recover()
            print(f"ha-up: {report['seconds']} s ({time.monotonic() - started:.1f} s with make and init)")
            yield cluster
        finally:
            if was_up:
                cluster.recover()  # as it was found: a leader and its synchronous standby
                cluster.drop_databases()
            else:
                subprocess.run(
                    ["make", "--no-print-directory", "ha-down", "HA_WIPE=1"],
                    cwd=REPO,
                    capture_output=True,
                    timeout=120,
                    check=False,
                )
