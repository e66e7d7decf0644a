"""What every response gets: CSRF on forms, security headers, rate limits.

The JSON API authenticates by bearer token, never by cookie, so a cross-site form
cannot ride on a session there; it is exempt from CSRF and rate-limited per token.
Browser forms carry a CSRF token (Flask-WTF). Logins are limited per user name
tried, so guessing one user's password is slow whatever addresses it comes from.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, current_app, g, request
from flask_limiter import Limiter
from flask_wtf.csrf import CSRFProtect

from portal.settings import portal_settings

csrf = CSRFProtect()


def _default_key() -> str:
    who = g.get("principal")
    return who.rate_key if who is not None else f"addr:{request.remote_addr}"


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


def api_limit() -> str:
    return str(portal_settings(current_app)["api_rate_limit"])


def login_key() -> str:
    return "login:" + (request.form.get("username") or "").strip().lower()


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
