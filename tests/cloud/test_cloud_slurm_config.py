"""`gpucredit slurm config|install` for a site with a `[cloud]` section: the power-saving
lines, and the three shims slurmctld runs with a hostlist."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from click.testing import CliRunner

from slurm_hooks.admin.cli import slurm
from slurm_hooks.admin.slurmconf import install, power_saving_lines

POWER_SAVING = """\
# gpucredit: cloud nodes (State=CLOUD in their NodeName lines) launched and ended through the
# provider's API ([cloud] in gpucredit.toml; `gpucredit cloud instances` shows what they cost)
ResumeProgram=/opt/h/cloud_resume.sh
SuspendProgram=/opt/h/cloud_suspend.sh
ResumeFailProgram=/opt/h/cloud_resume_fail.sh
ResumeTimeout=60
SuspendTime=20
# powered-down cloud nodes stay visible to sinfo and scontrol (`gpucredit cloud reconcile`)
PrivateData=cloud
# a node whose launch failed is DOWN with the provider's reason; to offer it again once it is
# powered down, add idle_on_node_suspend to your SlurmctldParameters (Slurm 21.08 and later)
"""


def test_the_lines_name_the_shims_and_the_timers() -> None:
    assert power_saving_lines("/opt/h", suspend_time_seconds=20, resume_timeout_seconds=60) == POWER_SAVING


def test_slurm_config_prints_them_only_for_a_site_with_a_cloud(tmp_path: Path) -> None:
    toml = tmp_path / "gpucredit.toml"
    toml.write_text("[database]\nurl = 'sqlite:////nonexistent/x.db'\n", encoding="utf-8")
    env = {"GPUCREDIT_CONFIG": str(toml)}
    plain = CliRunner().invoke(slurm, ["config", "--gres", "h100", "--hook-dir", "/opt/h"], env=env)
    assert plain.exit_code == 0 and "ResumeProgram" not in plain.output
    toml.write_text(
        toml.read_text()
        + "[cloud]\nregion = 'us-east-1'\nsuspend_time_seconds = 20\nresume_timeout_seconds = 60\n",
        encoding="utf-8",
    )
    cloudy = CliRunner().invoke(slurm, ["config", "--gres", "h100", "--hook-dir", "/opt/h"], env=env)
    assert cloudy.exit_code == 0, cloudy.output
    assert cloudy.output.endswith(POWER_SAVING)
    toml.write_text(toml.read_text().replace("= 20", "= 2.5"), encoding="utf-8")
    bad = CliRunner().invoke(slurm, ["config", "--gres", "h100", "--hook-dir", "/opt/h"], env=env)
    assert bad.exit_code == 1
    assert (
        bad.output
        == f"Error: {toml}: cloud.suspend_time_seconds: a whole number of seconds, at least 1, got 2.5\n"
    )


def test_install_writes_the_cloud_shims_which_pass_the_hostlist(tmp_path: Path) -> None:
    toml = tmp_path / "gpucredit.toml"
    toml.write_text("[cloud]\nregion = 'us-east-1'\n", encoding="utf-8")
    record = tmp_path / "argv"
    fake = tmp_path / "fake-gpucredit"
    fake.write_text(f'#!/bin/sh\necho "$GPUCREDIT_CONFIG $*" > {record}\n', encoding="utf-8")
    fake.chmod(0o755)
    hooks = tmp_path / "hooks"
    written = install(str(tmp_path / "etc"), str(hooks), [str(fake)], str(toml), cloud=[str(fake)])
    for name in ("cloud_resume.sh", "cloud_suspend.sh", "cloud_resume_fail.sh"):
        assert str(hooks / name) in written
    subprocess.run([str(hooks / "cloud_resume_fail.sh"), "cloud[1-2]"], check=True, env={}, timeout=10)
    assert record.read_text() == f"{toml} cloud resume-fail cloud[1-2]\n"
    assert os.access(hooks / "cloud_suspend.sh", os.X_OK)
    plain = install(str(tmp_path / "etc2"), str(tmp_path / "hooks2"), [str(fake)], str(toml))
    assert not any(Path(path).name.startswith("cloud_") for path in plain)
