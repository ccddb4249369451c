"""Helpers for the schema tests: the console's OpenAPI document as strict JSON Schema, the operation
that answers a URL, and a walk that finds the parts of an answer the schema leaves untyped."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft7Validator

METHODS = ("get", "put", "post", "patch", "delete")
# Answers that are documents in their own right: the schema names their media type, not a shape.
NOT_JSON = re.compile(r"^(text/|application/(x-protobuf|octet-stream|pdf|zip|gzip))")


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The schema a ``$ref`` points at (the schema itself when it is none)."""
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def untyped_parts(document: dict[str, Any], schema: dict[str, Any] | None, path: str = "$") -> Iterator[str]:
    """Where a response schema says nothing of the answer's shape: a missing schema, an object with
    neither properties nor a typed additionalProperties (a map of what?), an array of untyped items,
    or a schema with no type at all. Composites (allOf, oneOf, anyOf) are walked part by part."""
    if not schema:
        yield path
        return
    schema = resolve(document, schema)
    parts = [p for key in ("allOf", "oneOf", "anyOf") for p in schema.get(key, [])]
    if parts:
        for part in parts:
            yield from untyped_parts(document, part, path)
        return
    kind = schema.get("type")
    if kind is None and "enum" not in schema:
        yield path
    elif kind == "object":
        properties = schema.get("properties") or {}
        values = schema.get("additionalProperties")
        if not properties and not (isinstance(values, dict) and values):
            yield path
        for name, part in properties.items():
            yield from untyped_parts(document, part, f"{path}.{name}")
        if isinstance(values, dict) and values:
            yield from untyped_parts(document, values, f"{path}.*")
    elif kind == "array":
        yield from untyped_parts(document, schema.get("items"), f"{path}[]")


def json_responses(document: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any] | None]]:
    """(method, path, status, schema) of every 2xx JSON answer the document declares; an answer
    with a body and no declared content comes with schema None."""
    for path, operations in document["paths"].items():
        for method in METHODS:
            operation = operations.get(method)
            if operation is None:
                continue
            for status, response in operation["responses"].items():
                if not status.startswith("2") or status == "204":
                    continue
                content = response.get("content")
                if not content:
                    yield method, path, status, None
                for media_type, body in (content or {}).items():
                    if not NOT_JSON.match(media_type):
                        yield method, path, status, body.get("schema")


def strict(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI 3.0 response schema as JSON Schema (draft 7) that holds an answer to every word:
    ``nullable`` becomes a null alternative, and an object with properties takes no other key
    (an answer's undocumented field fails, as a missing required one does). Components go under
    ``definitions``, so recursive shapes stay finite."""

    def convert(node: Any) -> Any:
        if isinstance(node, list):
            return [convert(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {key: convert(value) for key, value in node.items() if key not in ("nullable", "readOnly", "writeOnly")}
        if "$ref" in out:
            out = {"$ref": out["$ref"].replace("#/components/schemas/", "#/definitions/")}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        if node.get("nullable"):
            out = {"anyOf": [out, {"type": "null"}]}
        return out

    converted = convert(copy.deepcopy(schema))
    converted["definitions"] = {name: convert(part) for name, part in document["components"]["schemas"].items()}
    return converted


def operation_for(document: dict[str, Any], method: str, url_path: str) -> tuple[str, dict[str, Any]]:
    """The document's path template and operation that answer ``method url_path``: of the templates
    that match, the one with the fewest parameters (``/jobs/overview`` before ``/jobs/{id}``)."""
    matches = []
    for template, operations in document["paths"].items():
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))
        if method in operations and re.fullmatch(pattern, url_path):
            matches.append((template.count("{"), template))
    assert matches, f"no operation in the schema answers {method.upper()} {url_path}"
    template = min(matches)[1]
    return template, document["paths"][template][method]


def answer_errors(document: dict[str, Any], method: str, url_path: str, status: int, body: Any) -> list[str]:
    """What in an answer breaks the schema its operation declares for its status (strict)."""
    template, operation = operation_for(document, method, url_path)
    response = operation["responses"].get(str(status))
    assert response is not None, f"{method.upper()} {template}: status {status} is not in the schema"
    schema = response["content"]["application/json"]["schema"]
    validator = Draft7Validator(strict(document, schema))
    # One line per field at fault: the rows of a list break the same way ("results/*/parent").
    found = {
        f"{method.upper()} {template} {status}: at {where(e.absolute_path)}: {short(e.message)}"
        for e in validator.iter_errors(body)
    }
    return sorted(found)


def short(message: str) -> str:
    """jsonschema's message without the offending value's whole text."""
    return re.sub(r"{.*}", "{...}", message)[:240]


def where(path: Any) -> str:
    """An answer's JSON path, its list indexes as * (the rows of a list break alike)."""
    return "/".join("*" if isinstance(part, int) else str(part) for part in path) or "$"
