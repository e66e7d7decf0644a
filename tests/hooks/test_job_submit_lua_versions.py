"""job_submit/job_submit.lua on the job_desc each real Slurm gave it (job_desc.json).

tests/fixtures/slurm-<version>/job_desc.json holds, per recorded submission, every
job_desc field a debug job_submit.lua read inside that version's slurmctld. Here the
real script reads those fields (as userdata: by name only), sends its `submit` request
to a fake daemon, and the daemon's parser must read the same figures from it on every
version as from the recording itself (tests/support/recorded_versions.py).
Needs lua5.1 and lua-socket, as tests/hooks/test_job_submit_lua.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from job_submit.request import parse_submit
from tests.support import FIXTURES
from tests.support.fakedaemon import FakeDaemon, Responder
from tests.support.fakedaemon import fake_daemon as fake_daemon
from tests.support.fakedaemon import sockdir as sockdir
from tests.support.lua_job_submit import decision, require_lua, run_script
from tests.support.recorded_versions import SUBMITTED, VERSIONS

RECORDER_KEYS = ("pairs", "submit_uid")  # the dump's own notes, not job_desc fields


@pytest.fixture(scope="module", autouse=True)
def lua_available() -> None:
    require_lua()


@pytest.mark.parametrize("version", VERSIONS)
def test_the_script_forwards_what_each_version_fills(
    version: str, fake_daemon: Callable[[Responder], FakeDaemon], tmp_path: Path
) -> None:
    daemon = fake_daemon(lambda _: decision("accept", ""))
    recorded = json.loads((FIXTURES / f"slurm-{version}" / "job_desc.json").read_text())
    sent = 0
    for name, calls in recorded.items():
        for i, call in enumerate(calls):
            job_desc = {key: value for key, value in call.items() if key not in RECORDER_KEYS}
            outcome = run_script(tmp_path, daemon.path, job_desc=job_desc, partitions={})
            assert (outcome.rc, outcome.error) == (0, []), (name, outcome)
            request = daemon.requests[sent]
            sent += 1
            assert request["op"] == "submit"
            got = parse_submit(request)
            assert (got.gpus, got.gpus_requested_as, got.time_limit_seconds, got.array_tasks) == (
                SUBMITTED[name][i]
            ), name
            assert got.user_comment == parse_submit(call).user_comment, name
    assert sent == sum(len(calls) for calls in recorded.values())
