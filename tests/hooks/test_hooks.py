"""slurm_hooks/client.py and slurm_hooks/hooks.py against a fake daemon and a fake scontrol.

The fake daemon is a real threaded Unix-socket server speaking the wire
protocol (one JSON line in, one out); the fake scontrol answers only the
exact argv it was told to expect. Hook environments are those of docs/slurm-facts.md §5
(no PATH, no GPU variables on the controller).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tomllib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from slurm_hooks.client import DaemonClient, DaemonRefused, DaemonUnreachable
from slurm_hooks.hooks import (
    NEVER_FITS,
    SETTINGS_VARIABLE,
    UNREACHABLE_REASON,
    CommandError,
    HookConfig,
    hold_job_with_reason,
    hook_settings,
    load_config,
    main,
    registry_path,
    run_command,
)
from tests.support import REPO
from tests.support.fake_slurm import (
    SCONTROL,
    SQUEUE,
    FakeSlurm,
    ctld_env,
    hold_argv,
    hold_object,
    job_line,
    ok,
    queue,
    queue_line,
    refused,
    show,
)
from tests.support.fakedaemon import CLOSE, HANG, FakeDaemon, Responder
from tests.support.fakedaemon import fake_daemon as fake_daemon
from tests.support.fakedaemon import sockdir as sockdir

NOW = datetime(2026, 12, 2, 10, 30, 0, tzinfo=UTC)


# --- DaemonClient ------------------------------------------------------------------------


def test_client_returns_the_result(fake_daemon: Callable[[Responder], FakeDaemon]) -> None:
    daemon = fake_daemon(lambda request: ok({"echo": request["op"], "n": request["n"]}))
    result = DaemonClient(daemon.path, timeout=2).call("ping", n=3, text='a "b"\nc ü')
    assert result == {"echo": "ping", "n": 3}
    assert daemon.requests == [{"op": "ping", "n": 3, "text": 'a "b"\nc ü'}]


def test_client_raises_refused_with_code_message_details(
    fake_daemon: Callable[[Responder], FakeDaemon],
) -> None:
    daemon = fake_daemon(lambda _: refused("daily_cap", "30.4 > 30", current="14.4", cap="30"))
    with pytest.raises(DaemonRefused) as info:
        DaemonClient(daemon.path, timeout=2).call("hold")
    assert info.value.code == "daily_cap"
    assert info.value.message == "30.4 > 30"
    assert info.value.details == {"current": "14.4", "cap": "30"}


def test_client_unavailable_code_means_unreachable(
    fake_daemon: Callable[[Responder], FakeDaemon],
) -> None:
    daemon = fake_daemon(lambda _: refused("unavailable", "database is down"))
    with pytest.raises(DaemonUnreachable, match="database is down"):
        DaemonClient(daemon.path, timeout=2).call("hold")


def test_client_missing_socket(sockdir: Path) -> None:
    with pytest.raises(DaemonUnreachable, match="cannot reach"):
        DaemonClient(str(sockdir / "nothing.sock"), timeout=1).call("hold")


def test_client_connection_refused(sockdir: Path) -> None:
    path = str(sockdir / "dead.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(path)  # a socket file nobody listens on: ECONNREFUSED
        with pytest.raises(DaemonUnreachable, match="cannot reach"):
            DaemonClient(path, timeout=1).call("hold")


def test_client_timeout(fake_daemon: Callable[[Responder], FakeDaemon]) -> None:
    daemon = fake_daemon(lambda _: HANG)
    with pytest.raises(DaemonUnreachable, match="no reply"):
        DaemonClient(daemon.path, timeout=0.2).call("hold")


@pytest.mark.parametrize(
    "reply",
    [
        b"not json\n",
        b"[1, 2]\n",
        b'{"ok": true}\n',
        b'{"ok": false, "error": "x"}\n',
        b"\n",
        CLOSE,
        b'{"ok": true, "result": {"a": "\xff"}}\n',
    ],
)
def test_client_garbled_reply(fake_daemon: Callable[[Responder], FakeDaemon], reply: Any) -> None:
    daemon = fake_daemon(lambda _: reply)
    with pytest.raises(DaemonUnreachable):
        DaemonClient(daemon.path, timeout=1).call("hold")


def test_client_accepts_a_reply_closed_without_newline(
    fake_daemon: Callable[[Responder], FakeDaemon],
) -> None:
    daemon = fake_daemon(lambda _: b'{"ok": true, "result": {"x": 1}}')
    assert DaemonClient(daemon.path, timeout=1).call("hold") == {"x": 1}


def test_client_constructor_does_no_io() -> None:
    client = DaemonClient("/nonexistent/daemon.sock", timeout=0.1)
    assert (client.socket_path, client.timeout) == ("/nonexistent/daemon.sock", 0.1)


def test_hook_modules_import_nothing_heavy() -> None:
    code = (
        "import sys, slurm_hooks.hooks, slurm_hooks.client, slurm_hooks.scontrol\n"
        "heavy = {'click', 'sqlalchemy', 'psycopg', 'flask', 'ledger', 'alembic', 'tomllib'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    root = REPO
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# Stdlib modules that cost milliseconds each to import (or, for _strptime, to first
# use) and that PrologSlurmctld does without; docs/design.md §3.8 wants hooks to start fast.
SLOW_STDLIB = ("tomllib", "dataclasses", "inspect", "typing", "subprocess", "socket", "tempfile", "pathlib",
               "_strptime")  # fmt: skip


def _modules_after(code: str, env: dict[str, str] | None = None) -> list[str]:
    """Run `code` in a fresh `python -S` (no site: only what the code itself imports)
    and return which of SLOW_STDLIB it left in sys.modules."""
    script = (
        f"{code}\nimport sys\nfound = sorted(m for m in {SLOW_STDLIB!r} if m in sys.modules)\n"
        "import json\nprint(json.dumps(found))\n"
    )
    root = REPO
    out = subprocess.run(
        [sys.executable, "-S", "-c", script], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    found: list[str] = json.loads(out.stdout.splitlines()[-1])
    return found


def test_importing_the_hooks_leaves_out_slow_stdlib_modules() -> None:
    assert _modules_after("import slurm_hooks.hooks") == []


def test_prolog_slurmctld_run_leaves_out_slow_stdlib_modules(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    """A whole hold, timestamps and all, with the settings a shim carries: no TOML."""
    daemon = fake_daemon(lambda _: ok(hold_object()))
    path = config()
    with open(path, "rb") as f:
        settings = json.dumps(hook_settings(tomllib.load(f)))
    code = (
        "from slurm_hooks import hooks\n"
        f"rc = hooks.main(['prolog-slurmctld'], environ=ENV, runner=lambda argv: {queue_line()!r},"
        " log=print)\n"
        "assert rc == 0, rc\n"
    )
    env = ctld_env(path)
    utc = {**os.environ, "TZ": "UTC"}  # scontrol prints local time
    assert _modules_after(code.replace("ENV", repr({**env, SETTINGS_VARIABLE: settings})), utc) == []
    assert daemon.requests[0]["start"] == "2026-12-02T10:00:01Z"
    # Without the shim's copy the hook falls back to the config file, so it needs tomllib.
    assert "tomllib" in _modules_after(code.replace("ENV", repr(env)), utc)


# --- fake Slurm --------------------------------------------------------------------------


NO_GPU_QUEUE = queue_line(30, tres="cpu=1,node=1,billing=1")
MIXED_TWO_NODES_QUEUE = queue_line(
    12,
    state="RUNNING",
    tres="cpu=2,node=2,billing=102,gres/gpu=6,gres/gpu:a100=2,gres/gpu:h100=4",
    node_list="node[1-2]",
    num_nodes=2,
)

NO_GPU_LINE = job_line(30, tres="cpu=1,node=1,billing=1", job_gres="(null)", groups=(("node1", ""),))

# sbatch -N 2 --gres=gpu:a100:1,gpu:h100:2: indices differ per node.
MIXED_TWO_NODES = job_line(
    12,
    state="RUNNING",
    tres="cpu=2,node=2,billing=102,gres/gpu=6,gres/gpu:a100=2,gres/gpu:h100=4",
    job_gres="gpu:a100:2,gpu:h100:4",
    groups=(
        ("node1", "gpu:a100:1(IDX:0),gpu:h100:2(IDX:2-3)"),
        ("node2", "gpu:a100:1(IDX:1),gpu:h100:2(IDX:2-3)"),
    ),
    node_list="node[1-2]",
)


@pytest.fixture
def config(tmp_path: Path, sockdir: Path) -> Callable[..., str]:
    def write(policy: str = "reject", timeout: float = 0.5) -> str:
        path = tmp_path / "gpucredit.toml"
        path.write_text(
            "[daemon]\n"
            f'socket = "{sockdir / "daemon.sock"}"\n'
            f"timeout_seconds = {timeout}\n"
            "[policy]\n"
            f'on_ledger_unreachable = "{policy}"\n'
            f'outage_spool_dir = "{tmp_path / "outage"}"\n'  # never the host's (a box may run)
            "[slurm]\n"
            'bin_dir = "/usr/bin"\n'
            'cluster = "fromconfig"\n'
            "[agent]\n"
            f'spool_dir = "{tmp_path / "spool" / "%n"}"\n'
        )
        return str(path)

    return write


def node_env(config_path: str, node: str, job_id: int = 12, restart: int = 0) -> dict[str, str]:
    """Node Prolog/Epilog environment; SLURM_JOB_GPUS carries 22.05's wrong value."""
    env = ctld_env(config_path, job_id, restart, SLURMD_NODENAME=node, SLURM_JOB_GPUS="2")
    env["SLURM_SCRIPT_CONTEXT"] = "prolog_slurmd"
    del env["SLURM_JOB_NAME"], env["SLURM_JOB_GROUP"]
    return env


