"""The box's ledger fails over under running jobs (issue 34; docs/failover.md).

The Slurm box's gpucredit (hooks, job_submit.lua, a daemon) runs on the HA box's
multi-host URL: Patroni, a primary and a synchronous standby (tests/support/ha.py).
Policy `reject`, full holds. With two jobs running, the primary is crashed: one job's
gate opens at once, so it ends and its epilog runs while no node takes writes; a third
job is submitted in that window, so job_submit.lua quotes it from the daemon's snapshot
and its prolog meets the failover; the other running job ends after the new leader
took over. After `gpucredit bridge sacct`, every run is charged exactly once
(`Books.check`: the charge is charge_for(price, ElapsedRaw), one settle and at most
one adjustment each, the account holds nothing and has its credit less exactly those
charges), and `gpucredit audit verify` passes through the multi-host URL.

Run it under the box's lock (`flock /tmp/gpucredit-box.lock ...`); it takes the box and
the HA box, so it is marked `slurm` and `ha`.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from ledger.store.db import make_engine
from ledger.store.schema import upgrade
from ledger.timeutil import utcnow
from slurmbox import ha
from tests.support.cluster import PRICES, Books, Cluster, Gate
from tests.support.ha import HACluster
from tests.support.ha import ha_cluster as ha_cluster


@pytest.fixture(scope="module")
def e2e_ledger_url(ha_cluster: HACluster) -> str:
    """The box's ledger for this module: a fresh database on the HA box (this overrides
    tests/slurm/conftest.py's, so the `cluster` fixture wires the box to it)."""
    url = ha_cluster.new_database()
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    return url


@pytest.fixture(scope="module")
def box(cluster: Cluster) -> Cluster:
    """`cluster` with `policy.epilog_grace_seconds = 0`, so `bridge sacct` settles at once
    a run whose epilog met the failover."""
    cluster.stop_daemon()
    cluster.config_path.write_text(
        cluster.config_path.read_text().replace(
            '[policy]\non_ledger_unreachable = "reject"\n',
            '[policy]\non_ledger_unreachable = "reject"\nepilog_grace_seconds = 0\n',
        )
    )
    assert "epilog_grace_seconds = 0" in cluster.config_path.read_text()
    cluster.box.use_hooks("gpucredit")
    cluster.start_daemon()
    return cluster


class HookLog:
    """The hooks' log lines written since this test began (job ids repeat across the box's
    lives, and the log keeps them all); the log is `@DIR@/hooks.log` of the cluster's config."""

    def __init__(self, cluster: Cluster) -> None:
        self.path = cluster.dir / "hooks.log"
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def lines(self, hook: str, job: int) -> list[str]:
        marker = f"gpucredit[{hook}] job={job} "
        try:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                text = log.read().decode(errors="replace")
        except FileNotFoundError:
            return []
        return [line for line in text.splitlines() if marker in line]


def wait_for(condition, what: str, timeout: float = 90) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout  # a bound on a slow machine, not a measurement
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_jobs_across_a_failover_are_charged_once(box: Cluster, ha_cluster: HACluster) -> None:
    since = utcnow() - timedelta(seconds=2)
    hook_lines = HookLog(box).lines
    account = box.new_account("20")
    across, ending = Gate(box.box), Gate(box.box)
    running = box.box.submit(["-A", account, "--gres=gpu:h100:1", "-t", "2", "--wrap", across.wrap])
    ends = box.box.submit(["-A", account, "--gres=gpu:a100:1", "-t", "2", "--wrap", ending.wrap])
    for job in (running, ends):
        box.box.wait_state(job, "RUNNING", timeout=60)
        wait_for(
            lambda job=job: any("hold " in line for line in hook_lines("prolog-slurmctld", job)), "no hold"
        )
    standby = next(n for n in ha.NODES if n.pg_port != ha_cluster.leader_port())
    crash = ha_cluster.crash_leader()
    crashed_at = time.monotonic()
    ending.open()  # its end and its epilog fall in the failover
    rc, out, err = box.box.sbatch(
        ["--parsable", "-A", account, "--gres=gpu:a100:1", "-t", "1", "--wrap", "sleep 2"]
    )
    submitted_in = time.monotonic() - crashed_at
    assert rc == 0, err  # quoted from the daemon's snapshot while no node takes writes
    assert "gpucredit: ~" in err, err
    started = int(out.strip().split(";")[0])
    wait_for(lambda: ha._read_write_leader(standby), "the standby never took writes")
    leader_after = time.monotonic() - crashed_at
    across.open()
    for job in (running, ends, started):
        box.box.wait_state(job, "COMPLETED", timeout=120)
    wait_for(
        lambda: any("settled hold" in line for line in hook_lines("epilog-slurmctld", running)), "no settle"
    )
    wait_for(lambda: bool(hook_lines("epilog-slurmctld", ends)), "no epilog")
    print(
        f"box failover: {crash['crashed']} crashed; {standby.name} took writes after {leader_after:.1f} s; "
        f"sbatch {submitted_in:.1f} s after the crash accepted; hooks: "
        + "; ".join(
            f"job {job} {hook}: {line.split(f'job={job} ', 1)[1]}"
            for job in (ends, started)
            for hook in ("prolog-slurmctld", "epilog-slurmctld")
            for line in hook_lines(hook, job)
        )
    )
    box.bridge_sacct(since)  # settles the run whose epilog met the failover
    holds = Books(box, since).check(
        account, {running: PRICES["h100"], ends: PRICES["a100"], started: PRICES["a100"]}
    )
    assert all(len(found) == 1 for found in holds.values()), holds  # each job held once (one run)
    assert box.gpucredit("audit", "verify").startswith("ok: ")
