"""`gpucredit slurm config|install`, and the cluster in a box that runs them."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger import api
from ledger.store.db import make_engine, make_sessionmaker
from ledger.store.schema import upgrade
from slurm_hooks.admin import slurmconf
from slurm_hooks.admin.cli import slurm
from slurm_hooks.admin.slurmconf import (
    DEFAULT_HOOK_DIR,
    DEVICE_LINES,
    HOOKS,
    install,
    launcher_command,
    shim_name,
    slurm_conf_lines,
)
from slurm_hooks.hooks import SETTINGS_VARIABLE, HookConfig, load_config
from slurmbox import SlurmBox, parse_scontrol
from tests.support import REPO
from tests.support.cluster import E2E_SLURM, Box, e2e_dir, in_box

GPUCREDIT_KEYS = (
    "JobSubmitPlugins",
    "PrologSlurmctld",
    "EpilogSlurmctld",
    "Prolog",
    "Epilog",
    "AccountingStorageTRES",
    "AccountingStorageEnforce",
    "AccountingStoreFlags",
    "PriorityType",
    "PriorityWeightFairshare",
)


def _config_output(*args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(slurm, ["config", *args], env=env)
    assert result.exit_code == 0, result.output
    return result.output


def test_config_prints_the_lines_the_box_runs() -> None:
    printed = _config_output("--gres", "a100,h100")
    lines = slurm_conf_lines(DEFAULT_HOOK_DIR, ["a100", "h100"], "/etc/slurm")
    assert printed == lines + DEVICE_LINES
    assert lines in SlurmBox().render_slurm_conf()


def test_config_says_how_to_confine_jobs_to_their_gpus_in_comments_a_paste_cannot_break() -> None:
    """ConstrainDevices belongs in cgroup.conf (slurm.conf refuses it), and the box runs
    without cgroups: the lines are advice, every one a comment."""
    assert all(line.startswith("#") for line in DEVICE_LINES.splitlines())
    assert "#   ConstrainDevices=yes" in DEVICE_LINES.splitlines()
    assert "#   TaskPlugin=task/cgroup,task/affinity" in DEVICE_LINES.splitlines()


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
        "AccountingStoreFlags=job_comment",  # the meter's reason for a cancel, in sacct's Comment
        "PriorityType=priority/multifactor",
        "PriorityWeightFairshare=10000",
    ]
    assert lines[0] == "# gpucredit: quote and refuse jobs at submit time (/etc/slurm/job_submit.lua)"
    assert len(lines) - len(settings) == 7  # a comment per group, two for accounting


def test_config_gres_types_are_the_ones_the_ledger_prices(tmp_path: Path) -> None:
    """A site that prices l40s must get gres/gpu:l40s in AccountingStorageTRES, or Slurm
    records no seconds of it (the example's a100,h100 were printed whatever was priced)."""
    config = tmp_path / "gpucredit.toml"
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    config.write_text(f'[database]\nurl = "{url}"\n')
    env = {"GPUCREDIT_CONFIG": str(config), "GPUCREDIT_DATABASE_URL": ""}
    fresh = CliRunner().invoke(slurm, ["config"], env=env)
    assert fresh.exit_code == 0
    assert "AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:h100\n" in fresh.stdout
    assert fresh.stderr.startswith(
        f"note: the ledger is not initialised yet ({tmp_path / 'ledger.db'} does not exist)"
    )
    assert not (tmp_path / "ledger.db").exists()  # reading the prices created no database
    assert fresh.stderr.endswith(": the lines name a100,h100; name yours with --gres\n")
    engine = make_engine(url)
    upgrade(engine)
    with make_sessionmaker(engine)() as s, s.begin():
        api.set_price(s, "l40s", "1.10")
        api.set_price(s, "h100", "3.60")
    printed = CliRunner().invoke(slurm, ["config", "--hook-dir", "/opt/h"], env=env)
    assert "AccountingStorageTRES=gres/gpu,gres/gpu:h100,gres/gpu:l40s\n" in printed.stdout
    assert printed.stderr == ""
    # A config named but missing is a typo, not the defaults.
    missing = CliRunner().invoke(slurm, ["config"], env={"GPUCREDIT_CONFIG": str(tmp_path / "absent.toml")})
    assert missing.exit_code == 1
    assert f"GPUCREDIT_CONFIG names {tmp_path / 'absent.toml'}, which does not exist" in missing.output


def test_config_says_which_qos_each_scarce_partition_needs(tmp_path: Path) -> None:
    config = tmp_path / "gpucredit.toml"
    config.write_text('[scarcity]\npartitions = ["onprem"]\n')
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    printed = _config_output(env={"GPUCREDIT_CONFIG": str(config), "GPUCREDIT_DATABASE_URL": ledger})
    assert printed.endswith(
        "#   sacctmgr -i add qos gpucredit-onprem\n#   PartitionName=onprem ... QOS=gpucredit-onprem\n"
    )


def test_config_prints_the_jwt_lines_when_the_portals_jobs_go_through_slurmrestd(tmp_path: Path) -> None:
    config = tmp_path / "gpucredit.toml"
    config.write_text('[portal]\nsubmitter_socket = "/run/gpucredit/submitter.sock"\n')
    env = {"GPUCREDIT_CONFIG": str(config), "GPUCREDIT_DATABASE_URL": f"sqlite:///{tmp_path / 'ledger.db'}"}
    assert "AuthAltTypes" not in _config_output(env=env)
    config.write_text('[portal]\njobs_backend = "slurmrestd"\njwt_key = "/etc/slurm/site.key"\n')
    assert _config_output(env=env).endswith(
        "# gpucredit: the portal's jobs API acts for each user through slurmrestd with a short-lived\n"
        "# token it signs with /etc/slurm/site.key (owned by SlurmUser, mode 0600; the portal reads a copy)\n"
        "AuthAltTypes=auth/jwt\n"
        "AuthAltParameters=jwt_key=/etc/slurm/site.key\n"
    )


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
    assert (etc / "job_submit.lua").read_text() == slurmconf.WRITTEN_BY + "return slurm.SUCCESS\n"
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


def folders_config(tmp_path: Path, slurm_user: str = "root") -> Path:
    """A config whose hook folders are under tmp_path (install makes them)."""
    config = tmp_path / "gpucredit.toml"
    config.write_text(
        f'[hooks]\nlog_file = "{tmp_path / "log" / "hooks.log"}"\n'
        f'[policy]\noutage_spool_dir = "{tmp_path / "spool" / "outage"}"\n'
        f'[agent]\nspool_dir = "{tmp_path / "spool" / "jobs" / "%n"}"\n'
        f'[slurm]\nbin_dir = "{tmp_path / "no-slurm"}"\n'  # no scontrol: SlurmUser from slurm.conf
        + (f'[daemon]\nsocket_user = "{slurm_user}"\n' if slurm_user != "root" else "")
    )
    return config


def test_install_command(tmp_path: Path, fake_exe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["install", "--etc-dir", str(tmp_path), "--hook-dir", str(tmp_path / "h"), "--slurm-user", "root"]
    args += ["--gpucredit-exe", str(fake_exe), "--config", str(folders_config(tmp_path))]
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
        f"{tmp_path / 'log'} (root, drwxr-xr-x)",
        f"{tmp_path / 'log' / 'hooks.log'} (root, -rw-r-----)",
        f"{tmp_path / 'spool' / 'outage'} (root, drwxr-x---)",
        f"{tmp_path / 'spool' / 'jobs'} (root, drwxr-xr-x)",
    ]
    again = CliRunner().invoke(slurm, args)  # its own files again: replaced, folders as they were
    assert again.exit_code == 0, again.output
    assert len(again.output.splitlines()) == len(HOOKS) + 1


def test_by_default_the_shims_run_this_installations_hook_without_site(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hooks start without site-packages (3-9 ms less per job): everything they
    import must come from the standard library or gpucredit's own packages. In a source
    checkout the launcher's path holds no third-party package, so a hook that grew such
    an import fails here."""
    monkeypatch.setattr(slurmconf, "PACKAGED_JOB_SUBMIT_LUA", Path(__file__))
    args = ["install", "--etc-dir", str(tmp_path), "--hook-dir", str(tmp_path / "h"), "--slurm-user", "root"]
    result = CliRunner().invoke(slurm, [*args, "--config", str(folders_config(tmp_path))])
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
def passthrough_box(slurm_box: Box) -> Iterator[Box]:
    """The box with hooks that accept everything: tests Slurm, not the ledger."""
    previous = slurm_box.hooks
    slurm_box.use_hooks("passthrough")
    try:
        yield slurm_box
    finally:
        slurm_box.use_hooks(previous)


@pytest.mark.slurm
def test_box_runs_a_gpu_job_and_accounts_it_by_type(passthrough_box: Box) -> None:
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
    # 24.11 and 26.05 spell it with a slash (docs/slurm-facts.md §16)
    assert job["TresPerNode"] == ("gres:gpu:a100:1" if E2E_SLURM.startswith("22.05") else "gres/gpu:a100:1")


@pytest.mark.slurm
def test_box_has_the_accounts_and_users(slurm_box: Box) -> None:
    out = slurm_box.run(
        ["sacctmgr", "-n", "-P", "show", "assoc", "format=account,user,parentname"], check=True
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
def test_prolog_hold_keeps_the_job_held_until_released(passthrough_box: Box, tmp_path: Path) -> None:
    """The Slurm behaviour gpucredit's refusal relies on (docs/design.md §3.2).

    A bare non-zero exit requeues the job and it loops; setting priority 0
    first leaves it PENDING with Reason=JobHeldAdmin that the user cannot
    release, and `scontrol release` runs it again as run 1.
    """
    box = passthrough_box
    folder = e2e_dir(box, f"gpucredit-hold-probe-{tmp_path.name}")  # the box's hooks see it
    folder.mkdir(parents=True, exist_ok=True)
    original = folder / "original.sh"
    original.write_text((box.inside(box.hook_dir) / shim_name("prolog-slurmctld")).read_text())
    original.chmod(0o755)
    allow = folder / "allow"
    prolog = HOLD_PROBE_PROLOG.format(original=in_box(box, original), allow=in_box(box, allow))
    with box.custom_hook("prolog-slurmctld", prolog):
        job_id = box.submit(["-J", "hold-probe", "--gres=gpu:a100:1", "--wrap", "true"])
        _poll(lambda: box.scontrol_job(job_id)["Reason"] == "JobHeldAdmin", 30, "held")
        time.sleep(2)  # not requeued again: still the first restart
        job = box.scontrol_job(job_id)
        assert (job["JobState"], job["Restarts"], job["Priority"]) == ("PENDING", "1", "0")
        assert job["Comment"].strip() == "gpucredit: no credit"
        squeue = box.run_as("alice", ["squeue", "-h", "-j", str(job_id), "-o", "%T|%r|%k"])
        assert squeue.stdout.strip() == "PENDING|JobHeldAdmin|gpucredit: no credit"
        assert box.run_as("alice", ["scontrol", "release", str(job_id)]).returncode != 0

        allow.touch()
        box.scontrol("release", str(job_id))
        assert box.wait_state(job_id, "COMPLETED", timeout=60) == "COMPLETED"
    assert [row["State"] for row in box.sacct_rows(job_id)] == ["REQUEUED", "COMPLETED"]
    shutil.rmtree(folder, ignore_errors=True)


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
    assert baked == slurmconf.WRITTEN_BY + 'local SOCKET_PATH = "/run/gc/primary.sock /run/gc/backup.sock"\n'
    config.write_text('[daemon]\nsockets = ["/run/gc/a b.sock"]\n')
    with pytest.raises(ValueError, match="may not be empty or hold spaces"):
        install(
            str(tmp_path / "etc2"),
            str(tmp_path / "h2"),
            [str(fake_exe)],
            str(config),
            job_submit_lua=str(lua),
        )


# --------------------------------------------------------------------------- a site's own hooks


SITE_LUA = """-- the site's own rules
function slurm_job_submit(job_desc, part_list, submit_uid)
    return slurm.SUCCESS
end
"""


def test_install_never_replaces_a_sites_own_job_submit_lua_silently(tmp_path: Path, fake_exe: Path) -> None:
    """A job_submit.lua (or a Prolog shim) that gpucredit did not write is left alone and
    nothing at all is written; --force replaces it, keeping a dated copy."""
    etc, hooks = tmp_path / "etc", tmp_path / "etc" / "gpucredit"
    etc.mkdir()
    (etc / "job_submit.lua").write_text(SITE_LUA)
    args = ["install", "--etc-dir", str(etc), "--hook-dir", str(hooks), "--slurm-user", "root"]
    args += ["--gpucredit-exe", str(fake_exe), "--config", str(folders_config(tmp_path))]
    refused = CliRunner().invoke(slurm, args)
    assert refused.exit_code == 1
    assert refused.output == (
        f"Error: {etc / 'job_submit.lua'}: not written by gpucredit (a site's own?); nothing was changed. "
        "Merge them (docs/admin-guide.md §2, A site's own hooks: --job-submit-to), "
        "or pass --force to replace them (each kept as NAME.bak-TIME)\n"
    )
    assert (etc / "job_submit.lua").read_text() == SITE_LUA
    assert not hooks.exists() and not (tmp_path / "log").exists()

    forced = CliRunner().invoke(slurm, [*args, "--force"])
    assert forced.exit_code == 0, forced.output
    (copy,) = etc.glob("job_submit.lua.bak-*")
    assert copy.read_text() == SITE_LUA
    assert forced.output.splitlines()[0] == f"{copy} (a copy of the file replaced)"
    assert (etc / "job_submit.lua").read_text().startswith(slurmconf.WRITTEN_BY)
    # gpucredit's own files (this install's, or an older one's) are replaced without --force.
    assert CliRunner().invoke(slurm, args).exit_code == 0
    assert len(list(etc.glob("job_submit.lua.bak-*"))) == 1


def test_a_site_keeps_its_job_submit_lua_and_calls_gpucredits(tmp_path: Path, fake_exe: Path) -> None:
    """--job-submit-to writes gpucredit's script beside the site's, which stays as it is
    and is dated ahead, so that slurmctld loads both again."""
    etc = tmp_path / "etc"
    etc.mkdir()
    site = etc / "job_submit.lua"
    site.write_text(SITE_LUA)
    os.utime(site, (1_000_000_000, 1_000_000_000))
    ours = etc / "gpucredit" / "job_submit.lua"
    args = ["install", "--etc-dir", str(etc), "--hook-dir", str(etc / "gpucredit"), "--slurm-user", "root"]
    args += ["--gpucredit-exe", str(fake_exe), "--config", str(folders_config(tmp_path))]
    done = CliRunner().invoke(slurm, [*args, "--job-submit-to", str(ours)])
    assert done.exit_code == 0, done.output
    assert str(ours) in done.output.splitlines()
    assert ours.read_text().startswith(slurmconf.WRITTEN_BY)
    assert site.read_text() == SITE_LUA
    assert site.stat().st_mtime > time.time()


def lua_run(script: str) -> str:
    done = subprocess.run(["lua5.1", "-e", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_example_site_wrapper_runs_the_sites_rules_then_gpucredits(tmp_path: Path) -> None:
    """gpucredit/examples/slurm/job_submit.lua under Slurm's Lua (5.1): each script in an
    environment of its own; a job the site refuses is never quoted."""
    from gpucredit.examples import example_text

    if subprocess.run(["sh", "-c", "command -v lua5.1"], capture_output=True).returncode != 0:
        pytest.skip("lua5.1 not installed (apt-get install lua5.1)")
    site = tmp_path / "site.lua"
    site.write_text(
        "local refused = 'nope'\n"
        "function slurm_job_submit(job_desc, part_list, uid)\n"
        "  print('site: ' .. job_desc.name)\n"
        "  if job_desc.name == refused then return slurm.ERROR end\n"
        "  return slurm.SUCCESS\n"
        "end\n"
        "function slurm_job_modify(job_desc, job_rec, part_list, uid) return slurm.SUCCESS end\n"
    )
    ours = tmp_path / "gpucredit.lua"
    ours.write_text(
        "function slurm_job_submit(job_desc, part_list, uid)\n"
        "  print('gpucredit: ' .. job_desc.name)\n"
        "  return slurm.SUCCESS\n"
        "end\n"
        "function slurm_job_modify(job_desc, job_rec, part_list, uid) return slurm.SUCCESS end\n"
        "return slurm.SUCCESS\n"
    )
    wrapper = tmp_path / "job_submit.lua"
    wrapper.write_text(
        example_text("slurm/job_submit.lua")
        .replace("/etc/slurm/job_submit.site.lua", str(site))
        .replace("/etc/slurm/gpucredit/job_submit.lua", str(ours))
    )
    out = lua_run(
        "slurm = {SUCCESS = 0, ERROR = -1}\n"
        f"assert(dofile('{wrapper}') == 0)\n"
        "print(slurm_job_submit({name = 'train'}, {}, 1001))\n"
        "print(slurm_job_submit({name = 'nope'}, {}, 1001))\n"
        "print(refused == nil)\n"  # the scripts' own globals stay in their environments
    )
    assert out == "site: train\ngpucredit: train\n0\nsite: nope\n-1\ntrue\n"


# --------------------------------------------------------------------------- the hooks' folders


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A folder other users may enter (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="gpucredit-install-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_install_gives_the_hooks_folders_to_slurmuser(open_tmp: Path, fake_exe: Path) -> None:
    """With Debian's SlurmUser (here `daemon`, a user that exists everywhere) the
    controller's hooks can write their log and the outage spool: root-owned folders
    once made the hooks skip their log in silence."""
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    tmp_path = open_tmp
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text("ClusterName=lab\nSlurmUser=daemon # Debian: slurm\n")
    args = ["install", "--etc-dir", str(etc), "--hook-dir", str(etc / "gpucredit")]
    args += ["--gpucredit-exe", str(fake_exe), "--config", str(folders_config(tmp_path, "daemon"))]
    done = CliRunner().invoke(slurm, args, env={"PATH": "/nonexistent"})
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[len(HOOKS) + 1 :] == [
        f"{tmp_path / 'log'} (daemon, drwxr-xr-x)",
        f"{tmp_path / 'log' / 'hooks.log'} (daemon, -rw-r-----)",
        f"{tmp_path / 'spool' / 'outage'} (daemon, drwxr-x---)",
        f"{tmp_path / 'spool' / 'jobs'} (root, drwxr-xr-x)",  # the node Prolog runs as SlurmdUser
    ]
    as_slurm = subprocess.run(
        [
            "runuser",
            "-u",
            "daemon",
            "--",
            "sh",
            "-c",
            f"echo x >> {tmp_path / 'log' / 'hooks.log'} && touch {tmp_path / 'spool' / 'outage' / 'runs'}",
        ],
        capture_output=True,
        text=True,
    )
    assert as_slurm.returncode == 0, as_slurm.stderr


def test_slurmuser_is_read_from_scontrol_then_slurm_conf(tmp_path: Path) -> None:
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\necho 'SLURM_VERSION = 22.05.8'\necho 'SlurmUser               = slurm(64030)'\n"
        "echo 'SlurmdUser = root(0)'\n"
    )
    scontrol.chmod(0o755)
    assert slurmconf.slurm_users(str(tmp_path), str(scontrol)) == ("slurm", "root", "scontrol show config")
    (tmp_path / "slurm.conf").write_text("# SlurmUser=nobody\nslurmuser = munge\n")
    assert slurmconf.slurm_users(str(tmp_path), str(tmp_path / "none")) == (
        "munge",
        "root",
        str(tmp_path / "slurm.conf"),
    )
    assert slurmconf.slurm_users(str(tmp_path / "x"), None) == ("root", "root", "Slurm's defaults")


def test_install_warns_when_the_daemons_socket_is_not_slurmusers(tmp_path: Path, fake_exe: Path) -> None:
    args = [
        "install",
        "--etc-dir",
        str(tmp_path),
        "--hook-dir",
        str(tmp_path / "h"),
        "--slurm-user",
        "daemon",
    ]
    args += ["--gpucredit-exe", str(fake_exe), "--config", str(folders_config(tmp_path))]
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    done = CliRunner().invoke(slurm, args)
    assert done.exit_code == 0, done.output
    assert done.stderr == (
        "warning: SlurmUser is daemon (--slurm-user) but daemon.socket_user is not set: the "
        "controller's hooks cannot open the daemon's socket (0600); set daemon.socket_user = \"daemon\" "
        "and restart the daemon\n"
    )


def test_the_admin_guide_shows_what_slurm_config_prints() -> None:
    guide = (REPO / "docs" / "admin-guide.md").read_text()
    section = guide[guide.index("## 2. Wire it into Slurm") :]
    shown = section.split("```\n")[3]  # the second block: the lines printed
    assert shown == _config_output("--gres", "a100,h100")
