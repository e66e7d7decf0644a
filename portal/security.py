"""What every response gets: CSRF on forms, security headers, rate limits.

The JSON API authenticates by bearer token, never by cookie, so a cross-site form
cannot ride on a session there; it is exempt from CSRF and rate-limited per token,
one budget over the whole API (`portal.api_rate_limit`), whichever operations it
spends it on. Browser forms carry a CSRF token (Flask-WTF).

Failed logins are limited twice, both keyed on the client's address (portal.proxy):
per user name and address (`portal.login_rate_limit`), so a stranger guessing
alice's password is slowed without locking alice out from her own address; and per
address whatever names it tries (`portal.login_address_rate_limit`), so spraying
many names from one address is as slow. A refused try costs no password check. And
at most `PASSWORD_CHECKS_AT_ONCE` argon2 checks run at once (each takes ~64 MiB and a
core for tens of milliseconds): a login beyond that is told at once to retry (503), so
logins from many addresses cannot take the threads /healthz and every page need. A
flood of requests from one address is the reverse proxy's to refuse before it costs the
portal anything (limit_req in gpucredit/examples/nginx/gpucredit.conf; bench.portal_logins).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import Flask, Response, current_app, g, request
from flask_limiter import Limiter
from flask_wtf.csrf import CSRFProtect

from ledger.errors import LedgerError
from portal.proxy import client_address
from portal.settings import portal_settings

csrf = CSRFProtect()
PASSWORD_CHECKS_AT_ONCE = 2
# A login that finds every slot taken is told to retry at once: a thread waiting for a
# slot is one of waitress's few, which /healthz and every page need too (a quarter of a
# second's wait put /healthz at ~0.4 s under a spray from many addresses: bench).
_password_checks = threading.BoundedSemaphore(PASSWORD_CHECKS_AT_ONCE)


class TooManyLogins(LedgerError):
    code = "too_many_logins"
    http_status = 503


def _default_key() -> str:
    who = g.get("principal")
    return who.rate_key if who is not None else f"addr:{client_address()}"


limiter = Limiter(key_func=_default_key, default_limits=[], headers_enabled=True)

# The portal draws charts as inline SVG with presentation attributes and ships its
# own CSS and JS files: nothing inline, nothing from another origin. Forms post only
# here, and may be redirected on only to the payment provider's checkout (browsers
# apply form-action to a form's redirects too).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'{checkout}; frame-ancestors 'none'"
)
CHECKOUT_ORIGINS = {"stripe": "https://checkout.stripe.com"}


def init_app(app: Flask) -> None:
    settings = portal_settings(app)
    app.config["RATELIMIT_STORAGE_URI"] = settings["rate_limit_storage"]
    provider = (app.config["GPUCREDIT"].get("payments") or {}).get("provider", "manual")
    checkout = f" {CHECKOUT_ORIGINS[provider]}" if provider in CHECKOUT_ORIGINS else ""
    app.extensions["gpucredit.csp"] = CONTENT_SECURITY_POLICY.format(checkout=checkout)
    csrf.init_app(app)
    limiter.init_app(app)
    app.after_request(_headers)


def login_limit() -> str:
    return str(portal_settings(current_app)["login_rate_limit"])


def login_address_limit() -> str:
    return str(portal_settings(current_app)["login_address_rate_limit"])


def api_limit() -> str:
    return str(portal_settings(current_app)["api_rate_limit"])


def login_key() -> str:
    """Failed logins per user name and client address."""
    return f"login:{client_address()}:" + (request.form.get("username") or "").strip().lower()


def login_address_key() -> str:
    """Failed logins per client address, whatever names it tries."""
    return f"login-from:{client_address()}"


def failed_login(response: Response) -> bool:
    """Only a failed login counts: a PI logging in often, or a class behind one NAT
    logging in at nine, spends nothing."""
    return response.status_code == 401


@contextmanager
def check_password_slot() -> Iterator[None]:
    """One of the PASSWORD_CHECKS_AT_ONCE slots for an argon2 check, or TooManyLogins
    (503, retry) when none is free."""
    if not _password_checks.acquire(blocking=False):
        raise TooManyLogins(
            f"too many logins at once (at most {PASSWORD_CHECKS_AT_ONCE} are checked at a time); "
            "retry in a moment",
            details={"limit": "password_checks_at_once", "cap": PASSWORD_CHECKS_AT_ONCE},
        )
    try:
        yield
    finally:
        _password_checks.release()


def _headers(response: Response) -> Response:
    headers: Any = response.headers
    headers.setdefault("Content-Security-Policy", current_app.extensions["gpucredit.csp"])
    headers.setdefault("X-Content-Type-Options", "nosniff")
    headers.setdefault("X-Frame-Options", "DENY")
    headers.setdefault("Referrer-Policy", "same-origin")
    headers.setdefault("Cross-Origin-Opener-Policy", "same-origin")
    if current_app.config.get("SESSION_COOKIE_SECURE"):
        headers.setdefault("Strict-Transport-Security", "max-age=31536000")
    if request.path.startswith("/api/") or g.get("principal") is not None:
        headers.setdefault("Cache-Control", "no-store")
    return response
