"""`gpucredit job submit|list|show|cancel|output`: a user's jobs through the portal's API.

An ordinary user runs these on a login node; they need no database and read no
gpucredit config they may not read. The portal's address is `GPUCREDIT_URL` (else
`[portal] url` in the config, when this user can read it). The user is proven by their
API token, `GPUCREDIT_TOKEN` (`gpucredit token create USER` by an admin, or the portal),
or, without one, by a MUNGE credential: `munge` (the node's munged, as this user) makes
one for each request, carrying the request itself (ledger.access.credentials), and the
portal takes it where `portal.munge_auth` is on (portal/munge_auth.py).

Standard library HTTP only (urllib), so a login node needs no portal extra.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any

import click

TIMEOUT_SECONDS = 60
MUNGE_TIMEOUT_SECONDS = 10


class ApiError(click.ClickException):
    """The API's refusal, with its code and words (exit 1)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(f"{error.get('code', status)}: {error.get('message', body)}")
        self.status = status


class BadInput(ApiError):
    """422: input the API cannot take (exit 2, as the other commands' bad usage)."""

    exit_code = 2


def _portal_url() -> str:
    url = os.environ.get("GPUCREDIT_URL")
    if not url:
        try:
            from ledger.config import load_config

            url = str(load_config().get("portal", {}).get("url") or "")
        except (OSError, ValueError):
            url = ""
    if not url:
        raise click.ClickException("set GPUCREDIT_URL to the portal's address (https://...)")
    return url.rstrip("/")


def authorization(method: str, target: str, data: bytes) -> str:
    """The Authorization header: the API token when one is set, else a MUNGE credential
    for exactly this request (`target`: its path under the portal's root, and ?query)."""
    token = os.environ.get("GPUCREDIT_TOKEN")
    if token:
        return f"Bearer {token}"
    from ledger.api import request_payload

    path, mark, query = target.partition("?")
    payload = request_payload(secrets.token_hex(16), method, urllib.parse.unquote(path) + mark + query, data)
    try:
        done = subprocess.run(
            ["munge"], input=payload, capture_output=True, timeout=MUNGE_TIMEOUT_SECONDS, check=False
        )
    except FileNotFoundError:
        raise click.ClickException(
            "no API token and no munge here: set GPUCREDIT_TOKEN to your API token (gpc_...), "
            "or run this on a cluster node (MUNGE)"
        ) from None
    except subprocess.TimeoutExpired:
        raise click.ClickException(f"munge did not answer in {MUNGE_TIMEOUT_SECONDS} s") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()
        raise click.ClickException(f"munge failed ({said}); or set GPUCREDIT_TOKEN to your API token")
    return f"MUNGE {done.stdout.decode('ascii').strip()}"


