"""`ResourcesServer`: one environment — session seeding, tools, and the reward.

The wire contract is NeMo-Gym's: `POST /seed_session` (the whole row; answers `{}` and sets the session cookie),
`POST /verify` (row + `response` in; the same JSON echoed with `reward` and the environment's fields out),
`POST /aggregate_metrics`, `GET /reverify_mode`, and one `POST /<tool>` per tool.

A subclass declares request/response models and implements `verify`; every public `async def` method whose single
argument is a pydantic model becomes a tool route named after the method:

    class WeatherServer(ResourcesServer):
        config: WeatherConfig

        async def get_weather(self, body: GetWeatherRequest) -> GetWeatherResponse: ...

        async def verify(self, body: WeatherRequest) -> WeatherResponse:
            return WeatherResponse.echo(body, reward=1.0)

Failure boundary (ARCHITECTURE decision 4): a `JudgeError` / `SandboxError` / `TransportError` raised inside
`verify`, or a verify that outlives `verify_timeout_s`, becomes an HTTP 200 row with `_ng_failure_class` set
(`judge_failed`, `sandbox_failed`, `transport_failed`, `verify_timeout`) and `failure` holding the reason, which
collectors route to the failures sidecar and keep out of rewards. A model's bad answer is `reward: 0.0`.
Bad tool arguments are the model's fault too: HTTP 200 with `{"error": ...}` it can read.

Sessions that outlive their process: an environment that keeps per-rollout state in memory (`keeps_session_state`;
by default, one that overrides `seed_session`) answers a tool call or `/verify` whose session cookie was issued by
an earlier process of this server (it crashed and `ng_run` restarted it) with HTTP 410 `session_lost`
(`gymfleet.serving.sessions`), never with its reward on an empty session; `/verify` of an environment whose reward
does not read the session (`reverify_mode = "stateless"`) is still served. Agents turn the 410 into a failure row.
Such an environment refuses `num_workers > 1` at start-up (the workers behind one port would each hold only some
sessions); `num_replicas` under Ray placement keeps each rollout on one replica.

Metrics (`gymfleet.metrics`): every `/verify` answer counts in `gymfleet_verify_results_total{environment, task,
outcome}` (the environment is the instance name), scored rows' rewards in `gymfleet_reward{environment, task}`, and
failure rows in `gymfleet_failures_total{failure_class, hop}` (the hop: the instance or upstream whose call failed,
`judge`/`sandbox` when the error does not say, `local` for a verify past its deadline), never as rewards.
`/openapi.json` shows `/verify` with the environment's own request and response classes (the latter or a
`VerifyFailureRow`), `/seed_session` and each tool with their argument and return types.

Provenance (`gymfleet.serving.provenance`): every `/verify` answer, failure rows included, carries `reward_provenance`:
`{environment, instance, version, config_hash, libraries, judge?}`, computed once per server (`reward_provenance()`,
cached). A subclass declares the libraries that decide its rewards in `reward_libraries` (distribution names, e.g.
`("math-verify", "sympy")`; `gymfleet` is always added); its version is the last `- vN:` entry of its module
docstring's `## Version history`; its judge, if any, is found from `self.judge` (a `JudgeClient`).
`GET /reward_provenance` answers the same object (`ng_reverify` keys its cache with it; not in `/openapi.json`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import types
import typing
from typing import Annotated, Any, ClassVar, Literal, Self

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response as StarletteResponse

from gymfleet.errors import MAX_REPORTED_ERRORS, JudgeError, SandboxError, TransportError, first_errors
from gymfleet.metrics import LOCAL_HOP, target_of
from gymfleet.serving.aggregate import aggregate_metrics
from gymfleet.serving.bodies import read_json, validate
from gymfleet.serving.deadline import finish_by
from gymfleet.serving.provenance import PROVENANCE_KEY
from gymfleet.serving.provenance import reward_provenance as compute_provenance
from gymfleet.serving.server import (
    PROTOCOL_DOCS,
    JSONResponse,
    RouteDoc,
    Server,
    ServerConfig,
    add_route,
    release_freed_memory,
)
from gymfleet.serving.sessions import SESSION_LOST
from gymfleet.wire import Response, ResponseCreateParams

log = logging.getLogger(__name__)

DOMAINS = (
    "math", "coding", "agent", "knowledge", "instruction_following", "long_context", "safety", "games",
    "translation", "e2e", "rlhf", "other",
)  # fmt: skip


class ResourcesServerConfig(ServerConfig):
    """Fields every resources server accepts."""

    domain: Literal[DOMAINS] | None = None  # type: ignore[valid-type]
    verify_timeout_s: float = 300.0
    """Deadline for one `/verify`; past it the row is a `verify_timeout` failure, never a hang."""


class SeedSessionRequest(BaseModel):
    """`/seed_session` body: the whole rollout row (fields a subclass does not declare are ignored)."""

    model_config = ConfigDict(extra="allow")


class VerifyRequest(BaseModel):
    """`/verify` body: the dataset row plus the model's `response`. Extra row fields are kept and echoed."""

    model_config = ConfigDict(extra="allow")
    responses_create_params: ResponseCreateParams
    response: Response


