"""The provider for tests/cloud/: moto's EC2 server on 127.0.0.1 (a free port), one per
session, reset before each test, behind slurmbox.provider_faults.FaultProxy, through
which a test injects the cloud's faults (5xx, throttling, capacity, no answer). The
code under test calls the proxy's URL exactly as it would call AWS: the endpoint is
configuration.

`make_programs(**cloud)` builds CloudPrograms on that endpoint with a FakeRunner for
Slurm (answers only the argv a test gave it), a clock the test sets, and a sleep that
records its waits instead of sleeping.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from accounting_bridge.cloud.config import load_cloud_config
from accounting_bridge.cloud.journal import Journal
from accounting_bridge.cloud.programs import CloudPrograms
from accounting_bridge.cloud.provider import Ec2Provider
from accounting_bridge.slurm.slurmcmd import FakeRunner
from slurmbox.provider_faults import FaultProxy
from tests.support.cloud import Rig, cloud_section


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    pytest.importorskip("boto3", reason="the cloud extra: pip install 'gpucredit[cloud]'")
    pytest.importorskip("moto.server", reason="moto[server], a dev extra")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def proxy(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    request = urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    # moto checks no signature; boto3 still needs some credentials to sign with.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    faults = FaultProxy(moto_url)
    faults.start()
    yield faults
    faults.stop()


@pytest.fixture
def make_rig(proxy: FaultProxy, tmp_path: Path) -> Callable[..., Rig]:
    def make(**overrides: Any) -> Rig:
        config = load_cloud_config(
            {"cloud": cloud_section(proxy.url, tmp_path / "cloud", **overrides), "slurm": {"cluster": "lab"}}
        )
        slurm = FakeRunner()
        said: list[str] = []
        waits: list[float] = []
        rig = Rig(
            CloudPrograms(
                config,
                Ec2Provider(config),
                Journal(config.state_dir),
                slurm,
                clock=lambda: rig.now[0],
                sleep=waits.append,
                say=said.append,
            ),
            config,
            slurm,
            said,
            waits,
        )
        return rig

    return make