def _discard(line: str) -> None:
    pass


def run_hook(hook: str, env: dict[str, str], slurm: FakeSlurm) -> tuple[int, list[str]]:
    lines: list[str] = []
    rc = main([hook], environ=env, runner=slurm, now=lambda: NOW, log=lines.append, tz=UTC)
    return rc, lines


# --- PrologSlurmctld ---------------------------------------------------------------------


def test_prolog_slurmctld_takes_a_hold(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    daemon = fake_daemon(lambda _: ok(hold_object()))
    slurm = FakeSlurm({queue(5): queue_line()})
    rc, lines = run_hook("prolog-slurmctld", ctld_env(config()), slurm)
    assert rc == 0
    assert daemon.requests == [
        {
            "op": "hold",
            "cluster": "lab",
            "job_id": 5,
            "run": 0,
            "account": "physics",
            "user": "alice",
            "partition": "debug",
            "gpus": {"a100": 1, "h100": 1},
            "seconds": 900,
            "start": "2026-12-02T10:00:01Z",
            "submit": "2026-12-02T10:00:00Z",
            "nodes": 1,
            "stdout": "/home/alice/slurm-5.out",
        }
    ]
    assert slurm.calls == [list(queue(5))]
    assert len(lines) == 1
    assert lines[0].startswith("gpucredit[prolog-slurmctld] job=5 run=0: hold h-1 of 1.40 credits")


def test_prolog_slurmctld_refusal_holds_the_job_with_the_reason(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    message = "needs 1.40 credits, 0.20 available in physics; top up at https://portal/physics"
    daemon = fake_daemon(lambda _: refused("insufficient_credits", message))
    slurm = FakeSlurm({queue(5): queue_line(), hold_argv(5, message): ""})
    rc, lines = run_hook("prolog-slurmctld", ctld_env(config()), slurm)
    assert rc == 1
    assert len(daemon.requests) == 1
    assert slurm.calls == [list(queue(5)), list(hold_argv(5, message))]
    assert lines == [
        f"gpucredit[prolog-slurmctld] job=5 run=0: refused (insufficient_credits): {message}; job held"
    ]


def test_prolog_slurmctld_refusal_for_a_limit(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    message = "concurrent GPUs for alice: 5 > 4"
    fake_daemon(lambda _: refused("concurrent_gpus", message, current=5, cap=4))
    slurm = FakeSlurm({queue(5): queue_line(), hold_argv(5, message): ""})
    rc, _ = run_hook("prolog-slurmctld", ctld_env(config()), slurm)
    assert rc == 1
    assert slurm.calls[1:] == [list(hold_argv(5, message))]


def test_prolog_slurmctld_unreachable_under_policy_reject(
    config: Callable[..., str],
) -> None:
    slurm = FakeSlurm({queue(5): queue_line(), hold_argv(5, UNREACHABLE_REASON): ""})
    rc, lines = run_hook("prolog-slurmctld", ctld_env(config("reject")), slurm)
    assert rc == 1
    assert slurm.calls == [list(queue(5)), list(hold_argv(5, UNREACHABLE_REASON))]
    assert "ledger unreachable" in lines[0] and "site policy is reject; job held" in lines[0]


def test_prolog_slurmctld_unreachable_under_policy_accept(config: Callable[..., str]) -> None:
    slurm = FakeSlurm({queue(5): queue_line()})
    rc, lines = run_hook("prolog-slurmctld", ctld_env(config("accept")), slurm)
    assert rc == 0
    assert slurm.calls == [list(queue(5))]
    assert "runs by site policy (accept)" in lines[0]


def test_prolog_slurmctld_timeout_follows_policy(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    fake_daemon(lambda _: HANG)
    slurm = FakeSlurm({queue(5): queue_line()})
    rc, lines = run_hook("prolog-slurmctld", ctld_env(config("accept", timeout=0.2)), slurm)
    assert rc == 0
    assert "no reply" in lines[0]


@pytest.mark.parametrize("reply", [b"garbage\n", refused("unavailable", "database down")])
def test_prolog_slurmctld_garbled_or_unavailable_follows_policy(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str], reply: Any
) -> None:
    fake_daemon(lambda _: reply)
    slurm = FakeSlurm({queue(5): queue_line(), hold_argv(5, UNREACHABLE_REASON): ""})
    rc, _ = run_hook("prolog-slurmctld", ctld_env(config("reject")), slurm)
    assert rc == 1
    assert slurm.calls[1] == list(hold_argv(5, UNREACHABLE_REASON))


def test_prolog_slurmctld_without_gpus_does_not_call_the_daemon(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    daemon = fake_daemon(lambda _: ok(hold_object()))
    slurm = FakeSlurm({queue(30): NO_GPU_QUEUE})
    rc, lines = run_hook("prolog-slurmctld", ctld_env(config(), job_id=30), slurm)
    assert rc == 0
    assert daemon.requests == []
    assert lines == ["gpucredit[prolog-slurmctld] job=30 run=0: no GPUs requested; nothing to hold"]


def test_prolog_slurmctld_second_run_unlimited_two_nodes(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    daemon = fake_daemon(lambda _: ok(hold_object(job_id=12, run=2)))
    line = MIXED_TWO_NODES_QUEUE.replace("|15:00|", "|UNLIMITED|")
    slurm = FakeSlurm({queue(12): line})
    rc, lines = run_hook("prolog-slurmctld", ctld_env(config(), job_id=12, restart=2), slurm)
    assert rc == 0
    request = daemon.requests[0]
    assert (request["job_id"], request["run"]) == (12, 2)
    assert request["gpus"] == {"a100": 2, "h100": 4}
    assert request["seconds"] is None
    assert request["nodes"] == 2
    assert lines[0].startswith("gpucredit[prolog-slurmctld] job=12 run=2: ")


def test_prolog_slurmctld_scontrol_failure_follows_policy(config: Callable[..., str]) -> None:
    failure = CommandError(list(queue(5)), 1, "slurm_load_jobs error: Socket timed out")
    slurm = FakeSlurm({queue(5): failure})
    rc, lines = run_hook("prolog-slurmctld", ctld_env(config("accept")), slurm)
    assert rc == 0
    assert "squeue failed" in lines[0]

    slurm = FakeSlurm({queue(5): failure, hold_argv(5, UNREACHABLE_REASON): ""})
    rc, _ = run_hook("prolog-slurmctld", ctld_env(config("reject")), slurm)
    assert rc == 1
    assert slurm.calls[1] == list(hold_argv(5, UNREACHABLE_REASON))


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        # A line of another shape (a field short): never read by position.
        (queue_line().replace("|15:00|", "|"), "expected 18 '|'-ended fields, got 17"),
        # Typed GPUs above the total: Slurm's own inconsistency, not guessed at.
        (
            queue_line(tres="cpu=1,gres/gpu=1,gres/gpu:a100=1,gres/gpu:h100=1"),
            "typed GPU counts {'a100': 1, 'h100': 1} exceed the gres/gpu total 1",
        ),
        # squeue answered for another job, or twice for this one.
        (queue_line(6), "squeue listed job 5 0 times, not once"),
        (queue_line() + queue_line(), "squeue listed job 5 2 times, not once"),
    ],
)
def test_prolog_slurmctld_unreadable_squeue_holds_for_an_admin_even_under_accept(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str], answer: str, problem: str
) -> None:
    daemon = fake_daemon(lambda _: ok(hold_object()))
    calls: list[list[str]] = []

    def runner(argv: Any) -> str:
        calls.append(list(argv))
        if tuple(argv) == queue(5):
            return answer
        if list(argv[:4]) == [SCONTROL, "update", "jobid=5", "priority=0"]:
            return ""
        raise AssertionError(f"unexpected command {argv}")

    lines: list[str] = []
    env = ctld_env(config("accept"))
    rc = main(["prolog-slurmctld"], environ=env, runner=runner, log=lines.append, tz=UTC)
    assert rc == 1
    assert daemon.requests == []
    comment, admin_comment = calls[1][4:]
    problem = problem.replace("=", ":")  # a comment holds no "="
    assert comment.startswith(f"comment=gpucredit: cannot read this job's GPU request ({problem}")
    assert admin_comment == "admincomment=gpucredit-unreadable"  # the daemon never releases it
    assert "squeue output unreadable" in lines[0] and lines[0].endswith("; job held")


@pytest.mark.parametrize(
    "name", ["y\nz", "x TimeLimit=00:00:01", "a\nJobId=5 TRES=gres/gpu=0|1|2|", "\u2028\x1c"]
)
def test_prolog_slurmctld_bills_what_squeue_says_whatever_the_job_name(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str], name: str
) -> None:
    """The name (any user text) is in the environment only, never in what is read."""
    daemon = fake_daemon(lambda _: ok(hold_object()))
    slurm = FakeSlurm({queue(5): queue_line()})
    rc, _ = run_hook("prolog-slurmctld", ctld_env(config(), SLURM_JOB_NAME=name), slurm)
    assert rc == 0
    assert (daemon.requests[0]["gpus"], daemon.requests[0]["seconds"]) == ({"a100": 1, "h100": 1}, 900)


def test_prolog_slurmctld_output_path_expands_the_pattern(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    daemon = fake_daemon(lambda _: ok(hold_object()))
    env = ctld_env(config(), SLURM_JOB_STDOUT="logs/%x-%j.%u.out", SLURM_JOB_NAME="train")
    run_hook("prolog-slurmctld", env, FakeSlurm({queue(5): queue_line()}))
    del env["SLURM_JOB_STDOUT"]  # not given: Slurm's default name
    run_hook("prolog-slurmctld", env, FakeSlurm({queue(5): queue_line()}))
    assert [r["stdout"] for r in daemon.requests] == [
        "/home/alice/logs/train-5.alice.out",
        "/home/alice/slurm-5.out",
    ]


HET_PARTS = queue_line(8, het=(8, 0), tres="cpu=1,node=1,gres/gpu=1,gres/gpu:a100=1") + queue_line(
    9, het=(8, 1), tres="cpu=1,node=1,gres/gpu=2,gres/gpu:h100=2", node_list="node2", account="chemistry"
)


@pytest.mark.parametrize("job_id", [8, 9])
def test_prolog_slurmctld_holds_a_hetjobs_parts_together(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str], job_id: int
) -> None:
    holds = [hold_object(id=1, job_id=8, amount="0.50"), hold_object(id=2, job_id=9, amount="1.80")]
    daemon = fake_daemon(lambda _: ok({"holds": holds}))
    mine = HET_PARTS.splitlines(keepends=True)[job_id - 8]
    slurm = FakeSlurm({queue(job_id): mine, queue(8): HET_PARTS})
    account = "physics" if job_id == 8 else "chemistry"
    env = ctld_env(config(), job_id=job_id, SLURM_HET_JOB_ID="8", SLURM_HET_JOB_OFFSET=str(job_id - 8))
    rc, lines = run_hook("prolog-slurmctld", {**env, "SLURM_JOB_ACCOUNT": account}, slurm)
    assert rc == 0
    (request,) = daemon.requests
    assert request["op"] == "hold_together"
    parts = request["parts"]
    assert [(p["job_id"], p["account"], p["gpus"]) for p in parts] == [
        (8, "physics", {"a100": 1}),
        (9, "chemistry", {"h100": 2}),
    ]
    # The environment names this run's part (its account, stdout); the others come from squeue.
    assert [p["stdout"] is not None for p in parts] == [job_id == 8, job_id == 9]
    amount = "0.50" if job_id == 8 else "1.80"
    assert lines[0].startswith(
        f"gpucredit[prolog-slurmctld] job={job_id} run=0: hold {job_id - 7} of {amount}"
    )
    assert lines[0].endswith("(with the other parts of heterogeneous job 8)")


def test_prolog_slurmctld_refused_hetjob_is_held_by_its_leader(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    message = "account chemistry: this job needs 1.80 credits but 0.20 are available"
    fake_daemon(lambda _: refused("insufficient_credits", message))
    mine = HET_PARTS.splitlines(keepends=True)[1]
    slurm = FakeSlurm({queue(9): mine, queue(8): HET_PARTS, hold_argv(8, message): ""})
    env = ctld_env(config(), job_id=9, SLURM_HET_JOB_ID="8", SLURM_HET_JOB_OFFSET="1")
    rc, _ = run_hook("prolog-slurmctld", env, slurm)
    assert rc == 1
    assert slurm.calls[-1] == list(hold_argv(8, message))


def test_prolog_slurmctld_a_job_over_a_cap_on_its_own_is_told_it_never_fits(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    message = "user alice in account physics: 0.67 credits today would exceed the daily cap of 0.50"
    fake_daemon(lambda _: refused("daily_cap", message, alone=True))
    reason = message + NEVER_FITS
    slurm = FakeSlurm({queue(5): queue_line(), hold_argv(5, reason): ""})
    rc, lines = run_hook("prolog-slurmctld", ctld_env(config()), slurm)
    assert rc == 1
    assert slurm.calls[-1] == list(hold_argv(5, reason))
    assert "cannot start until the cap is raised" in lines[0]


def test_prolog_slurmctld_hold_command_failure_is_logged(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    fake_daemon(lambda _: refused("insufficient_credits", "no credit"))
    slurm = FakeSlurm(
        {
            queue(5): queue_line(),
            hold_argv(5, "no credit"): CommandError(
                list(hold_argv(5, "no credit")), 1, "Job is no longer pending"
            ),
        }
    )
    rc, lines = run_hook("prolog-slurmctld", ctld_env(config()), slurm)
    assert rc == 1
    assert len(slurm.calls) == 2
    assert "could not hold job" in lines[0] and "no longer pending" in lines[0]


def test_prolog_slurmctld_internal_error_follows_policy(config: Callable[..., str]) -> None:
    def broken(argv: Any) -> str:
        if argv[0] == SQUEUE:
            raise RuntimeError("boom")
        return ""

    lines: list[str] = []
    rc = main(
        ["prolog-slurmctld"], environ=ctld_env(config("reject")), runner=broken, log=lines.append, tz=UTC
    )
    assert rc == 1
    assert "internal error RuntimeError: boom" in lines[0]


# --- EpilogSlurmctld ---------------------------------------------------------------------


def test_epilog_slurmctld_settles_with_the_runs_real_times(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    daemon = fake_daemon(lambda _: ok(hold_object(state="settled", charged="0.84")))
    line = queue_line(state="COMPLETING", end="2026-12-02T10:09:01")
    slurm = FakeSlurm({queue(5): line})
    rc, lines = run_hook("epilog-slurmctld", ctld_env(config()), slurm)
    assert rc == 0
    assert daemon.requests == [
        {
            "op": "settle",
            "cluster": "lab",
            "job_id": 5,
            "run": 0,
            "start": "2026-12-02T10:00:01Z",
            "end": "2026-12-02T10:09:01Z",
            "submit": "2026-12-02T10:00:00Z",
            "account": "physics",  # where the daemon queues it; the hold's account is charged
        }
    ]
    assert lines == [
        "gpucredit[epilog-slurmctld] job=5 run=0: settled hold h-1: charged 0.84 of 1.40 "
        "credits (2026-12-02T10:00:01Z .. 2026-12-02T10:09:01Z)"
    ]


@pytest.mark.parametrize(
    ("start", "end"), [("2026-12-02T10:00:01", "Unknown"), ("Unknown", "2026-12-02T11:00:00")]
)
def test_epilog_slurmctld_end_unknown_or_future_is_now(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str], start: str, end: str
) -> None:
    daemon = fake_daemon(lambda _: ok(hold_object(state="settled")))
    slurm = FakeSlurm({queue(5): queue_line(state="COMPLETING", start=start, end=end)})
    rc, _ = run_hook("epilog-slurmctld", ctld_env(config()), slurm)
    assert rc == 0
    assert daemon.requests[0]["end"] == "2026-12-02T10:30:00Z"


def test_epilog_slurmctld_after_a_requeue_ends_the_run_at_the_requeue(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    """docs/slurm-facts.md §11: StartTime is the requeue moment, EndTime that plus the limit;
    the run ended at the requeue, and its start is the one the prolog recorded."""
    daemon = fake_daemon(lambda _: ok(hold_object(state="settled")))
    line = queue_line(state="COMPLETING", restarts=1, start="2026-12-02T10:20:07", end="2026-12-02T10:35:07")
    rc, _ = run_hook("epilog-slurmctld", ctld_env(config(), restart=1), FakeSlurm({queue(5): line}))
    assert rc == 0
    assert (daemon.requests[0]["start"], daemon.requests[0]["end"]) == (None, "2026-12-02T10:20:07Z")


def test_epilog_slurmctld_requeued_run_uses_its_restart_count(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    daemon = fake_daemon(lambda _: ok(hold_object(run=1)))
    slurm = FakeSlurm({queue(5): queue_line(state="COMPLETING", restarts=1)})
    run_hook("epilog-slurmctld", ctld_env(config(), restart=1), slurm)
    assert daemon.requests[0]["run"] == 1


def test_epilog_slurmctld_not_found_is_fine(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    fake_daemon(lambda _: refused("not_found", "no hold for lab/5/0"))
    slurm = FakeSlurm({queue(5): queue_line(state="COMPLETING")})
    rc, lines = run_hook("epilog-slurmctld", ctld_env(config()), slurm)
    assert rc == 0
    assert lines == ["gpucredit[epilog-slurmctld] job=5 run=0: no hold for this run; nothing to settle"]


def test_epilog_slurmctld_unreachable_exits_zero(config: Callable[..., str]) -> None:
    slurm = FakeSlurm({queue(5): queue_line(state="COMPLETING")})
    rc, lines = run_hook("epilog-slurmctld", ctld_env(config("reject")), slurm)
    assert rc == 0
    assert "the bridge will reconcile" in lines[0]


def test_epilog_slurmctld_without_gpus_does_not_call(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    daemon = fake_daemon(lambda _: ok(hold_object()))
    slurm = FakeSlurm({queue(30): NO_GPU_QUEUE})
    rc, _ = run_hook("epilog-slurmctld", ctld_env(config(), job_id=30), slurm)
    assert rc == 0
    assert daemon.requests == []


def test_epilog_slurmctld_scontrol_failure_settles_at_now(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    daemon = fake_daemon(lambda _: ok(hold_object()))
    slurm = FakeSlurm({queue(5): CommandError(list(queue(5)), 1, "Invalid job id")})
    rc, lines = run_hook("epilog-slurmctld", ctld_env(config()), slurm)
    assert rc == 0
    assert daemon.requests[0]["start"] is None
    assert daemon.requests[0]["end"] == "2026-12-02T10:30:00Z"
    assert "start left to the daemon" in lines[0]


# --- node Prolog / Epilog ---------------------------------------------------------------


def test_node_hooks_register_mixed_type_gpus_per_node(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str], tmp_path: Path
) -> None:
    daemon = fake_daemon(lambda _: ok({}))
    slurm = FakeSlurm({show(12): MIXED_TWO_NODES})
    cfg = config()
    for node in ("node1", "node2"):
        rc, lines = run_hook("prolog", node_env(cfg, node), slurm)
        assert rc == 0, lines

    node2_file = tmp_path / "spool" / "node2" / "lab_12_0.json"
    assert json.loads(node2_file.read_text()) == {
        "cluster": "lab",
        "job_id": 12,
        "run": 0,
        "node": "node2",
        "gpus": {"1": "a100", "2": "h100", "3": "h100"},
    }
    node1_file = tmp_path / "spool" / "node1" / "lab_12_0.json"
    assert json.loads(node1_file.read_text())["gpus"] == {"0": "a100", "2": "h100", "3": "h100"}
    assert daemon.requests == []  # a node talks to no daemon: the agent reads the files

    # Slurm retrying the prolog rewrites the same file.
    rc, _ = run_hook("prolog", node_env(cfg, "node2"), slurm)
    assert rc == 0
    assert json.loads(node2_file.read_text())["gpus"] == {"1": "a100", "2": "h100", "3": "h100"}
    assert sorted(os.listdir(node2_file.parent)) == ["lab_12_0.json"]  # no temp files left

    calls_before = len(slurm.calls)
    rc, lines = run_hook("epilog", node_env(cfg, "node2"), slurm)
    assert rc == 0
    assert not node2_file.exists()
    assert node1_file.exists()
    assert len(slurm.calls) == calls_before  # the registry file answered, not scontrol
    assert daemon.requests == []
    assert (
        lines[0]
        == f"gpucredit[epilog] job=12 run=0: node node2 GPUs 1=a100,2=h100,3=h100: removed {node2_file}"
    )
    assert lines[0].startswith("gpucredit[epilog] job=12 run=0: node node2 GPUs 1=a100,2=h100,3=h100")

    # Epilog again: no file, scontrol still knows the GPUs; still exit 0.
    rc, _ = run_hook("epilog", node_env(cfg, "node2"), slurm)
    assert rc == 0


def test_node_epilog_after_requeue_removes_the_run_that_ended(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str], tmp_path: Path
) -> None:
    """22.05 runs the Epilog of a requeued run with the next SLURM_JOB_RESTART_COUNT."""
    fake_daemon(lambda _: ok({}))
    slurm = FakeSlurm({show(12): MIXED_TWO_NODES})
    cfg = config()
    rc, _ = run_hook("prolog", node_env(cfg, "node1", restart=0), slurm)
    assert rc == 0
    registered = tmp_path / "spool" / "node1" / "lab_12_0.json"
    assert registered.exists()
    rc, lines = run_hook("epilog", node_env(cfg, "node1", restart=1), slurm)
    assert rc == 0
    assert not registered.exists()
    assert f"removed {registered}" in lines[0]


def test_node_prolog_needs_no_daemon(config: Callable[..., str], tmp_path: Path) -> None:
    """A compute node reaches no daemon socket: its prolog registers the GPUs for the agent
    and says nothing of a daemon (it once said "job_started not delivered" on every job)."""
    slurm = FakeSlurm({show(12): MIXED_TWO_NODES})
    rc, lines = run_hook("prolog", node_env(config(), "node1"), slurm)
    registered = tmp_path / "spool" / "node1" / "lab_12_0.json"
    assert rc == 0
    assert registered.exists()
    assert lines == [
        f"gpucredit[prolog] job=12 run=0: node node1 GPUs 0=a100,2=h100,3=h100: registered {registered}"
    ]


def test_node_prolog_on_a_node_without_gpus(config: Callable[..., str], tmp_path: Path) -> None:
    slurm = FakeSlurm({show(30): NO_GPU_LINE})
    rc, lines = run_hook("prolog", node_env(config(), "node1", job_id=30), slurm)
    assert rc == 0
    assert not (tmp_path / "spool").exists()
    assert "no GPUs on node node1" in lines[0]


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_node_hooks_always_exit_zero(config: Callable[..., str], hook: str) -> None:
    failure = CommandError(list(show(12)), 1, "Socket timed out")
    rc, lines = run_hook(hook, node_env(config(), "node1"), FakeSlurm({show(12): failure}))
    assert rc == 0
    assert "scontrol failed" in lines[0]

    def broken(argv: Any) -> str:
        raise RuntimeError("boom")

    assert main([hook], environ=node_env(config(), "node1"), runner=broken, log=_discard) == 0


def test_node_prolog_unwritable_spool_still_exits_zero(config: Callable[..., str], tmp_path: Path) -> None:
    (tmp_path / "spool").write_text("a file, not a directory")
    slurm = FakeSlurm({show(12): MIXED_TWO_NODES})
    rc, lines = run_hook("prolog", node_env(config(), "node1"), slurm)
    assert rc == 0
    assert "cannot write" in lines[0]


# --- main, config, helpers ---------------------------------------------------------------


@pytest.mark.parametrize("argv", [[], ["nope"], ["prolog", "extra"]])
def test_bad_usage_exits_two(argv: list[str]) -> None:
    lines: list[str] = []
    assert main(argv, environ={}, runner=FakeSlurm({}), log=lines.append) == 2
    assert "usage" in lines[0]


@pytest.mark.parametrize(
    ("args", "code", "logged"),
    [
        (["bogus"], 2, "usage: gpucredit hook"),
        (["prolog-slurmctld"], 2, "SLURM_JOB_ID not set"),
        (["epilog"], 0, "SLURM_JOB_ID not set"),
    ],
)
def test_console_script_exits_with_the_hooks_code(
    tmp_path: Path, args: list[str], code: int, logged: str
) -> None:
    """`gpucredit hook ...` ends the process itself (os._exit): the code and log line survive."""
    root = REPO
    env = {"GPUCREDIT_CONFIG": str(tmp_path / "none.toml")}
    done = subprocess.run(
        [sys.executable, "-c", "from gpucredit.cli import main; main()", "hook", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == code
    assert logged in done.stderr


def test_missing_job_id(config: Callable[..., str]) -> None:
    env = ctld_env(config())
    del env["SLURM_JOB_ID"]
    assert main(["prolog-slurmctld"], environ=env, runner=FakeSlurm({}), log=_discard) == 2
    assert main(["epilog"], environ=env, runner=FakeSlurm({}), log=_discard) == 0


def test_cluster_falls_back_to_the_config(
    fake_daemon: Callable[[Responder], FakeDaemon], config: Callable[..., str]
) -> None:
    daemon = fake_daemon(lambda _: ok(hold_object()))
    env = ctld_env(config())
    del env["SLURM_CLUSTER_NAME"]
    run_hook("prolog-slurmctld", env, FakeSlurm({queue(5): queue_line()}))
    assert daemon.requests[0]["cluster"] == "fromconfig"


def test_load_config_defaults_when_missing(tmp_path: Path) -> None:
    cfg, problems = load_config({"GPUCREDIT_CONFIG": str(tmp_path / "none.toml")})
    assert problems == []
    assert cfg.socket_path == "/run/gpucredit/daemon.sock"
    assert cfg.timeout_seconds == 2.0
    assert cfg.on_ledger_unreachable == "reject"
    assert cfg.scontrol == "/usr/bin/scontrol"
    assert cfg.spool_dir == "/var/spool/gpucredit/jobs"


def test_load_config_bad_values_fall_back_to_safe_defaults(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(
        '[policy]\non_ledger_unreachable = "yes"\n[daemon]\ntimeout_seconds = -1\n'
        'socket = "relative.sock"\n[slurm]\nbin_dir = 5\n'
    )
    cfg, problems = load_config({"GPUCREDIT_CONFIG": str(path)})
    assert cfg.on_ledger_unreachable == "reject"
    assert cfg.timeout_seconds == 2.0
    assert cfg.socket_path == "/run/gpucredit/daemon.sock"
    assert cfg.bin_dir == "/usr/bin"
    assert len(problems) == 4


def test_load_config_prefers_the_shims_copy_of_the_settings(
    tmp_path: Path, config: Callable[..., str]
) -> None:
    path = config(policy="accept", timeout=0.7)
    with open(path, "rb") as f:
        baked = json.dumps(hook_settings(tomllib.load(f)))
    from_file, problems = load_config({"GPUCREDIT_CONFIG": path})
    assert problems == []
    # The file is not read at all: the shim's copy is enough.
    gone = str(tmp_path / "gone.toml")
    from_shim, problems = load_config({"GPUCREDIT_CONFIG": gone, SETTINGS_VARIABLE: baked})
    assert problems == []
    assert from_shim == from_file
    assert (from_shim.on_ledger_unreachable, from_shim.timeout_seconds, from_shim.cluster) == (
        "accept",
        0.7,
        "fromconfig",
    )


def test_bad_values_in_the_shims_copy_are_reported_like_the_files() -> None:
    baked = {
        "policy": {"on_ledger_unreachable": "yes"},
        "daemon": {"timeout_seconds": -1, "socket": "relative.sock"},
        "slurm": {"bin_dir": 5},
    }
    cfg, problems = load_config({"GPUCREDIT_CONFIG": "/etc/g.toml", SETTINGS_VARIABLE: json.dumps(baked)})
    assert cfg == HookConfig()  # the defaults, policy reject
    assert len(problems) == 4
    assert problems[0].startswith("/etc/g.toml (as of `gpucredit slurm install`): bad value")


@pytest.mark.parametrize("baked", ["", "{", "[1]", "null"])
def test_a_garbled_copy_of_the_settings_falls_back_to_the_file(
    config: Callable[..., str], baked: str
) -> None:
    cfg, problems = load_config({"GPUCREDIT_CONFIG": config(policy="accept"), SETTINGS_VARIABLE: baked})
    assert cfg.on_ledger_unreachable == "accept"
    assert len(problems) == 1
    assert problems[0].startswith(f"{SETTINGS_VARIABLE} is not a JSON object")


def test_hook_settings_copy_only_what_the_hooks_read() -> None:
    data = {
        "database": {"url": "postgresql://gc:secret@db/gpucredit"},
        "daemon": {"socket": "/run/g.sock", "socket_user": "slurm"},
        "hooks": {"log_file": "/var/log/g.log"},
        "prices": {"a100": "1.00"},
        "policy": "not a table",
    }
    assert hook_settings(data) == {
        "daemon": {"socket": "/run/g.sock"},
        "hooks": {"log_file": "/var/log/g.log"},
    }


def test_unreadable_config_is_reported_in_the_log(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[daemon\n")
    cfg, problems = load_config({"GPUCREDIT_CONFIG": str(path)})
    assert cfg.on_ledger_unreachable == "reject"
    assert "cannot read" in problems[0]
    lines: list[str] = []
    env = ctld_env(str(path), job_id=30)
    main(["epilog"], environ=env, runner=FakeSlurm({show(30): NO_GPU_LINE}), log=lines.append)
    assert "config: cannot read" in lines[0]


def test_hold_job_with_reason_argv_and_comment_cleanup() -> None:
    argv = (
        "/opt/slurm/bin/scontrol",
        "update",
        "jobid=7_3",
        "priority=0",
        "comment=gpucredit: daily cap: spent:30.4 cap:30 (see portal)",
        "admincomment=gpucredit-hold",
    )
    slurm = FakeSlurm({argv: ""})
    failures = hold_job_with_reason(
        "7_3", "daily cap:\n  spent=30.4 cap=30\t(see portal)", bin_dir="/opt/slurm/bin", run=slurm
    )
    assert failures == []
    assert slurm.calls == [list(argv)]


def test_hold_job_with_reason_truncates_long_messages() -> None:
    seen: list[list[str]] = []

    def record(argv: Any) -> str:
        seen.append(list(argv))
        return ""

    hold_job_with_reason(1, "x" * 1000, run=record)
    comment = seen[0][4]
    assert comment.startswith("comment=gpucredit: xxx") and comment.endswith("...")
    assert len(comment) < 300


def test_registry_path() -> None:
    assert registry_path("/var/spool/gpucredit/jobs", "node1", "lab", 12, 0) == (
        "/var/spool/gpucredit/jobs/lab_12_0.json"
    )
    assert registry_path("/spool/%n", "node2", "a/b", 3, 1) == "/spool/node2/a_b_3_1.json"


def test_run_command_returns_stdout_and_raises_with_stderr() -> None:
    assert run_command(["/bin/echo", "hi"]) == "hi\n"
    with pytest.raises(CommandError) as info:
        run_command(["/bin/sh", "-c", "echo oops >&2; exit 3"])
    assert info.value.returncode == 3
    assert info.value.argv == ["/bin/sh", "-c", "echo oops >&2; exit 3"]
    assert "oops" in str(info.value)
    with pytest.raises(CommandError):
        run_command(["/nonexistent/scontrol", "show", "job"])
    with pytest.raises(CommandError, match="timed out"):
        run_command(["/bin/sleep", "5"], timeout=0.1)


def test_run_command_keeps_subprocess_run_behaviour(tmp_path: Path) -> None:
    """run_command is os.posix_spawn + poll (subprocess is slow to import): same contract."""
    assert run_command(["/bin/cat"]) == ""  # stdin is /dev/null, not the hook's
    # Both pipes are read together: no deadlock when each gets more than a pipe buffer.
    chatty = "import sys; sys.stdout.write('o' * 300_000); sys.stderr.write('e' * 300_000)"
    assert run_command([sys.executable, "-c", chatty]) == "o" * 300_000
    assert (
        run_command([sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'caf\\xe9')"]) == "caf\ufffd"
    )
    with pytest.raises(CommandError, match="exited -9"):
        run_command(["/bin/sh", "-c", "kill -9 $$"])
    with pytest.raises(CommandError, match="timed out: started") as info:
        run_command(["/bin/sh", "-c", "echo started >&2; exec sleep 5"], timeout=0.2)
    assert info.value.returncode is None
    not_executable = tmp_path / "scontrol"
    not_executable.write_text("#!/bin/sh\n")
    with pytest.raises(CommandError, match="Permission denied"):
        run_command([str(not_executable)])
