"""Holds (one job run's reservation) and quotes: what the hooks and the bridge call.

A service or admin token reserves, charges, settles and releases; a user token reads
the holds of its accounts and quotes a job before submitting it.
"""

from __future__ import annotations

from typing import Any

from ledger import api
from ledger.errors import NotFound
from portal.api.access import duration_of, time_of, visible
from portal.api.paging import by_id
from portal.api.registry import Call, body_schema, endpoint
from portal.api.schemas import GPUS, HOLD_STATE, MAX_ID, NAME, SECONDS, TIME, ref
from portal.auth import accounts_of, own_user
from portal.store import transaction

SERVICES = ("service", "admin")
EVERYONE = ("user", "admin", "service")
SLURM_TIME = r"^([0-9]{1,3}-)?([0-9]{1,4}:)?[0-9]{1,4}:[0-9]{1,2}$|^[0-9]{1,8}$"
CLUSTER = {"type": "string", "pattern": r"^[A-Za-z0-9_.\-]{1,64}$"}

RESERVE = body_schema(
    ["account", "user", "job_id", "gpus", "seconds"],
    {
        "account": NAME,
        "user": NAME,
        "job_id": {"type": "integer", "minimum": 1, "maximum": 2**53 - 1},
        "gpus": GPUS,
        "seconds": {**SECONDS, "minimum": 1, "description": "the job's time limit"},
        "cluster": CLUSTER,
        "run": {"type": "integer", "minimum": 0, "maximum": MAX_ID, "description": "SLURM_JOB_RESTART_COUNT"},
        "partition": NAME,
        "at": TIME,
    },
)
RESERVE["example"] = {
    "account": "physics",
    "user": "alice",
    "job_id": 1001,
    "gpus": "h100:2",
    "seconds": 7200,
}
ELAPSED = body_schema(["elapsed"], {"elapsed": {**SECONDS, "description": "seconds run so far"}, "at": TIME})
RELEASE = body_schema([], {"at": TIME})
QUOTE = body_schema(
    ["account", "gpus", "time"],
    {
        "account": NAME,
        "gpus": GPUS,
        "time": {
            "anyOf": [
                SECONDS,
                {"type": "string", "pattern": SLURM_TIME},
            ],
            "description": "the time limit: [D-]HH:MM:SS or seconds",
        },
        "partition": NAME,
    },
)
QUOTE["example"] = {"account": "physics", "gpus": "h100:2", "time": "02:00:00"}


@endpoint(
    "POST",
    "/holds",
    tag="holds",
    summary="Reserve credit for a job run",
    roles=SERVICES,
    body=RESERVE,
    idempotency="optional",
    errors=(402, 404),
    responses={201: ref("Hold")},
)
def reserve(call: Call) -> Any:
    """Take the hold for one run of a job: its GPUs at today's prices times its time
    limit, earmarked from credit in burn order. Refused with 402 `insufficient_credits`
    or 429 `concurrent_gpus` / `spend_rate` / `daily_cap`, naming the value and the cap.
    A repeat for the same run returns the same hold."""
    body = call.body
    at = time_of(body, "at")
    with transaction() as s:
        request = api.HoldRequest(
            body["account"],
            user=body["user"],
            job_id=body["job_id"],
            gpus=body["gpus"],
            seconds=body["seconds"],
            cluster=body.get("cluster", "default"),
            run=body.get("run", 0),
            partition=body.get("partition"),
            at=at,
        )
        hold = api.keyed.create_hold(s, request, idempotency_key=call.idempotency_key)
    return hold, 201


@endpoint(
    "POST",
    "/holds/{hold_id}/usage",
    tag="holds",
    summary="Charge a running job provisionally",
    roles=SERVICES,
    body=ELAPSED,
    idempotency="optional",
    responses={200: ref("Hold")},
)
def charge_usage(call: Call, hold_id: int) -> Any:
    """Charge the hold for `elapsed` seconds run so far (cumulative: a repeat charges
    nothing more)."""
    at = time_of(call.body, "at")
    with transaction() as s:
        return api.keyed.hold_usage(
            s, hold_id, call.body["elapsed"], at=at, idempotency_key=call.idempotency_key
        )


