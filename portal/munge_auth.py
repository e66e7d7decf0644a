"""MUNGE authentication for the API: a user on a login node sends
`Authorization: MUNGE <credential>` and needs no token (gpucredit/job_cli.py makes it).

Off unless `portal.munge_auth = true`. What it trusts: the portal host's munged, and the
key it shares with the cluster. Whoever can get a credential from a munged with that key
(any process on any node, as its own uid) is that uid to the portal; root on any node
can encode a credential as any uid, so root on every node is trusted as every user,
as Slurm itself trusts it.

A credential is accepted when, in this order:

    unmunge decodes it (the cluster's key; munged   else 401: munged's words (invalid,
    checks its TTL and its own replay cache)             expired, rewound, replayed)
    its uid is not 0                                     else 401: root is no portal user
    it carries this request (ledger.access.credentials:  else 401: made for another request
    nonce, method, path and query, the body's SHA-256)
    the uid has a passwd entry on the portal host        else 401: no such user
    it was never spent before (api.spend_credential:     else 401: replayed
    the database every worker shares, kept until it
    expires, so a restart or another host forgets nothing)

and the request is that user's with role "user", as a user token is: their own
accounts, and their own jobs where they are a member. An admin's uid is a user here
too: admin work is done with an admin token, or on the controller with the database.

unmunge runs as an argv list with a timeout (UNMUNGE_TIMEOUT_SECONDS); its output is
read by one parser, `parse_unmunge`.
"""

from __future__ import annotations

import hashlib
import logging
import pwd
import re
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ledger import api
from ledger.timeutil import utcnow
from portal.store import transaction

log = logging.getLogger("gpucredit.portal.munge_auth")

SCHEME = "MUNGE"
UNMUNGE_TIMEOUT_SECONDS = 5.0
MAX_CREDENTIAL_CHARS = 4096  # a credential with a request of ~200 bytes is ~400
# A spent credential is kept this long past its expiry: another portal host's munged,
# with a clock behind this one's, would still take it until then.
CLOCK_SKEW_SECONDS = 300
_CREDENTIAL = re.compile(r"MUNGE:[A-Za-z0-9+/]+={0,2}:")
# munge.h's munge_err_t, for the refusals unmunge reports by its status alone.
_STATUS_WORDS = {15: "Expired credential", 16: "Rewound credential", 17: "Replayed credential"}
_REPLAYED = 17
_CREDENTIAL_ERRORS = range(8, 19)  # EMUNGE_BAD_CRED .. EMUNGE_CRED_UNAUTHORIZED: the credential's fault
_REQUIRED = ("STATUS", "UID", "GID", "ENCODE_TIME", "TTL")


class MungeRefused(Exception):
    """A credential the portal does not accept; the message says why, for the user."""


@dataclass(frozen=True)
class Unmunged:
    """What `unmunge --numeric` said of a credential."""

    status: int
    uid: int
    gid: int
    encode_time: int  # seconds since the epoch, by the encoding host's clock
    ttl_seconds: int
    payload: bytes


def parse_unmunge(output: bytes) -> Unmunged:
    """`unmunge --numeric`'s stdout: KEY: VALUE lines, a blank line, the payload.
    ValueError when a field it needs is missing or not a number."""
    head, _blank, payload = output.partition(b"\n\n")
    fields: dict[str, str] = {}
    for line in head.decode("ascii", errors="replace").splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields[key.strip()] = value.strip()
    missing = [key for key in _REQUIRED if not fields.get(key, "").lstrip("-").isdigit()]
    if missing:
        raise ValueError(f"unmunge's output has no number for {', '.join(missing)}")
    numbers = {key: int(fields[key]) for key in _REQUIRED}
    return Unmunged(
        numbers["STATUS"], numbers["UID"], numbers["GID"], numbers["ENCODE_TIME"], numbers["TTL"], payload
    )


def unmunge(credential: str, *, program: str, socket: str | None) -> Unmunged:
    """The decoded credential; MungeRefused for one munged refuses (or cannot check)."""
    argv = [program, "--numeric", *([f"--socket={socket}"] if socket else [])]
    try:
        done = subprocess.run(
            argv,
            input=credential.encode("ascii"),
            capture_output=True,
            timeout=UNMUNGE_TIMEOUT_SECONDS,
            check=False,
            shell=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        log.error("cannot run %s: %s", argv, error)
        raise MungeRefused(
            "the portal cannot check MUNGE credentials now (unmunge failed); try again"
        ) from None
    said = done.stderr.decode(errors="replace").strip()
    if done.returncode == 0:
        try:
            return parse_unmunge(done.stdout)
        except ValueError as error:
            log.error("%s: %s; stdout %r", argv, error, done.stdout[:500])
            raise MungeRefused("the portal cannot read unmunge's answer; ask an admin") from None
    if done.returncode not in _CREDENTIAL_ERRORS:  # munged down, its socket: the portal's problem
        log.error("%s exited %d: %s", argv, done.returncode, said)
        raise MungeRefused("the portal cannot check MUNGE credentials now (munged did not answer); try again")
    words = said.removeprefix("unmunge: Error: ") or _STATUS_WORDS.get(done.returncode, "Invalid credential")
    if done.returncode == _REPLAYED:
        raise MungeRefused(_replayed())
    raise MungeRefused(f"MUNGE credential refused: {words}")


def _replayed() -> str:
    return "MUNGE credential refused: it was used before (replayed); make a new one for each request"


def authenticate(credential: str, request: dict[str, Any], settings: dict[str, Any]) -> str:
    """The Unix user name `credential` proves for this request, or MungeRefused.

    `request`: "method", "target" (path under the portal's root, and ?query) and "body"
    (bytes), as received. `settings`: the portal's (unmunge, munge_socket)."""
    credential = credential.strip()
    if len(credential) > MAX_CREDENTIAL_CHARS or not _CREDENTIAL.fullmatch(credential):
        raise MungeRefused("not a MUNGE credential (Authorization: MUNGE MUNGE:...:)")
    decoded = unmunge(credential, program=str(settings["unmunge"]), socket=settings.get("munge_socket"))
    if decoded.uid == 0:
        raise MungeRefused("a MUNGE credential of root (uid 0) is not accepted: run as your own user")
    bound = api.read_request_payload(decoded.payload)
    if bound is None:
        raise MungeRefused("the MUNGE credential carries no gpucredit request (make it with gpucredit)")
    expected = api.request_payload(bound.nonce, request["method"], request["target"], request["body"])
    if decoded.payload != expected and (bound.method, bound.target) == (request["method"], request["target"]):
        raise MungeRefused(f"the MUNGE credential was made for another body of {bound.method} {bound.target}")
    if decoded.payload != expected:
        raise MungeRefused(
            f"the MUNGE credential was made for another request ({bound.method} {bound.target}), "
            f"not {request['method']} {request['target']}"
        )
    try:
        name = pwd.getpwuid(decoded.uid).pw_name
    except KeyError:
        raise MungeRefused(f"uid {decoded.uid} has no passwd entry on the portal host") from None
    if not spend(decoded):
        raise MungeRefused(_replayed())
    return name


def spend(decoded: Unmunged) -> bool:
    """Remember the credential until it has expired; False when it was spent before."""
    now = utcnow()
    expires = datetime.fromtimestamp(decoded.encode_time + max(decoded.ttl_seconds, 0), UTC)
    keep_until = max(expires, now) + timedelta(seconds=CLOCK_SKEW_SECONDS)
    with transaction() as s:
        return api.spend_credential(s, hashlib.sha256(decoded.payload).hexdigest(), keep_until, now)
