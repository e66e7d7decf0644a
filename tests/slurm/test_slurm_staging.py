"""A job's data staged to its cloud node on the real Slurm box: alice submits through the
portal with `data` and `cloud: "yes"`; on-premise is full, so it runs in partition
`cloud` (node3); node3's Prolog asks the module's daemon for the paths over the agents'
MUNGE channel, copies them as alice into the node's stage folder, where the job reads
them, and reports the files, bytes and milliseconds, which the job's API record shows. A
path alice may not read is not copied, and the record says so. The Epilog removes the
folder.

The host's box only (tests/slurm's HOST_BOX_ONLY in mk/slurm.mk): a chroot box's nodes run
their own munged, whose credentials the host's daemon would not take.

Run under the box lock: flock /tmp/gpucredit-box.lock pytest -m slurm tests/slurm/test_slurm_staging.py
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask

from tests.support.cluster import Cluster, on_premise_full, sacct_runs

pytestmark = pytest.mark.slurm
DATA = os.urandom(1 << 20)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def staging(cluster: Cluster) -> Iterator[Path]:
    """The module's daemon takes the nodes' stage-ins on a port, the hooks stage into
    DIR/stage/NODE, and onprem and cloud are tagged; the stage folder, as the hooks see it."""
    port = free_port()
    cluster.write_configs(
        f'[daemon]\nsocket = "@DIR@/daemon.sock"\ntimeout_seconds = 2.0\nagent_listen = "127.0.0.1:{port}"\n'
        '[policy]\non_ledger_unreachable = "reject"\n'
        '[slurm]\ncluster = "lab"\nbin_dir = "@BIN@"\n'
        f'[agent]\nspool_dir = "@DIR@/spool/%n"\nsend_to = ["127.0.0.1:{port}"]\n'
        '[hooks]\nlog_file = "@DIR@/hooks.log"\nstage_dir = "@DIR@/stage/%n"\n'
        '[partitions.onprem]\nsite = "onprem"\n[partitions.cloud]\nsite = "cloud"\n'
    )
    cluster.gpucredit("price", "set", "h100", "5.40", "--partition", "cloud")
    cluster.stop_daemon()
    cluster.start_daemon()
    yield cluster.dir / "stage"
    cluster.write_config("reject")
    cluster.stop_daemon()
    cluster.start_daemon()


@pytest.fixture
def data(cluster: Cluster) -> Iterator[Path]:
    """alice's data set (hers alone) and a file only root may read, beside it."""
    folder = Path(cluster.box.inside("/tmp")) / f"gpucredit-stage-{os.getpid()}"
    folder.mkdir(mode=0o755)
    (folder / "set.bin").write_bytes(DATA)
    shutil.chown(folder / "set.bin", "alice", "alice")
    (folder / "set.bin").chmod(0o600)
    (folder / "secret").write_text("root's own\n")
    (folder / "secret").chmod(0o600)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_cloud_jobs_data_is_staged_as_its_user_before_it_starts_and_the_copy_recorded(
    cluster: Cluster, staging: Path, data: Path, portal: Flask, alice: dict[str, str]
) -> None:
    account = cluster.new_account("10")
    client = portal.test_client()
    script = f'#!/bin/sh\nsha256sum "{staging}/$SLURMD_NODENAME/job_$SLURM_JOB_ID/set.bin"\n'
    body = {
        "account": account,
        "script": script,
        "gpus": "h100:1",
        "time_limit": "00:01:00",
        "cloud": "yes",
        "data": [str(data / "set.bin"), str(data / "secret")],
    }
    with on_premise_full(cluster):
        answer = client.post(
            "/api/v1/jobs", json=body, headers={**alice, "Idempotency-Key": f"stage-{account}"}
        )
        assert answer.status_code == 201, answer.get_json()
        job_id = answer.get_json()["job_id"]
        cluster.box.wait_state(job_id, "COMPLETED", timeout=90)
    [row] = sacct_runs(cluster.box, job_id, account)
    assert (row["Partition"], row["NodeList"]) == ("cloud", "node3")
    deadline = time.monotonic() + 30
    while not (shown := client.get(f"/api/v1/jobs/{job_id}", headers=alice).get_json())["data"]["staged"]:
        assert time.monotonic() < deadline, shown
        time.sleep(0.2)
    [staged] = shown["data"]["staged"]
    assert shown["data"]["paths"] == body["data"]
    assert (staged["run"], staged["node"], staged["files"], staged["bytes"]) == (0, "node3", 1, len(DATA))
    assert staged["error"] == f"{data / 'secret'}: Permission denied"  # copied as alice, not as root
    output = client.get(f"/api/v1/jobs/{job_id}/output?lines=5", headers=alice).get_json()
    assert output["lines"][0].startswith(hashlib.sha256(DATA).hexdigest()), output
    assert not (staging / "node3" / f"job_{job_id}").exists()  # the Epilog's