class VerifyResponse(VerifyRequest):
    """`/verify` answer: the request echoed, plus `reward` and the environment's own fields."""

    reward: float

    @classmethod
    def echo(cls, body: VerifyRequest, **fields: Any) -> Self:
        """The request echoed with `fields` (at least `reward`) added. No re-validation of the request."""
        values = {**body.__dict__, **(body.__pydantic_extra__ or {}), **fields}
        return cls.model_construct(**values)


class VerifyFailureRow(VerifyRequest):
    """`/verify` answer when infrastructure failed (judge, sandbox, an inner call, the deadline): the request echoed,
    `reward` 0.0 only to keep the schema, the failure's class and reason. Never a reward: collectors set it aside."""

    reward: float = 0.0
    failure_class: str = Field(alias="_ng_failure_class")
    failure: str


class ToolError(BaseModel):
    """A tool's answer to arguments it cannot use: a message the model can read (HTTP 200)."""

    error: str


class AggregateMetricsRequest(BaseModel):
    """`/aggregate_metrics` body."""

    model_config = ConfigDict(extra="allow")
    verify_responses: Annotated[list[dict[str, Any]], Field(fail_fast=True)]


PROTOCOL_DOCS["/aggregate_metrics"] = RouteDoc(AggregateMetricsRequest, dict[str, Any], "Metrics over /verify answers")


FAILURE_CLASSES: dict[type[Exception], str] = {
    JudgeError: "judge_failed",
    SandboxError: "sandbox_failed",
    TransportError: "transport_failed",
}

FAILURE_HOPS = {"judge_failed": "judge", "sandbox_failed": "sandbox"}
"""The hop a failure counts under when its error names no URL."""

_SESSIONLESS_ROUTES = frozenset({"/seed_session", "/aggregate_metrics"})
"""Routes served whatever the session: seeding starts a new one, aggregation reads none."""
_BASE_METHODS = frozenset(
    {"verify", "seed_session", "aggregate_metrics", "startup", "shutdown", "routes", "create_app"}
)


