"""Policy accept with outage credit lines (slurm_hooks/outage_spool.py), the read-back
that charges what the hooks admitted (accounting_bridge/outage/readback.py), and the
overspend bound (ledger/holds/bounds.py, `gpucredit policy bound`); docs/outage.md.

The hooks run in-process against a daemon socket nobody listens on (the ledger is
down) and a fake scontrol (tests/support/fake_slurm.py); the read-back and the bound run on
both stores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine

from accounting_bridge.outage.readback import read_back, refresh_sheet
from accounting_bridge.sacct.reconcile import DEFAULT_POLICY, reconcile_runs
from gpucredit.cli import _build
from gpucredit.daemon.outage_keeper import OutageKeeper
from ledger import api
from ledger.errors import InvalidInput
from ledger.holds.bounds import OutageConfig, OutageLines, RunningRun, outage_bound
from ledger.money import charge_for, parse_credits
from ledger.store.db import make_sessionmaker
from slurm_hooks.hooks import main
from slurm_hooks.outage_spool import (
    RUNS,
    Lines,
    Spool,
    charge_ucredits,
    parse_credit_text,
    read_sheet,
    write_sheet,
)
from tests.support import REPO
from tests.support.fake_slurm import FakeSlurm, ctld_env, hold_argv, queue, queue_line
from tests.support.fakedaemon import sockdir as sockdir
from tests.support.sacct import synthetic

NOW = datetime(2026, 12, 2, 10, 30, 0, tzinfo=UTC)
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
# a100 2.00 and h100 4.00 credits per GPU-hour: queue_line's 1×a100 + 1×h100 burns 6.00/h,
# so its 15-minute limit is estimated at 1.50 credits.
SHEET = {"prices": {"a100": 2_000_000, "h100": 4_000_000}, "partition_prices": {}}
HELD_TAIL = "job held by site policy until the ledger returns"


@pytest.fixture
def outage_dir(tmp_path: Path) -> Path:
    return tmp_path / "outage"


@pytest.fixture
def config(tmp_path: Path, sockdir: Path, outage_dir: Path) -> Callable[..., str]:
    """A hook config whose daemon socket nobody listens on, policy accept."""

    def write(**policy: Any) -> str:
        path = tmp_path / "gpucredit.toml"
        lines = [f'outage_spool_dir = "{outage_dir}"']
        for key, value in policy.items():
            if isinstance(value, dict):
                continue
            lines.append(f"{key} = {json.dumps(value)}")
        tables = [
            f"[policy.{key}]\n" + "".join(f'{name} = "{line}"\n' for name, line in value.items())
            for key, value in policy.items()
            if isinstance(value, dict)
        ]
        path.write_text(
            f'[daemon]\nsocket = "{sockdir / "down.sock"}"\ntimeout_seconds = 0.3\n'
            '[policy]\non_ledger_unreachable = "accept"\n'
            + "\n".join(lines)
            + '\n[slurm]\nbin_dir = "/usr/bin"\n'
            + "".join(tables)
        )
        return str(path)

    return write


def prolog(path: str, job_id: int, account: str = "physics", **line: Any) -> tuple[int, list[str], FakeSlurm]:
    return _hook("prolog-slurmctld", path, job_id, account, queue_line(job_id, **line))


def epilog(path: str, job_id: int, **line: Any) -> tuple[int, list[str], FakeSlurm]:
    return _hook("epilog-slurmctld", path, job_id, "physics", queue_line(job_id, state="COMPLETING", **line))


def _hook(name: str, path: str, job_id: int, account: str, line: str) -> tuple[int, list[str], FakeSlurm]:
    answers: dict[tuple[str, ...], Any] = {queue(job_id): line}
    slurm = _HoldingSlurm(answers)
    lines: list[str] = []
    env = ctld_env(path, job_id=job_id, SLURM_JOB_ACCOUNT=account)
    rc = main([name], environ=env, runner=slurm, now=lambda: NOW, log=lines.append, tz=UTC)
    return rc, lines, slurm


class _HoldingSlurm(FakeSlurm):
    """scontrol show job, and any `scontrol update` that holds a job (recorded)."""

    def __call__(self, argv: Any) -> str:
        argv = list(argv)
        if argv[1:2] == ["update"]:
            self.calls.append(argv)
            return ""
        return super().__call__(argv)


# --- the estimate is the ledger's --------------------------------------------------------------


def test_the_hooks_estimate_and_credit_strings_are_the_ledgers() -> None:
    for rate in (0, 1, 1_799, 2_000_000, 6_000_000, 7_777_777, 10**12):
        for seconds in (0, 1, 59, 60, 899, 900, 1799, 1800, 3601, 86_400 * 30):
            assert charge_ucredits(rate, seconds) == charge_for(rate, seconds), (rate, seconds)
    for text in ("0", "50", "12.5", "0.000001", "1000000.999999", " 7 "):
        assert parse_credit_text(text) == parse_credits(text, allow_zero=True)
    for bad in ("-5", "1e3", "12.1234567", "", "five", 50):
        with pytest.raises(ValueError):
            parse_credit_text(bad)


# --- the hooks during an outage, policy accept ----------------------------------------------


def test_accept_admits_up_to_the_account_line_then_holds_with_the_reason(
    config: Callable[..., str], outage_dir: Path
) -> None:
    path = config(outage_credit_line_per_account="3")
    write_sheet(str(outage_dir), SHEET)
    for job_id in (5, 6):
        rc, lines, slurm = prolog(path, job_id)
        assert rc == 0, lines
        assert slurm.calls == [list(queue(job_id))]  # nothing held
        assert lines[-1].endswith(
            f"job runs by site policy (accept); spooled at ~1.50 credits in {outage_dir / RUNS}"
        )
    rc, lines, slurm = prolog(path, 7)
    reason = (
        "ledger unreachable; outage credit line of account physics: 4.50 > 3.00 credits "
        f"with this job (~1.50); {HELD_TAIL}"
    )
    assert rc == 1
    assert slurm.calls == [list(queue(7)), list(hold_argv(7, reason))]
    assert lines[-1].endswith(f"site policy is accept: {reason}; job held")
    # Another account has a line of its own.
    rc, _lines, _slurm = prolog(path, 8, account="chemistry")
    assert rc == 0
    assert Spool(str(outage_dir)).totals() == ({"physics": 3_000_000, "chemistry": 1_500_000}, 4_500_000)
    # Slurm running the prolog again for an admitted run counts it once.
    rc, lines, _slurm = prolog(path, 5)
    assert rc == 0 and "spooled (already spooled) at ~1.50" in lines[-1]
    assert Spool(str(outage_dir)).totals()[1] == 4_500_000


def test_accept_holds_past_the_fleet_line(config: Callable[..., str], outage_dir: Path) -> None:
    path = config(outage_credit_line_fleet="2.5", outage_credit_lines={"chemistry": "10"})
    write_sheet(str(outage_dir), SHEET)
    assert prolog(path, 5)[0] == 0
    rc, _lines, slurm = prolog(path, 6, account="chemistry")
    reason = (
        "ledger unreachable; fleet outage credit line: 3.00 > 2.50 credits with this job (~1.50); "
        f"{HELD_TAIL}"
    )
    assert rc == 1
    assert slurm.calls[1] == list(hold_argv(6, reason))
    assert Spool(str(outage_dir)).totals() == ({"physics": 1_500_000}, 1_500_000)


def test_a_partition_price_and_an_unpriced_gpu_type(config: Callable[..., str], outage_dir: Path) -> None:
    path = config(outage_credit_line_per_account="100")
    # debug's own h100 price wins; a100 has none on the sheet: the dearest price (9.00) counts.
    write_sheet(
        str(outage_dir), {"prices": {"h100": 4_000_000}, "partition_prices": {"debug": {"h100": 9_000_000}}}
    )
    rc, lines, _slurm = prolog(path, 5)
    assert rc == 0
    assert "spooled at ~4.50 credits" in lines[-1]  # (9.00 + 9.00) × 15 min


def test_accept_with_a_line_but_no_sheet_holds(config: Callable[..., str], outage_dir: Path) -> None:
    path = config(outage_credit_line_per_account="3")
    rc, lines, slurm = prolog(path, 5)
    reason = (
        "ledger unreachable and no usable outage price sheet, so this job cannot be counted "
        f"against the outage credit line; {HELD_TAIL}"
    )
    assert rc == 1
    assert slurm.calls[1] == list(hold_argv(5, reason))
    assert f"{reason} (no outage price sheet {outage_dir / 'sheet.json'} (the daemon writes it" in lines[-1]


def test_accept_without_lines_still_admits_and_spools_when_it_can(
    config: Callable[..., str], outage_dir: Path
) -> None:
    path = config()
    rc, lines, _slurm = prolog(path, 5)
    assert rc == 0
    assert lines[-1].endswith(f"not spooled (no {outage_dir}); the bridge charges it from sacct")
    write_sheet(str(outage_dir), SHEET)
    assert prolog(path, 6)[0] == 0
    assert Spool(str(outage_dir)).totals() == ({"physics": 1_500_000}, 1_500_000)


def test_a_bad_line_setting_fails_closed(config: Callable[..., str], outage_dir: Path) -> None:
    path = config(outage_credit_line_per_account="lots")
    write_sheet(str(outage_dir), SHEET)
    rc, lines, slurm = prolog(path, 5)
    assert rc == 1
    assert any(
        "bad value for policy.outage_credit_line_per_account: 'lots' is not a decimal credit amount" in line
        and "using a line of 0" in line
        for line in lines
    )
    reason = (
        "ledger unreachable; outage credit line of account physics: 1.50 > 0.00 credits "
        f"with this job (~1.50); {HELD_TAIL}"
    )
    assert slurm.calls[1] == list(hold_argv(5, reason))


def test_the_spool_survives_a_crash(config: Callable[..., str], outage_dir: Path) -> None:
    path = config(outage_credit_line_per_account="3")
    write_sheet(str(outage_dir), SHEET)
    # A hook process that admits a run and dies at once, before any cleanup.
    code = (
        "import os, sys\n"
        "from datetime import UTC, datetime\n"
        "from slurm_hooks.hooks import main\n"
        f"from tests.support.fake_slurm import ctld_env, queue_line\n"
        f"env = ctld_env({path!r}, job_id=5)\n"
        "rc = main(['prolog-slurmctld'], environ=env, runner=lambda argv: queue_line(5),"
        " log=lambda line: None,"
        " now=lambda: datetime(2026, 12, 2, 10, 30, tzinfo=UTC), tz=UTC)\n"
        "os._exit(40 + rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False)
    assert done.returncode == 40
    # Another writer crashed mid-line: that run was never admitted.
    with open(outage_dir / RUNS, "a", encoding="utf-8") as f:
        f.write('{"op":"admit","cluster":"lab","job_id":99,"run":0,"account":"physics","estim')
    reopened = Spool(str(outage_dir))
    assert reopened.totals() == ({"physics": 1_500_000}, 1_500_000)
    assert [run.key for run in reopened.runs()] == [("lab", 5, 0, "2026-12-02T10:00:00Z")]
    assert prolog(path, 6)[0] == 0  # appended on a line of its own
    assert prolog(path, 7)[0] == 1  # 4.50 > 3.00: both earlier runs still count
    assert [run.key[1] for run in Spool(str(outage_dir)).runs()] == [5, 6]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root creates files for another owner")
def test_files_root_creates_in_the_spool_take_the_directorys_owner(outage_dir: Path) -> None:
    outage_dir.mkdir()
    os.chown(outage_dir, 65534, 65534)  # as if SlurmUser owned it
    spool = Spool(str(outage_dir))
    record = {"cluster": "lab", "job_id": 5, "run": 0, "account": "physics", "estimate_ucredits": 1}
    assert spool.admit(record, Lines()).admitted
    write_sheet(str(outage_dir), SHEET)
    assert spool.forget([("lab", 5, 0, None)]) == 1  # rewrites runs.jsonl
    owners = {name: (outage_dir / name).stat().st_uid for name in (RUNS, "spool.lock", "sheet.json")}
    assert owners == {RUNS: 65534, "spool.lock": 65534, "sheet.json": 65534}


# --- the read-back when the ledger returns ---------------------------------------------------


@pytest.fixture
def ledger(tx: Callable[[], Any]) -> Callable[[], Any]:
    """a100 2.00, h100 4.00; physics (alice) with 0.50 credits."""
    with tx() as s:
        api.set_price(s, "a100", "2.00", effective_at=EPOCH)
        api.set_price(s, "h100", "4.00", effective_at=EPOCH)
        api.create_account(s, "physics")
        api.add_member(s, "alice", "physics")
        api.topup(s, "physics", "0.50", effective_at=EPOCH)
    return tx


def test_read_back_charges_each_admitted_run_once_and_the_bridge_agrees(
    ledger: Callable[[], Any], engine: Engine, config: Callable[..., str], outage_dir: Path
) -> None:
    sessions = make_sessionmaker(engine)
    path = config(outage_credit_line_per_account="3")
    # The daemon wrote the sheet from the ledger's prices before it went down.
    refresh_sheet(sessions, str(outage_dir), NOW - timedelta(hours=1))
    assert read_sheet(str(outage_dir))["prices"] == {"a100": 2_000_000, "h100": 4_000_000}

    assert prolog(path, 5)[0] == 0
    assert prolog(path, 6)[0] == 0
    # Job 5 ends after 600 s while the ledger is still down; job 6 runs on.
    rc, lines, _slurm = epilog(path, 5, end="2026-12-02T10:10:01")
    assert rc == 0 and lines[-1].endswith("; its end is noted in the outage spool")

    first = read_back(sessions, str(outage_dir), NOW)
    assert first.charged == [
        {
            "run": "lab/5/0",
            "account": "physics",
            "charged": "1.00",
            "elapsed_seconds": 600,
            "estimate": "1.50",
        }
    ]
    assert (first.waiting, first.held, first.failed, first.forgotten) == (["lab/6/0"], [], [], 1)
    with ledger() as s:
        assert api.balance(s, "physics")["debt"] == "0.50"  # 1.00 charged, 0.50 credit
        [hold] = api.find_job_holds(s, "lab", 5)
    assert (hold.state, hold.charged_ucredits, hold.charged_seconds) == ("settled", 1_000_000, 600)
    assert Spool(str(outage_dir)).totals() == ({"physics": 1_500_000}, 1_500_000)  # job 6 still counts

    # Read back again: nothing more is charged.
    again = read_back(sessions, str(outage_dir), NOW)
    assert (again.charged, again.waiting, again.forgotten) == ([], ["lab/6/0"], 0)
    with ledger() as s:
        assert api.balance(s, "physics")["debt"] == "0.50"
        assert len(api.find_job_holds(s, "lab", 5)) == 1

    # Job 6 ends; its epilog comes 2 minutes after its 15-minute limit: it is charged the limit.
    rc, lines, _slurm = epilog(path, 6, end="2026-12-02T10:17:01")
    assert rc == 0 and lines[-1].endswith("; its end is noted in the outage spool")
    last = read_back(sessions, str(outage_dir), NOW)
    assert [(c["run"], c["charged"], c["elapsed_seconds"]) for c in last.charged] == [
        ("lab/6/0", "1.50", 900)
    ]
    assert Spool(str(outage_dir)).totals() == ({}, 0)

    # The bridge's sacct round finds job 5 charged as Slurm recorded it: nothing to adjust.
    start = datetime(2026, 12, 2, 10, 0, 1, tzinfo=UTC)
    run = synthetic(
        5,
        start=start,
        submit=datetime(2026, 12, 2, 10, 0, tzinfo=UTC),
        elapsed_seconds=600,
        gpus={"a100": 1, "h100": 1},
        requested_gpus={"a100": 1, "h100": 1},
        partition="debug",
        time_limit_seconds=900,
    )
    summary = reconcile_runs(sessions, [run], DEFAULT_POLICY, now=NOW + timedelta(days=1))
    assert summary.counts["matched"] == 1
    with ledger() as s:
        assert api.balance(s, "physics")["debt"] == "2.00"


def test_read_back_leaves_a_run_the_ledger_holds_uncharged(
    ledger: Callable[[], Any], engine: Engine, config: Callable[..., str], outage_dir: Path
) -> None:
    sessions = make_sessionmaker(engine)
    path = config(outage_credit_line_per_account="3")
    write_sheet(str(outage_dir), SHEET)
    assert prolog(path, 5)[0] == 0
    # The daemon had taken the hold after all (the hook's call timed out after it did).
    with ledger() as s:
        api.topup(s, "physics", "10", effective_at=EPOCH)
        api.create_hold(
            s,
            api.HoldRequest(
                "physics",
                user="alice",
                job_id=5,
                gpus={"a100": 1, "h100": 1},
                seconds=900,
                cluster="lab",
                at=NOW,
                submitted_at=datetime(2026, 12, 2, 10, 0, tzinfo=UTC),
            ),
        )
    epilog(path, 5, end="2026-12-02T10:10:01")
    result = read_back(sessions, str(outage_dir), NOW)
    assert (result.charged, result.held, result.forgotten) == ([], ["lab/5/0"], 1)
    with ledger() as s:
        [hold] = api.find_job_holds(s, "lab", 5)
    assert hold.state == "active"


def test_the_daemons_keeper_runs_only_for_accept_or_a_spool_left(
    ledger: Callable[[], Any], engine: Engine, outage_dir: Path
) -> None:
    sessions = make_sessionmaker(engine)
    policy = {"on_ledger_unreachable": "reject", "outage_spool_dir": str(outage_dir)}
    assert OutageKeeper.from_config(sessions, {"policy": policy}) is None
    keeper = OutageKeeper.from_config(sessions, {"policy": {**policy, "on_ledger_unreachable": "accept"}})
    assert keeper is not None
    assert keeper.tick(NOW) is not None
    assert read_sheet(str(outage_dir))["written_at"] == "2026-12-02T10:30:00Z"
    with pytest.raises(InvalidInput, match=r"policy\.outage_credit_line_fleet"):
        OutageKeeper.from_config(sessions, {"policy": {**policy, "outage_credit_line_fleet": "-1"}})


# --- the bound -------------------------------------------------------------------------------


def lease_run(**overrides: Any) -> RunningRun:
    """2×h100 at 4.00 (8.00/h), 2 h limit, started now, a 900 s lease held (2.00)."""
    values: dict[str, Any] = {
        "account": "physics",
        "cluster": "lab",
        "job_id": 41,
        "run": 0,
        "rate_ucredits_per_hour": 8_000_000,
        "limit_seconds": 7200,
        "held_ucredits": 2_000_000,
        "charged_ucredits": 0,
        "started_at": NOW,
    }
    values.update(overrides)
    return RunningRun(**values)


def test_bound_formulas() -> None:
    lines = OutageLines(per_account=50_000_000, fleet=500_000_000)
    lease = OutageConfig("lease", "accept", lines, 30)
    bound = outage_bound(lease, 1800, [lease_run()], ["physics", "chemistry"], NOW)
    # 8.00/h × (1800 + 30) s = 4.066667, less the 2.00 held: 2.066667.
    doc = bound.as_dict()
    assert doc["per_job"] == {
        "running": "2.066667",
        "running_job": "lab/41/0",
        "started_during_outage": "50.00",
    }
    assert doc["accounts"] == [
        {
            "account": "physics",
            "running_runs": 1,
            "running": "2.066667",
            "outage_line": "50.00",
            "bound": "52.066667",
        }
    ]
    # min(500, 2 accounts × 50) = 100.
    assert doc["fleet"] == {
        "running_runs": 1,
        "running": "2.066667",
        "outage_line": "100.00",
        "bound": "102.066667",
    }
    # docs/outage.md's worked number: 40 accounts, so the fleet line of 500 is the smaller.
    accounts = ["physics", *(f"a{i}" for i in range(39))]
    worked = outage_bound(lease, 1800, [lease_run()], accounts, NOW).as_dict()
    assert (worked["accounts"][0]["bound"], worked["other_accounts"]["bound"]) == ("52.066667", "50.00")
    assert worked["fleet"]["bound"] == "502.066667"
    full_site = outage_bound(
        OutageConfig("full", "accept", lines, 30), 1800, [lease_run(held_ucredits=16_000_000)], accounts, NOW
    )
    assert (full_site.as_dict()["accounts"][0]["bound"], full_site.as_dict()["fleet"]["bound"]) == (
        "50.00",
        "500.00",
    )
    lease_reject = outage_bound(
        OutageConfig("lease", "reject", lines, 30), 1800, [lease_run()], accounts, NOW
    )
    assert lease_reject.as_dict()["fleet"]["bound"] == "2.066667"
    # A run near its time limit stops there: its last 10 minutes (1.333333) less the 0.50
    # still held beyond what it was charged.
    near_end = lease_run(
        started_at=NOW - timedelta(seconds=6600), charged_ucredits=14_666_667, held_ucredits=15_166_667
    )
    assert outage_bound(lease, 1800, [near_end], [], NOW).as_dict()["per_job"]["running"] == "0.833333"
    # Full mode: the hold covers the whole limit, whatever D is.
    full = OutageConfig("full", "reject", lines, 30)
    full_run = lease_run(held_ucredits=16_000_000)
    assert outage_bound(full, 86_400, [full_run], ["physics"], NOW).as_dict()["fleet"]["bound"] == "0.00"
    # No line: unbounded.
    open_ended = OutageConfig("full", "accept", OutageLines(), 30)
    assert outage_bound(open_ended, 1800, [], ["physics"], NOW).as_dict()["fleet"]["bound"] == "unbounded"


@pytest.fixture
def gc(db_url: str, tmp_path: Path) -> Callable[..., Any]:
    def run(settings: str, *args: str) -> Any:
        path = tmp_path / "site.toml"
        path.write_text(settings + "\n[meter]\ninterval_seconds = 30\n")
        env = {"GPUCREDIT_DATABASE_URL": db_url, "GPUCREDIT_CONFIG": str(path)}
        return CliRunner().invoke(_build(), list(args), env=env, obj={"clock": lambda: NOW})  # type: ignore[arg-type]

    return run


def test_policy_bound_prints_the_bound_for_the_site(gc: Callable[..., Any], tx: Callable[[], Any]) -> None:
    with tx() as s:
        api.set_price(s, "h100", "4.00", effective_at=EPOCH)
        api.create_account(s, "physics")
        api.create_account(s, "chemistry")
        api.add_member(s, "alice", "physics")
        api.topup(s, "physics", "100", effective_at=EPOCH)
        api.create_hold(
            s,
            api.HoldRequest(
                "physics", user="alice", job_id=41, gpus={"h100": 2}, seconds=7200, cluster="lab", at=NOW
            ),
        )

    reject = gc(
        '[holds]\nmode = "full"\n[policy]\non_ledger_unreachable = "reject"',
        "policy",
        "bound",
        "--outage",
        "30m",
        "--format",
        "json",
    )
    assert reject.exit_code == 0, reject.output
    doc = json.loads(reject.output)
    assert (doc["outage_seconds"], doc["mode"], doc["policy"]) == (1800, "full", "reject")
    assert doc["per_job"] == {"running": "0.00", "running_job": None, "started_during_outage": "0.00"}
    assert doc["fleet"] == {"running_runs": 1, "running": "0.00", "outage_line": "0.00", "bound": "0.00"}

    accept = (
        '[holds]\nmode = "full"\n[policy]\non_ledger_unreachable = "accept"\n'
        'outage_credit_line_per_account = "50"\noutage_credit_line_fleet = "80"\n'
        '[policy.outage_credit_lines]\nphysics = "60"'
    )
    result = gc(accept, "policy", "bound", "--outage", "30m", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["per_job"]["started_during_outage"] == "60.00"
    assert doc["accounts"] == [
        {"account": "physics", "running_runs": 1, "running": "0.00", "outage_line": "60.00", "bound": "60.00"}
    ]
    assert doc["other_accounts"]["bound"] == "50.00"
    assert doc["fleet"]["bound"] == "80.00"  # min(80, 60 + 50)

    table = gc(accept, "policy", "bound", "--outage", "30m")
    assert table.exit_code == 0, table.output
    assert table.output.splitlines()[:3] == [
        "Overspend bound for an outage of 30m (1800 s) from now: holds.mode = full, "
        "policy.on_ledger_unreachable = accept, meter every 30 s",
        "per running job:                 0.00 credits",
        "per job started in the outage:   60.00 credits",
    ]
    assert table.output.splitlines()[-1].split() == ["(fleet)", "1", "0.00", "80.00", "80.00"]


@pytest.mark.parametrize(
    ("settings", "args", "message"),
    [
        (
            '[policy]\noutage_credit_line_fleet = "-5"',
            ("--outage", "30m"),
            "error: invalid_amount: policy.outage_credit_line_fleet '-5' must not be negative",
        ),
        (
            "[policy]\noutage_credit_line_per_account = 50",
            ("--outage", "30m"),
            "error: invalid_setting: policy.outage_credit_line_per_account = 50: "
            'expected a decimal credit string like "50"',
        ),
        (
            '[holds]\nmode = "lazy"',
            ("--outage", "30m"),
            "error: invalid_setting: holds.mode = 'lazy': expected one of full, lease",
        ),
        (
            '[policy]\non_ledger_unreachable = "maybe"',
            ("--outage", "30m"),
            "error: invalid_setting: policy.on_ledger_unreachable = 'maybe': expected one of reject, accept",
        ),
        (
            "",
            ("--outage", "soon"),
            "error: invalid_duration: outage 'soon' is not a duration like 1800, 90s, 30m, 2h or 1d",
        ),
    ],
)
def test_bad_settings_are_refused_clearly(
    gc: Callable[..., Any], settings: str, args: tuple[str, ...], message: str
) -> None:
    result = gc(settings, "policy", "bound", *args)
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == message


def test_policy_spool_lists_what_counts(
    gc: Callable[..., Any], config: Callable[..., str], outage_dir: Path, tmp_path: Path
) -> None:
    path = config(outage_credit_line_per_account="3")
    write_sheet(str(outage_dir), SHEET)
    assert prolog(path, 5)[0] == 0
    settings = (
        f'[policy]\non_ledger_unreachable = "accept"\noutage_spool_dir = "{outage_dir}"\n'
        'outage_credit_line_per_account = "3"'
    )
    result = gc(settings, "policy", "spool", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["accounts"] == {"physics": {"spooled": "1.50", "line": "3.00"}}
    assert doc["fleet"] == {"spooled": "1.50", "line": "none"}
    assert [run["run"] for run in doc["runs"]] == ["lab/5/0"]
    assert os.path.exists(outage_dir / RUNS)
