"""The submitter service (portal/jobs/submitter.py) without Slurm: who may ask (the
kernel's peer uid), and the exact argv it runs as the user for a request."""

from __future__ import annotations

import os
import pwd
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from portal.jobs.submitter import Submitter, ask, serve
from tests.support.fake_slurmrestd import token_user
from tests.support.services import require


@pytest.fixture
def alice() -> str:
    """The box's user alice, made as the box makes her where she is missing (as root):
    these tests run before the box's in CI, on a machine that may never have had one."""
    try:
        pwd.getpwnam("alice")
    except KeyError:
        require(os.geteuid() == 0, "the Unix user alice", "run as root, or make slurm-up once")
        # 9: the box made her a moment ago (its tests run beside these)
        made = subprocess.run(["/usr/sbin/useradd", "-m", "-s", "/bin/bash", "alice"], check=False)
        assert made.returncode in (0, 9), made
    return "alice"


class Recorder:
    """A runner that records argv and answers like sbatch --parsable."""

    def __init__(
        self, stdout: str = "4711\n", rc: int = 0, stderr: str = "sbatch: gpucredit: ~1.00 credits\n"
    ):
        self.calls: list[tuple[list[str], dict[str, Any]]] = []
        self.stdout, self.rc, self.stderr = stdout, rc, stderr

    def __call__(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append((argv, kwargs))
        if argv[4] == "/usr/bin/test":
            return subprocess.CompletedProcess(argv, 0, "", "")
        return subprocess.CompletedProcess(argv, self.rc, self.stdout, self.stderr)


def _serving(tmp_path: Path, allow_uid: int, recorder: Recorder, jwt_key: str | None = None) -> Iterator[str]:
    path = str(tmp_path / "submitter.sock")
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=serve,
        args=(path, allow_uid, Submitter(min_uid=1000, run=recorder, jwt_key=jwt_key)),
        kwargs={"ready": ready, "stop": stop},
        daemon=True,
    )
    thread.start()
    assert ready.wait(5)
    try:
        yield path
    finally:
        stop.set()
        thread.join(5)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def own_socket(tmp_path: Path, recorder: Recorder) -> Iterator[str]:
    yield from _serving(tmp_path, os.getuid(), recorder)


@pytest.fixture
def other_socket(tmp_path: Path, recorder: Recorder) -> Iterator[str]:
    yield from _serving(tmp_path, os.getuid() + 4242, recorder)


SPEC = {"account": "physics", "gpus": "h100:1", "time_limit": "00:10:00", "working_dir": "/tmp"}


def test_a_peer_other_than_the_portal_uid_is_refused_and_nothing_runs(
    other_socket: str, recorder: Recorder
) -> None:
    answer = ask(other_socket, {"op": "submit", "user": "nobody", "spec": SPEC, "script": "#!/bin/sh\n"})
    assert answer == {"ok": False, "error": "forbidden", "message": "only the portal may ask"}
    assert recorder.calls == []


def test_the_socket_is_private_to_the_portal_uid(own_socket: str) -> None:
    info = os.stat(own_socket)
    assert (info.st_mode & 0o777, info.st_uid) == (0o600, os.getuid())


@pytest.mark.usefixtures("alice")
def test_submit_runs_the_users_own_sbatch_with_a_clean_environment(
    own_socket: str, recorder: Recorder
) -> None:
    spec = {**SPEC, "name": "train", "cpus": 2, "memory": "4G", "environment": {"EPOCHS": "3; rm -rf /"}}
    answer = ask(
        own_socket, {"op": "submit", "user": "alice", "spec": spec, "script": "#!/bin/sh\necho hi\n"}
    )
    assert answer == {"ok": True, "job_id": 4711, "stderr": "sbatch: gpucredit: ~1.00 credits\n"}
    check, submit = recorder.calls
    assert check[0] == [
        "/usr/sbin/runuser",
        "-u",
        "alice",
        "--",
        "/usr/bin/test",
        "-d",
        "/tmp",
        "-a",
        "-r",
        "/tmp",
        "-a",
        "-x",
        "/tmp",
    ]
    home = pwd.getpwnam("alice").pw_dir
    assert submit[0] == [
        "/usr/sbin/runuser",
        "-u",
        "alice",
        "--",
        "/usr/bin/env",
        "-i",
        "PATH=/usr/local/bin:/usr/bin:/bin",
        f"HOME={home}",
        "USER=alice",
        "EPOCHS=3; rm -rf /",
        "/usr/bin/sbatch",
        "--parsable",
        "--export=ALL",
        "-A",
        "physics",
        "--gres=gpu:h100:1",
        "-t",
        "00:10:00",
        "-J",
        "train",
        "-c",
        "2",
        "--mem",
        "4G",
        "-D",
        "/tmp",
    ]
    assert submit[1]["input"] == "#!/bin/sh\necho hi\n" and submit[1]["cwd"] == "/"


