"""`gpucredit example`: the config, units and proxy files the admin guide copies ship in
the package (so in the wheel: tests/install/test_install.py), and copy to an installation's own
paths."""

from __future__ import annotations

import sys
from pathlib import Path

from click.testing import CliRunner

from gpucredit.cli import EXIT_MISSING_EXTRA, _build
from gpucredit.examples import EXAMPLES, GUIDE_EXECUTABLE, example_text
from tests.support import REPO

EXAMPLES_DIR = REPO / "gpucredit" / "examples"
HERE = str(Path(sys.executable).parent / "gpucredit")


def gc(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(_build(), list(args))
    return result.exit_code, result.output


def test_every_example_file_is_listed_and_described() -> None:
    on_disk = {
        str(path.relative_to(EXAMPLES_DIR))
        for path in EXAMPLES_DIR.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc")
    }
    assert set(EXAMPLES) == on_disk
    code, out = gc("example")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == list(EXAMPLES)


def test_a_unit_runs_this_installations_gpucredit() -> None:
    code, out = gc("example", "systemd/gpucredit-daemon.service")
    assert code == 0
    assert f"ExecStart={HERE} daemon\n" in out
    assert GUIDE_EXECUTABLE not in out
    assert out == example_text("systemd/gpucredit-daemon.service")


def test_copying_a_folder_refuses_to_replace_a_different_file(tmp_path: Path) -> None:
    code, out = gc("example", "systemd", "--to", str(tmp_path))
    assert code == 0, out
    units = sorted(path.name for path in tmp_path.iterdir())
    assert units == sorted(Path(name).name for name in EXAMPLES if name.startswith("systemd/"))
    assert (tmp_path / "gpucredit-portal.service").stat().st_mode & 0o777 == 0o644
    # Again: nothing to do. A unit the admin edited is kept unless --force.
    code, out = gc("example", "systemd", "--to", str(tmp_path))
    assert code == 0 and out.count("(unchanged)") == len(units)
    edited = tmp_path / "gpucredit-daemon.service"
    edited.write_text(edited.read_text() + "# mine\n")
    code, out = gc("example", "systemd", "--to", str(tmp_path))
    assert code == 1
    assert f"Error: {edited}: already there and not the example's text: nothing copied" in out
    assert edited.read_text().endswith("# mine\n")
    code, out = gc("example", "systemd/gpucredit-daemon.service", "--to", str(tmp_path), "--force")
    assert (code, out) == (0, f"{edited}\n")
    assert not edited.read_text().endswith("# mine\n")


def test_a_name_that_is_no_example_is_refused() -> None:
    code, out = gc("example", "systemd/nope.service")
    assert code == 2 and "no example 'systemd/nope.service'; `gpucredit example` lists them" in out
    code, out = gc("example", "systemd")
    assert code == 2 and "print one, or copy them with --to DIR" in out


def test_every_timer_starts_a_oneshot_unit_whose_command_exists() -> None:
    """A timer fires the .service of its own name, which must be there, run once, and
    name a gpucredit command that exists (a renamed command would fail only at 3 a.m.)."""
    timers = [name for name in EXAMPLES if name.endswith(".timer")]
    assert "systemd/gpucredit-cloud-reconcile.timer" in timers
    for timer in timers:
        unit = example_text(timer.removesuffix(".timer") + ".service")
        assert "Type=oneshot\n" in unit, timer
        [command] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
        words = command.split()[1:]  # after the executable, this installation's
        code, out = gc(*[word for word in words if not word.startswith("-")], "--help")
        assert code == 0, (timer, out)
    assert "\nUser=slurm\n" in example_text("systemd/gpucredit-cloud-reconcile.service")


def test_every_long_running_unit_stops_restarting_without_its_extra() -> None:
    """A service whose extra is missing exits EXIT_MISSING_EXTRA, which its unit names in
    RestartPreventExitStatus=, so systemd does not restart it every few seconds."""
    for name in EXAMPLES:
        if name.endswith(".service") and "Restart=always" in example_text(name):
            assert f"RestartPreventExitStatus={EXIT_MISSING_EXTRA}\n" in example_text(name), name


def test_the_example_config_is_safe_and_holds_only_keys_the_code_reads() -> None:
    """Every table and key of the example, set or commented out, is one gpucredit reads (a
    lost `[portal]` line once put the portal's keys under [daemon], where nothing read
    them), and it ships what the guide calls off by default off: Slurm's limits from the
    daemon, scarcity caps, the agents' listener."""
    import re
    import tomllib

    from ledger.config import DEFAULTS
    from portal.payments.providers import PAYMENTS_DEFAULTS
    from portal.settings import PORTAL_DEFAULTS

    known: dict[str, set[str]] = {table: set(keys) for table, keys in DEFAULTS.items()}
    known["daemon"] |= {"sockets", "socket_user", "metrics_port", "agent_listen", "munge_socket"}
    known["agent"] |= {"send_to", "munge_socket"}
    known["hooks"] = {"log_file", "stage_dir", "stage_timeout_seconds"}
    known["portal"] |= set(PORTAL_DEFAULTS)
    known["payments"] = set(PAYMENTS_DEFAULTS)
    known["payments.stripe"] = {"secret_key", "webhook_secret", "tolerance_seconds", "timeout_seconds"}
    known["policy.outage_credit_lines"] = {"physics"}
    known["partitions.onprem"] = known["partitions.cloud"] = {"site", "region"}
    known["routing.accounts.physics"] = {"max_cost", "cloud", "cloud_budget", "region"}
    text = example_text("gpucredit.toml")
    table = None
    found = []
    for line in text.splitlines():
        header = re.match(r"^#? ?\[([a-z_.]+)\]\s*(#.*)?$", line)
        if header:
            table = header.group(1)
            assert table in known, table
            continue
        key = re.match(r"^#? ?([a-z_]+) += ", line)
        if key and table is not None:
            found.append(f"{table}.{key.group(1)}")
            assert key.group(1) in known[table], f"{table}.{key.group(1)}"
    assert len(found) > 60
    config = tomllib.loads(text)
    assert config["limits_sync"]["in_daemon"] is False
    assert "partitions" not in config["scarcity"]
    assert "send_to" not in config["agent"] and "agent_listen" not in config["daemon"]
    assert config["portal"]["url"] == "https://gpucredit.example.org/"


def test_operations_shows_the_revision_healthz_answers_today() -> None:
    """docs/operations.md's /healthz example names the newest migration (it once showed
    0005 when 0007 was the schema's)."""
    versions = REPO / "ledger" / "store" / "migrations" / "versions"
    newest = max(path.name.split("_")[0] for path in versions.glob("0*.py"))
    operations = (REPO / "docs" / "operations.md").read_text()
    assert f'"revision": "{newest}"' in operations
