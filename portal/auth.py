"""Who is asking, and what they may see.

Three ways in, one `Principal`:
- a browser session after a password login (argon2 hash in `portal_users`), while
  `portal.password_login` allows them (always with auth = "local"; with auth =
  "header" only when set). A session carries its login's session generation, and
  logout or a new password moves the generation on: a cookie copied before then is
  worth nothing (the cookie alone is only signed, so it needs this state to end);
- single sign-on: a reverse proxy (Open OnDemand, mod_auth_openidc) puts the user
  name in `portal.sso_header`; it is honoured only on a request that is the proxy's
  (portal.proxy: from one of `portal.trusted_proxies` AND carrying the secret the
  proxy shares with the portal), so no other process, on any host, can claim a name;
- an API token, `Authorization: Bearer gpc_...` (stored hashed, with a role and an
  expiry; `gpucredit token create`);
- on the API only, when `portal.munge_auth` is on: a MUNGE credential,
  `Authorization: MUNGE ...`, made by the cluster's munged for one request; the uid it
  names is the user, with role "user" (portal/munge_auth.py says what it trusts).

Roles: a user sees the accounts they are a member of, and manages those where they
are `manager` (a PI); an admin sees and manages everything; a service token (hooks,
bridge) may reserve, charge and settle holds and quote, and reads no one's reports.
An account the principal may not see answers exactly like one that does not exist.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlsplit

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from flask import (
    Blueprint,
    Flask,
    abort,
    flash,
    g,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from sqlalchemy.orm import Session

from ledger import api
from ledger.errors import LedgerError, NotFound
from portal import munge_auth
from portal.proxy import client_address, from_proxy
from portal.security import (
    check_password_slot,
    failed_login,
    limiter,
    login_address_key,
    login_address_limit,
    login_key,
    login_limit,
)
from portal.settings import portal_settings
from portal.store import transaction

log = logging.getLogger("gpucredit.portal.auth")
F = TypeVar("F", bound=Callable[..., Any])
bp = Blueprint("auth", __name__)
hasher = PasswordHasher()
# Verified when a login names no known user, so that case costs the same time.
_DUMMY_HASH = hasher.hash("gpucredit: no such user")


class Forbidden(LedgerError):
    """The principal may see this account but not do this to it."""

    code = "forbidden"
    http_status = 403


class Unauthenticated(LedgerError):
    code = "unauthenticated"
    http_status = 401


@dataclass(frozen=True)
class Principal:
    user: str
    role: str  # "user" | "admin" | "service"
    via: str  # "session" | "header" | "token" | "munge"
    token_id: int | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def is_service(self) -> bool:
        return self.role == "service"

    @property
    def rate_key(self) -> str:
        """Who a rate limit counts: the token, else the user."""
        return f"token:{self.token_id}" if self.token_id is not None else f"user:{self.user}"


def init_app(app: Flask) -> None:
    app.register_blueprint(bp)
    app.before_request(_load_principal)
    app.context_processor(lambda: {"principal": g.get("principal")})


def hash_password(password: str) -> str:
    return hasher.hash(password)


# --- who is asking ---------------------------------------------------------------


def _load_principal() -> None:
    g.principal = None
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        with transaction() as s:
            token = api.authenticate_token(s, header.removeprefix("Bearer ").strip())
        if token is not None:
            g.principal = Principal(token.user, token.role, "token", token.id)
        else:
            g.auth_error = "invalid, expired or revoked token"
        return
    settings = portal_settings_now()
    if header.startswith(f"{munge_auth.SCHEME} ") and request.path.startswith("/api/"):
        _munge_principal(header.removeprefix(f"{munge_auth.SCHEME} "), settings)
        return
    if settings["auth"] == "header":
        name = request.headers.get(settings["sso_header"], "").strip()
        if name and from_proxy():
            g.principal = _principal_for(name, "header")
            return
        if name:  # someone other than the proxy claims a name: refuse it, and say so in the log
            log.warning(
                "ignored %s from %s: not the configured proxy", settings["sso_header"], client_address()
            )
    if settings["password_login"]:
        g.principal = _session_principal()


def _munge_principal(credential: str, settings: dict[str, Any]) -> None:
    """The user a MUNGE credential proves for this request, or why not (g.auth_error)."""
    if not settings["munge_auth"]:
        g.auth_error = (
            "MUNGE authentication is not enabled on this portal (portal.munge_auth): "
            "send an API token, Authorization: Bearer gpc_..."
        )
        return
    query = request.query_string.decode("latin-1")
    bound = {
        "method": request.method,
        "target": request.path + (f"?{query}" if query else ""),
        "body": request.get_data(cache=True),
    }
    try:
        name = munge_auth.authenticate(credential, bound, settings)
    except munge_auth.MungeRefused as refusal:
        log.warning("refused a MUNGE credential from %s: %s", client_address(), refusal)
        g.auth_error = str(refusal)
        return
    g.principal = Principal(name, "user", "munge")


def portal_settings_now() -> dict[str, Any]:
    from flask import current_app

    return portal_settings(current_app)


def _principal_for(name: str, via: str) -> Principal:
    with transaction() as s:
        user = api.portal_user(s, name)
    return Principal(name, "admin" if user and user["is_admin"] else "user", via)


def _session_principal() -> Principal | None:
    """The session's user, while its login exists and the session is of its current
    generation (logout and a new password end every older one)."""
    name = session.get("user")
    if not name:
        return None
    with transaction() as s:
        user = api.portal_user(s, str(name))
    if (
        user is None
        or user["password_hash"] is None
        or session.get("generation") != user["session_generation"]
    ):
        session.pop("user", None)
        session.pop("generation", None)
        return None
    return Principal(str(name), "admin" if user["is_admin"] else "user", "session")


def current() -> Principal | None:
    return g.get("principal")


def principal() -> Principal:
    """The principal of this request; 401 (API) or a login redirect (pages) when none."""
    who = current()
    if who is None:
        raise Unauthenticated(g.get("auth_error") or "log in or send an API token")
    return who


def to_login() -> Any:
    """The login page, back to this page after (Werkzeug's full_path ends in a bare "?"
    when there is no query)."""
    here = request.path + (f"?{request.query_string.decode()}" if request.query_string else "")
    return redirect(url_for("auth.login", next=here))


def login_required(view: F) -> F:
    @wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if current() is None:
            return to_login()
        if current().is_service:  # type: ignore[union-attr]
            abort(403)
        return view(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


# --- what they may see -------------------------------------------------------------


def accounts_of(s: Session, who: Principal) -> dict[str, str]:
    """The accounts `who` may see, with their role there: admin, manager or member."""
    if who.is_admin:
        return {name: "admin" for name in api.account_names(s)}
    if who.is_service:
        return {}
    return api.roles_of(s, who.user)


def require_account(s: Session, who: Principal, account: str, *, manage: bool = False) -> str:
    """The principal's role in `account`, or NotFound as if it did not exist.

    `manage`: members, limits, invoices; only its managers and admins.
    """
    role = accounts_of(s, who).get(account)
    if role is None:
        raise NotFound(f"account {account} does not exist", details={"account": account})
    if manage and role == "member":
        raise Forbidden(
            f"only a manager of {account} may do this", details={"account": account, "role": role}
        )
    return role


def own_user(role: str, who: Principal) -> str | None:
    """Whose jobs and usage `who` sees in an account where their role is `role`: a
    member sees their own (None is everyone's: the account's managers, admins, and the
    service that reserves and settles them). The one rule for pages, CSV and the API;
    an account's balance and grants are everyone's in it."""
    return who.user if role == "member" else None


def require_admin(who: Principal) -> None:
    if not who.is_admin:
        raise Forbidden("only an admin may do this")


def require_service_or_admin(who: Principal) -> None:
    if not (who.is_service or who.is_admin):
        raise Forbidden("only a service or admin token may do this")


# --- login and logout -------------------------------------------------------------


@bp.route("/login", methods=["GET", "POST"])
@limiter.limit(login_address_limit, key_func=login_address_key, methods=["POST"], deduct_when=failed_login)
@limiter.limit(login_limit, key_func=login_key, methods=["POST"], deduct_when=failed_login)
def login() -> Any:
    settings = portal_settings_now()
    if not settings["password_login"]:  # single sign-on only: there is no form to post
        if request.method == "POST":
            abort(404)
        return render_template("login.html", settings=settings)
    if request.method == "POST":
        name = request.form.get("username", "").strip()
        password = request.form.get("password", "")
        generation = _check_password(name, password)
        if generation is not None:
            session.clear()
            session["user"] = name
            session["generation"] = generation
            session.permanent = True
            return redirect(_safe_next(request.args.get("next")))
        log.warning("failed login for %r from %s", name, client_address())
        flash("Wrong user name or password.", "error")
        return render_template("login.html", settings=settings), 401
    return render_template("login.html", settings=settings)


def _check_password(name: str, password: str) -> int | None:
    """The login's session generation when `password` is `name`'s, else None. One argon2
    check whether or not the name exists, so both cost the same time."""
    with transaction() as s:
        user = api.portal_user(s, name) if name else None
    stored = user["password_hash"] if user else None
    try:
        with check_password_slot():
            hasher.verify(stored or _DUMMY_HASH, password)
    except (VerificationError, InvalidHashError):
        return None
    if stored is None or user is None:
        return None
    if hasher.check_needs_rehash(stored):
        with transaction() as s:  # the same password, stronger: its sessions go on
            api.set_portal_user(s, name, password_hash=hasher.hash(password), end_sessions=False)
    return int(user["session_generation"])


def _safe_next(target: str | None) -> str:
    """Where to go after logging in: a path on this site, or home. Never an open
    redirect: the target is parsed, not prefix-matched, and refused whole if it holds
    a control character (browsers drop tabs and newlines from URLs, so "/\t/evil"
    would be "//evil", another host), a backslash (read as a slash), a scheme or a host."""
    home = url_for("pages.home") if "pages.home" in _endpoints() else "/"
    if not target or any(ord(c) < 0x20 or ord(c) == 0x7F for c in target) or "\\" in target:
        return home
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/") or parts.path.startswith("//"):
        return home
    return target


def _endpoints() -> set[str]:
    from flask import current_app

    return {rule.endpoint for rule in current_app.url_map.iter_rules()}


@bp.route("/logout", methods=["POST"])
def logout() -> Any:
    """End the session, and every other session of this login (their cookies may have
    been copied): the login's session generation moves on."""
    who = current()
    if who is not None and who.via == "session":
        with transaction() as s:
            api.end_portal_sessions(s, who.user)
    session.clear()
    return redirect(url_for("auth.login"))
