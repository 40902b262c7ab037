"""NeMo-Gym's own agents (`responses_api_agents/<name>/app.py`, subclasses of `SimpleResponsesAPIAgent`), served by
gymfleet's server core with NeMo-Gym 0.7.0's behaviour.

An agent folder defines a pydantic model subclassing `SimpleResponsesAPIAgent` with `responses` and `run` (and, for
Environment Server episodes, `_seed_agent_session_state` / `_close_agent_session_state`); it is built as
`Agent(config=..., server_client=...)` and makes its FastAPI app in `setup_webserver()`. Here that app is gymfleet's
(`NeMoGymAgentHost`: `GET /` liveness with the fleet's identity, `GET /metrics`, the request guard and body deadline,
signed session cookies under NeMo-Gym's name `<AgentClass>___<instance>`), holding 0.7.0's routes:

- `POST /v1/responses` (also under `/ng-rollout/{rollout_id}/` and `/ng-rollout/{rollout_id}/training-token-capture/`,
  where a self-call made with `url_path_for_run` lands; the agent reads the rollout id from the path);
- `POST /run` (inside `rollout_context` of the run's rollout id when capture is on), `POST /aggregate_metrics`;
- `POST /v1/agent_sessions` and `POST /v1/agent_sessions/close`: the agent-session lifecycle, as 0.7.0's: seeding is
  idempotent per caller id (a retry with the same request reuses the state, another request under that id is a 409),
  the session cookie binds later activations and the close to their session, a close answer is kept for
  `session_close_retry_window_seconds` so a retried close gets the same answer and a late seed is refused, a failed
  setup (`AgentSessionSetupError`) keeps its partial state for the close, never for an activation.

Its `ServerClient` calls (the model, the resources server, its own `/v1/responses`) resolve servers by name from the
fleet config, with the fleet's token, deadlines and bounded retries (`gymfleet.serving.nemo_gym_client`). An error is
answered as 0.7.0 answers it where its callers read the answer: an inner server's non-2xx answer that the agent
raised (`raise_for_status`) is a 500 whose JSON body is the string `Hit an exception in <key> calling an inner server:
<the inner answer>` (and the header `x-gymfleet-error-type: upstream_error`); a call that got no answer is gymfleet's
typed 502 (`connection_error`, `timeout`); any other exception is gymfleet's typed 500 (`server_error`).
`NeMoGymAgentHost` is what `ng_run` serves for such a folder (`agent_host_class_for`), so supervision, restarts, the
zygote and Ray placement are gymfleet's; an agent built by a test (`Agent(config=..., server_client=...)`, then
`setup_webserver()`) gets a host of its own.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from time import monotonic
from typing import Any, ClassVar

from fastapi import Body, FastAPI, HTTPException, Request
from pydantic import ConfigDict, PrivateAttr
from starlette.responses import Response as StarletteResponse

from gymfleet.errors import TransportError
from gymfleet.masking import redact
from gymfleet.metrics import LOCAL_HOP
from gymfleet.serving.nemo_gym_agent import (
    AGENT_SESSION_COOKIE_KEY,
    AgentCloseSessionRequest,
    AgentCloseSessionResponse,
    AgentSeedSessionRequest,
    AgentSeedSessionResponse,
    AgentSessionSetupError,
    AgentSessionState,
    BaseResponsesAPIAgent,
    BaseResponsesAPIAgentConfig,
    ToolAccess,
)
from gymfleet.serving.nemo_gym_client import HTTPStatusError, get_first_server_config_dict
from gymfleet.serving.nemo_gym_metrics import AggregateMetricsMixin, compute_aggregate_metrics
from gymfleet.serving.nemo_gym_own_clients import (
    send_fleet_token_from_own_clients,
    stop_sending_fleet_token_from_own_clients,
)
from gymfleet.serving.nemo_gym_rollout import (
    ROLLOUT_PATH_PREFIX,
    TOKEN_CAPTURE_PATH_SEGMENT,
    apply_rollout_prefix,
    maybe_rollout_id_from_run_body,
    rollout_context,
    rollout_path_prefix,
)
from gymfleet.serving.nemo_gym_server import (
    SimpleServer,
    build_folder,
    defined_subclasses,
    host_class,
    plain_or_empty,
    type_hints,
)
from gymfleet.serving.nemo_gym_types import AggregateMetrics, AggregateMetricsRequest, EpisodeId
from gymfleet.serving.server import JSONResponse, Server, ServerConfig

log = logging.getLogger(__name__)

OBSERVABILITY_ENABLED_KEY_NAME = "observability_enabled"
TOKEN_ID_CAPTURE_BLOCK = "token_id_capture"
ERROR_TYPE_HEADER = "x-gymfleet-error-type"
_BODY = Body()


@dataclass
class _SessionRecord:
    """One agent session id's state: its lock, its live state, and once closed the close answer kept for retries."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    state: AgentSessionState | None = None
    closing: bool = False
    episode_id: EpisodeId | None = None
    close_response: AgentCloseSessionResponse | None = None
    expires_at: float = math.inf


