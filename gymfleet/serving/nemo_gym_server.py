"""NeMo-Gym's server base classes (`SimpleResourcesServer` and its bases), served by gymfleet's own server core.

A NeMo-Gym environment folder defines a pydantic model that subclasses `SimpleResourcesServer`, is built as
`Folder(config=..., server_client=...)`, and makes its FastAPI app in `setup_webserver()` (adding its tool routes
with `app.post("/tool")(self.tool)` after `super().setup_webserver()`). Here:

- `SimpleResourcesServer.setup_webserver()` returns an app built by gymfleet (`gymfleet.serving.server.Server.
  create_app`): `GET /` liveness (with the fleet's identity headers), `GET /metrics`, the body deadline, the error
  mapping, and signed session cookies with NeMo-Gym's name (`<FolderClass>___<instance>`), value format and
  `request.session[SESSION_ID_KEY]`. On it: `POST /seed_session` (the folder's `seed_session`, FastAPI-injected as
  under NeMo-Gym: `request` and `body`), `POST /close_session` (`close_resources_session`), `POST /verify`,
  `POST /aggregate_metrics` (the folder's `compute_metrics` / `get_key_metrics` hooks,
  `gymfleet.serving.nemo_gym_metrics`), `GET /reverify_mode` (the config's `REVERIFY_MODE`),
  `GET /reward_provenance`.
- `/verify` calls the folder's `verify` with its own signature and answers its declared response model's fields
  (FastAPI's response-model filtering: undeclared fields are dropped, `_ng_rollout_id` excluded), plus
  `reward_provenance` (`environment`: the folder's name; `version`: `folder@<12 hex>` of the folder's files; the
  folder config's hash). A `JudgeError`, `SandboxError` or `TransportError` out of `verify`, or a verify past
  `verify_timeout_s`, is a failure row (`_ng_failure_class`, `mask_sample: true`, `failure_kind`,
  `failure_reason`; NeMo-Gym's `judge_failsafe` row for judges), never a reward; so is any exception out of `verify`
  after one of its `ServerClient` calls failed (a judge's error answer the folder parsed regardless:
  `gymfleet.serving.nemo_gym_upstream`), and out of any other route it is a typed 502; a non-finite reward is a 500.
- `NeMoGymResourcesHost` is the gymfleet `ResourcesServer` that holds one folder instance: `ng_run`'s launcher
  (`gymfleet.fleet.launch`) builds it (`host_class_for(FolderClass)`) from the instance's YAML fields (the folder's
  config validates them; a bad one is a `ConfigError` naming the instance), so supervision, restarts, the zygote,
  Ray placement, the `session_lost` refusal of a restarted server's old sessions (for folders that override
  `seed_session`) and `num_workers` checks are gymfleet's. A folder built by its own tests (`Folder(config=...,
  server_client=MagicMock(...))` then `setup_webserver()`) gets a host of its own, so its tests run on this surface.

A folder whose `setup_webserver` builds a FastAPI app of its own instead of extending `super()`'s (NeMo-Gym's Gymnasium
base: `/reset`, `/step`) is served the same way: its routes, middleware and hooks move into gymfleet's app
(`NeMoGymResourcesHost.adopt`), so liveness, metrics, deadlines and NeMo-Gym's session cookies are there too.

A folder whose config sets `expose_tools_over_mcp: true` also serves its tool routes over MCP at `/mcp`
(`gymfleet.serving.nemo_gym_mcp`; `mcp_tools` and `mcp_allowed_tools_for_session` tailor what it exposes).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import logging
import math
import typing
from pathlib import Path
from typing import Any, ClassVar

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, PrivateAttr, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response as StarletteResponse

from gymfleet.errors import ConfigError
from gymfleet.masking import redact
from gymfleet.metrics import LOCAL_HOP
from gymfleet.serving.nemo_gym_aiohttp import DisconnectCancelMiddleware
from gymfleet.serving.nemo_gym_client import (
    FAILURE_REASON_CHARS,
    ServerClient,
    failure_fields,
    served_config,
    set_served_config,
)
from gymfleet.serving.nemo_gym_mcp import CatchAll, MCPTool, maybe_auto_expose, normalize_tool_name
from gymfleet.serving.nemo_gym_metrics import AggregateMetricsMixin, compute_aggregate_metrics
from gymfleet.serving.nemo_gym_own_clients import (
    send_fleet_token_from_own_clients,
    stop_sending_fleet_token_from_own_clients,
)
from gymfleet.serving.nemo_gym_types import (
    AggregateMetrics,
    AggregateMetricsRequest,
    BaseResourcesServerConfig,
    BaseRunServerInstanceConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ResourcesCloseSessionRequest,
    ResourcesCloseSessionResponse,
    ResourcesSeedSessionRequest,
    ResourcesSeedSessionResponse,
    ReverifyMode,
)
from gymfleet.serving.nemo_gym_upstream import SCOPE_KEY, UpstreamWatchMiddleware, classify, watch_calls
from gymfleet.serving.provenance import PROVENANCE_KEY, config_hash, library_versions
from gymfleet.serving.resources import FAILURE_CLASSES, ResourcesServer, ResourcesServerConfig, _hop_of
from gymfleet.serving.server import JSONResponse
from gymfleet.serving.sessions import SessionCookieMiddleware

log = logging.getLogger(__name__)

IGNORED_IN_FOLDER_HASH = frozenset({"tests", "data", "__pycache__", ".pytest_cache"})
_FASTAPI_DEFAULT_PATHS = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
"""Routes every FastAPI app has; gymfleet's app brings its own."""


