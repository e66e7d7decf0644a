"""gpucredit's four hooks replayed on what each real Slurm gave them (tests/fixtures/slurm-V/hook_env).

The recorder's shims dumped, in every hook of every recorded job, the environment slurmctld
or slurmd set, and on the controller what `scontrol show job -d -o` and
`slurm_hooks.squeue.squeue_argv` printed right then. Here the real hooks run on those:
environment as recorded, each Slurm command answered with the text recorded for it, a fake
daemon taking the requests. What they ask the daemon for must be the same on every
version: the same holds (GPUs, limit, nodes, account, output path), settlements over the
same run times, the same GPU indices registered on each node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from slurm_hooks.hooks import main
from slurm_hooks.squeue import squeue_argv
from tests.support import FIXTURES
from tests.support.fake_slurm import hold_object, ok, show
from tests.support.fakedaemon import FakeDaemon, Responder
from tests.support.fakedaemon import fake_daemon as fake_daemon
from tests.support.fakedaemon import sockdir as sockdir
from tests.support.recorded_versions import TWO_NODES, VERSIONS, allocated

LATER = datetime(2027, 1, 1, tzinfo=UTC)  # the hooks' clock: after every recorded run
_SLURM_VARIABLE = re.compile(r"(SLURM[A-Z_]*)=(.*)")


def hook_dumps(version: str, hook: str, suffix: str) -> dict[int, Path]:
    """Job id -> the dump of `hook` for it (the controller's, or the one node's)."""
    found = {}
    for path in (FIXTURES / f"slurm-{version}" / "hook_env").glob(f"{hook}.*.{suffix}"):
        found[int(path.name.split(".")[1])] = path
    return found


def slurm_environment(path: Path) -> dict[str, str]:
    """The dump's SLURM* variables. It is `env | sort`, so a value holding a line break
    (a job name) is split over sorted lines: only lines that start a SLURM variable count."""
    env = {}
    for line in path.read_text().splitlines():
        match = _SLURM_VARIABLE.fullmatch(line)
        if match:
            env[match[1]] = match[2]
    return env


@pytest.fixture
def config(tmp_path: Path, sockdir: Path) -> str:
    path = tmp_path / "gpucredit.toml"
    path.write_text(
        "[daemon]\n"
        f'socket = "{sockdir / "daemon.sock"}"\n'
        "[policy]\n"
        f'outage_spool_dir = "{tmp_path / "outage"}"\n'
        "[slurm]\n"
        'bin_dir = "/usr/bin"\n'
        "[agent]\n"
        f'spool_dir = "{tmp_path / "spool" / "%n"}"\n'
    )
    return str(path)


class Recorded:
    """Answers a hook's Slurm commands with one version's dumps, and nothing else."""

    def __init__(self, answers: dict[tuple[str, ...], str]) -> None:
        self.answers = answers

    def __call__(self, argv: Any) -> str:
        answer = self.answers.get(tuple(argv))
        if answer is None:
            raise AssertionError(f"no recording for {list(argv)}")
        return answer


def squeue_answers(version: str, hook: str) -> dict[tuple[str, ...], str]:
    return {
        tuple(squeue_argv("/usr/bin/squeue", str(job_id))): path.read_text()
        for job_id, path in hook_dumps(version, hook, "ctld.squeue").items()
    }


def replay(
    version: str, hook: str, config: str, daemon: FakeDaemon, answers: dict[tuple[str, ...], str], suffix: str
) -> dict[int, list[dict[str, Any]]]:
    """Run `hook` for every recorded job (not the `srun` round trips): job id -> requests."""
    jobs = allocated(version)
    sent: dict[int, list[dict[str, Any]]] = {}
    for job_id, path in sorted(hook_dumps(version, hook.replace("-", "_"), suffix).items()):
        if job_id not in jobs:
            continue
        env = {**slurm_environment(path), "GPUCREDIT_CONFIG": config}
        before = len(daemon.requests)
        lines: list[str] = []
        rc = main([hook], environ=env, runner=Recorded(answers), now=lambda: LATER, log=lines.append, tz=UTC)
        assert rc == 0, (version, job_id, lines)
        sent[job_id] = daemon.requests[before:]
    return sent


def answer(request: dict[str, Any]) -> dict[str, Any]:
    if request["op"] == "hold_together":
        return ok({"holds": [hold_object(job_id=part["job_id"]) for part in request["parts"]]})
    return ok(hold_object(job_id=request["job_id"]))


def timeless(request: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in request.items() if key not in ("start", "end", "submit")}


@pytest.mark.parametrize("version", VERSIONS)
def test_prolog_slurmctld_asks_the_same_holds_on_every_version(
    version: str, fake_daemon: Callable[[Responder], FakeDaemon], config: str
) -> None:
    daemon = fake_daemon(answer)
    sent = replay(
        version, "prolog-slurmctld", config, daemon, squeue_answers(version, "prolog_slurmctld"), "ctld.env"
    )
    jobs = allocated(version)
    assert set(sent) == set(jobs)
    for job_id, requests in sent.items():
        name, gpus, _ = jobs[job_id]
        if not gpus:
            assert requests == [], name
            continue
        (request,) = requests
        parts = request["parts"] if request["op"] == "hold_together" else [request]
        mine = next(part for part in parts if part["job_id"] == job_id)
        assert mine["start"] and mine["submit"], name
        array = array_tasks(version).get(job_id)
        assert timeless(mine) == {
            **({"op": "hold"} if request["op"] == "hold" else {}),
            "cluster": "lab",
            "job_id": job_id,
            "run": 0,
            "account": "physics",
            "user": "alice",
            "partition": "onprem",
            "gpus": gpus,
            "seconds": 300,
            "nodes": 2 if name in TWO_NODES else 1,
            "stdout": f"/tmp/gpucredit-box-jobs/slurm-{array or job_id}.out",
        }, name
        if name == "hetjob":  # each component's prolog holds both, together
            assert [part["job_id"] for part in parts] == job_ids_of(version, "hetjob")


def job_ids_of(version: str, name: str) -> list[int]:
    ids: list[int] = json.loads((FIXTURES / f"slurm-{version}" / "jobs.json").read_text())[name]
    return ids


def array_tasks(version: str) -> dict[int, str]:
    """The array's tasks by raw id -> their `%A_%a` (output `slurm-%A_%a.out`)."""
    first, second = job_ids_of(version, "array")
    return {first: f"{first}_1", second: f"{first}_0"}


