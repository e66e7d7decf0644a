"""`gpucredit cloud ...` from the CLI root, on gpucredit.toml, against moto's EC2."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpucredit.cli import EXIT_MISSING_EXTRA, _build
from slurmbox.provider_faults import Fault, FaultProxy


@pytest.fixture
def toml(proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "gpucredit.toml"
    path.write_text(
        f"""
[database]
url = "sqlite:///{tmp_path}/ledger.db"
[cloud]
endpoint_url = "{proxy.url}"
region = "eu-west-1"
image_id = "ami-12c6146b"
state_dir = "{tmp_path}/cloud"
launch_attempts = 1
[cloud.nodes]
"cloud[1-2]" = "h100"
[cloud.instance_types]
h100 = "p5.48xlarge"
[cloud.prices_ucredits_per_hour]
"p5.48xlarge" = 98_320_000
""",
        encoding="utf-8",
    )
    monkeypatch.setenv("GPUCREDIT_CONFIG", str(path))
    return path


def test_resume_then_instances_as_json(toml: Path) -> None:
    runner = CliRunner()
    resumed = runner.invoke(_build(), ["cloud", "resume", "cloud[1-2]"])
    assert resumed.exit_code == 0, resumed.output
    assert [line.split(" ")[:2] for line in resumed.output.splitlines()] == [
        ["cloud1:", "launched"],
        ["cloud2:", "launched"],
    ]
    listed = runner.invoke(_build(), ["cloud", "instances", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert [(r["node"], r["type"], r["region"], r["state"], r["terminated_at"]) for r in rows] == [
        ("cloud1", "p5.48xlarge", "eu-west-1", "running", None),
        ("cloud2", "p5.48xlarge", "eu-west-1", "running", None),
    ]
    for row in rows:
        assert isinstance(row["cost_ucredits"], int)
        datetime.fromisoformat(row["launched_at"])
    assert set(rows[0]) == {
        "id",
        "node",
        "type",
        "region",
        "state",
        "launched_at",
        "terminated_at",
        "cost_ucredits",
    }

    suspended = runner.invoke(_build(), ["cloud", "suspend", "cloud1"])
    assert suspended.exit_code == 0, suspended.output
    assert suspended.output == f"cloud1: terminated {rows[0]['id']}\n"
    text = runner.invoke(_build(), ["cloud", "instances"])
    assert text.output.splitlines()[0] == "id  node  type  region  state  launched_at  terminated_at  cost"
    assert text.output.splitlines()[1].split("  ")[:5] == [
        rows[0]["id"],
        "cloud1",
        "p5.48xlarge",
        "eu-west-1",
        "terminated",
    ]


def test_a_bad_hostlist_and_a_bad_section_are_refused(toml: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(_build(), ["cloud", "resume", "cloud[2-"])
    assert bad.exit_code == 2
    assert "Invalid value for HOSTLIST" in bad.output
    toml.write_text(toml.read_text(encoding="utf-8").replace("98_320_000", "98.32"), encoding="utf-8")
    refused = runner.invoke(_build(), ["cloud", "instances"])
    assert refused.exit_code == 1
    assert refused.output == (
        "Error: config_invalid: cloud.prices_ucredits_per_hour.p5.48xlarge: "
        "integer micro-credits an hour, got 98.32\n"
    )


def test_instances_when_the_provider_fails(toml: Path, proxy: FaultProxy) -> None:
    proxy.add(Fault("DescribeInstances", status=503, code="Unavailable"))
    failed = CliRunner().invoke(_build(), ["cloud", "instances"])
    assert failed.exit_code == 1
    assert failed.output == "Error: provider: Unavailable: injected by gpucredit's fault proxy\n"


def test_without_the_cloud_extra_a_cloud_command_names_it(toml: Path) -> None:
    code = (
        "import sys; sys.modules['boto3'] = None; sys.modules['botocore'] = None; "
        "sys.modules['botocore.exceptions'] = None; "
        "from gpucredit.cli import main; main(['cloud', 'instances'])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_MISSING_EXTRA
    assert done.stderr.startswith("error: missing_extra: gpucredit cloud needs the cloud extra (")
    assert done.stderr.rstrip().endswith("install 'gpucredit[cloud]'")


def test_reconcile_without_slurm_terminates_nothing(toml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = toml.read_text(encoding="utf-8").replace(
        "[cloud]\n", '[slurm]\nbin_dir = "/nonexistent"\n[cloud]\n', 1
    )
    toml.write_text(text, encoding="utf-8")
    failed = CliRunner().invoke(_build(), ["cloud", "reconcile"])
    assert failed.exit_code == 1
    assert failed.output.startswith("Error: slurm: ")
    assert failed.output.endswith("; nothing terminated\n")
