"""The node agent against the fake NVML, `gpu_usage`, and the efficiency report, on both stores."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import insert

from accounting_bridge.nvml.agent import Agent, fake_nvml_from_spec
from accounting_bridge.nvml.nvml_fake import FakeGpu, FakeMigDevice, FakeNvml, FakeProcess
from accounting_bridge.nvml.sampler import GpuRegistry, JobRunKey
from gpucredit.cli import _build
from ledger import api, cli_support
from ledger.errors import InvalidInput
from ledger.store.tables import job_runs_t
from ledger.views.efficiency import UsageDelta, add_gpu_usage, efficiency_report
from tests.support.agent import JOB_A, JOB_B, GiB, Monotonic, usage_rows

T0 = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def run_three_ticks(tx: Callable[[], Any], nvml: FakeNvml, registry: GpuRegistry) -> Agent:
    clock = Monotonic()
    agent = Agent(
        node="node1", nvml=nvml, registry=registry, sessions=tx, interval_seconds=10, monotonic=clock
    )
    first = agent.tick()  # charges one nominal interval: 10 s
    assert (first.units, first.charged_units, first.rows_written, first.problems) == (4, 3, 2, [])
    # 10 s of 25 % on one h100 is 2.5 busy seconds: sent as 3 (half-up), and 7.5 → 8 later,
    # not 3 + 3 + 3: the running total is rounded, never each tick.
    assert usage_rows(tx)[(101, "h100")][:2] == (20, 3)
    for memory_gib in (12, 8):
        clock.now += 10
        nvml.gpus[0].add_energy(300)
        nvml.gpus[1].add_energy(999)
        nvml.gpus[2].add_energy(100)
        nvml.gpus[0].memory_used_bytes = memory_gib * GiB
        agent.tick()
    return agent


def test_two_jobs_on_one_node_get_their_own_gpu_seconds(tx, node) -> None:
    nvml, registry = node
    agent = run_three_ticks(tx, nvml, registry)
    # A: 1 a100 × 30 s at 50 %; 2 × 300 J (the first sample only sets the counter); peak 12 GiB.
    # B: 2 h100 × 30 s, busy 25 % of one: 7.5 → 8; 200 J from GPU 2; peak 5 GiB (GPU 3).
    # GPU 1 (100 % busy, 1998 J) belongs to no job: no row, charged to nobody.
    assert usage_rows(tx) == {
        (100, "a100"): (30, 15, 600, 12 * GiB),
        (101, "h100"): (60, 8, 200, 5 * GiB),
    }
    # A's epilog removes its registry file: A's row stays as it was, B goes on.
    registry.unregister(JOB_A)
    agent.monotonic.now += 10  # type: ignore[attr-defined]
    report = agent.tick()
    assert (report.charged_units, report.finished_runs, report.rows_written) == (2, 1, 1)
    assert usage_rows(tx) == {
        (100, "a100"): (30, 15, 600, 12 * GiB),
        (101, "h100"): (80, 10, 200, 5 * GiB),
    }
    assert list(agent.accumulator.usage) == [JOB_B]


def test_a_restarted_agent_adds_to_the_stored_totals(tx, node) -> None:
    nvml, registry = node
    run_three_ticks(tx, nvml, registry)
    again = Agent(node="node1", nvml=nvml, registry=registry, sessions=tx, interval_seconds=10)
    again.tick()
    assert usage_rows(tx)[(101, "h100")] == (80, 11, 200, 5 * GiB)  # 8 + 2.5 → 3: 60 + 20 s, 8 + 3


def test_two_registry_files_claiming_one_gpu_charge_nobody(tx, node) -> None:
    nvml, registry = node
    registry.register(JobRunKey("lab", 102, 0), {0: "a100"})  # stale file of an older job
    agent = Agent(node="node1", nvml=nvml, registry=registry, sessions=tx, interval_seconds=10)
    report = agent.tick()
    assert report.charged_units == 2
    assert report.problems == ["GPU unit 0 claimed by lab/100/0, lab/102/0: charged to nobody"]
    assert set(usage_rows(tx)) == {(101, "h100")}


def test_mig_instances_are_counted_one_by_one(tx, tmp_path: Path) -> None:
    mig = FakeGpu(
        "GPU-m",
        mig_capable=True,
        mig_enabled=True,
        mig_devices={
            0: FakeMigDevice("MIG-0", processes=[FakeProcess(11)], memory_used_bytes=3 * GiB),
            1: FakeMigDevice("MIG-1"),
            3: FakeMigDevice("MIG-3", processes=[FakeProcess(12)]),
        },
    )
    nvml = FakeNvml([mig, FakeGpu("GPU-w", utilization_gpu_percent=40)])
    nvml.nvmlInit()
    registry = GpuRegistry(tmp_path)
    # Units in NVML order: MIG 0, 1, 3 of GPU 0 are units 0, 1, 2; the whole GPU 1 is unit 3.
    registry.register(JobRunKey("lab", 300, 0), {0: "1g.10gb", 1: "1g.10gb"})
    registry.register(JobRunKey("lab", 301, 0), {2: "1g.10gb", 3: "a100"})
    Agent(node="node1", nvml=nvml, registry=registry, sessions=tx, interval_seconds=10).tick()
    # NVML has no utilisation for MIG: an instance with a process is busy for the interval.
    assert usage_rows(tx) == {
        (300, "1g.10gb"): (20, 10, 0, 3 * GiB),
        (301, "1g.10gb"): (10, 10, 0, 0),
        (301, "a100"): (10, 4, 0, 0),
    }


def test_fake_nvml_spec() -> None:
    nvml = fake_nvml_from_spec("a100:2,h100:1@75", "node2")
    assert [(g.uuid, g.utilization_gpu_percent) for g in nvml.gpus] == [
        ("GPU-fake-node2-0", 0),
        ("GPU-fake-node2-1", 0),
        ("GPU-fake-node2-2", 75),
    ]
    for bad in ("a100", "a100:2@101", "a100:0", "a100:2;h100:1"):
        with pytest.raises(ValueError):
            fake_nvml_from_spec(bad)


def test_bad_usage_rows_are_refused(tx) -> None:
    row = UsageDelta("lab", 1, 0, "node1", "a100", 10, -1, 0, 0)
    with tx() as s, pytest.raises(InvalidInput):
        add_gpu_usage(s, [row])
    assert usage_rows(tx) == {}


# --------------------------------------------------------------------------- efficiency


@pytest.fixture
def measured(tx, node) -> Callable[[], Any]:
    """Jobs A (1×a100) and B (2×h100) held, run 30 s each, and measured by the agent."""
    with tx() as s:
        api.set_price(s, "a100", "2.00", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.set_price(s, "h100", "3.60", effective_at=datetime(2026, 1, 1, tzinfo=UTC))
        api.create_account(s, "physics")
        api.add_member(s, "alice", "physics")
        api.topup(s, "physics", "100", effective_at=datetime(2026, 11, 1, tzinfo=UTC))
    for job, gpus in ((JOB_A, "a100:1"), (JOB_B, "h100:2")):
        with tx() as s:
            h = api.create_hold(
                s,
                api.HoldRequest(
                    "physics", user="alice", job_id=job.job_id, gpus=gpus, seconds=3600, cluster="lab", at=T0
                ),
            )
            api.settle_hold(s, h.id, 30)
    run_three_ticks(tx, *node)
    return tx


def report(tx: Callable[[], Any], by: str, **kw: Any) -> list[tuple[Any, ...]]:
    with tx() as s:
        return [tuple(row.values()) for row in efficiency_report(s, by=by, **kw)]


def test_efficiency_report_numbers(measured) -> None:
    tx = measured
    # (key, jobs, allocated, measured, busy, efficiency)
    assert report(tx, "job") == [
        ("lab/100/0", 1, 30, 30, 15, "0.500"),
        ("lab/101/0", 1, 60, 60, 8, "0.133"),
    ]
    assert report(tx, "gres") == [("a100", 1, 30, 30, 15, "0.500"), ("h100", 1, 60, 60, 8, "0.133")]
    assert report(tx, "user") == [("alice", 2, 90, 90, 23, "0.256")]
    assert report(tx, "account") == [("physics", 2, 90, 90, 23, "0.256")]
    assert report(tx, "account", account="nobody") == []
    assert report(tx, "job", start=T0 + timedelta(seconds=1)) == []
    with pytest.raises(InvalidInput):
        report(tx, "day")


def test_efficiency_prefers_slurms_record_of_the_run(measured) -> None:
    tx = measured
    with tx() as s:  # the bridge ingested B from sacct: it really ran 40 s
        s.execute(
            insert(job_runs_t).values(
                cluster="lab",
                job_id=101,
                run=0,
                display_id="101",
                account="physics",
                user="alice",
                partition="gpu",
                state="COMPLETED",
                start_at=T0,
                end_at=T0 + timedelta(seconds=40),
                elapsed_seconds=40,
                gpus="h100:2",
                nodes="node1",
                hold_id=None,
                flags="",
                charged_ucredits=0,
                ingested_at=T0,
            )
        )
    assert report(tx, "job")[1] == ("lab/101/0", 1, 80, 60, 8, "0.100")


@pytest.fixture
def gc(db_url: str) -> Iterator[Callable[..., Any]]:
    runner = CliRunner()
    root: Any = _build()

    def run(*args: str, code: int = 0) -> Any:
        result = runner.invoke(root, list(args), env={"GPUCREDIT_DATABASE_URL": db_url})
        assert result.exit_code == code, (args, result.output, result.stderr)
        return result

    yield run
    engine = cli_support._engines.pop(db_url, None)
    if engine is not None:
        engine.dispose()


def test_report_efficiency_cli(measured, gc) -> None:
    out = gc("report", "--by", "gres", "--efficiency", "--format", "csv").output
    assert list(csv.reader(io.StringIO(out))) == [
        ["gres", "jobs", "allocated_gpu_seconds", "measured_gpu_seconds", "busy_gpu_seconds", "efficiency"],
        ["a100", "1", "30", "30", "15", "0.500"],
        ["h100", "1", "60", "60", "8", "0.133"],
    ]
    table = gc("report", "--efficiency", "--user", "alice").output.splitlines()
    assert table[0].split() == [
        "JOB",
        "JOBS",
        "ALLOCATED_GPU_SECONDS",
        "MEASURED_GPU_SECONDS",
        "BUSY_GPU_SECONDS",
        "EFFICIENCY",
    ]
    assert table[1].split() == ["lab/100/0", "1", "30", "30", "15", "0.500"]
    # Without the flag the report is what it always was.
    plain = gc("report", "--by", "gres", "--format", "csv").output
    assert plain.splitlines()[0] == "gres,charged,gpu_seconds,jobs"
    assert "cannot group by 'job'" in gc("report", "--by", "job", code=2).stderr


def test_efficiency_counts_a_running_job_to_where_the_meter_saw_it(measured) -> None:
    """The meter posts no charge per tick any more: a running job's allocated seconds are
    those its cost so far is read to, not its (still zero) charged seconds."""
    tx = measured
    with tx() as s:
        h = api.create_hold(
            s,
            api.HoldRequest(
                "physics",
                user="alice",
                job_id=102,
                gpus="a100:2",
                seconds=3600,
                cluster="lab",
                at=datetime(2026, 11, 2, tzinfo=UTC),
            ),
        )
    assert report(tx, "job")[2:] == []  # the meter has not seen it run
    with tx() as s:
        api.set_accrual(s, [(h.id, 45)])  # last seen running 45 s in
    assert report(tx, "job")[2] == ("lab/102/0", 1, 90, 0, 0, "0.000")
