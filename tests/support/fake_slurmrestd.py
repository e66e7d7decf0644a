"""slurmrestd where the real one cannot run (tests/portal): an HTTP server on 127.0.0.1
that answers with what 24.11's and 26.05's slurmrestd answered on the chroot boxes
(tests/fixtures/slurm-VERSION/slurmrestd_*.json, recorded there) and checks each token
as auth/jwt does: HS256 over the key, `sun` naming X-SLURM-USER-NAME, not expired; a
bad one gets slurmrestd's 401 "Authentication failure". The real one is
tests/slurm/test_slurm_jobs_api.py on the chroot boxes."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def recorded(version: str, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"slurm-{version}" / f"slurmrestd_{name}.json").read_text())
    return data


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def token_user(token: str, key: bytes, now: float) -> str | None:
    """The user a token speaks for, or None where auth/jwt would refuse it."""
    try:
        header, payload, signature = token.split(".")
        claims = json.loads(_unb64(payload))
        if json.loads(_unb64(header)).get("alg") != "HS256":
            return None
    except ValueError:
        return None
    expected = hmac.new(key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(expected, _unb64(signature)) or claims.get("exp", 0) <= now:
        return None
    return str(claims.get("sun"))


@dataclass
class FakeSlurmrestd:
    version: str
    key: bytes
    url: str = ""
    # The recorded answer a submit gets, or one given whole ({"status", "body"}).
    submit_answer: str | dict[str, Any] = "submit"
    cancel_answers: dict[int, str] = field(default_factory=dict)  # job id -> recorded answer
    requests: list[tuple[str, str, str | None, Any]] = field(default_factory=list)  # method, path, user, body

    def answer(self, method: str, path: str, headers: Any, body: Any) -> tuple[int, Any]:
        user = headers.get("X-SLURM-USER-NAME")
        if token_user(headers.get("X-SLURM-USER-TOKEN", ""), self.key, time.time()) != user:
            return 401, "Authentication failure"
        self.requests.append((method, path, user, body))
        paths = recorded(self.version, "openapi_paths")["paths"]
        if method == "GET" and path == "/openapi/v3":
            return 200, {"paths": {p: {} for p in paths}}
        route = path.rsplit("/", 1)[0] + "/{job_id}"
        if method == "POST" and path in paths:
            answer = self.submit_answer
            found = answer if isinstance(answer, dict) else recorded(self.version, answer)
            return found["status"], found["body"]
        if method == "DELETE" and route in paths:
            found = recorded(self.version, self.cancel_answers.get(int(path.rsplit("/", 1)[1]), "cancel"))
            return found["status"], found["body"]
        return 404, {"errors": [{"description": "Unable to find requested URL"}]}


@contextmanager
def serving(fake: FakeSlurmrestd) -> Iterator[FakeSlurmrestd]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            status, answer = fake.answer(self.command, self.path, self.headers, body)
            data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(answer, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _reply

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
