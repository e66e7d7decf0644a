"""One declaration per operation: the Flask route and its OpenAPI description.

`@endpoint(...)` registers the route and records the operation, so the document at
GET /api/v1/openapi.json is generated from the code and cannot drift from it: the
token roles an operation admits are enforced here, its query, Idempotency-Key and body are
checked against the schemas the document shows (`portal.api.checks`), and its
docstring is its description. A view receives a `Call` (who is asking and the checked
input) and the path's values.

Another area serves an operation under /api/v1 through the same decorator, on its own
blueprint (`blueprint=`, which must have no url_prefix): `roles=()` for one that takes
no token, `raw_body=True` to read the request body itself.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import wraps
from http import HTTPStatus
from typing import Any

from flask import Blueprint, Flask, current_app, request

from portal.api.checks import check, from_text, refuse
from portal.api.schemas import COMPONENTS, GRES, ID, MAX_ID, NAME, Schema, obj, ref
from portal.auth import Forbidden, Principal, Unauthenticated, principal
from portal.settings import portal_settings

API_PREFIX = "/api/v1"
MAX_PAGE = 500
bp = Blueprint("api", __name__)

# Path parameters by name: their schema, and the Flask converter that matches them.
PATH_PARAMETERS: dict[str, tuple[Schema, str]] = {
    "account": (NAME, "string"),
    "hold_id": (ID, f"int(min=1, max={MAX_ID})"),
    # any whole number: the view answers 404 outside Slurm's ids (a bounded converter made a
    # DELETE of an id out of its range a 405)
    "job_id": ({"type": "integer", "minimum": 1, "maximum": 4294967293}, "int"),
    "gres": (GRES, "string"),
}
IDEMPOTENCY_KEY: Schema = {"type": "string", "minLength": 1, "maxLength": 256}
PAGE_QUERY: dict[str, Schema] = {
    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "description": "default: page_size"},
    "cursor": {
        "type": "string",
        "pattern": r"^[0-9]{1,18}$",
        "description": "opaque: the next_cursor of the previous page",
    },
}
ERROR_CODES = {
    400: "Bad request.",
    401: "No valid bearer token (`unauthenticated`): missing, unknown, expired or revoked; or a MUNGE "
    "credential refused (expired, replayed, root, made for another request, or MUNGE off).",
    402: "Not enough credit (`insufficient_credits`); details say what was needed and what is available.",
    403: "The token's role may not do this (`forbidden`).",
    404: "No such account, hold or resource, or one this token may not see (`not_found`).",
    409: "`idempotency_conflict` (the key was used with another body), or the hold is resolved.",
    422: "Input the API cannot take (`invalid_input`, `invalid_amount`, `invalid_time`, ...), "
    "with details naming the field.",
    429: "A limit (`concurrent_gpus`, `spend_rate`, `daily_cap`) or the API rate limit (`rate_limited`).",
}

View = Callable[..., Any]


@dataclass(frozen=True)
class Page:
    """Which page of a list: at most `limit` items after `cursor` (None: the first)."""

    limit: int
    cursor: int | None


@dataclass(frozen=True)
class Call:
    """One request to an operation, checked: the principal (None where no token is
    taken), the query values as their schema's types, the JSON body, the key."""

    who: Principal | None
    query: dict[str, Any]
    body: dict[str, Any]
    idempotency_key: str | None
    page: Page

    @property
    def principal(self) -> Principal:
        if self.who is None:
            raise Unauthenticated("this operation takes no token")
        return self.who


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # under API_PREFIX, parameters as {name}
    operation_id: str
    tag: str
    summary: str
    description: str
    roles: tuple[str, ...]  # token roles admitted; () takes no token
    responses: Mapping[int, Schema]
    query: Mapping[str, Schema] = field(default_factory=dict)
    body: Schema | None = None
    raw_body: bool = False
    idempotency: str | None = None  # "optional" | "required"
    paginated: bool = False
    csv: bool = False
    errors: tuple[int, ...] = ()

    @property
    def rule(self) -> str:
        return API_PREFIX + _flask_rule(self.path)

    def statuses(self) -> list[int]:
        """Every error status this operation can answer."""
        found = set(self.errors) | {422}  # an unknown query parameter, at least
        if self.roles:
            found |= {401, 403, 429}
        if self.idempotency:
            found.add(409)
        if any(name in self.path for name in ("{hold_id}", "{account}", "{job_id}")):
            found.add(404)
        return sorted(found)

    def as_openapi(self) -> Schema:
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": PATH_PARAMETERS[name][0]}
            for name in _path_names(self.path)
        ]
        parameters += [{"name": n, "in": "query", "schema": s} for n, s in self.query_parameters().items()]
        if self.idempotency:
            parameters.append(
                {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": self.idempotency == "required",
                    "schema": IDEMPOTENCY_KEY,
                    "description": "a repeat with the same key and body returns the first result",
                }
            )
        roles = ", ".join(self.roles) or "none (no token)"
        operation: Schema = {
            "operationId": self.operation_id,
            "tags": [self.tag],
            "summary": self.summary,
            "description": f"{self.description}\n\nToken roles: {roles}.".strip(),
            "parameters": parameters,
            "responses": self._responses(),
        }
        if not self.roles:
            operation["security"] = []
        if self.body is not None:
            operation["requestBody"] = {
                "required": bool(self.body.get("required")),
                "content": {"application/json": {"schema": self.body}},
            }
        return operation

    def query_parameters(self) -> dict[str, Schema]:
        return {**self.query, **(PAGE_QUERY if self.paginated else {})}

    def _responses(self) -> Schema:
        responses: Schema = {}
        for status, schema in self.responses.items():
            content: Schema = {"application/json": {"schema": schema}}
            if self.csv:
                content["text/csv"] = {"schema": {"type": "string"}}
            responses[str(status)] = {"description": _reason(status), "content": content}
        for status in self.statuses():
            responses[str(status)] = {
                "description": ERROR_CODES.get(status, _reason(status)),
                "content": {"application/json": {"schema": ref("Error")}},
            }
        return responses


