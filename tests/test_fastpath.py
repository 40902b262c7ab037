"""`gymfleet.serving.fastpath`: a server's own routes are matched first unless that would change what answers, and
FastAPI's native telemetry hooks are off unless asked for."""

from __future__ import annotations

import inspect

import pytest
from fastapi import FastAPI
from starlette.routing import Match

from gymfleet.errors import BadRequestError
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


class Routes(Server):
    """Plain routes that answer how they were reached, raise a handled error, or raise an unhandled one."""

    def routes(self, app) -> None:
        async def where(request):
            scope = request.scope
            return JSONResponse({"direct": "fastapi_middleware_astack" not in scope,
                                 "endpoint": scope["endpoint"].__name__, "params": scope["path_params"]})

        async def bad(request):
            raise BadRequestError("the field x is wrong")

        async def broken(request):
            raise KeyError("oops")

        async def first(request):
            return JSONResponse({"answered_by": "first"})

        async def shadowed(request):
            return JSONResponse({"answered_by": "shadowed"})

        add_route(app, "/where", where)
        add_route(app, "/item/{name}", where)
        add_route(app, "/bad", bad)
        add_route(app, "/broken", broken)
        add_route(app, "/twice", first)
        add_route(app, "/twice", shadowed)
        add_route(app, "/twice", shadowed, methods=("PUT",))


def test_own_plain_routes_are_reached_directly_with_the_apps_error_handling_and_the_routers_choice():
    from fastapi.testclient import TestClient

    with TestClient(Routes({"name": "routes"}).create_app(), raise_server_exceptions=False) as client:
        assert client.post("/where").json() == {"direct": True, "endpoint": "where", "params": {}}
        # a path with parameters, and a method the route does not take, go through the router as before
        assert client.post("/item/7").json() == {"direct": False, "endpoint": "where", "params": {"name": "7"}}
        assert client.get("/where").status_code == 405
        answer = client.post("/bad")
        assert (answer.status_code, answer.json()["error_type"]) == (400, "bad_request")
        answer = client.post("/broken")
        assert (answer.status_code, answer.json()["error_type"]) == (500, "server_error")
        # the router's first full match answers, as before: the later route on the same path never does
        assert client.post("/twice").json() == {"answered_by": "first"}
        assert client.put("/twice").json() == {"answered_by": "shadowed"}
        metrics = client.get("/metrics").text
    assert 'route="/where",status="200"' in metrics and 'route="/bad",status="400"' in metrics


def test_the_framework_layers_that_do_nothing_here_are_left_out_of_the_stack():
    app = Echo({"name": "echo"}).create_app()
    app.middleware_stack = app.build_middleware_stack()
    layers, layer = [], app.middleware_stack
    while layer is not None:
        layers.append(type(layer).__name__)
        layer = getattr(layer, "app", None)
    assert "ExceptionTelemetryMiddleware" not in layers and "AppBodyLimitMiddleware" not in layers
    assert layers.index("MetricsMiddleware") < layers.index("OwnRoutesDirect") < layers.index("ExceptionMiddleware")
