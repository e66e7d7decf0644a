"""Whether a request came through the site's reverse proxy, and from which client.

An address identifies a host, not a process: on the portal's own host (the documented
deployment: a TLS proxy on the same machine) and on an Open OnDemand proxy host, which
runs its users' processes, any local user can connect from the proxy's address and send
any header. So the proxy proves itself with a secret it adds to every request it
forwards, `PROXY_SECRET_HEADER`, which it sets itself and so overwrites whatever a
client sent under that name; the portal reads the secret from `portal.proxy_secret_file`
and compares in constant time. A request is the proxy's only when it comes from one of
`portal.trusted_proxies` AND carries the secret. Only then does the portal believe what
the proxy says: the signed-on user (`portal.sso_header`, auth = "header") and the
client's address (`X-Real-IP`, for the login limits).

A Unix socket only the proxy may open would do as well on one host, but not for a proxy
on another host, and waitress would then serve nothing else (health checks, the API's
service tokens) on TCP: the secret header works for both, with any proxy that can set a
header (nginx, Apache, OnDemand's).
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress

from flask import current_app, g, request

from portal.settings import portal_settings

__all__ = ["CLIENT_ADDRESS_HEADER", "PROXY_SECRET_HEADER", "client_address", "from_proxy"]

PROXY_SECRET_HEADER = "X-Gpucredit-Proxy-Secret"
# What the proxy says the client's address is (nginx: proxy_set_header X-Real-IP
# $remote_addr). Not X-Forwarded-For: waitress removes that before the portal sees it.
CLIENT_ADDRESS_HEADER = "X-Real-IP"


def _peer() -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        peer = ipaddress.ip_address(request.remote_addr or "")
    except ValueError:
        return None
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        return peer.ipv4_mapped
    return peer


def from_proxy() -> bool:
    """True when this request came from a trusted proxy that showed the shared secret."""
    cached = g.get("gpucredit_from_proxy")
    if cached is None:
        cached = g.gpucredit_from_proxy = _check_proxy()
    return bool(cached)


def _check_proxy() -> bool:
    settings = portal_settings(current_app)
    secret = settings.get("proxy_secret")
    if not secret:
        return False
    peer = _peer()
    if peer is None or not any(peer in network for network in settings["trusted_proxies"]):
        return False
    shown = request.headers.get(PROXY_SECRET_HEADER, "")
    return hmac.compare_digest(shown.encode("utf-8", "surrogateescape"), secret.encode())


def client_address() -> str:
    """The client's address: the proxy's word for it when the request is the proxy's,
    else the connection's peer (a client cannot choose it either way)."""
    cached = g.get("gpucredit_client_address")
    if cached is None:
        cached = str(_peer() or request.remote_addr or "unknown")
        said = request.headers.get(CLIENT_ADDRESS_HEADER, "").strip()
        # A proxy that sends none (or nonsense): its own address stands for every client.
        if said and from_proxy():
            with contextlib.suppress(ValueError):
                cached = str(ipaddress.ip_address(said))
        g.gpucredit_client_address = cached
    return str(cached)