@endpoint(
    "POST",
    "/holds/{hold_id}/settle",
    tag="holds",
    summary="Settle a finished job",
    roles=SERVICES,
    body=ELAPSED,
    idempotency="optional",
    responses={200: ref("Hold")},
)
def settle(call: Call, hold_id: int) -> Any:
    """The final charge for `elapsed` seconds; the rest of the hold returns. A hold
    resolves once: another resolution is a 409 `hold_resolved`."""
    at = time_of(call.body, "at")
    with transaction() as s:
        return api.keyed.settle_hold(
            s, hold_id, call.body["elapsed"], at=at, idempotency_key=call.idempotency_key
        )


@endpoint(
    "POST",
    "/holds/{hold_id}/release",
    tag="holds",
    summary="Release a hold",
    roles=SERVICES,
    body=RELEASE,
    idempotency="optional",
    responses={200: ref("Hold")},
)
def release(call: Call, hold_id: int) -> Any:
    """Return what the hold did not charge (a job that never ran, or was cancelled)."""
    at = time_of(call.body, "at")
    with transaction() as s:
        return api.keyed.release_hold(s, hold_id, at=at, idempotency_key=call.idempotency_key)


@endpoint(
    "GET",
    "/holds/{hold_id}",
    tag="holds",
    summary="Read a hold",
    roles=EVERYONE,
    responses={200: ref("Hold")},
)
def show_hold(call: Call, hold_id: int) -> Any:
    """One hold; a user token reads the holds of its accounts only, a member's only the
    member's own."""
    who = call.principal
    with transaction() as s:
        hold = api.get_hold(s, hold_id)
        role = "service" if who.is_service else accounts_of(s, who).get(hold.account)
        if role is None or own_user(role, who) not in (None, hold.user):
            raise NotFound(f"hold {hold_id} does not exist", details={"hold_id": hold_id})
        return hold.as_dict()


@endpoint(
    "GET",
    "/holds",
    tag="holds",
    summary="List holds",
    roles=EVERYONE,
    query={"account": NAME, "state": HOLD_STATE},
    paginated=True,
    errors=(404,),
    responses={200: ref("HoldPage")},
)
def list_holds(call: Call) -> Any:
    """Holds newest first, of one account or of every account the token may see: a
    member's own in accounts where the token's user is a member, every hold in those
    they manage."""
    who = call.principal
    account = call.query.get("account")
    with transaction() as s:
        if account is not None:
            roles = {account: visible(s, who, account)}
        else:
            roles = {} if who.is_service or who.is_admin else accounts_of(s, who)
        everyone = [name for name, role in roles.items() if own_user(role, who) is None]
        own = [name for name, role in roles.items() if own_user(role, who) is not None]
        unlimited = account is None and (who.is_service or who.is_admin)
        holds = api.holds_page(
            s,
            accounts=None if unlimited else everyone,
            own=(who.user, own) if own else None,
            state=call.query.get("state"),
            before_id=call.page.cursor,
            limit=call.page.limit + 1,
        )
    return by_id(holds, call.page, lambda hold: hold.id, lambda hold: hold.as_dict())


@endpoint(
    "POST",
    "/quotes",
    tag="holds",
    summary="Quote a job",
    roles=EVERYONE,
    body=QUOTE,
    errors=(404,),
    responses={200: ref("Quote")},
)
def quote(call: Call) -> Any:
    """What a job spec costs at today's prices and whether the account can afford it
    now; reserves nothing."""
    body = call.body
    seconds = duration_of(body["time"], "time")
    with transaction() as s:
        visible(s, call.principal, body["account"])
        return api.quote(s, body["account"], body["gpus"], seconds, partition=body.get("partition"))
