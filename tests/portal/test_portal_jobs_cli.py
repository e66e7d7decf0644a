"""`gpucredit job ...` (gpucredit/job_cli.py) against the real portal served over HTTP
(werkzeug on loopback), with the fake job backend standing in for Slurm."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from flask import Flask
from werkzeug.serving import make_server

from gpucredit.cli import _build
from ledger.jobs.retries import RetryPolicy
from tests.support.fake_jobs import FakeBackend
from tests.support.portal import Site


@pytest.fixture
def served(app: Flask, site: Site) -> Iterator[tuple[str, FakeBackend]]:
    backend = FakeBackend()
    app.extensions["gpucredit.jobs_backend"] = backend
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", backend
    finally:
        server.shutdown()
        thread.join(5)


def run(url: str, token: str, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        _build(), ["job", *args], input=stdin, env={"GPUCREDIT_URL": url, "GPUCREDIT_TOKEN": token}
    )
    return result.exit_code, result.stdout, result.stderr


def test_submit_list_show_and_cancel_from_a_login_node(
    served: tuple[str, FakeBackend], site: Site, tmp_path: Path
) -> None:
    url, backend = served
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\npython train.py\n")
    bob = site.tokens["bob"]
    code, out, err = run(
        url,
        bob,
        "submit",
        str(script),
        "-A",
        "physics",
        "--gpus",
        "h100:1",
        "--time",
        "00:01:00",
        "--env",
        "EPOCHS=3",
    )
    assert (code, out) == (0, "Submitted job 5001\n"), err
    assert err == "gpucredit: ~0.06 credits (1×h100 × 1 min), 100.00 available\n"
    [(user, spec)] = backend.submits
    assert (user, spec.account, spec.environment) == ("bob", "physics", {"EPOCHS": "3"})

    code, out, err = run(url, bob, "list")
    assert code == 0, err
    assert out.splitlines()[1:] == [
        f"{5001:>8}  {'physics':<12} {'bob':<10} {'queued':<10} {'0.00':>12}  (waiting for GPUs)"
    ]
    code, out, err = run(url, bob, "cancel", "5001")
    assert (code, out) == (0, "job 5001: cancelled, cost 0.00\n"), err
    assert backend.cancels == [("bob", 5001)]


def test_a_refusal_prints_the_apis_code_and_words_and_exits_non_zero(
    served: tuple[str, FakeBackend], site: Site, tmp_path: Path
) -> None:
    url, backend = served
    script = tmp_path / "bad.sh"
    script.write_text("python train.py\n")
    code, _out, err = run(
        url,
        site.tokens["bob"],
        "submit",
        str(script),
        "-A",
        "physics",
        "--gpus",
        "h100:1",
        "--time",
        "00:01:00",
    )
    assert code == 2
    assert err == "Error: invalid_input: script: must start with a #! line (like #!/bin/bash)\n"
    assert backend.submits == []
    code, _out, err = run(url, site.tokens["bob"], "show", "1001")
    assert (code, err) == (1, "Error: not_found: job 1001 does not exist\n")


def test_submit_with_retries_sends_the_policy(
    served: tuple[str, FakeBackend], site: Site, tmp_path: Path
) -> None:
    url, backend = served
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\npython train.py\n")
    base = ["submit", str(script), "-A", "physics", "--gpus", "h100:1", "--time", "00:01:00"]
    code, out, err = run(
        url, site.tokens["bob"], *base, "--retry", "3", "--retry-on", "exit:75", "--retry-backoff", "10"
    )
    assert (code, out) == (0, "Submitted job 5001\n"), err
    code, out, err = run(url, site.tokens["bob"], *base, "--retry", "2", "--retry-on", "exit:1")
    assert code == 0, err
    assert [spec.retry for _user, spec in backend.submits] == [
        RetryPolicy(3, ("exit:75",), 10),
        RetryPolicy(2, ("exit:1",), 60),
    ]
    code, out, err = run(url, site.tokens["bob"], *base, "--retry", "11", "--retry-on", "exit:1")
    assert code != 0 and "retry.max" in err, (out, err)
    assert len(backend.submits) == 2


def test_submit_with_cloud_region_and_data_sends_them(
    served: tuple[str, FakeBackend], site: Site, tmp_path: Path
) -> None:
    url, backend = served
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\npython train.py\n")
    base = [
        "submit",
        str(script),
        "-A",
        "physics",
        "--gpus",
        "h100:1",
        "--time",
        "00:01:00",
        "--cloud",
        "yes",
    ]
    code, out, err = run(
        url, site.tokens["bob"], *base, "--data", "/home/bob/set.tar", "--data", "/home/bob/cfg"
    )
    assert (code, out) == (0, "Submitted job 5001\n"), err
    [(_user, spec)] = backend.submits
    assert (spec.cloud, spec.region, spec.data) == ("yes", None, ("/home/bob/set.tar", "/home/bob/cfg"))
    code, out, err = run(url, site.tokens["bob"], *base, "--region", "us-west-2")
    assert code != 0 and "region: no cloud partition is in region us-west-2" in err, (out, err)
    assert len(backend.submits) == 1
