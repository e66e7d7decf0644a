"""A fake of Stripe's remote side, for exactly what the portal uses of it.

`FakeStripe` is an HTTP server on 127.0.0.1 that answers as Stripe's API does:
POST /v1/checkout/sessions (form-encoded, as the `stripe` package sends it) creates
a checkout.session, GET /v1/checkout/sessions/{id} reads one back. Any other
request, an unknown parameter, or a missing API key is answered with Stripe's error
shape and recorded, and `check()` fails the test on it: a change in what the portal
asks of Stripe cannot pass unnoticed. `event` and `signature` build webhook
deliveries the way Stripe signs them (`t=<timestamp>,v1=<HMAC-SHA256 of "t.payload">`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

SESSION_PARAMS = {
    "mode",
    "line_items",
    "client_reference_id",
    "metadata",
    "success_url",
    "cancel_url",
}
_KEY_PART = re.compile(r"^([^\[\]]+)|\[([^\[\]]*)\]")


def decode_form(body: str) -> dict[str, Any]:
    """Stripe's form encoding (`a[b][0][c]=v`) back into nested dicts and lists."""
    root: dict[str, Any] = {}
    for key, value in parse_qsl(body, keep_blank_values=True, strict_parsing=bool(body)):
        parts = [m.group(1) if m.group(1) is not None else m.group(2) for m in _KEY_PART.finditer(key)]
        if not parts or parts[0] + "".join(f"[{p}]" for p in parts[1:]) != key:
            raise ValueError(f"malformed parameter name {key!r}")
        node = root
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return _lists(root)


