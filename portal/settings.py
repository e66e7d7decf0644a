"""The portal's settings, in layers: built-in defaults, then the gpucredit TOML file
(its `[portal]` and `[payments]` tables, the same file the CLI and the daemon read),
then `GPUCREDIT_PORTAL_*` environment variables, then what `create_app` is given.

The secret key that signs session cookies comes from `portal.secret_key_file`
(created 0600 with a random key on first start), so restarting the portal does not
log everyone out, and the key never sits in the world-readable TOML file. Whoever can
write that file, or read it, can sign a session for any user: the portal refuses to
start with a key file (or a proxy secret file) another user can write or read
(`private_file_text`).

A setting that would leave a door open stops the portal at start with a
`PortalConfigError` saying which, never a portal that runs half-configured.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flask import Flask

from ledger.config import load_config

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MIN_SECRET_CHARS = 32  # a session key or proxy secret shorter than this is refused


class PortalConfigError(ValueError):
    """A setting the portal will not start with; the message names it and the fix."""


PORTAL_DEFAULTS: dict[str, Any] = {
    "auth": "local",  # "local": argon2 passwords; "header": single sign-on by a trusted proxy
    "sso_header": "X-Remote-User",  # mod_auth_openidc / Open OnDemand pass the user here
    # The reverse proxy in front of the portal: its addresses (networks), and the file
    # holding the secret it adds to every request it forwards (PROXY_SECRET_HEADER).
    # Both are needed before the portal believes anything a proxy says: the user in
    # sso_header (auth = "header"), the client's address in X-Real-IP (rate limits).
    "trusted_proxies": [],  # none by default: header sign-on needs a configured proxy
    "proxy_secret_file": None,
    # MUNGE authentication for the API (portal/munge_auth.py): off unless set; then anyone
    # who can get a credential from the cluster's munged is, to the API, the uid it names.
    "munge_auth": False,
    "munge_socket": None,  # None: munged's own (/run/munge/munge.socket.2)
    "unmunge": "/usr/bin/unmunge",
    "password_login": None,  # None: on with auth = "local", off with auth = "header"
    "secret_key_file": None,  # default: beside an embedded database, else the StateDirectory
    "cookie_secure": None,  # None: secure unless the portal is served on plain http loopback
    "low_balance_credits": "10",  # the dashboard warns at or below this
    "login_rate_limit": "10 per minute",  # failed logins per user name and client address
    "login_address_rate_limit": "30 per minute",  # failed logins per client address, any names
    "api_rate_limit": "600 per minute",  # per token, over the whole API
    "rate_limit_storage": "memory://",  # e.g. "redis://127.0.0.1:6379" when several workers
    "threads": 8,  # waitress worker threads
    "page_size": 50,  # default length of a page of a list (API and pages)
    # /metrics (every account's credit) on a listener of its own, never the public port.
    "metrics_host": "127.0.0.1",
    "metrics_port": 9467,  # 0: not served
    "metrics_allow": ["127.0.0.1/32", "::1/128"],  # peers the metrics listener answers
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
    _check_sign_on(portal)


def _check_sign_on(portal: dict[str, Any]) -> None:
    """Header sign-on only behind a configured proxy that proves itself with a secret."""
    if portal["auth"] not in ("local", "header"):
        raise PortalConfigError(f'portal.auth must be "local" or "header", not {portal["auth"]!r}')
    portal["trusted_proxies"] = networks(portal["trusted_proxies"], "portal.trusted_proxies")
    portal["metrics_allow"] = networks(portal["metrics_allow"], "portal.metrics_allow")
    if portal["proxy_secret_file"]:
        if not portal["trusted_proxies"]:
            raise PortalConfigError("portal.proxy_secret_file is set but portal.trusted_proxies is empty")
        path = Path(portal["proxy_secret_file"])
        try:
            portal["proxy_secret"] = private_file_text(path, "portal.proxy_secret_file")
        except FileNotFoundError:
            raise PortalConfigError(f"portal.proxy_secret_file {path} does not exist") from None
    else:
        portal["proxy_secret"] = None
    if portal["auth"] == "header" and portal["proxy_secret"] is None:
        raise PortalConfigError(
            'portal.auth = "header" trusts the user name a proxy sends, so it needs the proxy '
            "configured: portal.trusted_proxies (its addresses) and portal.proxy_secret_file (the "
            "secret it adds to each request; an address alone does not tell the proxy from another "
            "process on its host). See docs/admin-guide.md, Security."
        )
    portal["password_login"] = _password_login(portal)
    portal["munge_auth"] = _truthy(portal["munge_auth"])
    if portal["munge_auth"] and not str(portal["unmunge"] or "").startswith("/"):
        raise PortalConfigError(f"portal.unmunge must be an absolute path, not {portal['unmunge']!r}")


def _password_login(portal: dict[str, Any]) -> bool:
    configured = portal.get("password_login")
    if configured is None or configured == "":
        return bool(portal["auth"] == "local")
    return _truthy(configured)


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def networks(configured: Any, setting: str) -> list[Network]:
    """A list of networks (or one string of them, comma-separated, as the environment
    gives it); a bare address is a network of one."""
    if configured is None:
        return []
    items: Iterable[Any] = configured.split(",") if isinstance(configured, str) else configured
    found = []
    for item in items:
        if isinstance(item, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
            found.append(item)
            continue
        text = str(item).strip()
        if not text:
            continue
        try:
            found.append(ipaddress.ip_network(text, strict=False))
        except ValueError as error:
            raise PortalConfigError(f"{setting}: {error}") from None
    return found


def portal_settings(app: Flask) -> dict[str, Any]:
    return app.config["GPUCREDIT"]["portal"]


def _cookie_secure(portal: dict[str, Any]) -> bool:
    if portal.get("cookie_secure") is not None:
        return _truthy(portal["cookie_secure"])
    url = portal.get("url") or ""
    if url.startswith("https://"):
        return True
    try:
        return not ipaddress.ip_address(str(portal.get("host", "127.0.0.1"))).is_loopback
    except ValueError:
        return portal.get("host") != "localhost"


def default_secret_key_file(database_url: str) -> Path | None:
    """Where the session key is kept when `portal.secret_key_file` is not set: beside an
    embedded database; else in the unit's state directory (systemd's StateDirectory=
    sets $STATE_DIRECTORY: /var/lib/gpucredit), else /var/lib/gpucredit. None for an
    in-memory database, whose portal lasts as long as its process anyway."""
    if database_url.startswith("sqlite:"):
        path = database_url.removeprefix("sqlite:///")
        if path in ("", ":memory:") or database_url in ("sqlite://", "sqlite:///:memory:"):
            return None
        return Path(path).parent / "portal-secret-key"
    state = (os.environ.get("STATE_DIRECTORY") or "").split(":")[0]
    return Path(state or "/var/lib/gpucredit") / "portal-secret-key"


def _secret_key(portal: dict[str, Any], database_url: str) -> str:
    """The key that signs session cookies, kept in a file so that a restart logs no one
    out: read, or created (0600) on first start. Never a throwaway key in silence: a
    portal that can neither read nor create its key file does not start, and says where."""
    configured = portal.get("secret_key_file")
    key_path = Path(configured) if configured else default_secret_key_file(database_url)
    if key_path is None:
        return secrets.token_hex(32)
    try:
        return private_file_text(key_path, "portal.secret_key_file")
    except (FileNotFoundError, NotADirectoryError):
        pass
    except PermissionError as error:
        raise PortalConfigError(
            f"portal.secret_key_file {key_path} cannot be read by this user ({error.strerror}): "
            "chown it to the portal's user, or set portal.secret_key_file to a file it may read"
        ) from None
    key = secrets.token_hex(32)
    try:
        try:
            key_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError as error:  # another worker wrote it first, or a file is in the way
            if error.filename != str(key_path):
                raise
            return private_file_text(key_path, "portal.secret_key_file")
    except OSError as error:
        raise PortalConfigError(
            f"portal.secret_key_file {key_path} does not exist and cannot be created "
            f"({error.strerror}); without a kept key every restart would log everyone out: "
            "set portal.secret_key_file to a file the portal may write (its unit's StateDirectory, "
            f"/var/lib/gpucredit), or create it: openssl rand -hex 32 > {key_path}; "
            f"chown gpucredit {key_path}; chmod 0600 {key_path}"
        ) from None
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key


def private_file_text(path: Path, setting: str) -> str:
    """The secret in `path`, stripped; PortalConfigError when another user could have
    written it or can read it (whoever can forges sessions or the proxy's word), or when
    it is too short to be a secret. FileNotFoundError when it does not exist.

    The checks are made on the open file itself (fstat), so the file read is the file
    checked. Allowed: owned by this process's user or root, not writable by group or
    others, not readable by others (group-readable, root:gpucredit 0640, is fine).
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "r") as handle:
        info = os.fstat(handle.fileno())
        problem = _private_file_problem(info)
        if problem is not None:
            raise PortalConfigError(f"{setting} {path} {problem}; the portal will not use it")
        text = handle.read().strip()
    if len(text) < MIN_SECRET_CHARS:
        raise PortalConfigError(
            f"{setting} {path} holds {len(text)} characters, fewer than the {MIN_SECRET_CHARS} "
            "a secret needs (openssl rand -hex 32 > FILE)"
        )
    return text


def _private_file_problem(info: os.stat_result) -> str | None:
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid not in (os.geteuid(), 0):
        return f"is owned by uid {info.st_uid}, neither this process's user (uid {os.geteuid()}) nor root"
    if mode & 0o022:
        return f"is writable by {'others' if mode & 0o002 else 'its group'} (mode {mode:04o}): chmod go-w it"
    if mode & 0o004:
        return f"is readable by every user (mode {mode:04o}): chmod o-r it"
    return None