class SimpleResponsesAPIAgent(BaseResponsesAPIAgent, AggregateMetricsMixin, SimpleServer):
    """The class NeMo-Gym's agents subclass: implement `responses` and `run` (module docstring)."""

    config: BaseResponsesAPIAgentConfig
    _session_records: dict[str, _SessionRecord] = PrivateAttr(default_factory=dict)
    _closed_records: OrderedDict[str, _SessionRecord] = PrivateAttr(default_factory=OrderedDict)
    _gymfleet_host: NeMoGymAgentHost | None = PrivateAttr(default=None)

    def setup_webserver(self) -> FastAPI:
        if self._gymfleet_host is None:  # built by a test, not by ng_run: a host of its own
            agent_host_class_for(type(self))(None, plain_or_empty(self.server_client), folder=self)
        return self._gymfleet_host.build_app()

    async def responses(self, body: Any = _BODY) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement responses()")

    async def run(self, body: Any = _BODY) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement run()")

    async def aggregate_metrics(self, body: AggregateMetricsRequest = _BODY) -> AggregateMetrics:
        """Metrics over verify responses with this agent's hooks; none when verification is skipped (0.7.0)."""
        if self.config.skip_verification:
            log.warning("%s: skip_verification=True, so no aggregate metrics (disable_aggregation avoids the call)",
                        self.config.name)
            return AggregateMetrics()
        return compute_aggregate_metrics(body.verify_responses, compute_metrics_fn=self.compute_metrics,
                                         get_key_metrics_fn=self.get_key_metrics)

    # ------------------------------------------------------------------------------------------- agent sessions

    @asynccontextmanager
    async def _locked_agent_session(self, session_id: str) -> AsyncIterator[_SessionRecord]:
        """The record of `session_id`, held under its lock (expired close answers are dropped first; a record that
        ends with neither state nor close answer is forgotten)."""
        now = monotonic()
        while self._closed_records:
            key, record = next(iter(self._closed_records.items()))
            if record.expires_at > now:
                break
            self._closed_records.pop(key)
            self._session_records.pop(key, None)
        while True:
            record = self._session_records.setdefault(session_id, _SessionRecord())
            async with record.lock:
                if self._session_records.get(session_id) is not record:
                    continue  # replaced while this caller waited: take the new record's lock instead
                try:
                    yield record
                finally:
                    if record.state is None and record.close_response is None:
                        self._session_records.pop(session_id, None)
                return

    @staticmethod
    def _agent_session_id_from_request(request: Request | None) -> str | None:
        """The agent session id the request's session cookie carries, if any (an invalid one is a 409)."""
        session = getattr(request, "scope", {}).get("session") if request is not None else None
        if not isinstance(session, Mapping) or AGENT_SESSION_COOKIE_KEY not in session:
            return None
        marker = session[AGENT_SESSION_COOKIE_KEY]
        if not isinstance(marker, str) or not marker:
            raise HTTPException(409, "Invalid agent session marker")
        return marker

    def _require_agent_session(self, agent_session_id: str) -> AgentSessionState:
        record = self._session_records.get(agent_session_id)
        if record is None or record.state is None or record.closing:
            raise HTTPException(409, "Unknown or closing agent_session_id")
        return record.state

    def effective_tool_accesses(self, request: AgentSeedSessionRequest) -> list[ToolAccess]:
        """The configured tool accesses, those of the session's request replacing any of the same name."""
        accesses = {access.name: access for access in self.config.tool_accesses}
        accesses.update((access.name, access) for access in request.tool_accesses)
        return list(accesses.values())

    async def seed_agent_session(self, request: Request, body: AgentSeedSessionRequest) -> AgentSeedSessionResponse:
        """Seed the session `body.agent_session_id` once; the same request again reuses its state."""
        if self.config.num_workers not in (None, 1):
            raise ValueError("Agent sessions require num_workers=1")
        current = self._agent_session_id_from_request(request)
        if current is not None and current != body.agent_session_id:
            raise HTTPException(409, "agent_session_id does not match the session cookie")
        async with self._locked_agent_session(body.agent_session_id) as record:
            if record.close_response is not None:
                raise HTTPException(409, "Agent session is already closed")
            if record.closing:
                raise HTTPException(409, "Agent session is closing")
            if record.state is None:
                if current is not None:
                    raise HTTPException(409, "Agent session cookie has expired")
                record.episode_id = body.episode_id
                try:
                    record.state = await self._seed_agent_session_state(body.model_copy(deep=True))
                except AgentSessionSetupError as error:
                    record.state, record.closing = error.state, True  # kept for the close, never activated
                    raise error.error from None
            elif record.state.request != body:
                raise HTTPException(409, "agent_session_id is already bound to another seed request")
            request.session[AGENT_SESSION_COOKIE_KEY] = body.agent_session_id
            return AgentSeedSessionResponse(agent_session_id=body.agent_session_id)

    async def close_agent_session(self, request: Request, body: AgentCloseSessionRequest) -> AgentCloseSessionResponse:
        """Close the session; its answer (observations included) is kept for the retry window. A close of an unknown
        id is answered and remembered too, so a seed arriving after it is refused."""
        if type(self)._close_agent_session_state is SimpleResponsesAPIAgent._close_agent_session_state:
            raise NotImplementedError("This agent does not implement episode sessions")
        current = self._agent_session_id_from_request(request)
        if current is not None and current != body.agent_session_id:
            raise HTTPException(409, "agent_session_id does not match the session cookie")
        async with self._locked_agent_session(body.agent_session_id) as record:
            if record.episode_id is not None and record.episode_id != body.episode_id:
                raise HTTPException(409, "episode_id does not match the seeded agent session")
            if record.close_response is not None:
                return record.close_response.model_copy(deep=True)
            if record.state is None:
                if current is not None:
                    raise HTTPException(409, "Agent close receipt has expired")
                result = AgentCloseSessionResponse(agent_session_id=body.agent_session_id)
            else:
                record.closing = True
                result = await self._close_agent_session_state(record.state)  # raises: state kept for a retry
            record.state, record.episode_id = None, body.episode_id
            record.close_response = result.model_copy(deep=True)
            record.expires_at = monotonic() + self.config.session_close_retry_window_seconds
            self._closed_records[body.agent_session_id] = record
            request.session[AGENT_SESSION_COOKIE_KEY] = body.agent_session_id  # a stale /v1/responses stays refused
            return result

    async def _seed_agent_session_state(self, body: AgentSeedSessionRequest) -> AgentSessionState:
        raise NotImplementedError("This agent does not implement episode sessions")

    async def _close_agent_session_state(self, state: AgentSessionState) -> AgentCloseSessionResponse:
        raise NotImplementedError("This agent does not implement episode sessions")

    # ------------------------------------------------------------------------------- rollout correlation paths

    def _global_config(self) -> Mapping[str, Any] | None:
        config = getattr(self.server_client, "global_config_dict", None)
        return config if isinstance(config, Mapping) else None

    def _model_call_capture_enabled(self) -> bool:
        config = self._global_config()
        return bool(config.get(OBSERVABILITY_ENABLED_KEY_NAME, False)) if config is not None else False

    def _token_id_capture_enabled(self) -> bool:
        config = self._global_config()
        block = (config.get(TOKEN_ID_CAPTURE_BLOCK) or {}) if config is not None else {}
        if not isinstance(block, Mapping) or not block.get("enabled", False):
            return False
        return bool(block.get("all_agents", False)) or bool(self.config.token_id_capture)

    def _capture_correlation_enabled(self) -> bool:
        return self._model_call_capture_enabled() or self._token_id_capture_enabled()

    def rollout_id_from_run(self, body: Any) -> str | None:
        """The run's rollout id when capture is on and the body has one, else None."""
        return maybe_rollout_id_from_run_body(body) if self._capture_correlation_enabled() else None

    def url_path_for_run(self, url_path: str, body: Any) -> str:
        return rollout_path_prefix(self.rollout_id_from_run(body),
                                   token_capture=self._token_id_capture_enabled()) + url_path

    def base_url_for_run(self, base_url: str, body: Any) -> str:
        return apply_rollout_prefix(base_url, self.rollout_id_from_run(body),
                                    token_capture=self._token_id_capture_enabled())

    def url_path_for_request(self, url_path: str, request: Request | None) -> str:
        """`url_path` under the rollout prefix the inbound request came with (none: unchanged)."""
        params = getattr(request, "path_params", None)
        rollout_id = params.get("rollout_id") if isinstance(params, Mapping) else None
        token_capture = f"/{TOKEN_CAPTURE_PATH_SEGMENT}/" in getattr(getattr(request, "url", None), "path", "")
        return rollout_path_prefix(rollout_id, token_capture=token_capture) + url_path

    def resolve_model_base_url(self, model_server_name: str, rollout_id: str | None = None) -> str:
        fields = get_first_server_config_dict(self.server_client.global_config_dict, model_server_name)
        base_url = self.server_client._build_server_base_url(fields)
        return f"{apply_rollout_prefix(base_url, rollout_id, token_capture=self._token_id_capture_enabled())}/v1"


