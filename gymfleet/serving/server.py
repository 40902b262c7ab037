"""The base server every gymfleet server (resources, model, agent) builds on.

A `Server` owns a validated pydantic config, the global config dict (to reach other servers by name through
`gymfleet.http.ServerClient`), and builds a FastAPI app with: `GET /` liveness, `GET /metrics` (Prometheus),
signed session cookies (`gymfleet.serving.sessions`), and error mapping:

- a malformed request body is a 422 naming the offending field (FastAPI's shape) and is logged;
- a `TransportError` from an inner call is a 502 naming the server that failed, with its `error_type`; an inner
  4xx that rejects what the caller sent (400, 404, 422, ...) is passed on as that 4xx instead, except 401/403
  (the fleet's own credentials: `auth_failed`) and 429, which are the fleet's problem;
- any other exception is a logged traceback and a 500 JSON body `{"detail": ..., "error_type": ...}`,
  never `repr(e)` as a bare string.

Hostile or broken clients cannot stall a server: a 422 lists at most `MAX_REPORTED_ERRORS` errors and counts the
rest (`gymfleet.errors.first_errors`); a request body not wholly received within `request_body_timeout_s` is
answered 408 and its connection closed (`gymfleet.serving.guard`); a client that hangs up mid-request is one INFO
line, no traceback.

`GET /openapi.json` lists every route with its request and response types, plain routes included (`add_route`'s
`request`/`response`, or for the wire-protocol routes model and agent servers register untyped, `PROTOCOL_DOCS`);
`GET /docs` is its Swagger UI (which loads its script and style sheet from a CDN). `GET /metrics` is described in
`gymfleet.metrics`.

Every other route requires the fleet's token (`gymfleet.auth`, checked by `gymfleet.serving.guard`) when the server
runs in a fleet (the token the supervisor hands it, `gymfleet.auth.hold`); a bare app (a test's `serve(app)`) checks
none.
`GET /` answers `{"status": "ok"}` to anyone; to a request carrying the fleet's token it also names the fleet and
the instance in `X-Gymfleet-Fleet` / `X-Gymfleet-Instance` headers, so the supervisor's readiness probe counts only
its own server, never another process that holds the same port, and says in `X-Gymfleet-Ready` whether a warm-up the
fleet waits for is still running or failed (`gymfleet.serving.warm_up`, where `Server.warm_up` is run).
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import typing
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from gymfleet import auth, http
from gymfleet.errors import (
    MAX_REPORTED_ERRORS,
    BadRequestError,
    BusyError,
    SessionLostError,
    TransportError,
    too_many_errors,
)
from gymfleet.masking import is_secret_key, redact
from gymfleet.metrics import LOCAL_HOP, MetricsMiddleware, ServerMetrics, target_of
from gymfleet.serving.fastpath import LeanFastAPI, OwnRoutesDirect, fastapi_options, own_routes_first
from gymfleet.serving.guard import RequestBodyTimeout, RequestBodyTooLarge, RequestGuardMiddleware
from gymfleet.serving.memory import release_freed_memory, release_memory_when_idle
from gymfleet.serving.openapi import PROTOCOL_DOCS, RouteDoc, add_route, openapi_schema  # noqa: F401  (re-exported)
from gymfleet.serving.read_pacer import IntakePacer
from gymfleet.serving.sessions import SESSION_LOST, SESSION_LOST_STATUS, SessionCookieMiddleware, cookie_name
from gymfleet.serving.warm_up import FAILED, READY_HEADER, READY_WAIT_HEADER, WarmUp

NOT_THE_CALLERS_FAULT = frozenset({401, 403, 410, 429})
"""Inner 4xx answers that are the fleet's problem, not the caller's: credentials the fleet holds (a wrong
`api_key` for the upstream model or judge; tagged `auth_failed`), a session lost with a restarted server (410
`session_lost`: `gymfleet.serving.sessions`) and overload. They become a 502."""
log = logging.getLogger(__name__)

FLEET_HEADER, INSTANCE_HEADER = auth.FLEET_HEADER, auth.INSTANCE_HEADER


class RayResources(BaseModel):
    """What one replica of a server asks of the Ray node it runs on (Ray's own actor options)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    num_cpus: float = Field(default=1.0, ge=0)
    """Logical CPUs reserved on the node (Ray's `num_cpus`)."""
    memory: int | str | None = None
    """Memory reserved on the node: bytes, or a size such as `2GiB`, `512MiB`, `4GB` (Ray's `memory`)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom node resources, e.g. `{sandbox_node: 1}` to run only on nodes started with that resource."""


class ReplicaAddress(BaseModel):
    """Where one replica of a server listens (published by the head server under Ray placement)."""

    model_config = ConfigDict(extra="forbid")

    host: str
    port: int


class ServerConfig(BaseModel):
    """Fields every server instance accepts. Subclasses add their own; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str = ""
    """Instance name (the top-level config key); filled in by the launcher."""
    entrypoint: str = "app.py"
    """File (relative to the implementation folder) that defines the server class."""
    host: str = "127.0.0.1"
    port: int = 0
    num_workers: int | None = None
    """Worker processes behind one port (uvicorn workers)."""
    num_replicas: int = Field(default=1, ge=1)
    """Copies of this server, each with its own address, placed on a Ray cluster's nodes (`placement: ray`, see
    `gymfleet.fleet.ray_placement`); clients spread rollouts over them, each rollout sticking to one."""
    ray_resources: RayResources | None = None
    """What each replica asks of its Ray node (`num_cpus`, `memory`, custom `resources`); None: the server class's
    `ray_resources_default`. Ignored without Ray placement."""
    replicas: list[ReplicaAddress] | None = None
    """Every replica's address, filled in by the fleet under Ray placement (the first is `host`/`port`)."""
    domain: str | None = None
    """Resources servers' task domain (NeMo-Gym enum)."""
    verified: bool | None = None
    description: str | None = None
    value: str | None = None
    license: str | None = None
    datasets: list[dict[str, Any]] | None = None
    """Datasets declared on this instance (read by `ng_prepare_data`)."""
    max_request_body_mb: float = Field(default=64.0, gt=0)
    """Largest request body this server reads, in MiB; a larger one is answered 413 before it is held in memory."""
    request_body_timeout_s: float = Field(default=30.0, gt=0)
    """Deadline for receiving a whole request body; past it the request is answered 408 and the connection closed,
    so half-sent requests cannot pile up."""


