"""A cloud node's stage-in (slurm_hooks/stage_in.py): the node Prolog asks the controller's
daemon for its job's paths over the agents' MUNGE channel, copies them as the job's user
and reports what it copied; the Epilog removes them. Real parts: the receiver on TCP, a
munged of the test's own, the ledger, and a real uid switch (`nobody` plays the user), so
a path only root may read is refused as it would be for the user.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from accounting_bridge.nvml.munge import Munge
from accounting_bridge.nvml.receiver import UsageReceiver
from ledger import api
from ledger.jobs.staging import bind_job_data, job_data, keep_job_data
from ledger.store.db import make_engine, make_sessionmaker
from slurm_hooks.hooks import main

USER = "nobody"  # every system has one; it reads only what anyone may


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def receiver(sessions: sessionmaker[Session], munge_socket: str) -> Iterator[UsageReceiver]:
    stop = threading.Event()
    receiver = UsageReceiver(Munge(munge_socket), sessions, cloud_partitions={"cloud"})
    receiver.serve("127.0.0.1", 0, stop)
    yield receiver
    stop.set()


@pytest.fixture
def work() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("the stage-in switches to the job's user: run as root")
    folder = Path(tempfile.mkdtemp(prefix="gpucredit-stage-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def started_job(sessions: sessionmaker[Session], paths: list[str], job_id: int = 41) -> None:  # once a test
    """`USER`'s job, its paths kept by the portal at submit, its run-0 hold taken."""
    now = datetime.now(UTC)
    with sessions() as s, s.begin():
        api.create_account(s, "physics")
        api.topup(s, "physics", "100", effective_at=now - timedelta(days=1))
        api.set_price(s, "h100", "3.60", effective_at=now - timedelta(days=1))
        bind_job_data(s, keep_job_data(s, "lab", USER, paths, now), job_id)
        hold = api.HoldRequest("physics", user=USER, job_id=job_id, gpus="h100:1", seconds=60, cluster="lab")
        api.create_hold(s, replace(hold, at=now, submitted_at=now))


def node_hook(
    hook: str,
    work: Path,
    receiver: UsageReceiver,
    munge_socket: str,
    partition: str = "cloud",
    job_id: int = 41,
) -> list[str]:
    config = work / "gpucredit.toml"
    config.write_text(
        '[slurm]\ncluster = "lab"\n'
        f'[agent]\nspool_dir = "{work}/spool/%n"\nsend_to = ["127.0.0.1:{receiver.address[1]}"]\n'
        f'munge_socket = "{munge_socket}"\n'
        f'[hooks]\nstage_dir = "{work}/stage/%n"\n'
    )
    env = {
        "GPUCREDIT_CONFIG": str(config),
        "SLURMD_NODENAME": "cloud1",
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_USER": USER,
        "SLURM_JOB_PARTITION": partition,
        "PATH": "/usr/bin:/bin",
    }
    said: list[str] = []

    def no_scontrol(argv: list[str]) -> str:  # the node's GPUs are another test's
        from slurm_hooks.hooks import CommandError

        raise CommandError(argv, 1, "not in this test")

    assert main([hook], environ=env, runner=no_scontrol, log=said.append) == 0
    return said


def test_a_cloud_jobs_data_is_copied_as_its_user_and_the_copy_recorded(
    work: Path, receiver: UsageReceiver, munge_socket: str, sessions: sessionmaker[Session]
) -> None:
    data = work / "data"
    (data / "set").mkdir(parents=True)
    (data / "set" / "part1").write_bytes(b"x" * 1000)
    (data / "set" / "part2").write_bytes(b"y" * 24)
    (data / "cfg.yaml").write_text("lr: 0.1\n")
    (data / "secret").write_text("root's own\n")
    (data / "secret").chmod(0o600)
    data.chmod(0o755)
    for f in ("set", "set/part1", "set/part2", "cfg.yaml"):
        (data / f).chmod(0o755 if (data / f).is_dir() else 0o644)
    started_job(sessions, [str(data / "set"), str(data / "cfg.yaml"), str(data / "secret")])

    said = node_hook("prolog", work, receiver, munge_socket)
    folder = work / "stage" / "cloud1" / "job_41"
    assert sorted(p.name for p in folder.rglob("*")) == ["cfg.yaml", "part1", "part2", "set"]
    assert (folder / "set" / "part1").read_bytes() == b"x" * 1000
    assert (folder / "cfg.yaml").stat().st_uid == folder.stat().st_uid != 0  # the user's files
    assert not (folder / "secret").exists()  # nobody may not read it, so it was not copied
    with sessions() as s:
        [staged] = job_data(s, "lab", [41])[41].staged
    assert (staged.run, staged.node, staged.files, staged.bytes) == (0, "cloud1", 3, 1000 + 24 + 8)
    assert staged.error == f"{data / 'secret'}: Permission denied"
    assert said[-1].startswith("gpucredit[prolog] job=41 run=0: staged 3 files, 1032 bytes in ")
    assert said[-1].endswith(f"to {folder}: failed: {data / 'secret'}: Permission denied")

    node_hook("epilog", work, receiver, munge_socket)
    assert not folder.exists()


