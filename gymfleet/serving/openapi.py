"""Plain routes and the OpenAPI document that describes them.

Hot-path routes are plain Starlette routes (`add_route`: no FastAPI dependency solving), so FastAPI's own
`/openapi.json` would leave them out. `openapi_schema` lists them too, with the body and answer types given to
`add_route`, or for the wire-protocol routes model and agent servers register untyped, `PROTOCOL_DOCS`.
`gymfleet.serving.server` serves it at `GET /openapi.json` and re-exports these names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import TypeAdapter
from starlette.routing import Route


@dataclass(frozen=True)
class RouteDoc:
    """What `/openapi.json` says of a plain route: its body and answer types (any type pydantic can describe)."""

    request: Any = None
    response: Any = None
    summary: str | None = None


class DocumentedRoute(Route):
    """A plain Starlette route carrying its `RouteDoc` (None: undocumented, or a `PROTOCOL_DOCS` route)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], *, methods: list[str], doc: RouteDoc | None):
        super().__init__(path, endpoint, methods=methods)
        self.doc = doc


def add_route(
    app: FastAPI,
    path: str,
    endpoint: Callable[[Request], Any],
    methods: tuple[str, ...] = ("POST",),
    *,
    request: Any = None,
    response: Any = None,
    summary: str | None = None,
) -> None:
    """Register a hot-path route as a plain Starlette route.

    The endpoint takes the `Request` and returns a response; it parses its own body (`gymfleet.serving.bodies`), which
    skips FastAPI's dependency solving and response encoding — about half the per-request cost of `/verify`.
    Errors still go through the app's exception handlers. `request` and `response` are the body and answer types
    `/openapi.json` shows; they document, they do not validate.
    """
    doc = RouteDoc(request, response, summary) if request or response or summary else None
    app.router.routes.append(DocumentedRoute(path, endpoint, methods=list(methods), doc=doc))


PROTOCOL_DOCS: dict[str, RouteDoc] = {}
"""The wire-protocol routes' types (`spec/protocol.md`), for servers that register them without any. Each module
that defines a protocol route's types registers them here (`gymfleet.serving.agent`: `/run`;
`gymfleet.serving.resources`: `/aggregate_metrics`), so this base module imports none of its subclasses."""


def _protocol_docs() -> dict[str, RouteDoc]:
    """`PROTOCOL_DOCS` plus the model routes' types (imported when `/openapi.json` is first asked for)."""
    from openai.types.chat import ChatCompletion
    from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming

    from gymfleet.wire import Response as ResponsesObject
    from gymfleet.wire import ResponseCreateParams

    return {
        "/v1/responses": RouteDoc(ResponseCreateParams, ResponsesObject, "One model call (OpenAI Responses API)"),
        "/v1/chat/completions": RouteDoc(
            CompletionCreateParamsNonStreaming, ChatCompletion, "One model call (OpenAI Chat Completions API)"
        ),
        **PROTOCOL_DOCS,
    }


_VALIDATION_ERROR = {
    "description": "Validation Error: the body is not JSON, or a field is missing or mistyped",
    "content": {"application/json": {"schema": {
        "type": "object",
        "properties": {"detail": {"type": "array", "items": {"type": "object", "properties": {
            "type": {"type": "string"}, "loc": {"type": "array"}, "msg": {"type": "string"}}}}},
    }}},
}  # fmt: skip


def openapi_schema(app: FastAPI) -> dict[str, Any]:
    """`app`'s OpenAPI document: FastAPI's for its own routes, plus every plain route with its `RouteDoc` types."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    plain = [
        route for route in app.routes
        if isinstance(route, Route) and not isinstance(route, APIRoute) and route.include_in_schema
    ]  # fmt: skip
    protocol = _protocol_docs() if any(getattr(route, "doc", None) is None for route in plain) else {}
    docs = [getattr(route, "doc", None) or protocol.get(route.path) or RouteDoc() for route in plain]
    inputs = []
    for index, doc in enumerate(docs):
        if doc.request is not None:
            inputs.append(((index, "request"), "validation", TypeAdapter(doc.request)))
        if doc.response is not None:
            inputs.append(((index, "response"), "serialization", TypeAdapter(doc.response)))
    types, definitions = _any_of(TypeAdapter.json_schemas(inputs, ref_template="#/components/schemas/{model}"))
    schema.setdefault("components", {}).setdefault("schemas", {}).update(definitions.get("$defs", {}))
    paths = schema.setdefault("paths", {})
    for index, (route, doc) in enumerate(zip(plain, docs, strict=True)):
        for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
            paths.setdefault(route.path_format, {})[method.lower()] = _operation(
                route, method, doc, types.get(((index, "request"), "validation")),
                types.get(((index, "response"), "serialization")),
            )
    app.openapi_schema = schema
    return schema


def _any_of(node: Any) -> Any:
    """`node` with every `oneOf` an `anyOf`: pydantic writes a union it picks from by a callable discriminator (the
    Responses API's output items, with a catch-all for unknown item types) as `oneOf`, which a body matching the
    catch-all and its own type would fail."""
    if isinstance(node, dict):
        return {("anyOf" if key == "oneOf" and isinstance(item, list) else key): _any_of(item)
                for key, item in node.items()}
    if isinstance(node, list | tuple):
        return type(node)(_any_of(item) for item in node)
    return node


def _operation(route: Route, method: str, doc: RouteDoc, request: Any, response: Any) -> dict[str, Any]:
    summary = doc.summary or (_first_line(route.endpoint) or route.name.replace("_", " "))
    operation: dict[str, Any] = {
        "summary": summary,
        "operationId": f"{route.name}_{method.lower()}_{route.path_format.strip('/').replace('/', '_') or 'root'}",
        "responses": {"200": {"description": "Successful Response",
                              "content": {"application/json": {"schema": response or {}}}}},
    }
    if route.param_convertors:
        operation["parameters"] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in route.param_convertors
        ]
    if method != "GET":
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": request or {}}}}
        operation["responses"]["422"] = _VALIDATION_ERROR
    return operation


def _first_line(function: Any) -> str | None:
    doc = getattr(function, "__doc__", None)
    return doc.strip().splitlines()[0] if doc and doc.strip() else None