def call(
    method: str, path: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> Any:
    """One API request; the decoded JSON answer, or ApiError with the API's code and words."""
    data = None if body is None else json.dumps(body).encode()
    target = "/api/v1" + path
    request = urllib.request.Request(_portal_url() + target, data=data, method=method)
    request.add_header("Authorization", authorization(method, target, data or b""))
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:
            return json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        try:
            payload = json.loads(error.read() or b"{}")
        except ValueError:
            payload = {}
        raise (BadInput if error.code == 422 else ApiError)(error.code, payload) from None
    except urllib.error.URLError as error:
        raise click.ClickException(f"the portal at {_portal_url()} did not answer: {error.reason}") from None


def _print(value: Any, fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def _job_line(job: dict[str, Any]) -> str:
    why = f"  ({job['reason']})" if job.get("reason") else ""
    who = f"{job['account']:<12} {job['user']:<10}"
    return f"{job['job_id']:>8}  {who} {job['state']:<10} {job['cost']:>12}{why}"


@click.group("job")
def job_group() -> None:
    """Your Slurm jobs through the portal (GPUCREDIT_URL; GPUCREDIT_TOKEN, or MUNGE)."""


@job_group.command("submit")
@click.argument("script", type=click.File("r"))
@click.option("--account", "-A", required=True)
@click.option("--gpus", required=True, help="TYPE:N, like h100:1")
@click.option("--time", "time_limit", required=True, help="[D-]HH:MM:SS")
@click.option("--name", "-J", default=None)
@click.option("--cpus", type=int, default=None)
@click.option("--mem", "memory", default=None, help="like 16G")
@click.option("--max-cost", default=None, help="credits")
@click.option("--cloud", type=click.Choice(["yes", "no"]), default=None, help="may it run in the cloud")
@click.option("--region", default=None, help="the only cloud region it may run in, like us-west-2")
@click.option(
    "--data", multiple=True, help="an absolute path its cloud node copies before it starts, repeatable"
)
@click.option("--workdir", "working_dir", default=None, help="absolute (default: your home)")
@click.option("--env", "environment", multiple=True, help="NAME=VALUE, repeatable")
@click.option("--container", default=None, help="an OCI bundle directory to run it in (absolute)")
@click.option(
    "--retry",
    "retry_max",
    type=int,
    default=None,
    help="requeue it up to N times on a --retry-on failure",
)
@click.option("--retry-on", multiple=True, help="node_fail or exit:N, repeatable (a failure to retry on)")
@click.option(
    "--retry-backoff", type=int, default=None, help="seconds before the first retry, doubling (default 60)"
)
@click.option(
    "--idempotency-key", default=None, help="default: a new one (a retry with the same key submits once)"
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def submit_command(
    script: Any,
    account: str,
    gpus: str,
    time_limit: str,
    name: str | None,
    cpus: int | None,
    memory: str | None,
    max_cost: str | None,
    cloud: str | None,
    region: str | None,
    data: tuple[str, ...],
    working_dir: str | None,
    environment: tuple[str, ...],
    container: str | None,
    retry_max: int | None,
    retry_on: tuple[str, ...],
    retry_backoff: int | None,
    idempotency_key: str | None,
    fmt: str,
) -> None:
    """Submit SCRIPT ("-" for stdin) as you: quoted and checked by job_submit like sbatch."""
    body: dict[str, Any] = {
        "account": account,
        "script": script.read(),
        "gpus": gpus,
        "time_limit": time_limit,
    }
    optional = {
        "name": name,
        "cpus": cpus,
        "memory": memory,
        "max_cost": max_cost,
        "cloud": cloud,
        "region": region,
        "working_dir": working_dir,
        "container": container,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    if data:
        body["data"] = list(data)
    if environment:
        pairs = [item.partition("=") for item in environment]
        if any(not sep for _name, sep, _value in pairs):
            raise click.BadParameter("NAME=VALUE", param_hint="--env")
        body["environment"] = {key: value for key, _sep, value in pairs}
    if (
        retry_max is not None or retry_on or retry_backoff is not None
    ):  # the portal checks it (retry.max, ...)
        body["retry"] = {"max": retry_max, "on": list(retry_on)}
        if retry_backoff is not None:
            body["retry"]["backoff_seconds"] = retry_backoff
    key = idempotency_key or str(uuid.uuid4())
    answer = call("POST", "/jobs", body, {"Idempotency-Key": key})
    if fmt == "json":
        _print(answer, fmt)
        return
    click.echo(f"Submitted job {answer['job_id']}")
    if answer.get("message"):
        click.echo(answer["message"], err=True)


@job_group.command("list")
@click.option("--account", "-A", default=None)
@click.option("--state", default=None)
@click.option("--limit", type=int, default=None)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def list_command(account: str | None, state: str | None, limit: int | None, fmt: str) -> None:
    """Your jobs (a manager: the account's), newest first."""
    query = {
        key: value for key, value in {"account": account, "state": state, "limit": limit}.items() if value
    }
    page = call("GET", "/jobs" + (f"?{urllib.parse.urlencode(query)}" if query else ""))
    if fmt == "json":
        _print(page, fmt)
        return
    click.echo(f"{'JOB':>8}  {'ACCOUNT':<12} {'USER':<10} {'STATE':<10} {'COST':>12}")
    for job in page["items"]:
        click.echo(_job_line(job))


@job_group.command("show")
@click.argument("job_id", type=click.IntRange(1))
def show_command(job_id: int) -> None:
    """One job, as JSON: state, reason, cost, attempts."""
    _print(call("GET", f"/jobs/{job_id}"), "json")


@job_group.command("cancel")
@click.argument("job_id", type=click.IntRange(1))
def cancel_command(job_id: int) -> None:
    """Cancel your job: a queued job costs nothing, a running one is settled to the second."""
    job = call("DELETE", f"/jobs/{job_id}")
    click.echo(f"job {job_id}: {job['state']}, cost {job['cost']}")


@job_group.command("output")
@click.argument("job_id", type=click.IntRange(1))
@click.option("--lines", "-n", type=click.IntRange(1, 1000), default=50, show_default=True)
def output_command(job_id: int, lines: int) -> None:
    """The tail of your job's output."""
    answer = call("GET", f"/jobs/{job_id}/output?lines={lines}")
    sys.stdout.write("".join(line + "\n" for line in answer["lines"]))
