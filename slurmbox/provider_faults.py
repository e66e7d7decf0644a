"""A fault layer in front of the provider's endpoint: the cloud's outages, on demand.

The cloud code talks to `proxy.url` exactly as it would to AWS (it is only
`cloud.endpoint_url`); the proxy forwards each request to the real endpoint (moto's
server on the box and in tests/cloud/) unless a queued Fault matches the request's EC2
`Action`, in which case it answers that fault instead:

    Fault("RunInstances", status=500, code="InsufficientInstanceCapacity")   capacity
    Fault("RunInstances", status=503, code="RequestLimitExceeded")           throttling
    Fault("TerminateInstances", status=500, code="InternalError")            a 5xx
    Fault(None, drop=True, times=3)          the connection closed unanswered, 3 times:
                                             the API unreachable

Each fault answers `times` requests, then is spent; `proxy.actions` lists every Action
that came in, answered or not. Errors are EC2's XML error body, so botocore reads the
code as it would AWS's. Standard library only: the box starts it too.
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["Fault", "FaultProxy"]

ERROR_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
    "<RequestID>gpucredit-fault</RequestID></Response>"
)
FORWARD_TIMEOUT_SECONDS = 30.0


@dataclass
class Fault:
    action: str | None  # the EC2 Action it answers; None: every request
    status: int = 503
    code: str = "Unavailable"
    message: str = "injected by gpucredit's fault proxy"
    drop: bool = False  # close the connection without an answer
    times: int = 1


class FaultProxy:
    """`start()` listens on 127.0.0.1 (a free port) and returns the URL; `stop()`."""

    def __init__(self, target_url: str) -> None:
        parsed = urllib.parse.urlsplit(target_url)
        self.target = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.faults: list[Fault] = []
        self.actions: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the fault proxy is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, fault: Fault) -> None:
        with self._lock:
            self.faults.append(fault)

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            self.actions.clear()

    def take(self, action: str) -> Fault | None:
        with self._lock:
            self.actions.append(action)
            for fault in self.faults:
                if fault.times > 0 and fault.action in (None, action):
                    fault.times -= 1
                    return fault
        return None

    def start(self) -> str:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                proxy.handle(self)

            def do_GET(self) -> None:
                proxy.handle(self)

            def log_message(self, format: str, *args: object) -> None:  # quiet
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)
        action = (form.get("Action") or query.get("Action") or [""])[0]
        fault = self.take(action)
        if fault is not None and fault.drop:
            request.close_connection = True
            request.connection.close()
            return
        if fault is not None:
            payload = ERROR_BODY.format(code=fault.code, message=fault.message).encode()
            self._answer(request, fault.status, [("Content-Type", "text/xml")], payload)
            return
        connection = http.client.HTTPConnection(*self.target, timeout=FORWARD_TIMEOUT_SECONDS)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("connection", "host")}
            connection.request(request.command, request.path, body=body, headers=headers)
            answer = connection.getresponse()
            payload = answer.read()
            skipped = ("connection", "content-length")
            kept = [(k, v) for k, v in answer.getheaders() if k.lower() not in skipped]
            self._answer(request, answer.status, kept, payload)
        finally:
            connection.close()

    @staticmethod
    def _answer(
        request: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]], payload: bytes
    ) -> None:
        request.send_response(status)
        for key, value in headers:
            request.send_header(key, value)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        request.wfile.write(payload)
