"""Request values checked against the JSON schemas the OpenAPI document declares.

One checker for the small subset of JSON Schema the API uses (type, nullable, enum,
required, properties, additionalProperties false, pattern, min/maxLength,
minimum/maximum, anyOf, $ref to a component), so what the document promises is what
a request is held to: a value outside it is a 422 `invalid_input` naming the field,
refused before any transaction begins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ledger.errors import InvalidInput

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
}
_INTEGER = re.compile(r"^-?[0-9]{1,19}$")


def refuse(field: str, reason: str) -> InvalidInput:
    return InvalidInput(f"{field}: {reason}", details={"field": field, "reason": reason})


def check(value: Any, schema: Mapping[str, Any], components: Mapping[str, Any], field: str) -> None:
    """Raise `invalid_input` at the first place `value` breaks `schema`."""
    if "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[-1]]
    if value is None:
        if not schema.get("nullable"):
            raise refuse(field, "must not be null")
        return
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            try:
                check(value, option, components, field)
                return
            except InvalidInput:
                continue
        raise refuse(field, "matches none of the allowed forms")
    kind = schema.get("type")
    # bool is an int in Python, never in JSON
    if kind is not None and (
        not isinstance(value, _TYPES[kind]) or (kind == "integer" and isinstance(value, bool))
    ):
        raise refuse(field, f"must be of type {kind}")
    if "enum" in schema and value not in schema["enum"]:
        raise refuse(field, "must be one of " + ", ".join(str(v) for v in schema["enum"]))
    if isinstance(value, str):
        _check_string(value, schema, field)
    elif isinstance(value, int):
        _check_integer(value, schema, field)
    elif isinstance(value, dict):
        _check_object(value, schema, components, field)
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            check(item, schema["items"], components, f"{field}[{index}]")


def _check_string(value: str, schema: Mapping[str, Any], field: str) -> None:
    if len(value) < schema.get("minLength", 0):
        raise refuse(field, f"must be at least {schema['minLength']} characters")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        raise refuse(field, f"must be at most {schema['maxLength']} characters")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        raise refuse(field, f"must match {schema['pattern']}")


def _check_integer(value: int, schema: Mapping[str, Any], field: str) -> None:
    if "minimum" in schema and value < schema["minimum"]:
        raise refuse(field, f"must be at least {schema['minimum']}")
    if "maximum" in schema and value > schema["maximum"]:
        raise refuse(field, f"must be at most {schema['maximum']}")


def _check_object(
    value: dict[str, Any], schema: Mapping[str, Any], components: Mapping[str, Any], field: str
) -> None:
    properties = schema.get("properties", {})
    prefix = "" if field == "body" else field + "."
    for name in schema.get("required", ()):
        if name not in value:
            raise refuse(prefix + name, "is required")
    for name, item in value.items():
        if name in properties:
            check(item, properties[name], components, prefix + name)
        elif schema.get("additionalProperties") is False:
            raise refuse(prefix + name, "is not a known field")


def from_text(text: str, schema: Mapping[str, Any], components: Mapping[str, Any], field: str) -> Any:
    """A query, path or header value (always text on the wire) as the schema's type."""
    if "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[-1]]
    value: Any = text
    if schema.get("type") == "integer":
        if not _INTEGER.match(text):
            raise refuse(field, "must be a whole number")
        value = int(text)
    check(value, schema, components, field)
    return value
