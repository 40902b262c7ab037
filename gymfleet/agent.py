"""`AgentServer`: runs one rollout per `POST /run`.

Routes: `POST /run` (a dataset row in; the resources server's verify answer out), `POST /v1/responses` (one
episode without verification), `POST /aggregate_metrics`. Subclasses implement `run` and `respond`.
Inner calls that fail (model or resources server down, timeouts) surface as HTTP 502 with `error_type` naming the
failure class, never as a hang and never as a reward.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response as StarletteResponse

from gymfleet.aggregate import aggregate_metrics
from gymfleet.bodies import read_json, validate
from gymfleet.resources import AggregateMetricsRequest
from gymfleet.server import JSONResponse, Server, ServerConfig, add_route
from gymfleet.wire import ResponseCreateParams


class AgentServerConfig(ServerConfig):
    """Fields every agent accepts."""

    skip_verification: bool = False
    """Return the episode with `reward = skip_verification_reward` instead of calling `/verify`."""
    skip_verification_reward: float = 0.0


class RunRequest(BaseModel):
    """`/run` body: a dataset row. Every field is kept and forwarded to the resources server."""

    model_config = ConfigDict(extra="allow")
    responses_create_params: ResponseCreateParams


class AgentServer(Server):
    """Base class of agents."""

    config: AgentServerConfig

    async def run(self, body: RunRequest, raw: dict[str, Any], cookies: dict[str, str]) -> tuple[dict, dict]:
        """One rollout; returns (verify result, cookies to re-emit)."""
        raise NotImplementedError

    async def respond(self, params: dict[str, Any], cookies: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
        """One episode (model ⇄ tools) without verification; returns (response, cookies)."""
        raise NotImplementedError

    async def aggregate(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        return aggregate_metrics(verify_responses)

    def routes(self, app: FastAPI) -> None:
        async def run_route(request: Request) -> StarletteResponse:
            raw = await read_json(request)
            body = validate(RunRequest, raw)
            result, cookies = await self.run(body, raw, dict(request.cookies))
            return _with_cookies(JSONResponse(result), cookies)

        async def responses_route(request: Request) -> StarletteResponse:
            raw = await read_json(request)
            validate(ResponseCreateParams, raw)
            response, cookies = await self.respond(raw, dict(request.cookies))
            return _with_cookies(JSONResponse(response), cookies)

        async def aggregate_route(request: Request) -> StarletteResponse:
            body = validate(AggregateMetricsRequest, await read_json(request))
            return JSONResponse(await self.aggregate(body.verify_responses))

        add_route(app, "/run", run_route)
        add_route(app, "/v1/responses", responses_route)
        add_route(app, "/aggregate_metrics", aggregate_route)


def _with_cookies(response: StarletteResponse, cookies: dict[str, str]) -> StarletteResponse:
    for name, value in cookies.items():
        response.set_cookie(name, value, httponly=True, samesite="lax")
    return response
