"""structured_outputs grading: is the model's document (text or tool-call arguments) valid under the row's schema?

A pure function of (response, row fields, limits), table-tested without a server; `app.py` runs it in a worker
thread. Every outcome is a `Grade`: reward 1.0 with no error, or 0.0 with the first failed stage as `error_type`:

- text mode: `empty_response` (no visible text) -> `schema_error` (`schema_str` is not JSON) -> `parse_error`
  (the text is not a `schema_type` document, is over the size limits, or holds NaN or an infinity) ->
  `schema_error` (the strict schema is not a valid JSON Schema, or has a `$ref` that does not resolve locally) ->
  `validation_error`.
- tool-call mode: `response_error` (the response carries an `error`) -> `missing_tool_call` / `multiple_tool_calls`
  (exactly one `function_call` item must be in the output) -> `wrong_tool_name` (when the row names the tool) ->
  `schema_error` -> `parse_error` (arguments are not JSON, or hold NaN or an infinity) -> `validation_error`
  (including arguments lacking the row's `tool_payload_key`).

Validation is JSON Schema draft 2020-12 (`jsonschema`), the dialect NeMo-Gym's `openapi-schema-validator` (OAS 3.1)
applies: the schema is checked first, `format` is an annotation (not asserted), and `$ref` resolves only inside the
schema (no network: a remote `$ref` is a `schema_error`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from referencing import Registry
from referencing.exceptions import Unresolvable

from gymfleet.wire import Response
from resources_servers.structured_outputs.documents import (
    SchemaType,
    coerce_csv,
    coerce_xml,
    count_nodes,
    first_non_finite,
    loads_json,
    parse_document,
    strictify,
)

ErrorType = Literal[
    "empty_response", "schema_error", "parse_error", "validation_error",
    "response_error", "missing_tool_call", "multiple_tool_calls", "wrong_tool_name",
]  # fmt: skip
MESSAGE_CHARS = 200
"""Error messages are clipped to this length (they can quote the whole document otherwise)."""
_LOCAL_ONLY = Registry()  # an empty registry: no `$ref` is fetched over the network


@dataclass(frozen=True)
class Limits:
    """Bounds on the work one document may cause (see the config fields of the same names)."""

    max_document_chars: int = 400_000
    max_document_nodes: int = 100_000
    xml_coerce_types: bool = True


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Grade:
    """The reward and, when it is 0.0, the stage that failed and why."""

    reward: float
    error_type: ErrorType | None = None
    error_message: str | None = None


@dataclass(frozen=True)
class _Schema:
    schema: Any
    validator: Draft202012Validator | None
    not_json: str | None = None
    """Why `schema_str` is not JSON (graded before the document is parsed)."""
    invalid: str | None = None
    """Why the strict schema is not a valid JSON Schema (graded after the document parses, as NeMo-Gym does)."""


@lru_cache(maxsize=1024)
def _compile(schema_str: str) -> _Schema:
    """The strict schema and its validator. Cached: many rows share a schema, and checking one costs milliseconds."""
    try:
        schema = json.loads(schema_str)
    except ValueError as error:
        return _Schema(None, None, not_json=f"schema_str is not JSON: {error}")
    strictify(schema)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as error:
        return _Schema(schema, None, invalid=f"invalid JSON Schema: {error.message}")
    return _Schema(schema, Draft202012Validator(schema, registry=_LOCAL_ONLY))


def _fail(error_type: ErrorType, message: str) -> Grade:
    return Grade(0.0, error_type, message[:MESSAGE_CHARS])


def _validate(document: Any, compiled: _Schema, limits: Limits) -> Grade:
    if compiled.validator is None:
        return _fail("schema_error", compiled.invalid or "invalid schema")
    nodes = count_nodes(document, limits.max_document_nodes)
    if nodes > limits.max_document_nodes:
        return _fail("parse_error", f"document expands to more than {limits.max_document_nodes} values")
    non_finite = first_non_finite(document, limits.max_document_nodes)
    if non_finite is not None:
        return _fail("parse_error", f"{non_finite}: NaN and infinities are not JSON numbers; write a finite number")
    try:
        error = best_match(compiled.validator.iter_errors(document))
    except Unresolvable as unresolved:
        return _fail("schema_error", f"unresolvable $ref: {unresolved}")
    except Exception as crash:
        # A model-written document must never become a 500: RecursionError on deep nesting, TypeError on a CSV
        # row's None key (a row with more cells than the header), ...
        return _fail("validation_error", f"{type(crash).__name__}: {crash}")
    if error is not None:
        return _fail("validation_error", f"{error.json_path}: {error.message}")
    return Grade(1.0)


def grade_text(text: str, schema_str: str, schema_type: SchemaType, limits: Limits = DEFAULT_LIMITS) -> Grade:
    """Grade a text-mode answer: `text` parsed as `schema_type` must validate under the strict schema."""
    if not text.strip():
        return _fail("empty_response", "no assistant text")
    compiled = _compile(schema_str)
    if compiled.not_json:
        return _fail("schema_error", compiled.not_json)
    if len(text) > limits.max_document_chars:
        return _fail("parse_error", f"document longer than {limits.max_document_chars} characters")
    try:
        document = parse_document(text, schema_type)
        if schema_type == "xml" and limits.xml_coerce_types:
            document = coerce_xml(document, compiled.schema)
        elif schema_type == "csv":
            document = coerce_csv(document, compiled.schema)
    except Exception as error:
        # Each parser raises its own family (JSONDecodeError, YAMLError, ExpatError, TOMLDecodeError, csv.Error) and
        # deep nesting raises RecursionError; all of them mean the model's text is not a usable document.
        return _fail("parse_error", f"{type(error).__name__}: {error}")
    return _validate(document, compiled, limits)


def grade_tool_call(
    response: Response,
    schema_str: str,
    tool_name: str | None,
    payload_key: str | None,
    limits: Limits = DEFAULT_LIMITS,
) -> Grade:
    """Grade a tool-call-mode answer: the one function call's arguments (or `arguments[payload_key]`) must validate."""
    if getattr(response, "error", None):
        return _fail("response_error", f"response error: {response.error}")
    calls = [item for item in response.output if item.type == "function_call"]
    if not calls:
        return _fail("missing_tool_call", "the response has no function_call")
    if len(calls) > 1:
        return _fail("multiple_tool_calls", f"{len(calls)} function calls; exactly one is graded")
    call = calls[0]
    if tool_name is not None and call.name != tool_name:
        return _fail("wrong_tool_name", f"called {call.name!r}, expected {tool_name!r}")
    compiled = _compile(schema_str)
    if compiled.not_json:
        return _fail("schema_error", compiled.not_json)
    if len(call.arguments) > limits.max_document_chars:
        return _fail("parse_error", f"arguments longer than {limits.max_document_chars} characters")
    try:
        arguments = loads_json(call.arguments)
    except (ValueError, RecursionError) as error:
        return _fail("parse_error", f"arguments are not JSON: {type(error).__name__}: {error}")
    if payload_key is not None:
        if not isinstance(arguments, dict) or payload_key not in arguments:
            return _fail("validation_error", f"arguments have no {payload_key!r} key")
        arguments = arguments[payload_key]
    return _validate(arguments, compiled, limits)
