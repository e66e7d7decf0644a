"""The box per Slurm version (slurmbox.versions, .rootfs, .chroot): what each renders and
when a cached root filesystem is reused; and, opt-in, a chroot box end to end.

The end-to-end test builds (or reuses) a Debian root filesystem and runs Slurm in it, so
it runs only for the versions named in GPUCREDIT_BOX_VERSIONS (e.g. "24.11 26.05"): it
needs root, debootstrap and the network to Debian's registry and PyPI on its first run.
"""

from __future__ import annotations

import csv
import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_hooks.admin import slurmconf
from slurmbox import SlurmBox, rootfs, versions
from slurmbox.__main__ import _options, main
from slurmbox.chroot import JWT_KEY, ChrootBox
from tests.support.version_box import WANTED, running_box

CHROOT_VERSIONS = [v for v in versions.VERSIONS.values() if v.chroot]


def _ports(conf: str) -> dict[str, str]:
    return dict(re.findall(r"(?m)^(\w+Port)=(\d+)", conf))


@pytest.mark.parametrize("version", CHROOT_VERSIONS, ids=lambda v: v.name)
def test_a_chroot_box_renders_the_host_box_config_on_its_own_ports(version: versions.SlurmVersion) -> None:
    box = ChrootBox(version)
    conf = box.render_slurm_conf()
    # The chroot boxes render no cloud (the host box's opt-in, GPUCREDIT_BOX_CLOUD): compare
    # with the host box as it renders without one, whatever this run's environment says.
    host = SlurmBox(cloud=False).render_slurm_conf()
    base = version.port_base // 100
    assert _ports(conf) == {
        "SlurmctldPort": f"{base}17",
        "SlurmdPort": f"{base}18",
        "AccountingStoragePort": f"{base}19",
    }
    nodes = re.findall(r"(?m)^NodeName=(\w+) .* Port=(\d+) ", conf)
    assert nodes == [("node1", f"{base}18"), ("node2", f"{base}28"), ("node3", f"{base}38")]
    # Everything else is the host box's, line for line, and auth/jwt's where the root has
    # slurmrestd (the jobs API's way to Slurm there).
    if box.has_rest:
        host += slurmconf.jwt_lines(JWT_KEY)
    assert re.sub(r"Port=\d+", "Port=N", conf) == re.sub(r"Port=\d+", "Port=N", host)


@pytest.mark.parametrize("version", CHROOT_VERSIONS, ids=lambda v: v.name)
def test_a_chroot_box_has_its_own_accounting_database(version: versions.SlurmVersion) -> None:
    dbd = ChrootBox(version).render_slurmdbd_conf()
    assert f"StorageLoc={version.db_name}\n" in dbd
    assert version.db_name != versions.get("22.05").db_name == "slurm_acct_db"
    assert f"DbdPort={version.port_base // 100}19\n" in dbd
    assert "StoragePort=3306\n" in dbd  # MariaDB's port is not Slurm's: left alone


def test_each_version_has_ports_apart_from_every_other() -> None:
    seen: dict[int, str] = {}
    for version in versions.VERSIONS.values():
        for port in version.ports.values():
            assert port not in seen, f"{version.name} and {seen.get(port)} share port {port}"
            seen[port] = version.name


def test_the_host_version_is_not_a_chroot() -> None:
    assert versions.get(versions.DEFAULT).suite is None
    with pytest.raises(Exception, match="host's box"):
        ChrootBox(versions.get("22.05"))


def test_an_unknown_version_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown Slurm version '23\.02'; known: 22\.05, 24\.11, 26\.05"):
        versions.get("23.02")


def test_newer_versions_write_a_cgroup_conf_that_disables_cgroups() -> None:
    assert versions.get("22.05").cgroup_conf is None
    for name in ("24.11", "26.05"):
        assert "CgroupPlugin=disabled" in (versions.get(name).cgroup_conf or "")


# --------------------------------------------------------------------------- the rootfs cache