def test_nothing_is_staged_outside_a_cloud_partition_or_for_a_job_without_data(
    work: Path, receiver: UsageReceiver, munge_socket: str, sessions: sessionmaker[Session]
) -> None:
    (work / "cfg.yaml").write_text("lr: 0.1\n")
    started_job(sessions, [str(work / "cfg.yaml")])
    said = node_hook("prolog", work, receiver, munge_socket, partition="onprem")
    assert [line for line in said if "stage" in line] == []  # asked, answered: nothing to stage
    said = node_hook("prolog", work, receiver, munge_socket, job_id=42)
    assert [line for line in said if "stage" in line] == []
    assert not (work / "stage").exists()
    with sessions() as s:
        assert job_data(s, "lab", [41])[41].staged == ()


def test_a_daemon_that_does_not_answer_leaves_the_job_to_start_without_its_data(
    work: Path, receiver: UsageReceiver, munge_socket: str, sessions: sessionmaker[Session]
) -> None:
    started_job(sessions, ["/etc/hostname"])
    receiver.address = ("127.0.0.1", 9)  # the discard port: nothing listens there
    said = node_hook("prolog", work, receiver, munge_socket)
    assert said[-1].startswith("gpucredit[prolog] job=41 run=0: stage-in not done: 127.0.0.1:9: ")
    assert not (work / "stage").exists()


def test_a_job_that_starts_before_its_paths_are_bound_waits_for_them(
    work: Path, receiver: UsageReceiver, munge_socket: str, sessions: sessionmaker[Session]
) -> None:
    """The portal keeps the paths before sbatch and binds them after: a job that starts at
    once on an idle node reaches its Prolog in between, and waits instead of running bare."""
    (work / "cfg.yaml").write_text("lr: 0.1\n")
    started_job(sessions, [str(work / "cfg.yaml")], job_id=40)  # the account, the price; job 40's
    now = datetime.now(UTC)
    with sessions() as s, s.begin():
        kept = keep_job_data(s, "lab", USER, [str(work / "cfg.yaml")], now)
        hold = api.HoldRequest("physics", user=USER, job_id=41, gpus="h100:1", seconds=60, cluster="lab")
        api.create_hold(s, replace(hold, at=now, submitted_at=now))

    def sbatch_answers() -> None:
        time.sleep(1.5)
        with sessions() as s, s.begin():
            bind_job_data(s, kept, 41)

    binder = threading.Thread(target=sbatch_answers)
    binder.start()
    said = node_hook("prolog", work, receiver, munge_socket)
    binder.join()
    assert said[-1].endswith(f"to {work}/stage/cloud1/job_41: done"), said
    assert (work / "stage" / "cloud1" / "job_41" / "cfg.yaml").read_text() == "lr: 0.1\n"


def test_a_stage_folder_someone_else_may_write_is_refused_and_nothing_is_copied(
    work: Path, receiver: UsageReceiver, munge_socket: str, sessions: sessionmaker[Session]
) -> None:
    """A user who made the stage folder could swap job_<id> for a link to /etc/shadow between
    root's mkdir and chown: root stages only inside a folder of its own."""
    (work / "stage" / "cloud1").mkdir(parents=True)
    shutil.chown(work / "stage" / "cloud1", USER)
    (work / "cfg.yaml").write_text("lr: 0.1\n")
    started_job(sessions, [str(work / "cfg.yaml")])
    said = node_hook("prolog", work, receiver, munge_socket)
    assert said[-1].startswith(f"gpucredit[prolog] job=41 run=0: stage-in into {work}/stage/%n failed: ")
    assert "is not root's alone" in said[-1]
    assert list((work / "stage" / "cloud1").iterdir()) == []
    (work / "stage" / "cloud1" / "job_41").mkdir()
    said = node_hook("epilog", work, receiver, munge_socket)
    assert (work / "stage" / "cloud1" / "job_41").exists()  # nor removed from it
    assert any(
        line.startswith("gpucredit[epilog] job=41 run=0: stage folder of job 41 not removed: ")
        for line in said
    )


def test_a_device_or_a_pipe_is_not_copied(
    work: Path, receiver: UsageReceiver, munge_socket: str, sessions: sessionmaker[Session]
) -> None:
    started_job(sessions, ["/dev/zero"])
    said = node_hook("prolog", work, receiver, munge_socket)
    assert said[-1].endswith("failed: /dev/zero: not a regular file or directory"), said


def test_a_report_must_name_the_job_whose_paths_it_reports_on(
    work: Path, receiver: UsageReceiver, munge_socket: str, sessions: sessionmaker[Session]
) -> None:
    from slurm_hooks import stage_in

    started_job(sessions, ["/etc/hostname"])
    with sessions() as s:
        data_id = job_data(s, "lab", [41])[41].data_id
    address = [f"127.0.0.1:{receiver.address[1]}"]
    report = {"data_id": data_id, "cluster": "lab", "job_id": 42, "user": USER, "run": 0, "files": 1}
    report |= {"bytes": 1, "milliseconds": 1, "error": None}
    with pytest.raises(stage_in.StageError, match="bad_request: no data kept for nobody's job 42 of lab"):
        stage_in.ask(address, munge_socket, {"v": 1, "node": "cloud1", "staged": report}, 5)
    with pytest.raises(stage_in.StageError, match=r"bad_request: staged\.files is an integer"):
        stage_in.ask(address, munge_socket, {"v": 1, "node": "cloud1", "staged": {**report, "files": "1"}}, 5)
    assert stage_in.ask(
        address, munge_socket, {"v": 1, "node": "cloud1", "staged": {**report, "job_id": 41}}, 5
    ) == {"recorded": True}
