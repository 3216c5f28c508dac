"""`response_format`: the JSON schema a chat answer is constrained to (None: free text).

Both `json_object` and `json_schema` are guaranteed by constrained decoding on the
last stage (entry/grammars.py), strict or not: a schema is followed, never hoped for.
"""

from __future__ import annotations

from .errors import ApiError

ANY_OBJECT = {"type": "object"}


def parse_response_format(body: dict) -> dict | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ApiError(400, "response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}",
                           param="response_format")
        schema = spec.get("schema")
        if schema is None:
            return ANY_OBJECT
        if not isinstance(schema, dict):
            raise ApiError(400, "response_format json_schema.schema must be a JSON schema object",
                           param="response_format")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ApiError(400, "response_format json_schema.strict must be a boolean", param="response_format")
        return schema
    raise ApiError(400, f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                   param="response_format")