@pytest.mark.usefixtures("alice")
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"environment": {"LD_PRELOAD": "/tmp/x.so"}}, "environment"),
        ({"environment": {"SBATCH_ACCOUNT": "chemistry"}}, "environment"),
        ({"name": "x; reboot"}, "name"),
        ({"account": "--uid=0"}, "account"),
        ({"gpus": "h100"}, "gpus"),
        ({"time_limit": "forever"}, "time_limit"),
        ({"working_dir": "relative/dir"}, "working_dir"),
        ({"cpus": True}, "cpus"),
    ],
)
def test_a_field_the_submitter_will_not_pass_refuses_the_request(
    own_socket: str, recorder: Recorder, change: dict[str, Any], field: str
) -> None:
    answer = ask(
        own_socket, {"op": "submit", "user": "alice", "spec": {**SPEC, **change}, "script": "#!/bin/sh\n"}
    )
    assert (answer["ok"], answer["error"], answer["field"]) == (False, "invalid_input", field)
    assert recorder.calls == []


def test_root_and_system_users_are_refused(own_socket: str, recorder: Recorder) -> None:
    answer = ask(own_socket, {"op": "submit", "user": "root", "spec": SPEC, "script": "#!/bin/sh\n"})
    assert answer == {
        "ok": False,
        "error": "invalid_input",
        "field": "user",
        "message": "root is a system user (uid outside 1000-59999)",
    }
    assert recorder.calls == []


@pytest.mark.usefixtures("alice")
def test_cancel_runs_scancel_as_the_user(own_socket: str, recorder: Recorder) -> None:
    recorder.stdout, recorder.stderr = "", ""
    assert ask(own_socket, {"op": "cancel", "user": "alice", "job_id": 77}) == {
        "ok": True,
        "exit": 0,
        "stderr": "",
    }
    assert recorder.calls[0][0] == ["/usr/sbin/runuser", "-u", "alice", "--", "/usr/bin/scancel", "77"]


@pytest.mark.usefixtures("alice")
def test_sbatch_refusing_is_passed_back_with_its_words(own_socket: str, recorder: Recorder) -> None:
    recorder.rc, recorder.stdout = 1, ""
    recorder.stderr = "sbatch: error: gpucredit: this job would cost ~0.06 credits\n"
    answer = ask(own_socket, {"op": "submit", "user": "alice", "spec": SPEC, "script": "#!/bin/sh\n"})
    assert answer == {"ok": False, "error": "refused", "exit": 1, "stderr": recorder.stderr}


KEY = b"0123456789abcdef0123456789abcdef"


@pytest.fixture
def signer(tmp_path: Path, recorder: Recorder) -> Iterator[str]:
    key = tmp_path / "jwt_hs256.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    yield from _serving(tmp_path, os.getuid(), recorder, jwt_key=str(key))


@pytest.mark.usefixtures("alice")
def test_with_the_key_it_signs_a_minutes_token_for_a_user_and_runs_nothing(
    signer: str, recorder: Recorder
) -> None:
    before = time.time()
    answer = ask(signer, {"op": "token", "user": "alice"})
    assert answer["ok"] is True, answer
    assert token_user(answer["token"], KEY, before + 59) == "alice"
    assert token_user(answer["token"], KEY, before + 62) is None  # expired after its 60 s
    assert recorder.calls == []


def test_it_signs_for_no_system_user_and_for_no_peer_but_the_portal(
    signer: str, tmp_path: Path, recorder: Recorder
) -> None:
    for user in ("root", "nobody"):
        answer = ask(signer, {"op": "token", "user": user})
        assert (answer["ok"], answer["field"]) == (False, "user"), answer
        assert "system user" in answer["message"]
    key = tmp_path / "other.key"
    key.write_bytes(KEY)
    other = _serving(tmp_path / "other", os.getuid() + 4242, recorder, jwt_key=str(key))
    (tmp_path / "other").mkdir()
    path = next(other)
    try:
        assert ask(path, {"op": "token", "user": "alice"}) == {
            "ok": False,
            "error": "forbidden",
            "message": "only the portal may ask",
        }
    finally:
        next(other, None)


@pytest.mark.usefixtures("alice")
def test_without_a_key_it_signs_nothing(own_socket: str) -> None:
    answer = ask(own_socket, {"op": "token", "user": "alice"})
    assert answer == {
        "ok": False,
        "error": "invalid_input",
        "field": "op",
        "message": "this submitter signs no tokens (serve it with --jwt-key)",
    }


@pytest.mark.usefixtures("alice")
def test_it_signs_no_token_for_slurmuser_whatever_its_uid(tmp_path: Path) -> None:
    """SlurmUser may act as anyone through slurmrestd; a site's may have a uid in the range."""
    key = tmp_path / "jwt_hs256.key"
    key.write_bytes(KEY)
    submitter = Submitter(jwt_key=str(key), slurm_user="alice")  # alice stands for it here
    assert submitter.answer({"op": "token", "user": "alice"}) == {
        "ok": False,
        "error": "invalid_input",
        "field": "user",
        "message": "alice is SlurmUser: no token for it",
    }
