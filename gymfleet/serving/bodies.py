"""Fast request-body parsing that keeps FastAPI's 422 error shape.

Routes that carry whole rollouts (`/verify`, `/run`, `/v1/responses`) parse the raw body with orjson and validate
with pydantic directly: FastAPI's generic body path (json → dict → validate → jsonable_encoder on the way out)
costs several times more on rollout-sized bodies. The body itself is read with plain `receive` calls
(`read_body`), not through Starlette's `Request.stream()` async generator.
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from gymfleet.errors import first_errors, too_many_errors

ModelT = TypeVar("ModelT", bound=BaseModel)


MAX_DEPTH = 253
"""Deepest nesting a body may have: orjson reads 1024 levels but writes at most 253, and every body is echoed."""


async def read_body(request: Request) -> bytes:
    """`await request.body()` without the async generator Starlette reads it through (a few µs a request): the same
    bytes, kept on the request for a later `request.body()`, and `ClientDisconnect` if the client hangs up first."""
    body = getattr(request, "_body", None)
    if body is not None:
        return body
    if request._stream_consumed:  # read with `request.stream()` already, as Starlette says
        raise RuntimeError("Stream consumed")
    chunks: list[bytes] = []
    while True:
        message = await request.receive()
        if message["type"] == "http.request":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                request._stream_consumed = True
                break
        elif message["type"] == "http.disconnect":
            request._is_disconnected = True
            raise ClientDisconnect()
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    request._body = body  # Starlette's own cache: `request.body()` answers it from now on
    return body


async def read_json(request: Request) -> Any:
    """The request body as JSON, or a 422 (`json_invalid`, `json_too_deep`) naming what is wrong."""
    raw = await read_body(request)
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body", exc.pos), "msg": f"JSON decode error: {exc.msg}"}]
        ) from exc
    # Only a body with that many brackets can nest that deep (a C-speed count); writing it back is the exact check.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _too_deep(data):
        raise RequestValidationError(
            [{"type": "json_too_deep", "loc": ("body",),
              "msg": f"the body nests deeper than {MAX_DEPTH} levels of arrays and objects; flatten it"}]
        )
    return data


def _too_deep(data: Any) -> bool:
    try:
        orjson.dumps(data)
    except TypeError:  # "Recursion limit reached"
        return True
    return False


def validate(model: type[ModelT], data: Any) -> ModelT:
    """Validate `data` into `model`, turning a pydantic error into FastAPI's 422 with `body.<field>` locations."""
    if not isinstance(data, dict):
        raise RequestValidationError(
            [{"type": "model_attributes_type", "loc": ("body",), "msg": "the body must be a JSON object"}]
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = first_errors(model, data, exc)  # a body of many wrong items is its first errors and a count
        errors += too_many_errors(exc.error_count(), len(errors))
    # raised out here, so pydantic's error (hundreds of MB for a huge body of wrong items) is freed already
    raise RequestValidationError(
        [{"type": error["type"], "loc": ("body", *error["loc"]), "msg": error["msg"]} for error in errors]
    )