class JSONResponse(Response):
    """orjson-encoded JSON response (several times faster than the stdlib encoder on rollout-sized bodies)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def dump(model: BaseModel) -> dict[str, Any]:
    """Wire form of a model: JSON-compatible, `None` fields kept only where they were set."""
    return model.model_dump(mode="json", exclude_unset=False, exclude_none=False)


class Server(WarmUp):
    """Base class: subclasses declare `config: <TheirConfig>` and add routes in `routes()`."""

    config: ServerConfig
    config_class: ClassVar[type[ServerConfig]] = ServerConfig
    ray_resources_default: ClassVar[dict[str, Any]] = {"num_cpus": 1}
    """What each replica asks of its Ray node when the config gives no `ray_resources` (CPU-heavy servers, such as
    the sandbox and the code environments, ask for more)."""
    intake: IntakePacer | None = None
    """How the server reads a burst of new connections' requests (`GatedServer` applies it; agents set one)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        hint = typing.get_type_hints(cls).get("config")
        if isinstance(hint, type) and issubclass(hint, ServerConfig):
            cls.config_class = hint

    def __init__(self, config: ServerConfig | dict[str, Any], global_config: dict[str, Any] | None = None):
        if isinstance(config, dict):
            config = self.config_class.model_validate(config)
        self.config = config
        self.global_config = global_config or {}
        self.client = http.ServerClient(self.global_config)
        self.metrics = ServerMetrics()

    @functools.cached_property
    def secret_values(self) -> tuple[str, ...]:
        """The secrets in this server's own config (values under secret-looking keys, header maps included): an
        upstream that echoes one in its error text has it replaced by `****` before the text is logged or answered."""
        found: list[str] = []

        def walk(node: Any, secret: bool) -> None:
            if isinstance(node, BaseModel):
                node = dict(node)
            if isinstance(node, SecretStr):
                node = node.get_secret_value()
            if isinstance(node, dict):
                for key, value in node.items():
                    walk(value, secret or is_secret_key(key))
            elif isinstance(node, list | tuple):
                for item in node:
                    walk(item, secret)
            elif secret and isinstance(node, str) and node:
                found.append(node)
                found.extend(part for part in node.split() if len(part) >= 8)  # `Bearer <key>`: the key alone too

        walk(self.config, False)
        return tuple(sorted(set(found), key=len, reverse=True))

    @property
    def cookie_name(self) -> str:
        return cookie_name(type(self).__name__, self.config.name or type(self).__name__)

    def fleet_identity(self, request: Request) -> dict[str, str]:
        """Headers of `GET /` that tell the supervisor this is its server (fleet token and instance name): only to a
        request that carries the fleet's token, so the token is never told to anyone who does not hold it."""
        token = auth.fleet_token()
        if not token or not auth.matches(auth.presented(request.headers.raw), token):
            return {}
        return {FLEET_HEADER: token, INSTANCE_HEADER: self.config.name}

    def head_address(self) -> tuple[str, int] | None:
        """Where this server's fleet's head server listens (from the global config), if known."""
        head = self.global_config.get("head_server")
        if isinstance(head, dict) and head.get("port") is not None:
            return str(head.get("host") or "127.0.0.1"), int(head["port"])
        return None

    def routes(self, app: FastAPI) -> None:
        """Register this server's routes on `app`."""

    @classmethod
    def single_process_reason(cls) -> str | None:
        """Why this server cannot run as several worker processes behind one port (`num_workers > 1`), or None."""
        return None

    def lost_session_refusal(self, scope: dict[str, Any]) -> str | None:
        """Why a request whose session died with an earlier process of this server cannot be served (answered 410
        `session_lost`: `gymfleet.serving.sessions`), or None to serve it on a fresh session. Default: serve it."""
        return None

    @classmethod
    def preload(cls) -> None:
        """Load, once per fleet, what every process of this server shares and only reads (tokenizer models, language
        profiles): `ng_run`'s zygote calls it before forking the servers, so they start with it loaded and share its
        pages (`gymfleet.fleet.zygote`). Must start no thread and open no connection or event loop. Default: nothing.
        """

    async def startup(self) -> None:
        """Called once when the app starts serving."""

    async def shutdown(self) -> None:
        """Called once when the app stops."""
        await http.close()

    def create_app(self) -> FastAPI:
        """Build the FastAPI app for this server."""

        @asynccontextmanager
        async def lifespan(app: FastAPI):
            await self.startup()
            if type(self).warm_up is not WarmUp.warm_up:
                self._start_warm_up()
            gc.freeze()  # what start-up built lives as long as the server: out of every later collection's scan
            try:
                yield
            finally:
                gc.unfreeze()
                await self._stop_warm_up()
                await self.shutdown()

        app = LeanFastAPI(
            title=f"{type(self).__name__} ({self.config.name})",
            description=(type(self).__doc__ or "").strip(),
            lifespan=lifespan,
            docs_url="/docs",
            redoc_url=None,
            **fastapi_options(),
        )
        app.state.server = self
        app.openapi = lambda: openapi_schema(app)

        @app.get("/", include_in_schema=False)
        async def liveness(request: Request) -> Response:
            identity = self.fleet_identity(request)
            if not identity:
                return JSONResponse({"status": "ok"})
            # The fleet's probe: a failed start-up check stops the fleet with its error.
            state, error = await self.readiness_within(request.headers.get(READY_WAIT_HEADER))
            body = {"status": "ok", "detail": error} if state == FAILED else {"status": "ok"}
            return JSONResponse(body, headers={**identity, READY_HEADER: state})

        app.add_route("/metrics", self.metrics.endpoint, include_in_schema=False)
        framework = list(app.router.routes)
        self.routes(app)
        own_routes_first(app, framework)
        app.add_exception_handler(RequestValidationError, self._on_validation_error)
        app.add_exception_handler(TransportError, self._on_transport_error)
        app.add_exception_handler(BadRequestError, self._on_bad_request)
        app.add_exception_handler(SessionLostError, self._on_session_lost)
        app.add_exception_handler(BusyError, self._on_busy)
        app.add_exception_handler(RequestBodyTimeout, self._on_body_timeout)
        app.add_exception_handler(RequestBodyTooLarge, self._on_body_too_large)
        app.add_exception_handler(ClientDisconnect, self._on_client_disconnect)
        app.add_exception_handler(Exception, self._on_error)
        app.add_middleware(OwnRoutesDirect, router=app.router)  # innermost: see gymfleet.serving.fastpath
        app.add_middleware(SessionCookieMiddleware, name=self.cookie_name, refuse=self.lost_session_refusal)
        app.add_middleware(RequestGuardMiddleware, loopback_only=auth.is_loopback(self.config.host),
                           max_body_bytes=int(self.config.max_request_body_mb * 2**20),
                           token=auth.server_token() or None, head=self.head_address(),
                           body_timeout_s=self.config.request_body_timeout_s)
        app.add_middleware(MetricsMiddleware, metrics=self.metrics, on_idle=release_memory_when_idle)
        return app

    async def _on_validation_error(self, request: Request, exc: RequestValidationError) -> Response:
        errors = _capped(exc.errors())
        log.warning("%s %s: invalid request: %s", request.method, request.url.path, _describe(errors))
        if errors[-1:] and errors[-1]["type"] == "too_many_errors":
            release_freed_memory()
        return JSONResponse({"detail": errors}, status_code=422)

    async def _on_body_timeout(self, request: Request, exc: RequestBodyTimeout) -> Response:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return JSONResponse(
            {"detail": f"{self.config.name}: {exc}", "error_type": "request_body_timeout"},
            status_code=408,
            headers={"Connection": "close"},
        )

    async def _on_body_too_large(self, request: Request, exc: RequestBodyTooLarge) -> Response:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": f"{self.config.name}: {exc}", "error_type": "request_too_large"},
                            status_code=413, headers={"Connection": "close"})

    async def _on_client_disconnect(self, request: Request, exc: ClientDisconnect) -> Response:
        log.info("%s %s: the client disconnected before sending the whole request", request.method, request.url.path)
        return Response(status_code=499)  # nobody reads it; 499 is what the request counts as in /metrics

    async def _on_bad_request(self, request: Request, exc: BadRequestError) -> Response:
        log.warning("%s %s: bad request: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": str(exc), "error_type": "bad_request"}, status_code=400)

    async def _on_busy(self, request: Request, exc: BusyError) -> Response:
        log.warning("%s %s: busy: %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": f"{self.config.name}: {exc}", "error_type": "busy"}, status_code=429,
                            headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))})

    async def _on_session_lost(self, request: Request, exc: SessionLostError) -> Response:
        log.warning("%s %s: %s: %s", request.method, request.url.path, SESSION_LOST, exc)
        self.metrics.failures.labels(SESSION_LOST, LOCAL_HOP).inc()
        return JSONResponse({"detail": f"{self.config.name}: {exc}", "error_type": SESSION_LOST},
                            status_code=SESSION_LOST_STATUS)

    async def _on_transport_error(self, request: Request, exc: TransportError) -> Response:
        if exc.status is not None and 400 <= exc.status < 500 and exc.status not in NOT_THE_CALLERS_FAULT:
            # The inner server rejected what we forwarded from the caller (e.g. a row missing the fields the
            # environment needs): the caller's fault, so pass the 4xx on instead of blaming the fleet with a 5xx.
            message = redact(str(exc), self.secret_values)
            log.warning("%s %s: inner server rejected the request: %s", request.method, request.url.path, message)
            return JSONResponse({"detail": f"{self.config.name}: {message}", "error_type": "inner_request_rejected",
                                 "upstream_status": exc.status}, status_code=exc.status)
        message = redact(str(exc), self.secret_values)
        log.error("%s %s: inner call failed: %s", request.method, request.url.path, message)
        failure_class = "auth_failed" if exc.status in (401, 403) else exc.failure_class
        self.metrics.failures.labels(failure_class, target_of(exc.url)).inc()
        return JSONResponse(
            {
                "detail": f"{self.config.name}: inner call failed: {message}",
                "error_type": failure_class,
                "upstream_status": exc.status,
            },
            status_code=502,
        )

    async def _on_error(self, request: Request, exc: Exception) -> Response:
        log.exception("%s %s: unhandled %s", request.method, request.url.path, type(exc).__name__)
        self.metrics.failures.labels("server_error", LOCAL_HOP).inc()
        message = redact(str(exc), self.secret_values)
        return JSONResponse(
            {"detail": f"{self.config.name}: {type(exc).__name__}: {message}", "error_type": "server_error"},
            status_code=500,
        )


