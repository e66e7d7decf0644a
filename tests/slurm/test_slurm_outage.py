"""Policy accept with an outage credit line on the real Slurm box (docs/outage.md): with
the daemon stopped a job runs within its account's line and the next one waits, held
with the line, the value and the cap; with the daemon back the first is charged once
from the spool, the second is released and runs on a hold, and after `bridge sacct`
the books are exact. Uses tests/slurm/conftest.py's cluster and books.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from slurm_hooks.outage_spool import RUNS, SHEET, Spool
from tests.support.cluster import PRICES, Books, Cluster, submit

pytestmark = pytest.mark.slurm


def _write_config(c: Cluster, outage_dir: Path, line: str) -> None:
    """`outage_dir`: in the cluster's folder (daemon and hooks see it, each at its path)."""
    c.policy = "accept"
    c.write_configs(  # bakes the policy and the line into the shims
        '[daemon]\nsocket = "@DIR@/daemon.sock"\ntimeout_seconds = 2.0\n'
        '[policy]\non_ledger_unreachable = "accept"\n'
        f'outage_credit_line_per_account = "{line}"\noutage_spool_dir = "@DIR@/{outage_dir.name}"\n'
        "outage_sheet_seconds = 0.5\n"
        '[slurm]\ncluster = "lab"\nbin_dir = "@BIN@"\n'
        '[agent]\nspool_dir = "@DIR@/spool/%n"\n'
        '[hooks]\nlog_file = "@DIR@/hooks.log"\n'
    )


def _wait(what: str, predicate, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def test_accept_runs_within_the_line_and_the_books_are_exact_after(cluster: Cluster, books: Books) -> None:
    outage_dir = cluster.dir / f"outage-{os.getpid()}"
    account = cluster.new_account("1")
    cluster.stop_daemon()
    # 1×a100 for 1 minute is estimated at 0.033333: the line of 0.05 admits one such job.
    _write_config(cluster, outage_dir, "0.05")
    try:
        cluster.start_daemon()  # writes the price sheet the hooks estimate with
        _wait("the price sheet", lambda: (outage_dir / SHEET).exists())
        cluster.stop_daemon()

        first = submit(cluster.box, "-A", account, "--gres=gpu:a100:1", "-t", "1", "--wrap", "sleep 1")
        cluster.box.wait_state(first, "COMPLETED", timeout=90)
        assert [run.key[1] for run in Spool(str(outage_dir)).runs() if run.admit["account"] == account] == [
            first
        ]
        assert cluster.holds(first, account) == []

        second = submit(cluster.box, "-A", account, "--gres=gpu:a100:1", "-t", "1", "--wrap", "sleep 1")
        reason = (
            f"gpucredit: ledger unreachable; outage credit line of account {account}: 0.066666 > 0.05 "
            "credits with this job (~0.033333); job held by site policy until the ledger returns"
        )
        _wait("the line's hold", lambda: cluster.box.scontrol_job(second).get("Reason") == "JobHeldAdmin")
        assert cluster.box.scontrol_job(second).get("Comment", "").strip() == reason

        cluster.start_daemon()  # reads the spool back, releases the held job
        _wait("the read-back", lambda: [h.state for h in cluster.holds(first, account)] == ["settled"])
        cluster.box.wait_state(second, "COMPLETED", timeout=90)
        _wait(
            "the spool to empty",
            lambda: not any(run.admit["account"] == account for run in Spool(str(outage_dir)).runs()),
        )
        [charged] = cluster.holds(first, account)
        assert charged.charged_seconds <= 60
        books.check(account, {first: PRICES["a100"], second: PRICES["a100"]})
    finally:
        cluster.stop_daemon()
        for name in (RUNS, SHEET):
            (outage_dir / name).unlink(missing_ok=True)
        cluster.write_config("reject")
        cluster.start_daemon()