class ResourcesServer(Server):
    """Base class of every environment. Subclasses implement `verify` (and tools, and maybe `seed_session`)."""

    config: ResourcesServerConfig
    reverify_mode: ClassVar[Literal["stateless", "unsupported", "unknown"]] = "unknown"
    """Whether `/verify` can be re-run on a stored rollout without its session (for `gym eval reverify`)."""
    keeps_session_state: ClassVar[bool | None] = None
    """Whether tools (and `/verify`, unless `reverify_mode` is "stateless") read state that `seed_session` put in this
    process's memory, so that a session from an earlier process is refused as `session_lost`. None: whether the
    class overrides `seed_session`."""
    reward_libraries: ClassVar[tuple[str, ...]] = ()
    """Distributions (pip names) whose versions decide this environment's rewards, for `reward_provenance`."""
    _provenance: dict[str, Any] | None = None

    def reward_provenance(self) -> dict[str, Any]:
        """The `reward_provenance` every `/verify` answer carries (`gymfleet.serving.provenance`); computed once."""
        if self._provenance is None:
            self._provenance = compute_provenance(self)
        return self._provenance

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        raise NotImplementedError(f"{type(self).__name__} must implement verify()")

    async def seed_session(self, body: SeedSessionRequest) -> dict[str, Any]:
        """Prepare per-rollout state (keyed by `gymfleet.serving.sessions.session_id()`). Default: nothing."""
        return {}

    @classmethod
    def _keeps_session_state(cls) -> bool:
        if cls.keeps_session_state is not None:
            return cls.keeps_session_state
        return cls.seed_session is not ResourcesServer.seed_session

    @classmethod
    def single_process_reason(cls) -> str | None:
        if not cls._keeps_session_state():
            return None
        return (f"{cls.__name__} keeps each rollout's session in its process's memory, and the workers behind one "
                "port would each see only some of a rollout's calls")

    def lost_session_refusal(self, scope: dict[str, Any]) -> str | None:
        path = scope.get("path", "")
        if (not self._keeps_session_state() or scope.get("method") != "POST" or path in _SESSIONLESS_ROUTES
                or (path == "/verify" and self.reverify_mode == "stateless")):
            return None
        self.metrics.failures.labels(SESSION_LOST, LOCAL_HOP).inc()
        log.warning("POST %s: session %s was started by an earlier process of this server; refused as %s", path,
                    scope.get(SESSION_LOST), SESSION_LOST)
        return (f"{self.config.name}: POST {path}: this rollout's session was started by an earlier process of this "
                "server, which has exited (a crash and restart), and its state went with it; the rollout cannot "
                "go on. Run it again from /seed_session (ng_collect_rollouts +resume=true does).")

    def routes(self, app: FastAPI) -> None:
        verify_model = self.verify_request_model()
        seed_model = _body_model(type(self).seed_session, SeedSessionRequest)
        timeout_s = self.config.verify_timeout_s
        environment = self.config.name or type(self).__name__

        async def verify_route(request: Request) -> StarletteResponse:
            raw = await read_json(request)
            body = validate(verify_model, raw)
            await self.warmed()
            row = await self._verify_row(body, raw, timeout_s)
            row[PROVENANCE_KEY] = self.reward_provenance()  # replaces a stored row's when re-verified
            self.metrics.record_verify(environment, row)
            return JSONResponse(row)

        async def seed_route(request: Request) -> StarletteResponse:
            body = validate(seed_model, await read_json(request))
            return JSONResponse(_to_json(await self.seed_session(body)))

        async def aggregate_route(request: Request) -> StarletteResponse:
            body = validate(AggregateMetricsRequest, await read_json(request))
            return JSONResponse(self.aggregate_metrics(body.verify_responses))

        async def reverify_mode_route(request: Request) -> StarletteResponse:
            return JSONResponse(self.reverify_mode)

        async def provenance_route(request: Request) -> StarletteResponse:
            return JSONResponse(self.reward_provenance())

        verify_answer = _return_type(type(self).verify, VerifyResponse)
        add_route(app, "/verify", verify_route, request=verify_model, response=verify_answer | VerifyFailureRow,
                  summary="Score one rollout: the row echoed with its reward")
        add_route(app, "/seed_session", seed_route, request=seed_model,
                  response=_return_type(type(self).seed_session, dict[str, Any]),
                  summary="Start a rollout's session (sets the session cookie)")
        add_route(app, "/aggregate_metrics", aggregate_route, request=AggregateMetricsRequest,
                  response=dict[str, Any], summary="Metrics over /verify answers, overall and per task")
        add_route(app, "/reverify_mode", reverify_mode_route, methods=("GET",),
                  response=Literal["stateless", "unsupported", "unknown"],
                  summary="Whether /verify can be re-run on a stored rollout without its session")
        # Outside the wire protocol (NeMo-Gym has no such route), so left out of /openapi.json.
        app.add_route("/reward_provenance", provenance_route, methods=["GET"], include_in_schema=False)
        for name, method, model in self.tools():
            answer = _return_type(method, Any)
            add_route(app, f"/{name}", _tool_route(name, method, model), request=model,
                      response=answer | ToolError if isinstance(answer, type) else Any,
                      summary=_summary(method) or f"Tool {name}")

    @classmethod
    def verify_request_model(cls) -> type[VerifyRequest]:
        """The model `/verify` validates rows with (the annotation of `verify`'s argument)."""
        return _body_model(cls.verify, VerifyRequest)

    def tools(self) -> list[tuple[str, Any, type[BaseModel]]]:
        """`(name, bound method, argument model)` for every tool this server exposes."""
        found = []
        for name, function in inspect.getmembers(type(self), inspect.iscoroutinefunction):
            if name.startswith("_") or name in _BASE_METHODS or hasattr(ResourcesServer, name):
                continue
            model = _body_model(function, None)
            if model is not None:
                found.append((name, getattr(self, name), model))
        return found

    def aggregate_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        """Mean/max/min/median/std of every numeric field, overall and per task. Override to add metrics."""
        return aggregate_metrics(verify_responses)

    async def _verify_row(self, body: VerifyRequest, raw: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        try:
            result = await finish_by(asyncio.get_running_loop().time() + timeout_s, self.verify(body))
        except TimeoutError:
            return self._failure_row(raw, "verify_timeout", f"verify took longer than {timeout_s:g}s", LOCAL_HOP)
        except tuple(FAILURE_CLASSES) as exc:
            failure_class = next(cls for error, cls in FAILURE_CLASSES.items() if isinstance(exc, error))
            log.warning("verify failed (%s): %s", failure_class, exc)
            return self._failure_row(raw, failure_class, str(exc), _hop_of(exc, failure_class))
        return _merge_result(raw, result, type(body))

    def _failure_row(
        self, raw: dict[str, Any], failure_class: str, reason: str, hop: str = "unknown"
    ) -> dict[str, Any]:
        self.metrics.failures.labels(failure_class, hop).inc()
        return {**raw, "reward": 0.0, "_ng_failure_class": failure_class, "failure": reason}


def _hop_of(exc: BaseException, failure_class: str) -> str:
    """The hop a verify failure counts under: the URL of the first `TransportError` in its chain, if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, TransportError) and seen.url:
            return target_of(seen.url)
        seen = seen.__cause__ or seen.__context__
    return FAILURE_HOPS.get(failure_class, "unknown")


def _return_type(function: Any, default: Any) -> Any:
    """The return annotation of a handler, if it is a class (a model, `dict`); else `default`."""
    try:
        hint = typing.get_type_hints(function).get("return")
    except (NameError, TypeError):
        return default
    return hint if isinstance(hint, type) and hint is not type(None) else default


def _summary(function: Any) -> str | None:
    doc = inspect.getdoc(function)
    return doc.splitlines()[0] if doc else None


def _merge_result(raw: dict[str, Any], result: BaseModel | dict[str, Any], request_cls: type) -> dict[str, Any]:
    """The raw request echoed verbatim, plus what verify added (reward and the environment's fields)."""
    if isinstance(result, dict):
        added = result
    else:
        extra = [key for key in result.__pydantic_extra__ or () if key not in raw]
        added = None if extra else _plain_added(result, request_cls)
        if added is None:
            include = _added_fields(type(result), request_cls)
            added = result.model_dump(mode="json", include=include.union(extra) if extra else include)
    reward = added.get("reward")
    if not isinstance(reward, int | float) or isinstance(reward, bool) or not math.isfinite(reward):
        raise ValueError(f"verify returned a non-finite or non-numeric reward: {reward!r}")
    return {**raw, **added}


_PLAIN_TYPES = (str, int, float, bool, type(None))


def _plain_added(result: BaseModel, request_cls: type) -> dict[str, Any] | None:
    """What `model_dump(mode="json", include=<the added fields>)` gives, read straight from the fields when each
    holds a plain JSON value of a type its annotation names (text, an integer, a finite float, a bool, None) and the
    class customises no serialization; None otherwise (the caller dumps). The same keys and values in the same
    order, at a fraction of the cost."""
    fields = _plain_added_names(type(result), request_cls)
    if fields is None:
        return None
    values = result.__dict__
    added = {}
    for name, allowed in fields:
        value = values.get(name, allowed)  # a field model_construct left unset: let model_dump decide
        kind = type(value)
        if kind not in allowed or (kind is float and not math.isfinite(value)):
            return None
        added[name] = value
    return added


def _plain_types(annotation: Any) -> frozenset[type]:
    """The plain value types a field of this annotation dumps unchanged (an `int` in a `float` field does not: it
    is written as a float)."""
    if annotation is Any or annotation is object:
        return frozenset(_PLAIN_TYPES)
    if annotation is None:
        return frozenset({type(None)})
    if annotation in _PLAIN_TYPES:
        return frozenset({annotation})
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return frozenset().union(*(_plain_types(member) for member in typing.get_args(annotation)))
    return frozenset()


@functools.cache
def _plain_added_names(result_cls: type[BaseModel], request_cls: type) -> tuple[tuple[str, frozenset], ...] | None:
    """The added fields, in the order `model_dump` writes them, each with the value types written unchanged; None
    when the class changes how it serializes (serializers, computed fields, excluded fields)."""
    decorators = result_cls.__pydantic_decorators__
    if decorators.field_serializers or decorators.model_serializers or result_cls.model_computed_fields:
        return None
    include = _added_fields(result_cls, request_cls)
    fields = result_cls.model_fields
    if not include <= fields.keys() or any(fields[name].exclude for name in include):
        return None
    return tuple((name, _plain_types(field.annotation)) for name, field in fields.items() if name in include)


@functools.cache
def _added_fields(result_cls: type[BaseModel], request_cls: type) -> frozenset[str]:
    """The fields a verify answer adds to its request: `reward` and those its class declares beyond the request's."""
    return frozenset(result_cls.model_fields).difference(request_cls.model_fields).union({"reward"})


def _body_model(function: Any, default: type[BaseModel] | None) -> type[BaseModel] | None:
    """The pydantic model annotating a handler's single argument."""
    try:
        hints = typing.get_type_hints(function)
    except (NameError, TypeError):
        return default
    params = [name for name in inspect.signature(function).parameters if name != "self"]
    if len(params) == 1:
        hint = hints.get(params[0])
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            return hint
    return default


def _tool_route(name: str, method: Any, model: type[BaseModel]):
    async def route(request: Request) -> StarletteResponse:
        try:
            data = await read_json(request)
            data = data if data is not None else {}
            arguments = model.model_validate(data)
        except RequestValidationError as exc:
            return JSONResponse({"error": f"invalid arguments for tool {name!r}: {exc.errors()[0]['msg']}"})
        except ValidationError as exc:
            problems, many = _describe(model, data, exc), exc.error_count() > MAX_REPORTED_ERRORS
        else:
            await method.__self__.warmed()
            return JSONResponse(_to_json(await method(arguments)))
        if many:  # out of the except block, pydantic's errors are freed: give their memory back
            release_freed_memory()
        return JSONResponse({"error": f"invalid arguments for tool {name!r}: {problems}"})

    route.__name__ = name
    return route


def _describe(model: type[BaseModel], data: Any, exc: ValidationError) -> str:
    """`a.b: msg; c: msg` for the first errors, and how many there were in all when that is more."""
    errors = first_errors(model, data, exc)
    problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(arguments)'}: {e['msg']}" for e in errors)
    total = exc.error_count()
    return problems if total <= len(errors) else f"{problems}; ... ({total} errors in all)"


def _to_json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value