def _fake_root(cache: Path, version: versions.SlurmVersion, key: object) -> Path:
    root = cache / version.name / "rootfs"
    root.mkdir(parents=True)
    (root.with_name("rootfs.json")).write_text(json.dumps({"key": key, "size_bytes": 1}))
    return root


def test_a_root_built_from_the_same_packages_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = versions.get("24.11")
    monkeypatch.setattr(rootfs, "CACHE_DIR", tmp_path)
    _fake_root(tmp_path, version, rootfs.build_key(version))
    monkeypatch.setenv("PATH", str(tmp_path))  # no debootstrap: a rebuild would fail
    assert rootfs.ensure_rootfs(version)["cached"] is True


def test_a_root_built_from_other_packages_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    version = versions.get("24.11")
    monkeypatch.setattr(rootfs, "CACHE_DIR", tmp_path)
    _fake_root(tmp_path, version, rootfs.build_key(version))
    monkeypatch.setattr(rootfs, "PACKAGES", (*rootfs.PACKAGES, "slurm-wlm-basic-plugins-dev"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(rootfs.RootfsError, match=r"debootstrap is missing: apt-get install .* debootstrap"):
        rootfs.ensure_rootfs(version)


def test_a_missing_root_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rootfs, "CACHE_DIR", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(rootfs.RootfsError, match="debootstrap is missing"):
        rootfs.ensure_rootfs(versions.get("26.05"))


def test_pip_in_the_root_trusts_what_the_hosts_pip_trusts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "site-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("PIP_CERT", str(bundle))
    assert rootfs.host_ca_bundle() == str(bundle)


# --------------------------------------------------------------------------- the command line


def test_run_takes_version_and_user_before_the_command() -> None:
    options, command = _options(["--slurm", "24.11", "-u", "alice", "--", "sbatch", "-u", "x"])
    assert options == {"slurm": "24.11", "user": "alice"}
    assert command == ["sbatch", "-u", "x"]


@pytest.mark.parametrize(
    "argv",
    [["run"], ["run", "--slurm", "24.11"], ["up", "--", "sinfo"], ["up", "-u", "alice"], ["nothing"]],
)
def test_bad_command_lines_print_the_usage(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage: python -m slurmbox up|down|status|rootfs [--slurm VERSION]" in capsys.readouterr().err


def test_an_unknown_version_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--slurm", "25.11"]) == 2
    assert "unknown Slurm version '25.11'" in capsys.readouterr().err


# --------------------------------------------------------------------------- end to end (opt-in)


@pytest.fixture(params=WANTED or ["24.11"])
def version_box(request: pytest.FixtureRequest) -> Iterator[ChrootBox]:
    with running_box(request.param) as box:
        yield box


def _holds(box: ChrootBox) -> list[dict[str, str]]:
    proc = box.run(["gpucredit", "hold", "list", "--format", "csv"])
    assert proc.returncode == 0, proc.stderr
    return list(csv.DictReader(io.StringIO(proc.stdout)))


@pytest.mark.slurm
def test_a_gpu_job_is_quoted_held_and_settled_in_the_version_box(version_box: ChrootBox) -> None:
    box = version_box
    assert box.run(["gpucredit", "topup", "physics", "100"]).returncode == 0
    before = {h["id"] for h in _holds(box)}  # the ledger outlives the box, and job ids repeat
    submit = [
        "sbatch",
        "--parsable",
        "-A",
        "physics",
        "--gres=gpu:h100:1",
        "-t",
        "10",
        "--wrap",
        "sleep 3",
    ]
    sbatch = box.run(submit, user="alice")
    assert sbatch.returncode == 0, sbatch.stderr
    assert "gpucredit: ~0.60 credits (1×h100 × 10 min)" in sbatch.stderr
    job_id = sbatch.stdout.strip()
    deadline = time.monotonic() + 60
    new: list[dict[str, str]] = []
    while time.monotonic() < deadline:
        new = [h for h in _holds(box) if h["job_id"] == job_id and h["id"] not in before]
        if new and new[0]["state"] == "settled":
            break
        time.sleep(0.5)
    assert [(h["gpus"], h["amount"], h["state"]) for h in new] == [("h100:1", "0.60", "settled")]
    _held_for_credit_then_released_by_a_top_up(box)


@pytest.mark.slurm
def test_on_a_login_node_alice_submits_through_the_boxs_portal_whose_tokens_the_submitter_signs(
    version_box: ChrootBox,
) -> None:
    """The box as `make slurm-up SLURM=V` leaves it: `gpucredit job submit` as alice (MUNGE,
    no token) reaches the box's portal, which gets alice's token from the root submitter
    (the portal's config names no key) and submits through slurmrestd: the job is alice's."""
    box = version_box
    _ok(box, ["gpucredit", "topup", "physics", "10"])
    assert "jwt_key" not in box.inside("/etc/gpucredit/gpucredit.toml").read_text()
    submit = [
        "gpucredit",
        "job",
        "submit",
        "-",
        "-A",
        "physics",
        "--gpus",
        "h100:1",
        "--time",
        "00:01:00",
    ]
    done = box.run([*submit, "--format", "json"], user="alice", input="#!/bin/sh\nsleep 1\n")
    assert done.returncode == 0, (done.stdout, done.stderr)
    job_id = json.loads(done.stdout)["job_id"]
    shown = _ok(box, ["scontrol", "show", "job", str(job_id)])
    assert re.search(r"\bUserId=alice\(", shown), shown
    signed = box.inside("/var/log/gpucredit/submitter.log").read_text()
    assert "token for alice" in signed
    listed = json.loads(_ok(box, ["gpucredit", "job", "list", "--format", "json"], user="alice"))
    assert job_id in [job["job_id"] for job in listed["items"]], listed


def _ok(box: ChrootBox, argv: list[str], user: str | None = None) -> str:
    proc = box.run(argv, user=user)
    assert proc.returncode == 0, (argv, proc.stderr)
    return proc.stdout


def _held_for_credit_then_released_by_a_top_up(box: ChrootBox) -> None:
    """The daemon releases a job held for credit only after reading squeue --json, whose
    numbers and states this version writes its own way (docs/slurm-facts.md §16)."""
    account = f"v{time.time_ns() % 10**9}"  # the ledger outlives the box: a fresh account each run
    _ok(box, ["sacctmgr", "-i", "add", "account", account, "cluster=lab"])
    _ok(box, ["sacctmgr", "-i", "add", "user", "alice", f"account={account}"])
    _ok(box, ["gpucredit", "account", "import-slurm"])
    _ok(box, ["gpucredit", "topup", account, "0.06"])  # one 1×h100 minute: job_submit accepts it
    submit = [
        "sbatch",
        "--parsable",
        "--hold",
        "-A",
        account,
        "--gres=gpu:h100:1",
        "-t",
        "1",
        "--wrap",
        "sleep 2",
    ]
    job_id = _ok(box, submit, user="alice").strip()
    _ok(box, ["gpucredit", "consume", account, "0.06"])  # spent elsewhere before it starts
    _ok(box, ["scontrol", "release", job_id])
    deadline = time.monotonic() + 60
    state = ""
    while not state.startswith("PENDING|JobHeldAdmin"):
        assert time.monotonic() < deadline, state
        time.sleep(0.5)
        state = _ok(box, ["squeue", "-h", "-j", job_id, "-o", "%T|%r"]).strip()
    _ok(box, ["gpucredit", "topup", account, "1"])
    settled: list[dict[str, str]] = []
    while time.monotonic() < deadline + 60:
        settled = [  # job ids repeat across boxes' lives: this account's hold is this job's
            h for h in _holds(box) if (h["job_id"], h["account"], h["state"]) == (job_id, account, "settled")
        ]
        if settled:
            break
        time.sleep(0.5)
    assert [(h["gpus"], h["account"]) for h in settled] == [("h100:1", account)]