OPERATIONS: dict[tuple[str, str], Operation] = {}


def endpoint(
    method: str,
    path: str,
    *,
    tag: str,
    summary: str,
    roles: tuple[str, ...],
    responses: Mapping[int, Schema],
    query: Mapping[str, Schema] | None = None,
    body: Schema | None = None,
    raw_body: bool = False,
    idempotency: str | None = None,
    paginated: bool = False,
    csv: bool = False,
    errors: tuple[int, ...] = (),
    blueprint: Blueprint | None = None,
) -> Callable[[View], View]:
    """Serve `method path` (under /api/v1) with the decorated view and document it."""

    def register(view: View) -> View:
        operation = Operation(
            method=method.lower(),
            path=path,
            operation_id=view.__name__,
            tag=tag,
            summary=summary,
            description=inspect.getdoc(view) or "",
            roles=roles,
            responses=responses,
            query=query or {},
            body=body,
            raw_body=raw_body,
            idempotency=idempotency,
            paginated=paginated,
            csv=csv,
            errors=errors,
        )
        _record(operation)

        @wraps(view)
        def serve(**path_values: Any) -> Any:
            return view(_prepare(operation), **path_values)

        (blueprint or bp).add_url_rule(operation.rule, view.__name__, serve, methods=[method.upper()])
        return view

    return register


def _record(operation: Operation) -> None:
    key = (operation.method, operation.path)
    if key in OPERATIONS or operation.operation_id in {op.operation_id for op in OPERATIONS.values()}:
        raise RuntimeError(
            f"{operation.method.upper()} {operation.path} ({operation.operation_id}) is declared twice"
        )
    OPERATIONS[key] = operation


def openapi_document(app: Flask) -> Schema:
    """The OpenAPI 3 document of the operations this app serves."""
    served = {(rule.rule, m.lower()) for rule in app.url_map.iter_rules() for m in rule.methods or ()}
    paths: dict[str, Schema] = {}
    for (method, path), operation in sorted(OPERATIONS.items(), key=lambda item: item[0][1]):
        if (operation.rule, method) in served:
            paths.setdefault(API_PREFIX + path, {})[method] = operation.as_openapi()
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "gpucredit API",
            "version": "1",
            "description": "Prepaid GPU credits for Slurm: balances, top-ups, holds, quotes, usage. "
            "Credits are decimal strings; times ISO 8601 UTC. Errors: "
            '{"error": {"code", "message", "details"}}.',
        },
        "paths": paths,
        "components": {
            "schemas": COMPONENTS,
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer"},
                "mungeAuth": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "Authorization",
                    "description": "MUNGE <credential>, made for this one request (where "
                    "portal.munge_auth is on; docs/api.md, From a login node)",
                },
            },
        },
        "security": [{"bearerAuth": []}, {"mungeAuth": []}],
    }


def _prepare(operation: Operation) -> Call:
    """Who is asking, then the input: a refusal here changes nothing."""
    who = None
    if operation.roles:
        who = principal()
        if who.via not in ("token", "munge"):
            raise Unauthenticated("the API takes a bearer token: Authorization: Bearer gpc_...")
        if who.role not in operation.roles:
            raise Forbidden(
                f"a {who.role} token may not {operation.summary[0].lower()}{operation.summary[1:]}",
                details={"role": who.role, "roles": list(operation.roles)},
            )
    declared = operation.query_parameters()
    for name in request.args:
        if name not in declared:  # a misspelt ?limt= would otherwise be ignored in silence
            raise refuse(name, "is not a query parameter of this operation")
    query = {
        name: from_text(request.args[name], schema, COMPONENTS, name)
        for name, schema in declared.items()
        if name in request.args
    }
    key = None
    if operation.idempotency:
        key = request.headers.get("Idempotency-Key")
        if key is None and operation.idempotency == "required":
            raise refuse("Idempotency-Key", "is required")
        if key is not None:
            check(key, IDEMPOTENCY_KEY, COMPONENTS, "Idempotency-Key")
    body = _body(operation.body) if operation.body is not None and not operation.raw_body else {}
    limit = query.pop("limit", None) or int(portal_settings(current_app)["page_size"])
    cursor = query.pop("cursor", None)
    return Call(who, query, body, key, Page(min(limit, MAX_PAGE), None if cursor is None else int(cursor)))


def _body(schema: Schema) -> dict[str, Any]:
    raw = request.get_data(cache=True)
    try:
        value = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        raise refuse("body", "is not a JSON document") from None
    check(value, schema, COMPONENTS, "body")
    return dict(value)


def _path_names(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def _flask_rule(path: str) -> str:
    parts = []
    for part in path.split("/"):
        if part.startswith("{"):
            name = part[1:-1]
            part = f"<{PATH_PARAMETERS[name][1]}:{name}>"
        parts.append(part)
    return "/".join(parts)


def _reason(status: int) -> str:
    return HTTPStatus(status).phrase


def body_schema(required: list[str], properties: dict[str, Schema]) -> Schema:
    """A request body: the named fields only."""
    return obj(required, properties, closed=True)
