"""`gpucredit slurm config|install`, and the cluster in a box that runs them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_hooks.admin import slurmconf
from slurm_hooks.admin.cli import slurm
from slurm_hooks.admin.slurmconf import (
    DEFAULT_HOOK_DIR,
    HOOKS,
    install,
    launcher_command,
    shim_name,
    slurm_conf_lines,
)
from slurm_hooks.hooks import SETTINGS_VARIABLE, HookConfig, load_config
from slurmbox import SlurmBox, parse_scontrol

GPUCREDIT_KEYS = (
    "JobSubmitPlugins",
    "PrologSlurmctld",
    "EpilogSlurmctld",
    "Prolog",
    "Epilog",
    "AccountingStorageTRES",
    "AccountingStorageEnforce",
    "PriorityType",
    "PriorityWeightFairshare",
)


def _config_output(*args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(slurm, ["config", *args], env=env)
    assert result.exit_code == 0, result.output
    return result.output


def test_config_prints_the_lines_the_box_runs() -> None:
    printed = _config_output("--gres", "a100,h100")
    assert printed == slurm_conf_lines(DEFAULT_HOOK_DIR, ["a100", "h100"], "/etc/slurm")
    assert printed in SlurmBox().render_slurm_conf()


def test_config_lines_are_the_only_source_of_gpucredit_settings() -> None:
    conf = SlurmBox().render_slurm_conf()
    keys = [line.split("=", 1)[0] for line in conf.splitlines() if "=" in line and line[0] != "#"]
    for key in GPUCREDIT_KEYS:
        assert keys.count(key) == 1, key
    assert "@" not in conf


def test_config_lines_content() -> None:
    lines = slurm_conf_lines("/opt/hooks", ["h100", "a100", "h100"], "/etc/slurm").splitlines()
    settings = [line for line in lines if not line.startswith("#")]
    assert settings == [
        "JobSubmitPlugins=lua",
        "PrologSlurmctld=/opt/hooks/prolog_slurmctld.sh",
        "EpilogSlurmctld=/opt/hooks/epilog_slurmctld.sh",
        "Prolog=/opt/hooks/prolog.sh",
        "Epilog=/opt/hooks/epilog.sh",
        "AccountingStorageTRES=gres/gpu,gres/gpu:h100,gres/gpu:a100",
        "AccountingStorageEnforce=associations,limits,safe",
        "PriorityType=priority/multifactor",
        "PriorityWeightFairshare=10000",
    ]
    assert lines[0] == "# gpucredit: quote and refuse jobs at submit time (/etc/slurm/job_submit.lua)"
    assert len(lines) - len(settings) == 6  # a comment per group, two for accounting


def test_config_gres_types_come_from_the_price_table(tmp_path: Path) -> None:
    config = tmp_path / "gpucredit.toml"
    config.write_text('[prices]\nl40s = "1.10"\nh100 = "3.60"\n')
    printed = _config_output("--hook-dir", "/opt/h", env={"GPUCREDIT_CONFIG": str(config)})
    assert "AccountingStorageTRES=gres/gpu,gres/gpu:l40s,gres/gpu:h100\n" in printed
    missing = _config_output(env={"GPUCREDIT_CONFIG": str(tmp_path / "absent.toml")})
    assert "AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:h100\n" in missing


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hook-dir", "relative/dir"], "hook_dir must be an absolute path"),
        (["--gres", "a100,bad type"], "invalid GPU type 'bad type'"),
        (["--gres", ","], "name at least one GPU type"),
    ],
)
def test_config_rejects_bad_input(args: list[str], message: str) -> None:
    result = CliRunner().invoke(slurm, ["config", *args])
    assert result.exit_code == 2
    assert message in result.output


@pytest.fixture
def fake_exe(tmp_path: Path) -> Path:
    """Stands in for gpucredit: prints its config, arguments and the settings the shim passes."""
    exe = tmp_path / "bin" / "fake gpucredit"
    exe.parent.mkdir()
    exe.write_text(
        f'#!/bin/sh\necho "CONFIG=$GPUCREDIT_CONFIG ARGS=$*"\necho "SETTINGS=${SETTINGS_VARIABLE}"\n'
    )
    exe.chmod(0o755)
    return exe


def test_install_writes_shims_and_job_submit(tmp_path: Path, fake_exe: Path) -> None:
    lua = tmp_path / "src.lua"
    lua.write_text("return slurm.SUCCESS\n")
    etc, hooks = tmp_path / "etc", tmp_path / "etc" / "hooks"
    config = tmp_path / "my config.toml"
    written = install(str(etc), str(hooks), [str(fake_exe)], str(config), job_submit_lua=str(lua))

    assert written == [*(str(hooks / shim_name(h)) for h in HOOKS), str(etc / "job_submit.lua")]
    assert (etc / "job_submit.lua").read_text() == "return slurm.SUCCESS\n"
    for hook in HOOKS:
        shim = hooks / shim_name(hook)
        assert stat.S_IMODE(shim.stat().st_mode) == 0o755
        # Slurm runs hooks with an empty environment: no PATH at all.
        out = subprocess.run([str(shim)], env={}, capture_output=True, text=True, check=True)
        # No config file: the hooks get the defaults, as they would reading a missing file.
        assert out.stdout == f"CONFIG={config} ARGS=hook {hook}\nSETTINGS={{}}\n"


def _shim_hook_config(shim: Path) -> HookConfig:
    """What the real hook would load when Slurm runs `shim` (with the fake exe)."""
    out = subprocess.run([str(shim)], env={}, capture_output=True, text=True, check=True).stdout
    config_line, settings_line = out.splitlines()
    environ = {
        "GPUCREDIT_CONFIG": config_line.removeprefix("CONFIG=").rsplit(" ARGS=", 1)[0],
        SETTINGS_VARIABLE: settings_line.removeprefix("SETTINGS="),
    }
    config, problems = load_config(environ)
    assert problems == []
    return config


def test_install_copies_the_hook_settings_and_a_rerun_updates_them(tmp_path: Path, fake_exe: Path) -> None:
    lua = tmp_path / "src.lua"
    lua.write_text("return slurm.SUCCESS\n")
    config = tmp_path / "gpucredit.toml"
    config.write_text(
        '[database]\nurl = "postgresql://gc:secret@db/gpucredit"\n'
        '[daemon]\nsocket = "/run/one.sock"\ntimeout_seconds = 1.5\n'
        '[policy]\non_ledger_unreachable = "accept"\n'
        '[slurm]\ncluster = "lab"\nbin_dir = "/opt/slurm/bin"\n'
        '[agent]\nspool_dir = "/var/spool/g/%n"\n[hooks]\nlog_file = "/var/log/g.log"\n'
    )
    args = (str(tmp_path / "etc"), str(tmp_path / "hooks"), [str(fake_exe)], str(config))
    install(*args, job_submit_lua=str(lua))
    shims = [tmp_path / "hooks" / shim_name(hook) for hook in HOOKS]
    expected = HookConfig(
        socket_path="/run/one.sock",
        timeout_seconds=1.5,
        on_ledger_unreachable="accept",
        cluster="lab",
        bin_dir="/opt/slurm/bin",
        spool_dir="/var/spool/g/%n",
        log_file="/var/log/g.log",
    )
    for shim in shims:
        assert _shim_hook_config(shim) == expected
        assert "secret" not in shim.read_text()  # only what the hooks read is copied

    config.write_text('[daemon]\nsocket = "/run/two.sock"\n')
    # The shims keep the copy they were given...
    assert _shim_hook_config(shims[0]) == expected
    # ...until install runs again, as the shim's comment says.
    install(*args, job_submit_lua=str(lua))
    assert "run `gpucredit slurm install` again" in shims[0].read_text()
    for shim in shims:
        assert _shim_hook_config(shim) == HookConfig(socket_path="/run/two.sock")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[daemon]\nsocket = 1979-05-27\n", "a hook setting is not a string or number"),
        ("[daemon\n", "Expected"),
    ],
)
def test_install_refuses_a_config_it_cannot_copy(
    tmp_path: Path, fake_exe: Path, toml: str, message: str
) -> None:
    config = tmp_path / "gpucredit.toml"
    config.write_text(toml)
    with pytest.raises(ValueError, match=message):
        install(str(tmp_path), str(tmp_path / "h"), [str(fake_exe)], str(config), job_submit_lua=__file__)
    assert not (tmp_path / "h").exists()  # nothing written


def test_install_bumps_job_submit_mtime(tmp_path: Path, fake_exe: Path) -> None:
    """slurmctld reloads job_submit.lua only when its mtime (seconds) grows."""
    lua = tmp_path / "src.lua"
    lua.write_text("return slurm.SUCCESS\n")
    args = (str(tmp_path), str(tmp_path / "h"), [str(fake_exe)], "/etc/gpucredit.toml")
    install(*args, job_submit_lua=str(lua))
    first = os.stat(tmp_path / "job_submit.lua").st_mtime
    install(*args, job_submit_lua=str(lua))
    assert int(os.stat(tmp_path / "job_submit.lua").st_mtime) > int(first)


def test_install_refuses_relative_paths_and_missing_lua(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="the hook command must be an absolute path"):
        install(str(tmp_path), str(tmp_path), ["gpucredit"], "/c.toml", job_submit_lua=__file__)
    with pytest.raises(ValueError, match="python must be an absolute path"):
        launcher_command("python3")
    with pytest.raises(FileNotFoundError, match=r"job_submit\.lua not found"):
        install(str(tmp_path), str(tmp_path), ["/x"], "/c.toml", job_submit_lua=str(tmp_path / "no"))


def test_install_command(tmp_path: Path, fake_exe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["install", "--etc-dir", str(tmp_path), "--hook-dir", str(tmp_path / "h")]
    args += ["--gpucredit-exe", str(fake_exe), "--config", "/etc/g.toml"]
    lua = tmp_path / "shipped.lua"
    monkeypatch.setattr(slurmconf, "PACKAGED_JOB_SUBMIT_LUA", lua)

    result = CliRunner().invoke(slurm, args)
    assert result.exit_code == 2
    assert f"job_submit.lua not found at {lua}" in result.output

    lua.write_text("return slurm.SUCCESS\n")
    result = CliRunner().invoke(slurm, args)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        *(str(tmp_path / "h" / shim_name(h)) for h in HOOKS),
        str(tmp_path / "job_submit.lua"),
    ]


def test_by_default_the_shims_run_this_installations_hook_without_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hooks start without site-packages (3-9 ms less per job): everything they
    import must come from the standard library or gpucredit's own packages. In a source
    checkout the launcher's path holds no third-party package, so a hook that grew such
    an import fails here."""
    monkeypatch.setattr(slurmconf, "PACKAGED_JOB_SUBMIT_LUA", Path(__file__))
    args = ["install", "--etc-dir", str(tmp_path), "--hook-dir", str(tmp_path / "h")]
    result = CliRunner().invoke(slurm, [*args, "--config", str(tmp_path / "none.toml")])
    assert result.exit_code == 0, result.output
    shim = (tmp_path / "h" / "prolog_slurmctld.sh").read_text()
    assert shim.endswith(f"    {sys.executable} -I -S {slurmconf.HOOK_LAUNCHER} hook prolog-slurmctld\n")
    # As Slurm runs it (no environment at all), outside a job: the real hook answers.
    done = subprocess.run(
        [str(tmp_path / "h" / "prolog_slurmctld.sh")], env={}, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert "gpucredit[prolog-slurmctld] job=? run=0: SLURM_JOB_ID not set; nothing to do" in done.stderr


def test_parse_scontrol_keeps_values_with_spaces() -> None:
    line = "JobId=7 JobName=my job Reason=gpucredit: no credit JobState=PENDING Comment=a b"
    job = parse_scontrol(line)
    assert job == {
        "JobId": "7",
        "JobName": "my job",
        "Reason": "gpucredit: no credit",
        "JobState": "PENDING",
        "Comment": "a b",
    }


# --------------------------------------------------------------------------- on the box


@pytest.fixture
def passthrough_box(slurm_box: SlurmBox) -> Iterator[SlurmBox]:
    """The box with hooks that accept everything: tests Slurm, not the ledger."""
    previous = slurm_box.hooks
    slurm_box.use_hooks("passthrough")
    try:
        yield slurm_box
    finally:
        slurm_box.use_hooks(previous)


@pytest.mark.slurm
def test_box_runs_a_gpu_job_and_accounts_it_by_type(passthrough_box: SlurmBox) -> None:
    box = passthrough_box
    rc, out, err = box.sbatch(["--parsable", "--gres=gpu:a100:1", "--wrap", "true"], user="alice")
    assert rc == 0, err
    job_id = int(out)

    assert box.wait_state(job_id, "COMPLETED", timeout=60) == "COMPLETED"
    (row,) = box.sacct_rows(job_id)
    assert row["User"] == "alice"
    assert row["Account"] == "physics"
    assert row["Partition"] == "onprem"
    assert "gres/gpu:a100=1" in row["AllocTRES"].split(",")
    job = box.scontrol_job(job_id)
    assert job["JobState"] == "COMPLETED"
    assert job["TresPerNode"] == "gres:gpu:a100:1"


@pytest.mark.slurm
def test_box_has_the_accounts_and_users(slurm_box: SlurmBox) -> None:
    out = subprocess.run(
        ["/usr/bin/sacctmgr", "-n", "-P", "show", "assoc", "format=account,user,parentname"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert {"physics||research", "chemistry||research"} <= set(out)
    assert {"physics|alice|", "physics|bob|", "chemistry|bob|"} <= set(out)
    assert {"research|root|", "physics|root|", "chemistry|root|"} <= set(out)
    assert "chemistry|alice|" not in out


# Refuses jobs named hold-probe the way gpucredit's PrologSlurmctld does, but without its
# AdminComment mark: the box's daemons release marked jobs their account can pay for (a
# full scan every minute), and this probes Slurm alone. Other jobs run the real shim.
HOLD_PROBE_PROLOG = """#!/bin/sh
case "$SLURM_JOB_NAME" in hold-probe) ;; *) exec {original} ;; esac
[ -e {allow} ] && exit 0
/usr/bin/scontrol update jobid=$SLURM_JOB_ID priority=0 comment="gpucredit: no credit"
exit 1
"""


def _poll(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.2)


@pytest.mark.slurm
def test_prolog_hold_keeps_the_job_held_until_released(passthrough_box: SlurmBox, tmp_path: Path) -> None:
    """The Slurm behaviour gpucredit's refusal relies on (docs/design.md §3.2).

    A bare non-zero exit requeues the job and it loops; setting priority 0
    first leaves it PENDING with Reason=JobHeldAdmin that the user cannot
    release, and `scontrol release` runs it again as run 1.
    """
    box = passthrough_box
    original = tmp_path / "original.sh"
    original.write_text((Path(box.hook_dir) / shim_name("prolog-slurmctld")).read_text())
    original.chmod(0o755)
    allow = tmp_path / "allow"
    prolog = HOLD_PROBE_PROLOG.format(original=original, allow=allow)
    with box.custom_hook("prolog-slurmctld", prolog):
        job_id = box.submit(["-J", "hold-probe", "--gres=gpu:a100:1", "--wrap", "true"])
        _poll(lambda: box.scontrol_job(job_id)["Reason"] == "JobHeldAdmin", 30, "held")
        time.sleep(2)  # not requeued again: still the first restart
        job = box.scontrol_job(job_id)
        assert (job["JobState"], job["Restarts"], job["Priority"]) == ("PENDING", "1", "0")
        assert job["Comment"].strip() == "gpucredit: no credit"
        squeue = box.run_as("alice", ["/usr/bin/squeue", "-h", "-j", str(job_id), "-o", "%T|%r|%k"])
        assert squeue.stdout.strip() == "PENDING|JobHeldAdmin|gpucredit: no credit"
        assert box.run_as("alice", ["/usr/bin/scontrol", "release", str(job_id)]).returncode != 0

        allow.touch()
        box.scontrol("release", str(job_id))
        assert box.wait_state(job_id, "COMPLETED", timeout=60) == "COMPLETED"
    assert [row["State"] for row in box.sacct_rows(job_id)] == ["REQUEUED", "COMPLETED"]


def test_install_ships_gpucredits_own_job_submit_lua() -> None:
    """The script `slurm install` copies is the packaged one (a wrong path once made the box
    fall back to the pass-through script, and every GPU job was accepted unquoted)."""
    assert slurmconf.PACKAGED_JOB_SUBMIT_LUA.is_file()
    assert "function slurm_job_submit" in slurmconf.PACKAGED_JOB_SUBMIT_LUA.read_text()


def test_install_bakes_every_daemon_socket_into_job_submit(tmp_path: Path, fake_exe: Path) -> None:
    """Two controllers: job_submit.lua tries the sockets of daemon.sockets in order."""
    lua = tmp_path / "src.lua"
    lua.write_text('local SOCKET_PATH = "@SOCKET@"\n')
    config = tmp_path / "gpucredit.toml"
    config.write_text('[daemon]\nsockets = ["/run/gc/primary.sock", "/run/gc/backup.sock"]\n')
    install(str(tmp_path / "etc"), str(tmp_path / "h"), [str(fake_exe)], str(config), job_submit_lua=str(lua))
    baked = (tmp_path / "etc" / "job_submit.lua").read_text()
    assert baked == 'local SOCKET_PATH = "/run/gc/primary.sock /run/gc/backup.sock"\n'
    config.write_text('[daemon]\nsockets = ["/run/gc/a b.sock"]\n')
    with pytest.raises(ValueError, match="may not be empty or hold spaces"):
        install(
            str(tmp_path / "etc2"),
            str(tmp_path / "h2"),
            [str(fake_exe)],
            str(config),
            job_submit_lua=str(lua),
        )