class BaseServer(BaseModel):
    """Every NeMo-Gym server: a pydantic model holding its `config`."""

    config: BaseRunServerInstanceConfig

    def setup_liveness(self, app: FastAPI) -> None:
        """Nothing to add: gymfleet's app answers `GET /` already."""


class SimpleServer(BaseServer):
    """A NeMo-Gym server with a `server_client` that builds its FastAPI app in `setup_webserver`."""

    server_client: ServerClient
    ray_enabled: ClassVar[bool | None] = None

    def setup_webserver(self) -> FastAPI:
        raise NotImplementedError(f"{type(self).__name__} must implement setup_webserver()")

    def get_session_middleware_key(self) -> str:
        """The session cookie's name and signing secret: `<ClassName>___<instance name>`, as NeMo-Gym's."""
        return f"{type(self).__name__}___{self.config.name}"

    def setup_session_middleware(self, app: FastAPI) -> None:
        """Session cookies with NeMo-Gym's name: gymfleet's app carries them already; an app the folder builds itself
        gets gymfleet's cookie middleware (so its own tests see `request.session`), and under `ng_run` is served
        inside gymfleet's app (`NeMoGymResourcesHost.adopt`)."""
        if getattr(app.state, "server", None) is None:
            app.add_middleware(SessionCookieMiddleware, name=self.get_session_middleware_key())

    def setup_exception_middleware(self, app: FastAPI) -> None:
        """Nothing to add: gymfleet's app maps errors already."""

    def setup_cancellation_middleware(self, app: FastAPI) -> None:
        """Cancel a request's handler when its client disconnects (0.7.0's; `gymfleet.serving.nemo_gym_aiohttp`)."""
        app.add_middleware(DisconnectCancelMiddleware)

    @classmethod
    def run_webserver(cls) -> None:
        """NeMo-Gym's `python app.py` start; under gymfleet a folder starts with `ng_run`."""
        raise RuntimeError(f"{cls.__name__}: start NeMo-Gym folders with ng_run \"+config_paths=[<folder>/configs/"
                           "<name>.yaml]\" (gymfleet serves them; app.py is not run as a script)")


class BaseResourcesServer(BaseServer):
    config: BaseResourcesServerConfig


