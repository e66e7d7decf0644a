"""`scontrol show config` read once (slurmtext.show_config): the version and the device
confinement `gpucredit slurm check` names, and the SlurmUser `slurm install` uses."""

from __future__ import annotations

import pytest

from slurmtext import SlurmTextError
from slurmtext.show_config import billing_notes, devices_constrained, parse_show_config, release
from tests.support import FIXTURES

RECORDED = (FIXTURES / "slurm-22.05" / "scontrol_show_config.txt").read_text()

# Hand-written as Slurm prints a cluster with cgroups (src/api/config_info.c: the
# cgroup.conf section follows slurm.conf's settings under its own title).
CONFINED = """\
Configuration data as of 2026-12-03T13:01:43
SLURM_VERSION           = 24.11.5
SlurmUser               = slurm(64030)
TaskPlugin              = task/cgroup,task/affinity

Cgroup Support Configuration:
CgroupPlugin            = cgroup/v2
ConstrainDevices        = yes
ConstrainCores          = yes
"""


def test_the_recorded_box_is_22_05_with_devices_free_for_any_job() -> None:
    settings = parse_show_config(RECORDED)
    assert (settings["SLURM_VERSION"], settings["TaskPlugin"], settings["SlurmUser"]) == (
        "22.05.8",
        "task/none",
        "root(0)",
    )
    assert settings["SlurmctldHost[0]"] == "vm(127.0.0.1)"
    assert not devices_constrained(settings)
    assert billing_notes(settings) == [
        "devices are not constrained (TaskPlugin task/none, ConstrainDevices unset): a job that asked for"
        " no GPU can use one unbilled; set TaskPlugin=task/cgroup and, in cgroup.conf, ConstrainDevices=yes"
    ]


def test_a_cluster_with_task_cgroup_and_constrained_devices_has_nothing_to_note() -> None:
    settings = parse_show_config(CONFINED)
    assert devices_constrained(settings)
    assert billing_notes(settings) == []


@pytest.mark.parametrize(
    "changed",
    [
        ("ConstrainDevices        = yes", "ConstrainDevices        = no"),
        ("TaskPlugin              = task/cgroup,task/affinity", "TaskPlugin              = task/affinity"),
    ],
)
def test_either_half_missing_leaves_devices_free(changed: tuple[str, str]) -> None:
    assert not devices_constrained(parse_show_config(CONFINED.replace(*changed)))


def test_a_release_gpucredit_is_not_tested_on_is_named_with_the_ones_it_is() -> None:
    settings = parse_show_config(CONFINED.replace("24.11.5", "23.02.7"))
    assert billing_notes(settings) == [
        "Slurm 23.02.7 is not a release gpucredit is tested on (22.05, 24.11, 26.05)"
    ]


@pytest.mark.parametrize(
    ("version", "expected"), [("22.05.8", "22.05"), ("26.05.5", "26.05"), ("24.11", "24.11")]
)
def test_release_of_a_version(version: str, expected: str) -> None:
    assert release(version) == expected


@pytest.mark.parametrize("text", ["", "slurm-wlm 22.05.8", "SlurmUser = root\n"])
def test_text_that_is_not_show_config_is_refused(text: str) -> None:
    with pytest.raises(SlurmTextError):
        parse_show_config(text)
