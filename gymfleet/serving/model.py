"""`ModelServer`: the OpenAI-compatible front of a policy or judge model.

Routes: `POST /v1/responses` (a `ResponseCreateParams` body, a Responses object back) and
`POST /v1/chat/completions` (a Chat Completions body, a completion back). Subclasses implement `responses` and
`chat_completions`; both return plain dicts (already in wire form).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response as StarletteResponse

from gymfleet.serving.bodies import read_json, validate
from gymfleet.serving.server import JSONResponse, Server, ServerConfig, add_route
from gymfleet.wire import ResponseCreateParams


class ModelServerConfig(ServerConfig):
    """Fields every model server accepts."""


class ModelServer(Server):
    """Base class of model servers."""

    config: ModelServerConfig

    async def responses(self, params: ResponseCreateParams, raw: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} does not serve /v1/responses")

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} does not serve /v1/chat/completions")

    def routes(self, app: FastAPI) -> None:
        async def responses_route(request: Request) -> StarletteResponse:
            raw = await read_json(request)
            params = validate(ResponseCreateParams, raw)
            return JSONResponse(await self.responses(params, raw))

        async def chat_route(request: Request) -> StarletteResponse:
            body = await read_json(request)
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                return JSONResponse(
                    {
                        "detail": [
                            {"type": "missing", "loc": ["body", "messages"], "msg": "a list of messages is required"}
                        ]
                    },
                    status_code=422,
                )
            return JSONResponse(await self.chat_completions(body))

        add_route(app, "/v1/responses", responses_route)
        add_route(app, "/v1/chat/completions", chat_route)
