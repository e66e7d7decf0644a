"""Prices, the Open OnDemand balance document, and this API's own OpenAPI document."""

from __future__ import annotations

from typing import Any

from flask import current_app

from ledger import api
from portal.api.access import time_of
from portal.api.paging import by_position
from portal.api.registry import Call, body_schema, endpoint, openapi_document
from portal.api.schemas import CREDITS_IN, NAME, TIME, obj, ref
from portal.store import transaction

PRICE = body_schema(
    ["credits_per_gpu_hour"],
    {"credits_per_gpu_hour": CREDITS_IN, "partition": NAME, "effective_at": TIME},
)
PRICE["example"] = {"credits_per_gpu_hour": "3.60"}
OOD_DOCUMENT = obj(
    ["version", "timestamp", "config", "balances"],
    {
        "version": {"type": "integer", "enum": [1]},
        "timestamp": {"type": "integer", "description": "seconds since the epoch"},
        "config": {"type": "object"},
        "balances": {
            "type": "array",
            "items": obj(
                ["user", "project", "value"],
                {"user": {"type": "string"}, "project": {"type": "string"}, "value": {"type": "integer"}},
            ),
        },
    },
)


@endpoint(
    "GET",
    "/prices",
    tag="prices",
    summary="List prices",
    roles=("user", "admin", "service"),
    paginated=True,
    responses={200: ref("PricePage")},
)
def list_prices(call: Call) -> Any:
    """Every price version, by GPU type (the general price before partitions' own),
    then by the time it takes effect."""
    with transaction() as s:
        prices = api.list_prices(s)
    return by_position(prices, call.page)


@endpoint(
    "PUT",
    "/prices/{gres}",
    tag="prices",
    summary="Set a price",
    roles=("admin",),
    body=PRICE,
    idempotency="optional",
    responses={201: ref("Price")},
)
def set_price(call: Call, gres: str) -> Any:
    """A new price version for a GPU type (optionally one partition's), effective at
    `effective_at` (default now). Prices are append-only: the latest version effective
    at a time wins, and earlier holds keep the price they were taken at."""
    body = call.body
    effective_at = time_of(body, "effective_at")
    with transaction() as s:
        price = api.set_price(
            s,
            gres,
            body["credits_per_gpu_hour"],
            partition=body.get("partition"),
            effective_at=effective_at,
            idempotency_key=call.idempotency_key,
        )
    return price, 201


@endpoint(
    "GET",
    "/ood/balance.json",
    tag="reports",
    summary="Read the Open OnDemand balance document",
    roles=("user", "admin"),
    responses={200: OOD_DOCUMENT},
)
def ood_balance(call: Call) -> Any:
    """OnDemand's "version 1" balance format (OOD_BALANCE_PATH may name this URL): each
    member's available credit per account, in whole credits. A user token gets its
    own rows, an admin token every user's."""
    from portal.ood import ood_document  # the ops area owns the format

    who = call.principal
    with transaction() as s:
        return ood_document(s, user=None if who.is_admin else who.user)


@endpoint(
    "GET",
    "/openapi.json",
    tag="meta",
    summary="Read this OpenAPI document",
    roles=(),
    responses={200: {"type": "object"}},
)
def openapi(call: Call) -> Any:
    """Generated from the routes themselves, so it cannot drift from them."""
    return openapi_document(current_app)