class SimpleResourcesServer(BaseResourcesServer, AggregateMetricsMixin, SimpleServer):
    """The class NeMo-Gym environment folders subclass: override `verify` (and `seed_session`, tools, metrics)."""

    config: BaseResourcesServerConfig
    _gymfleet_host: NeMoGymResourcesHost | None = PrivateAttr(default=None)

    def setup_webserver(self) -> FastAPI:
        if self._gymfleet_host is None:  # built by the folder's own tests, not by ng_run: a host of its own
            host_class_for(type(self))(None, plain_or_empty(self.server_client), folder=self)
        return self._gymfleet_host.build_app()

    async def seed_session(self, body: ResourcesSeedSessionRequest | BaseSeedSessionRequest
                           ) -> ResourcesSeedSessionResponse | BaseSeedSessionResponse:
        """Seed per-rollout state; the default keeps none (an Environment Server's seed gets its id back)."""
        if isinstance(body, ResourcesSeedSessionRequest):
            return ResourcesSeedSessionResponse(resources_session_id=body.resources_session_id)
        return BaseSeedSessionResponse()

    async def close_resources_session(self, body: ResourcesCloseSessionRequest) -> ResourcesCloseSessionResponse:
        """Release what an Environment Server seeded (`/close_session`); the default keeps none."""
        return ResourcesCloseSessionResponse(resources_session_id=body.resources_session_id)

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        raise NotImplementedError(f"{type(self).__name__} must implement verify()")

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Metrics over verify responses, with this server's `compute_metrics` / `get_key_metrics` hooks."""
        return compute_aggregate_metrics(
            body.verify_responses, compute_metrics_fn=self.compute_metrics, get_key_metrics_fn=self.get_key_metrics)

    async def get_reverify_mode(self) -> ReverifyMode:
        return self.config.REVERIFY_MODE

    def normalize_tool_name(self, name: str) -> str:
        """A trajectory's tool name without this server's MCP namespace (`mcp__<server>__<tool>` -> `<tool>`)."""
        return normalize_tool_name(name, self.config.name or type(self).__name__)

    def mcp_tools(self, harvested: list[MCPTool], catchall: CatchAll | None) -> list[MCPTool] | None:
        """The tools served over MCP (`expose_tools_over_mcp`): by default every typed `POST /<tool>` route; override
        to filter them, add `catchall.tool(name, input_schema, description)` ones, or return None for none."""
        return harvested

    def mcp_allowed_tools_for_session(self, seed_body: dict[str, Any]) -> list[str] | None:
        """The tools one rollout's MCP token may call (`seed_body`: its `/seed_session` body, or an Environment
        Server seed's `task_data`); None, the default, for all."""
        return None


def plain_or_empty(client: Any) -> dict[str, Any]:
    """The global config a folder's client holds, or {} (a test's `MagicMock(spec=ServerClient)` holds none)."""
    config = getattr(client, "global_config_dict", None) if isinstance(client, ServerClient) else None
    if config is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        return OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else dict(config)
    except (TypeError, ValueError):
        return {}


class NeMoGymHostConfig(ResourcesServerConfig):
    """gymfleet's resources-server fields; every other field is the folder's (its config class validates them)."""

    model_config = ConfigDict(extra="allow")
    domain: str | None = None


def _folder_fields(config: BaseModel, config_class: type[BaseModel]) -> dict[str, Any]:
    """What the folder's config class validates: the fields the config gave (its YAML, the host and port the fleet
    chose) and the fields the class declares, as NeMo-Gym hands it its instance config; not gymfleet's defaults for
    fields of its own (`num_replicas`, `max_request_body_mb`, ...), which a folder whose config forbids extra keys
    (`extra="forbid"`) would refuse, nor gymfleet's unset None for a field the folder's class narrows
    (terminal_bench_4's `num_workers: Literal[1] = 1`)."""
    everything = config.model_dump(mode="json")
    given = config.model_dump(mode="json", exclude_unset=True)
    return {**{name: everything[name] for name in config_class.model_fields  # None: the folder's own default applies
               if everything.get(name) is not None}, **given}