def _capped(errors: Any) -> list[dict[str, Any]]:
    """JSON-safe errors: at most `MAX_REPORTED_ERRORS`, plus one entry counting the rest (if not there already)."""
    if len(errors) <= MAX_REPORTED_ERRORS + 1:  # a list `gymfleet.serving.bodies.validate` capped, or a short one
        return [_jsonable_error(error) for error in errors]
    listed = [_jsonable_error(error) for error in errors[:MAX_REPORTED_ERRORS]]
    return listed + too_many_errors(len(errors), len(listed), ("body",))


def _describe(errors: list[dict[str, Any]], shown: int = 3) -> str:
    """One log line for a 422: its first `shown` errors, then how many more (the count entry's words if any).

    Each error's location is cut to `LOG_LOC_CHARS`: a location holds the client's keys, and a body with a
    megabyte-long key must not write a megabyte log line per request.
    """
    parts = [f"{_clip('.'.join(map(str, e['loc'])))}: {_clip(str(e['msg']))}" for e in errors[:shown]]
    if len(errors) > shown:
        last = errors[-1]
        parts.append(last["msg"] if last["type"] == "too_many_errors" else f"... and {len(errors) - shown} more")
    return "; ".join(parts)


LOG_LOC_CHARS = 200


def _clip(text: str) -> str:
    return text if len(text) <= LOG_LOC_CHARS else f"{text[:LOG_LOC_CHARS]}... ({len(text)} chars)"


def _jsonable_error(error: dict[str, Any]) -> dict[str, Any]:
    """Pydantic error dicts may hold exceptions in `ctx`; keep only JSON-safe parts."""
    clean = {key: error[key] for key in ("type", "loc", "msg") if key in error}
    if "input" in error and isinstance(error["input"], str | int | float | bool | None):
        clean["input"] = error["input"]
    return clean


def _ref_name(value: Any) -> Any:
    if isinstance(value, dict) and set(value) <= {"type", "name"} and "name" in value:
        return value["name"]
    return value


ServerRef = typing.Annotated[str, BeforeValidator(_ref_name)]
"""A reference to another instance: NeMo-Gym's `{type, name}` dict or, as sugar, the plain instance name."""