class NeMoGymAgentHostConfig(ServerConfig):
    """gymfleet's server fields; every other field is the agent's (its config class validates them)."""

    model_config = ConfigDict(extra="allow")


class NeMoGymAgentHost(Server):
    """Serves one NeMo-Gym agent folder instance behind gymfleet's core (module docstring)."""

    config: NeMoGymAgentHostConfig
    folder_class: ClassVar[type[SimpleResponsesAPIAgent]] = SimpleResponsesAPIAgent

    def __init__(self, config: NeMoGymAgentHostConfig | dict[str, Any] | None,
                 global_config: dict[str, Any] | None = None, *, folder: SimpleResponsesAPIAgent | None = None):
        if folder is not None:
            config = folder.config.model_dump(mode="json")
        super().__init__(config, global_config)
        if folder is None:
            folder = build_folder(self.folder_class, self.config, self.global_config)
        else:
            self.config.name = folder.config.name
        folder._gymfleet_host = self
        self.folder = folder

    @classmethod
    def single_process_reason(cls) -> str | None:
        return "a NeMo-Gym agent keeps its agent sessions in one process's memory (0.7.0: num_workers=1)"

    @property
    def cookie_name(self) -> str:
        return self.folder.get_session_middleware_key()

    async def startup(self) -> None:
        await super().startup()
        send_fleet_token_from_own_clients()

    async def shutdown(self) -> None:
        stop_sending_fleet_token_from_own_clients()
        await super().shutdown()

    def create_app(self) -> FastAPI:
        app = self.folder.setup_webserver()
        if getattr(app.state, "server", None) is not self:
            raise TypeError(f"{type(self.folder).__name__}.setup_webserver() builds a FastAPI app of its own: "
                            "gymfleet serves NeMo-Gym agents on the app SimpleResponsesAPIAgent.setup_webserver() "
                            "returns")
        return app

    def build_app(self) -> FastAPI:
        app = Server.create_app(self)
        app.add_middleware(AnswerUntypedErrors, on_error=self._on_error)
        return app

    def routes(self, app: FastAPI) -> None:
        folder = self.folder
        app.post("/v1/responses")(folder.responses)
        app.post(f"/{ROLLOUT_PATH_PREFIX}/{{rollout_id}}/v1/responses")(folder.responses)
        app.post(f"/{ROLLOUT_PATH_PREFIX}/{{rollout_id}}/{TOKEN_CAPTURE_PATH_SEGMENT}/v1/responses")(folder.responses)
        app.post("/run")(self._run_endpoint())
        app.post("/aggregate_metrics")(folder.aggregate_metrics)
        app.post("/v1/agent_sessions")(folder.seed_agent_session)
        app.post("/v1/agent_sessions/close")(folder.close_agent_session)

    def _run_endpoint(self) -> Any:
        """The agent's `run`, with its own parameters, inside `rollout_context` of the run's rollout id."""
        run = self.folder.run

        @functools.wraps(run)
        async def endpoint(*args: Any, **kwargs: Any) -> Any:
            body = kwargs.get("body")
            if body is None:
                body = next((value for value in (*kwargs.values(), *args) if hasattr(value, "model_dump")), None)
            with rollout_context(self.folder.rollout_id_from_run(body)):
                return await run(*args, **kwargs)

        del endpoint.__wrapped__  # FastAPI reads the resolved signature below, not run's unresolved strings
        hints = type_hints(run)
        signature = inspect.signature(run)
        endpoint.__signature__ = signature.replace(
            parameters=[p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()],
            return_annotation=hints.get("return", signature.return_annotation))
        return endpoint

    async def _on_transport_error(self, request: Request, exc: TransportError) -> StarletteResponse:
        """An inner server's non-2xx answer the agent raised: 0.7.0's 500 with the inner answer in a JSON string."""
        if not isinstance(exc, HTTPStatusError):
            return await super()._on_transport_error(request, exc)
        inner = redact(str(exc.response_content), self.secret_values)
        log.warning("%s %s: an inner server answered %s: %s", request.method, request.url.path, exc.status,
                    inner[:500])
        self.metrics.failures.labels("upstream_error", LOCAL_HOP).inc()
        return JSONResponse(f"Hit an exception in {self.cookie_name} calling an inner server: {inner}",
                            status_code=500, headers={ERROR_TYPE_HEADER: "upstream_error"})


class AnswerUntypedErrors:
    """Answer an exception no handler typed with `on_error` (gymfleet's typed 500) here, as 0.7.0's exception
    middleware answers it, not in Starlette's outermost error middleware, which answers it too but then re-raises it
    to the server, which may drop the connection before the client has read the answer (pure ASGI)."""

    def __init__(self, app: Any, on_error: Any) -> None:
        self.app = app
        self.on_error = on_error

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def noting_start(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, noting_start)
        except Exception as exc:  # the boundary: whatever the agent raised, answered once, typed
            if started:
                raise
            answer = await self.on_error(Request(scope, receive), exc)
            await answer(scope, receive, send)


def agent_host_class_for(folder_class: type[SimpleResponsesAPIAgent]) -> type[NeMoGymAgentHost]:
    """The gymfleet server class that serves agent class `folder_class` (one per class, named as it)."""
    return host_class(folder_class, NeMoGymAgentHost)


def nemo_gym_agent_classes(module: Any) -> list[type[SimpleResponsesAPIAgent]]:
    """The NeMo-Gym agent classes a folder's module defines (not the ones it imports)."""
    return defined_subclasses(module, SimpleResponsesAPIAgent)
