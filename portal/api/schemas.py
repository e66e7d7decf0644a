"""The shapes the API takes and returns: OpenAPI components, checked on every request
(`portal.api.checks`) and on every response by tests/portal/test_portal_api_schema.py.

Credits are decimal strings, never numbers; times are ISO 8601 UTC strings.
"""

from __future__ import annotations

from typing import Any

from ledger import api

Schema = dict[str, Any]

MAX_ID = 2**31 - 1  # ids are 32-bit integers on PostgreSQL


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


def obj(required: list[str], properties: dict[str, Schema], *, closed: bool = False) -> Schema:
    """An object schema; `closed` (request bodies) refuses fields it does not name."""
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if closed:
        schema["additionalProperties"] = False
    return schema


def page_of(item: str) -> Schema:
    return obj(
        ["items", "next_cursor"],
        {
            "items": {"type": "array", "items": ref(item)},
            "next_cursor": nullable({"type": "string", "description": "pass as ?cursor= for the next page"}),
        },
    )


# -- values ------------------------------------------------------------------------------

CREDITS_IN: Schema = {
    "type": "string",
    "pattern": r"^[0-9]{1,13}(\.[0-9]{1,6})?$",
    "description": "decimal credits, up to 6 decimals",
    "example": "100.00",
}
CREDITS: Schema = {"type": "string", "pattern": r"^-?[0-9]+\.[0-9]{2,6}$", "example": "14.40"}
TIME: Schema = {"type": "string", "format": "date-time", "example": "2026-12-02T10:00:00Z"}
NAME: Schema = {"type": "string", "pattern": r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$", "maxLength": 128}
GRES: Schema = {"type": "string", "pattern": r"^[A-Za-z0-9_.\-]{1,64}$"}
GPUS: Schema = {
    "type": "string",
    "pattern": r"^[A-Za-z0-9_.\-]{1,64}:[0-9]{1,6}(,[A-Za-z0-9_.\-]{1,64}:[0-9]{1,6}){0,15}$",
    "description": "GPU types and counts, like h100:2,a100:1",
    "example": "h100:2",
}
TEXT: Schema = {"type": "string", "pattern": r"^[^\x00-\x1f\x7f]*$", "maxLength": 256}
SECONDS: Schema = {"type": "integer", "minimum": 0, "maximum": 366 * 24 * 3600}
ID: Schema = {"type": "integer", "minimum": 1, "maximum": MAX_ID}
HOLD_STATE: Schema = {"type": "string", "enum": list(api.HoldStatus.ALL)}

COMPONENTS: dict[str, Schema] = {
    "Error": obj(
        ["error"],
        {
            "error": obj(
                ["code", "message", "details"],
                {
                    "code": {"type": "string", "example": "insufficient_credits"},
                    "message": {"type": "string"},
                    "details": {"type": "object"},
                },
            )
        },
    ),
    "Grant": obj(
        ["id", "amount", "remaining", "effective_at", "expires_at", "priority"],
        {
            "id": {"type": "integer"},
            "source": {"type": "string", "example": "topup"},
            "amount": CREDITS,
            "remaining": CREDITS,
            "effective_at": TIME,
            "expires_at": nullable(TIME),
            "priority": {"type": "integer"},
            "reference": nullable({"type": "string"}),
        },
    ),
    "Balance": obj(
        ["account", "at", "available", "held", "grants"],
        {
            "account": {"type": "string"},
            "at": TIME,
            "available": CREDITS,
            "held": CREDITS,
            "debt": CREDITS,
            "grants": {"type": "array", "items": ref("Grant")},
        },
    ),
    "Transfer": obj(
        ["from", "to", "amount", "at", "expires_at", "taken", "grant", "debt_paid", "entries"],
        {
            "from": {"type": "string"},
            "to": {"type": "string"},
            "amount": CREDITS,
            "at": TIME,
            "expires_at": nullable(TIME),
            "taken": {
                "type": "array",
                "items": obj(["grant_id", "amount"], {"grant_id": {"type": "integer"}, "amount": CREDITS}),
                "description": "what each of FROM's grants gave, in its burn order",
            },
            "grant": ref("Grant"),
            "debt_paid": CREDITS,
            "entries": {"type": "array", "items": {"type": "integer"}, "description": "FROM's and TO's"},
        },
    ),
    "GrantCreated": obj(
        ["grant", "entry_id", "debt_paid"],
        {"grant": ref("Grant"), "entry_id": {"type": "integer"}, "debt_paid": CREDITS},
    ),
    "Payment": obj(
        ["id", "account", "amount", "provider", "state"],
        {
            "id": {"type": "integer"},
            "account": {"type": "string"},
            "amount": CREDITS,
            "provider": {"type": "string"},
            "external_id": nullable({"type": "string"}),
            "state": {"type": "string", "enum": ["pending", "paid", "cancelled"]},
            "requested_by": {"type": "string"},
            "created_at": TIME,
            "resolved_at": nullable(TIME),
            "grant_id": nullable({"type": "integer"}),
        },
    ),
    "PurchaseStarted": obj(
        ["payment", "checkout_url"],
        {
            "payment": ref("Payment"),
            "checkout_url": nullable({"type": "string", "description": "where to pay; null for an invoice"}),
        },
    ),
    "Consumption": obj(
        ["account", "charged", "entry_id", "at"],
        {"account": {"type": "string"}, "charged": CREDITS, "entry_id": {"type": "integer"}, "at": TIME},
    ),
    "Hold": obj(
        ["id", "account", "user", "cluster", "job_id", "run", "state", "amount", "charged", "expires_at"],
        {
            "id": {"type": "integer"},
            "account": {"type": "string"},
            "user": {"type": "string"},
            "cluster": {"type": "string"},
            "job_id": {"type": "integer"},
            "run": {"type": "integer"},
            "state": HOLD_STATE,
            "amount": CREDITS,
            "charged": CREDITS,
            "expires_at": TIME,
            "submitted_at": nullable(TIME),
            "gpus": {"type": "string"},
            "partition": nullable({"type": "string"}),
            "rate": {"type": "string", "description": "credits per second"},
            "started_at": TIME,
            "charged_seconds": {"type": "integer"},
            "resolved_at": nullable(TIME),
        },
    ),
    "Quote": obj(
        ["account", "gpus", "seconds", "cost", "rate", "prices", "available", "affordable", "at"],
        {
            "account": {"type": "string"},
            "gpus": {"type": "string"},
            "seconds": {"type": "integer"},
            "partition": nullable({"type": "string"}),
            "tasks": {"type": "integer"},
            "cost": CREDITS,
            "cost_per_task": CREDITS,
            "rate": {"type": "string", "description": "credits per second"},
            "prices": {"type": "object", "additionalProperties": CREDITS},
            "available": CREDITS,
            "affordable": {"type": "boolean"},
            "at": TIME,
        },
    ),
    "Price": obj(
        ["gres", "partition", "credits_per_gpu_hour", "effective_at"],
        {
            "gres": {"type": "string"},
            "partition": nullable({"type": "string"}),
            "credits_per_gpu_hour": CREDITS,
            "effective_at": TIME,
            "unchanged": {
                "type": "boolean",
                "description": "set: true when this price was in force then already: no version added",
            },
        },
    ),
    "Posting": obj(
        ["account", "grant_id", "bucket", "amount"],
        {
            "account": {"type": "string"},
            "grant_id": nullable({"type": "integer"}),
            "bucket": {"type": "string", "enum": ["available", "held", "debt", "system"]},
            "amount": CREDITS,
        },
    ),
    "Entry": obj(
        ["id", "seq", "kind", "effective_at", "recorded_at", "postings", "hash"],
        {
            "id": {"type": "integer"},
            "seq": {"type": "integer"},
            "kind": {"type": "string"},
            "effective_at": TIME,
            "recorded_at": TIME,
            "user": nullable({"type": "string"}),
            "hold_id": nullable({"type": "integer"}),
            "links_entry_id": nullable({"type": "integer"}),
            "memo": {"type": "object"},
            "postings": {"type": "array", "items": ref("Posting")},
            "hash": {"type": "string"},
        },
    ),
    "AccountRole": obj(
        ["account", "role"],
        {"account": {"type": "string"}, "role": {"type": "string", "enum": ["member", "manager", "admin"]}},
    ),
    "UsageRow": obj(
        ["charged", "gpu_seconds", "jobs"],
        {
            "day": {"type": "string"},
            "gres": {"type": "string"},
            "user": {"type": "string"},
            "partition": {"type": "string"},
            "account": {"type": "string"},
            "charged": CREDITS,
            "gpu_seconds": {"type": "integer"},
            "jobs": {"type": "integer"},
        },
    ),
    "TreeRow": obj(
        ["account", "parent", "depth", "available", "held"],
        {
            "account": {"type": "string"},
            "parent": nullable({"type": "string"}),
            "depth": {"type": "integer", "description": "0: the account asked for"},
            "available": CREDITS,
            "held": CREDITS,
        },
    ),
    "Tree": obj(["items"], {"items": {"type": "array", "items": ref("TreeRow")}}),
    "HoldPage": page_of("Hold"),
    "EntryPage": page_of("Entry"),
    "PricePage": page_of("Price"),
    "AccountPage": page_of("AccountRole"),
    "UsagePage": page_of("UsageRow"),
}