@pytest.mark.parametrize("version", VERSIONS)
def test_epilog_slurmctld_settles_the_same_runs_on_every_version(
    version: str, fake_daemon: Callable[[Responder], FakeDaemon], config: str
) -> None:
    daemon = fake_daemon(lambda request: ok(hold_object(job_id=request["job_id"], state="settled")))
    sent = replay(
        version, "epilog-slurmctld", config, daemon, squeue_answers(version, "epilog_slurmctld"), "ctld.env"
    )
    jobs = allocated(version)
    assert set(sent) == set(jobs)
    for job_id, requests in sent.items():
        name, gpus, _ = jobs[job_id]
        if not gpus:
            assert requests == [], name
            continue
        (request,) = requests
        assert timeless(request) == {
            "op": "settle",
            "cluster": "lab",
            "job_id": job_id,
            "run": 0,
            "account": "physics",
        }
        ran = datetime.fromisoformat(request["end"]) - datetime.fromisoformat(request["start"])
        if not name.startswith("busy_"):  # `sleep 4`; the busy jobs were cancelled
            assert 3 <= ran.total_seconds() <= 6, (name, request)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_node_prolog_registers_the_same_gpu_indices_on_every_version(
    version: str, config: str, tmp_path: Path
) -> None:
    """The node Prolog of each job on its batch node (the only node a batch job without
    steps runs it on), answered with the controller's `scontrol show job -d -o` of then."""
    answers = {
        show(job_id): path.read_text()
        for job_id, path in hook_dumps(version, "prolog_slurmctld", "ctld.scontrol").items()
    }
    jobs = allocated(version)
    registered: set[int] = set()
    for path in sorted((FIXTURES / f"slurm-{version}" / "hook_env").glob("prolog.*.node*.env")):
        _, job, node, _ = path.name.split(".")
        if int(job) not in jobs:
            continue
        env = {**slurm_environment(path), "GPUCREDIT_CONFIG": config}
        assert env["SLURMD_NODENAME"] == node
        lines: list[str] = []
        assert (
            main(
                ["prolog"], environ=env, runner=Recorded(answers), now=lambda: LATER, log=lines.append, tz=UTC
            )
            == 0
        )
        name, _, node_gpus = jobs[int(job)]
        files = list((tmp_path / "spool" / node).glob(f"lab_{job}_0.json"))
        expected = node_gpus.get(node, {})
        if not expected:
            assert files == [], (name, lines)
            continue
        (file,) = files
        assert json.loads(file.read_text())["gpus"] == {str(i): t for i, t in sorted(expected.items())}, name
        registered.add(int(job))
    # Every GPU job but the het job's second part: a batch job's parts without a step run
    # no node Prolog (no PrologFlags=Alloc), on any version.
    with_gpus = {job_id for job_id, (_, gpus, _) in jobs.items() if gpus}
    assert registered == with_gpus - {job_ids_of(version, "hetjob")[1]}
