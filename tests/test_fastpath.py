"""`gymfleet.serving.fastpath`: a server's own routes are matched first unless that would change what answers, and
FastAPI's native telemetry hooks are off unless asked for."""

from __future__ import annotations

import inspect

import pytest
from fastapi import FastAPI
from starlette.routing import Match

from gymfleet.serving import fastpath
from gymfleet.serving.resources import ResourcesServer, VerifyRequest, VerifyResponse
from gymfleet.serving.server import JSONResponse, Server, add_route


class Echo(ResourcesServer):
    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        return VerifyResponse.echo(body, reward=1.0)


class CatchAll(Server):
    """Answers every GET path itself: moving its route ahead would take `/metrics`, `/docs`, ... from the framework."""

    def routes(self, app) -> None:
        async def anything(request):
            return JSONResponse({"caught": request.path_params["name"]})

        add_route(app, "/verify", anything)
        add_route(app, "/{name}", anything, methods=("GET",))


def _answering(app: FastAPI, path: str, method: str) -> str:
    scope = {"type": "http", "path": path, "method": method, "root_path": ""}
    return next(route.path for route in app.router.routes if route.matches(scope)[0] == Match.FULL)


def test_a_servers_own_routes_come_first_and_every_route_still_answers_its_path():
    app = Echo({"name": "echo"}).create_app()
    paths = [route.path for route in app.router.routes]
    assert paths[0] == "/verify"
    assert paths.index("/aggregate_metrics") < paths.index("/openapi.json")
    for path in ("/", "/metrics", "/openapi.json", "/docs", "/reward_provenance"):
        assert _answering(app, path, "GET") == path


def test_own_routes_that_would_take_a_framework_path_leave_the_order_as_it_was():
    app = CatchAll({"name": "catch"}).create_app()
    assert _answering(app, "/metrics", "GET") == "/metrics"
    assert _answering(app, "/docs", "GET") == "/docs"
    assert _answering(app, "/anything", "GET") == "/{name}"


@pytest.mark.skipif("telemetry" not in inspect.signature(FastAPI.__init__).parameters,
                    reason="this FastAPI has no native telemetry to turn off")
def test_fastapi_native_telemetry_is_off_unless_asked_for(monkeypatch):
    monkeypatch.delenv(fastpath.TELEMETRY_ENV, raising=False)
    app = Echo({"name": "echo"}).create_app()
    assert not any(app._telemetry[key] for key in ("tracing", "metrics", "logs"))
    monkeypatch.setenv(fastpath.TELEMETRY_ENV, "1")
    assert fastpath.fastapi_options() == {}