def build_folder(cls: type[SimpleServer], config: BaseModel, global_config: dict[str, Any]) -> Any:
    """NeMo-Gym server class `cls` (a folder's) built as NeMo-Gym builds it, `cls(config=..., server_client=...)`:
    its config class validates the host's config (`_folder_fields`), its client calls the fleet of `global_config`.

    Raises:
        ConfigError: the folder's config class refuses the instance's fields (each error names the field).
    """
    config_class = cls.model_fields["config"].annotation
    fields = _folder_fields(config, config_class)
    where = getattr(config, "name", None) or cls.__name__
    try:
        folder_config = config_class.model_validate(fields)
    except ValidationError as exc:
        lines = [f"{where}.{'.'.join(map(str, error['loc']))}: {error['msg']} (got {_clip(error.get('input'))})"
                 for error in exc.errors()[:10]]
        raise ConfigError(f"invalid {config_class.__name__} config for NeMo-Gym folder {cls.__name__}:\n  "
                          + "\n  ".join(lines), path=where) from None
    set_served_config(global_config)
    from omegaconf import DictConfig

    client = ServerClient(head_server_config=global_config.get("head_server"),
                          global_config_dict=DictConfig(global_config))
    return cls(config=folder_config, server_client=client)


def folder_hash(folder: Path) -> str:
    """`folder@<12 hex>`: SHA-256 over the folder's files (path and bytes; tests, data and caches left out)."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or IGNORED_IN_FOLDER_HASH & set(relative.parts) or path.suffix == ".pyc":
            continue
        digest.update(str(relative).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"folder@{digest.hexdigest()[:12]}"


class NeMoGymResourcesHost(ResourcesServer):
    """Serves one NeMo-Gym folder instance behind gymfleet's core (module docstring); see `host_class_for`."""

    config: NeMoGymHostConfig
    folder_class: ClassVar[type[SimpleResourcesServer]] = SimpleResourcesServer
    _adopting = False

    def __init__(self, config: NeMoGymHostConfig | dict[str, Any] | None, global_config: dict[str, Any] | None = None,
                 *, folder: SimpleResourcesServer | None = None):
        if folder is not None:
            config = folder.config.model_dump(mode="json")
        super().__init__(config, global_config)
        if folder is None:
            folder = self._build_folder()
        else:
            self.config.name = folder.config.name
        folder._gymfleet_host = self
        self.folder = folder
        self.reverify_mode = ReverifyMode(type(folder.config).REVERIFY_MODE).value

    def _build_folder(self) -> SimpleResourcesServer:
        return build_folder(self.folder_class, self.config, self.global_config)

    async def startup(self) -> None:
        await super().startup()
        send_fleet_token_from_own_clients()  # a folder's own httpx clients on the fleet's addresses (gdpval's judges)

    async def shutdown(self) -> None:
        stop_sending_fleet_token_from_own_clients()
        await super().shutdown()

    @property
    def cookie_name(self) -> str:
        return self.folder.get_session_middleware_key()

    @classmethod
    def _keeps_session_state(cls) -> bool:
        return cls.folder_class.seed_session is not SimpleResourcesServer.seed_session

    def create_app(self) -> FastAPI:
        """The folder's app (`setup_webserver()`): the one `build_app` made, or, for a folder that builds a FastAPI
        app of its own (NeMo-Gym's Gymnasium base does), gymfleet's app holding that app's routes (`adopt`)."""
        app = self.folder.setup_webserver()
        app = app if getattr(app.state, "server", None) is self else self.adopt(app)
        maybe_auto_expose(self.folder, app)
        return app

    def build_app(self) -> FastAPI:
        """gymfleet's app for this folder, with NeMo-Gym's base routes (the folder adds its tools to it)."""
        app = ResourcesServer.create_app(self)
        app.add_middleware(UpstreamWatchMiddleware)
        return app

    async def _on_error(self, request: Request, exc: Exception) -> StarletteResponse:
        """An exception out of a route after one of its `ServerClient` calls failed: a typed 502 (as a
        `TransportError` is answered); any other: the base's untyped 500."""
        typed = classify(exc, request.scope.get(SCOPE_KEY) or [])
        if typed is None:
            return await super()._on_error(request, exc)
        failure_class, reason = typed
        log.warning("%s %s failed (%s): %s", request.method, request.url.path, failure_class, reason)
        self.metrics.failures.labels(failure_class, LOCAL_HOP).inc()
        return JSONResponse({"detail": f"{self.config.name}: {redact(reason, self.secret_values)}",
                             "error_type": failure_class}, status_code=502)

    def adopt(self, own: FastAPI) -> FastAPI:
        """gymfleet's app (liveness, metrics, body deadline, error mapping, session cookies, `/reward_provenance`)
        serving the routes, middleware, exception handlers and start/stop hooks of an app the folder built itself,
        in place of NeMo-Gym's base routes."""
        self._adopting = True
        try:
            app = ResourcesServer.create_app(self)
        finally:
            self._adopting = False
        app.add_middleware(UpstreamWatchMiddleware)
        app.router.routes.extend(route for route in own.router.routes if route.path not in _FASTAPI_DEFAULT_PATHS)
        app.user_middleware[:0] = [item for item in own.user_middleware if item.cls is not SessionCookieMiddleware]
        for key, handler in own.exception_handlers.items():
            app.exception_handlers.setdefault(key, handler)
        app.router.on_startup.extend(own.router.on_startup)
        app.router.on_shutdown.extend(own.router.on_shutdown)
        log.info("%s builds its own FastAPI app: serving its %d routes behind gymfleet's", self.config.name,
                 sum(route.path not in _FASTAPI_DEFAULT_PATHS for route in own.router.routes))
        return app

    def routes(self, app: FastAPI) -> None:
        if self._adopting:
            app.add_route("/reward_provenance", self._provenance_route, methods=["GET"], include_in_schema=False)
            return
        folder = self.folder
        app.post("/seed_session")(folder.seed_session)
        app.post("/close_session")(folder.close_resources_session)
        app.post("/verify", response_model=None)(self._verify_endpoint())
        app.post("/aggregate_metrics")(folder.aggregate_metrics)
        app.get("/reverify_mode")(folder.get_reverify_mode)
        app.add_route("/reward_provenance", self._provenance_route, methods=["GET"], include_in_schema=False)

    async def _provenance_route(self, request: Any) -> StarletteResponse:
        return JSONResponse(self.reward_provenance())

    def reward_provenance(self) -> dict[str, Any]:
        if self._provenance is None:
            folder = Path(inspect.getfile(self.folder_class)).resolve().parent
            self._provenance = {
                "environment": folder.name,
                "instance": self.config.name or self.folder_class.__name__,
                "version": folder_hash(folder),
                "config_hash": config_hash(self.folder.config),
                "libraries": library_versions(()),
            }
        return self._provenance

    def _verify_endpoint(self) -> Any:
        """The folder's `verify` as a FastAPI endpoint with its own parameters, answering its response model."""
        verify = self.folder.verify
        hints = type_hints(verify)
        answer = hints.get("return")
        adapter = TypeAdapter(answer) if isinstance(answer, type) and issubclass(answer, BaseModel) else None
        environment = self.config.name or type(self).__name__
        timeout_s = self.config.verify_timeout_s

        @functools.wraps(verify)
        async def endpoint(*args: Any, **kwargs: Any) -> StarletteResponse:
            body = kwargs.get("body") or next(
                (value for value in (*kwargs.values(), *args) if isinstance(value, BaseModel)), None)
            try:
                with watch_calls() as failed_calls:
                    async with asyncio.timeout(timeout_s):
                        result = await verify(*args, **kwargs)
            except TimeoutError:
                row = self._nemo_failure_row(body, "verify_timeout", f"verify took longer than {timeout_s:g}s",
                                             LOCAL_HOP)
            except tuple(FAILURE_CLASSES) as exc:
                failure_class = next(cls for error, cls in FAILURE_CLASSES.items() if isinstance(exc, error))
                log.warning("verify failed (%s): %s", failure_class, exc)
                row = self._nemo_failure_row(body, failure_class, str(exc), _hop_of(exc, failure_class))
            except Exception as exc:
                typed = None if isinstance(exc, HTTPException) else classify(exc, failed_calls)
                if typed is None:
                    raise  # the folder's own bug: an untyped 500
                failure_class, reason = typed[0], redact(typed[1], self.secret_values)
                log.warning("verify failed (%s): %s", failure_class, reason)
                row = self._nemo_failure_row(body, failure_class, reason, LOCAL_HOP)
            else:
                if isinstance(result, StarletteResponse):
                    return result
                row = _answer_row(result, answer, adapter)
            row[PROVENANCE_KEY] = self.reward_provenance()
            self.metrics.record_verify(environment, row)
            return JSONResponse(row)

        del endpoint.__wrapped__  # FastAPI reads the resolved signature below, not verify's unresolved strings
        signature = inspect.signature(verify)
        endpoint.__signature__ = signature.replace(
            parameters=[p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()],
            return_annotation=inspect.Signature.empty,
        )
        return endpoint

    def _nemo_failure_row(self, body: BaseModel | None, failure_class: str, reason: str, hop: str) -> dict[str, Any]:
        """NeMo-Gym's failure row (`failure_fields`; a judge's also `instance_config.mask_sample`, as 0.7.0's
        `judge_failsafe`) and gymfleet's (`_ng_failure_class`, `failure`), counted in `/metrics`."""
        echoed = body.model_dump(mode="json", by_alias=True) if body is not None else {}
        row = self._failure_row(echoed, failure_class, reason[:FAILURE_REASON_CHARS], hop)
        row.update(failure_fields(failure_class, reason))
        if failure_class == "judge_failed":  # 0.7.0's judge_failsafe also masks it where older NeMo-RL reads it
            instance = row.get("instance_config")
            row["instance_config"] = {**(instance if isinstance(instance, dict) else {}), "mask_sample": True}
        return row


