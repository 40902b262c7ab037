"""What every server's FastAPI app leaves out of, or moves off, the path each request takes.

Costs FastAPI puts on every request, measured on `/verify` (`bench/verify_throughput.py`, in process):

- its native OpenTelemetry hooks (FastAPI >= 0.130): even with no provider configured, each request looks the
  tracer, meter and logger providers up (about 10 µs). `fastapi_options()` turns them off, unless
  `GYMFLEET_FASTAPI_TELEMETRY=1` is set (for a user who configures OpenTelemetry providers and wants FastAPI's spans);
  gymfleet's own metrics (`GET /metrics`) do not depend on them.
- route matching walks the routes in order, and the framework's own (`/openapi.json`, `/docs`, ...) come first: a
  `/verify` was tried against five routes before its own (about 10 µs). `own_routes_first` moves the server's routes
  ahead of them, unless one of the server's routes would then answer a request meant for a framework route (a
  catch-all `GET /{name}`, say), in which case the order is left as it was.
- the layers between the server's own middlewares and its route: `ExceptionMiddleware` (which only sets the
  exception handlers and wraps the app in the same handling the route's own wrapper repeats),
  `AsyncExitStackMiddleware` (closes uploaded files, which plain routes never take) and the router's walk over the
  routes (about 15 µs on a loaded machine). `OwnRoutesDirect`, the innermost of the server's middlewares, hands a
  request for one of the server's own plain routes (`gymfleet.serving.openapi.add_route`: `/verify`, `/run`, tools)
  straight to that route with the app's exception handlers, exactly where the router would have sent it; every other
  request goes the usual way.
- two framework layers that do nothing here: FastAPI's `ExceptionTelemetryMiddleware` with its telemetry off, and
  its `AppBodyLimitMiddleware` with no `max_body_size` (the server's own guard limits bodies). `LeanFastAPI`
  builds the middleware stack without them.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from fastapi import FastAPI
from starlette.routing import BaseRoute, Match, Route

from gymfleet.serving.openapi import DocumentedRoute

TELEMETRY_ENV = "GYMFLEET_FASTAPI_TELEMETRY"
_TELEMETRY_OFF = {"tracing": False, "metrics": False, "logs": False}


def telemetry_wanted() -> bool:
    """Whether the user asked for FastAPI's native telemetry (`GYMFLEET_FASTAPI_TELEMETRY=1`)."""
    return os.environ.get(TELEMETRY_ENV, "") == "1"


def fastapi_options() -> dict[str, Any]:
    """Keyword arguments for `FastAPI(...)`: its native telemetry off where it has any (see the module docstring)."""
    if telemetry_wanted():
        return {}
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:  # FastAPI before native telemetry
        return {}
    return {"telemetry": dict(_TELEMETRY_OFF)}


_INERT_LAYERS = {"ExceptionTelemetryMiddleware": "telemetry", "AppBodyLimitMiddleware": "body_limit"}


class LeanFastAPI(FastAPI):
    """`FastAPI` whose middleware stack leaves out the framework layers that do nothing here (module docstring)."""

    def build_middleware_stack(self):
        stack = super().build_middleware_stack()
        inert = {"telemetry": not telemetry_wanted(), "body_limit": getattr(self, "max_body_size", None) is None}
        layer = stack
        while (inner := getattr(layer, "app", None)) is not None:
            if inert.get(_INERT_LAYERS.get(type(inner).__name__, ""), False):
                layer.app = inner.app  # AppBodyLimitMiddleware without a limit wraps the app itself, unchanged
                continue
            if type(inner).__name__ == "ExceptionMiddleware":
                break  # the server's own middlewares and what follows are left as they are
            layer = inner
        return stack


class OwnRoutesDirect:
    """Pure ASGI middleware, innermost of the server's: a request for one of the server's own plain routes goes
    straight to it (see the module docstring). Its `app` is Starlette's `ExceptionMiddleware`, whose handlers the
    route's own wrapper then applies, as it does when the router calls it."""

    def __init__(self, app, *, router: Any):
        self.app = app
        self.router = router
        self._known = -1
        self._direct: dict[tuple[str, str], Route] = {}
        self._usable = (not telemetry_wanted() and not getattr(router, "form_limits", None)
                        and hasattr(app, "_exception_handlers") and hasattr(app, "_status_handlers"))

    def _table(self) -> dict[tuple[str, str], Route]:
        """`(path, method) -> route` for every own plain route the router would pick for that request (built on the
        first request, and again if routes are added)."""
        routes = self.router.routes
        if len(routes) == self._known:
            return self._direct
        direct: dict[tuple[str, str], Route] = {}
        for index, route in enumerate(routes):
            if type(route) is not DocumentedRoute or route.param_convertors or not route.methods:
                continue
            for method in route.methods:
                scope = {"type": "http", "path": route.path, "method": method, "root_path": ""}
                if (route.path, method) not in direct and route.matches(scope)[0] is Match.FULL and \
                        not any(earlier.matches(scope)[0] is Match.FULL for earlier in routes[:index]):
                    direct[route.path, method] = route
        self._known, self._direct = len(routes), direct
        return direct

    async def __call__(self, scope, receive, send):
        if self._usable and scope["type"] == "http" and not scope.get("root_path"):
            route = self._table().get((scope["path"], scope["method"]))
            if route is not None:
                if "router" not in scope:
                    scope["router"] = self.router
                scope.update(route.matches(scope)[1])  # endpoint and path_params, as the router sets them
                scope["starlette.exception_handlers"] = (self.app._exception_handlers, self.app._status_handlers)
                await route.app(scope, receive, send)
                return
        await self.app(scope, receive, send)


def own_routes_first(app: FastAPI, framework: list[BaseRoute]) -> None:
    """Put `app`'s routes other than `framework` (those FastAPI and the base server added) ahead of those, keeping
    each group's order, when no own route would take a request one of the framework routes answers."""
    routes = app.router.routes
    own = [route for route in routes if not any(route is kept for kept in framework)]
    for route in framework:
        path = getattr(route, "path", None)
        if path is None or "{" in path:
            return
        for method in getattr(route, "methods", None) or {"GET"}:
            scope = {"type": "http", "path": path, "method": method, "root_path": ""}
            if any(other.matches(scope)[0] == Match.FULL for other in own):
                return
    routes[:] = own + [route for route in routes if any(route is kept for kept in framework)]
