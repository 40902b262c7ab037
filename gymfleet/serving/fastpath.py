"""What every server's FastAPI app leaves out of, or moves off, the path each request takes.

Two costs FastAPI puts on every request, measured on `/verify` (`bench/verify_throughput.py`, in process):

- its native OpenTelemetry hooks (FastAPI >= 0.130): even with no provider configured, each request looks the
  tracer, meter and logger providers up (about 10 µs). `fastapi_options()` turns them off, unless
  `GYMFLEET_FASTAPI_TELEMETRY=1` is set (for a user who configures OpenTelemetry providers and wants FastAPI's spans);
  gymfleet's own metrics (`GET /metrics`) do not depend on them.
- route matching walks the routes in order, and the framework's own (`/openapi.json`, `/docs`, ...) come first: a
  `/verify` was tried against five routes before its own (about 10 µs). `own_routes_first` moves the server's routes
  ahead of them, unless one of the server's routes would then answer a request meant for a framework route (a
  catch-all `GET /{name}`, say), in which case the order is left as it was.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from fastapi import FastAPI
from starlette.routing import BaseRoute, Match

TELEMETRY_ENV = "GYMFLEET_FASTAPI_TELEMETRY"
_TELEMETRY_OFF = {"tracing": False, "metrics": False, "logs": False}


def fastapi_options() -> dict[str, Any]:
    """Keyword arguments for `FastAPI(...)`: its native telemetry off where it has any (see the module docstring)."""
    if os.environ.get(TELEMETRY_ENV, "") == "1":
        return {}
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:  # FastAPI before native telemetry
        return {}
    return {"telemetry": dict(_TELEMETRY_OFF)}


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