def _clip(value: Any, chars: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= chars else f"{text[:chars]}..."


def type_hints(function: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function)
    except (NameError, TypeError):
        return {}


def _answer_row(result: Any, answer: Any, adapter: TypeAdapter | None) -> dict[str, Any]:
    """`result` as FastAPI answers it for a response model `answer`: validated into it, then dumped (by alias)."""
    if adapter is None:
        row = result.model_dump(mode="json", by_alias=True) if isinstance(result, BaseModel) else dict(result)
    elif type(result) is answer:
        row = result.model_dump(mode="json", by_alias=True)
    else:
        data = result.model_dump(by_alias=True) if isinstance(result, BaseModel) else result
        row = adapter.dump_python(adapter.validate_python(data), mode="json", by_alias=True)
    reward = row.get("reward")
    if not isinstance(reward, int | float) or isinstance(reward, bool) or not math.isfinite(reward):
        raise ValueError(f"verify returned a non-finite or non-numeric reward: {reward!r}")
    return row


_HOSTS: dict[type, type] = {}


def host_class(folder_class: type, base: type) -> type:
    """The gymfleet server class (a `base` subclass) that serves NeMo-Gym class `folder_class`: one per folder
    class, named and documented as it."""
    host = _HOSTS.get(folder_class)
    if host is None:
        host = type(folder_class.__name__, (base,), {
            "folder_class": folder_class, "__module__": folder_class.__module__, "__doc__": folder_class.__doc__,
            "__qualname__": folder_class.__qualname__,
        })
        _HOSTS[folder_class] = host
    return host


def host_class_for(folder_class: type[SimpleResourcesServer]) -> type[NeMoGymResourcesHost]:
    """The gymfleet server class that serves resources folder class `folder_class`."""
    return host_class(folder_class, NeMoGymResourcesHost)


def defined_subclasses(module: Any, base: type) -> list[type]:
    """The subclasses of `base` that `module` defines (not the ones it imports)."""
    return [obj for _, obj in inspect.getmembers(module, inspect.isclass)
            if issubclass(obj, base) and obj.__module__ == module.__name__]


def nemo_gym_server_classes(module: Any) -> list[type[SimpleResourcesServer]]:
    """The NeMo-Gym resources server classes a folder's module defines."""
    return defined_subclasses(module, SimpleResourcesServer)


def served_global_config() -> dict[str, Any] | None:
    """The fleet config of the folder this process serves (`nemo_gym.global_config.get_global_config_dict`)."""
    return served_config()