def _lists(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    converted = {k: _lists(v) for k, v in node.items()}
    if converted and all(k.isdigit() for k in converted):
        if sorted(int(k) for k in converted) != list(range(len(converted))):
            raise ValueError(f"list indexes {sorted(converted)} are not 0..n-1")
        return [converted[str(i)] for i in range(len(converted))]
    return converted


class StripeRefusal(Exception):
    def __init__(self, status: int, message: str, error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, error_type


class FakeStripe:
    """Stripe's API for checkout sessions, on a local port, for one test."""

    def __init__(self, secret_key: str = "sk_test_fake") -> None:
        self.secret_key = secret_key
        self.sessions: dict[str, dict[str, Any]] = {}
        self.created: list[dict[str, Any]] = []  # the parameters of each session created
        self.by_idempotency_key: dict[str, tuple[str, dict[str, Any]]] = {}  # key -> (body, response)
        self.unexpected: list[str] = []
        self.refuse_next: StripeRefusal | None = None  # the next session to create is refused so
        self.refused: StripeRefusal | None = None
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def api_base(self) -> str:
        assert self._server is not None, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeStripe:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake._answer(self, "GET")

            def do_POST(self) -> None:
                fake._answer(self, "POST")

            def do_DELETE(self) -> None:
                fake._answer(self, "DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the test reads `unexpected`, not stderr."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @contextmanager
    def running(self) -> Iterator[FakeStripe]:
        """Serve for a block; on leaving it, fail on any request that was not expected."""
        self.start()
        try:
            yield self
        finally:
            self.stop()
        self.check()

    def check(self) -> None:
        """Fail on any request this fake was not built to answer."""
        assert not self.unexpected, f"unexpected requests to the fake Stripe: {self.unexpected}"

    # --- the API ------------------------------------------------------------------

    def _answer(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length).decode()
        try:
            if handler.headers.get("Authorization") != f"Bearer {self.secret_key}":
                raise StripeRefusal(401, "Invalid API Key provided", "authentication_error")
            status, reply = self._route(
                method,
                handler.path,
                handler.headers.get("Content-Type", ""),
                body,
                handler.headers.get("Idempotency-Key"),
            )
        except StripeRefusal as refusal:
            if refusal is not self.refused:
                with self._lock:
                    self.unexpected.append(f"{method} {handler.path}: {refusal.message}")
            status, reply = (
                refusal.status,
                {"error": {"type": refusal.error_type, "message": refusal.message}},
            )
        data = json.dumps(reply).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("Request-Id", f"req_{secrets.token_hex(7)}")
        handler.end_headers()
        handler.wfile.write(data)

    def _route(
        self, method: str, path: str, content_type: str, body: str, idempotency_key: str | None
    ) -> tuple[int, dict[str, Any]]:
        if method == "POST" and path == "/v1/checkout/sessions":
            if not content_type.startswith("application/x-www-form-urlencoded"):
                raise StripeRefusal(400, f"unexpected Content-Type {content_type!r}")
            with self._lock:
                if self.refuse_next is not None:
                    self.refused, self.refuse_next = self.refuse_next, None
                    raise self.refused
                first = self.by_idempotency_key.get(idempotency_key or "")
            if first is not None:  # Stripe replays the first response to a repeated key
                if first[0] != body:
                    raise StripeRefusal(
                        400, "Keys for idempotent requests can only be used with the same parameters"
                    )
                return 200, dict(first[1])
            session = self._create_session(decode_form(body))
            if idempotency_key:
                with self._lock:
                    self.by_idempotency_key[idempotency_key] = (body, session)
            return 200, session
        match = re.fullmatch(r"/v1/checkout/sessions/(cs_test_\w+)", path)
        if method == "GET" and match:
            with self._lock:
                session = self.sessions.get(match.group(1))
            if session is None:
                raise StripeRefusal(404, f"No such checkout.session: '{match.group(1)}'")
            return 200, session
        raise StripeRefusal(404, f"the fake Stripe does not answer {method} {path}")

    def _create_session(self, params: dict[str, Any]) -> dict[str, Any]:
        unknown = set(params) - SESSION_PARAMS
        if unknown:
            raise StripeRefusal(400, f"Received unknown parameters: {', '.join(sorted(unknown))}")
        if params.get("mode") != "payment":
            raise StripeRefusal(400, f"mode must be payment here, not {params.get('mode')!r}")
        items = params.get("line_items")
        if not isinstance(items, list) or len(items) != 1:
            raise StripeRefusal(400, "expected exactly one line item")
        price = items[0].get("price_data") or {}
        try:
            quantity = int(items[0]["quantity"])
            unit_amount = int(price["unit_amount"])
            currency = price["currency"]
            product_name = price["product_data"]["name"]
        except (KeyError, TypeError, ValueError) as error:
            raise StripeRefusal(400, f"malformed line item: {error!r}") from None
        if not product_name:
            raise StripeRefusal(400, "line_items[0][price_data][product_data][name] is empty")
        for url in ("success_url", "cancel_url"):
            if not str(params.get(url, "")).startswith(("http://", "https://")):
                raise StripeRefusal(400, f"Not a valid URL: {url}")
        session_id = f"cs_test_{secrets.token_hex(12)}"
        session = {
            "id": session_id,
            "object": "checkout.session",
            "mode": "payment",
            "status": "open",
            "payment_status": "unpaid",
            "currency": currency,
            "amount_subtotal": unit_amount * quantity,
            "amount_total": unit_amount * quantity,
            "client_reference_id": params.get("client_reference_id"),
            "metadata": params.get("metadata") or {},
            "success_url": params["success_url"],
            "cancel_url": params["cancel_url"],
            "url": f"https://checkout.stripe.com/c/pay/{session_id}",
            "livemode": False,
            "created": int(time.time()),
        }
        with self._lock:
            self.sessions[session_id] = session
            self.created.append(params)
        return dict(session)

    # --- what Stripe sends back ------------------------------------------------------

    def finish(
        self, session_id: str, *, payment_status: str = "paid", status: str = "complete"
    ) -> dict[str, Any]:
        """The session as Stripe holds it once the payer is done (or it expired)."""
        with self._lock:
            session = self.sessions[session_id]
            session.update(status=status, payment_status=payment_status, url=None)
            return dict(session)


def event(event_type: str, session: dict[str, Any], *, event_id: str | None = None, **changes: Any) -> bytes:
    """A webhook body: an `event` wrapping `session` with `changes` applied."""
    body = {
        "id": event_id or f"evt_{secrets.token_hex(12)}",
        "object": "event",
        "api_version": "2025-01-27.acacia",
        "created": int(time.time()),
        "livemode": False,
        "pending_webhooks": 1,
        "type": event_type,
        "data": {"object": {**session, **changes}},
    }
    return json.dumps(body).encode()


def signature(payload: bytes, secret: str, *, timestamp: int | None = None) -> str:
    """The Stripe-Signature header Stripe would send for `payload`."""
    stamp = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{stamp}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={stamp},v1={mac}"
