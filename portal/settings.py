"""The portal's settings, in layers: built-in defaults, then the gpucredit TOML file
(its `[portal]` and `[payments]` tables, the same file the CLI and the daemon read),
then `GPUCREDIT_PORTAL_*` environment variables, then what `create_app` is given.

The secret key that signs session cookies comes from `portal.secret_key_file`
(created 0600 with a random key on first start), so restarting the portal does not
log everyone out, and the key never sits in the world-readable TOML file.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path
from typing import Any

from flask import Flask

from ledger.config import load_config

PORTAL_DEFAULTS: dict[str, Any] = {
    "auth": "local",  # "local": argon2 passwords; "header": single sign-on by a trusted proxy
    "sso_header": "X-Remote-User",  # mod_auth_openidc / Open OnDemand pass the user here
    "trusted_proxies": ["127.0.0.1", "::1"],  # only these may assert sso_header
    "secret_key_file": None,  # default: portal-secret-key beside the embedded database
    "cookie_secure": None,  # None: secure unless the portal is served on plain http loopback
    "low_balance_credits": "10",  # the dashboard warns at or below this
    "login_rate_limit": "10 per minute",  # per user name tried
    "api_rate_limit": "600 per minute",  # per token
    "rate_limit_storage": "memory://",  # e.g. "redis://127.0.0.1:6379" when several workers
    "threads": 8,  # waitress worker threads
    "page_size": 50,  # default length of a page of a list (API and pages)
}


def configure(app: Flask, overrides: dict[str, Any]) -> None:
    gpucredit = overrides.get("GPUCREDIT") or load_config()
    portal = {**PORTAL_DEFAULTS, **gpucredit.get("portal", {})}
    for key in list(PORTAL_DEFAULTS):
        env = os.environ.get(f"GPUCREDIT_PORTAL_{key.upper()}")
        if env is not None:
            portal[key] = env
    gpucredit = {**gpucredit, "portal": portal}
    app.config.update(
        GPUCREDIT=gpucredit,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_NAME="gpucredit_session",
        PERMANENT_SESSION_LIFETIME=12 * 3600,
        MAX_CONTENT_LENGTH=1024 * 1024,
        WTF_CSRF_TIME_LIMIT=None,  # bound to the session, which expires on its own
        JSON_SORT_KEYS=False,
    )
    app.config.update({k: v for k, v in overrides.items() if k != "GPUCREDIT"})
    if "SESSION_COOKIE_SECURE" not in overrides:
        app.config["SESSION_COOKIE_SECURE"] = _cookie_secure(portal)
    if not app.config.get("SECRET_KEY"):
        app.config["SECRET_KEY"] = _secret_key(portal, gpucredit["database"]["url"])


def portal_settings(app: Flask) -> dict[str, Any]:
    return app.config["GPUCREDIT"]["portal"]


def _cookie_secure(portal: dict[str, Any]) -> bool:
    if portal.get("cookie_secure") is not None:
        return str(portal["cookie_secure"]).lower() in ("1", "true", "yes")
    url = portal.get("url") or ""
    if url.startswith("https://"):
        return True
    try:
        return not ipaddress.ip_address(str(portal.get("host", "127.0.0.1"))).is_loopback
    except ValueError:
        return portal.get("host") != "localhost"


def _secret_key(portal: dict[str, Any], database_url: str) -> str:
    path = portal.get("secret_key_file")
    if not path:
        if database_url.startswith("sqlite:///") and database_url != "sqlite:///:memory:":
            path = str(Path(database_url.removeprefix("sqlite:///")).parent / "portal-secret-key")
        else:
            path = "/etc/gpucredit/portal-secret-key"
    key_path = Path(path)
    try:
        return key_path.read_text().strip()
    except FileNotFoundError:
        pass
    key = secrets.token_hex(32)
    try:
        key_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another worker wrote it first
        return key_path.read_text().strip()
    except OSError:  # nowhere to keep it: sessions last as long as this process
        return key
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key
