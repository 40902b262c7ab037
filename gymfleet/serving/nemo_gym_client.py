"""NeMo-Gym's `ServerClient` and judge-call helpers, on gymfleet's one HTTP client (`gymfleet.http`).

A folder calls other fleet servers the NeMo-Gym way:

    response = await self.server_client.post(server_name="judge", url_path="/v1/responses", json=params)
    await raise_for_status(response)
    data = await get_response_json(response)

`ServerClient` resolves `server_name` from the fleet's global config (as gymfleet's own servers do, replicas
included) and sends through `gymfleet.http.request`: pooled connections, a deadline per attempt
(`DEFAULT_TIMEOUT_S` unless the call passes `timeout=`), bounded retries with backoff for what never reached the
server (a refused connection; a POST that may have reached the server is never resent; an answer, a 429 or 503
included, goes back to the folder as under 0.7.0, which retries it within its own deadline if it wants), and
`gymfleet_upstream_*` metrics per instance. NeMo-Gym retries disconnects forever with a fixed 0.5 s sleep; here a
call that cannot be completed raises `gymfleet.errors.TransportError`, which the resources server turns into a
`transport_failed` row, never a reward. A call that failed (a non-2xx answer too) is noted in its request
(`gymfleet.serving.nemo_gym_upstream`): whatever the folder raises after it is typed as well, never an untyped 500.

The answer is aiohttp-shaped (`NeMoGymClientResponse`: `status`, `ok`, `headers`, `cookies` as a `SimpleCookie`,
`await read()/json()/text()`, `content.read()`, `raise_for_status()`), already read whole. `raise_for_status`
raises `HTTPStatusError`, both an `aiohttp.ClientResponseError` (what folders catch) and a gymfleet
`TransportError` (what the server's failure boundary classifies), with `response_content` set as NeMo-Gym sets it;
likewise a body that broke off is a `PayloadLostError` (`aiohttp.ClientPayloadError`) and a connection that could not
be made or dropped a `ConnectionLostError` (`aiohttp.ClientConnectionError`), both `TransportError`s.

Judge calls: `call_judge` posts, checks the status and validates the answer into the given model, and
`reraise_judge_errors(coro)` turns any exception of the awaited call into `JudgeError` (gymfleet's own), so a failed
judge call becomes a `judge_failed` row (`_ng_failure_class`, kept out of rewards), while an answer the judge gave but
the folder cannot parse stays the folder's to score.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from http.cookies import SimpleCookie
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict, PrivateAttr

from gymfleet import http
from gymfleet.errors import JudgeError, TransportError
from gymfleet.serving.nemo_gym_rollout import strip_rollout_prefix
from gymfleet.serving.nemo_gym_upstream import FailedCall, is_model_server, note_failed_call

log = logging.getLogger(__name__)

SESSION_ID_KEY = "session_id"
"""Where a request's session id lives in `request.session` (NeMo-Gym's key; `gymfleet.serving.sessions`)."""
_SERVED_CONFIG: dict[str, Any] = {}
"""The global config of the fleet this process serves in (set by `gymfleet.serving.nemo_gym_server`)."""

ResponseT = TypeVar("ResponseT", bound=BaseModel)
ServerStatus = Literal["success", "connection_error", "timeout", "unknown_error"]
"""What `ServerClient.poll_for_status` answers."""
RATE_LIMIT_ERROR_CODES = [429, 502, 503, 504, 520]
"""HTTP statuses NeMo-Gym's model clients treat as rate limiting (`nemo_gym.openai_utils`)."""
RETRY_ERROR_CODES = [*RATE_LIMIT_ERROR_CODES, 404, 408, 500]
"""HTTP statuses NeMo-Gym's model clients retry."""
MAX_NUM_TRIES = 3
"""NeMo-Gym's default for a model client's `max_http_attempts` (`NeMoGymAsyncOpenAI`)."""


def set_served_config(config: Mapping[str, Any]) -> None:
    """Record the global config of the fleet this process serves (for `get_global_config_dict` and
    `ServerClient.load_from_global_config`)."""
    _SERVED_CONFIG.clear()
    _SERVED_CONFIG.update(config)


def served_config() -> dict[str, Any] | None:
    """The global config recorded by `set_served_config`, or None outside a served NeMo-Gym folder."""
    return _SERVED_CONFIG or None


def _server_utils_config() -> Any:
    """The global config `get_server_url` and `ServerClient.load_from_global_config` read: as under 0.7.0, whatever
    `nemo_gym.server_utils.get_global_config_dict` answers when a folder's test has patched that name (gdpval's judge
    panel test sets its config so), else the served fleet's (None outside one). Looked up in `sys.modules` at each
    call, as 0.7.0's functions look up their module's global; `nemo_gym` is not imported from here."""
    module = sys.modules.get("nemo_gym.server_utils")
    source = getattr(module, "get_global_config_dict", None)
    if source is not None and getattr(source, "__module__", None) != "gymfleet.fleet.run_helper":
        return source()
    return served_config()


def plain_config(config: Any) -> dict[str, Any]:
    """A global config (an OmegaConf `DictConfig`, resolved, or any mapping) as a plain dict."""
    if isinstance(config, dict):
        return config
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):
            return OmegaConf.to_container(config, resolve=True)
    except ImportError:  # omegaconf is a dependency; a mapping without it is still a mapping
        pass
    return dict(config or {})


class _Content:
    """`response.content`: what aiohttp's stream reader offers of a body already read."""

    def __init__(self, body: bytes):
        self._body = body

    async def read(self, n: int = -1) -> bytes:
        return self._body


class NeMoGymClientResponse:
    """An answer read whole, shaped like `aiohttp.ClientResponse` for the parts folders use."""

    def __init__(self, response: http.HttpResponse, method: str = "POST"):
        self._response = response
        self.method = method
        self.status = response.status
        self.headers = response.headers
        self.url = response.url
        self.content = _Content(response.body)
        self.reason = ""

    @property
    def ok(self) -> bool:
        return self._response.ok

    @property
    def cookies(self) -> SimpleCookie:
        cookies = SimpleCookie()
        for name, value in self._response.cookies.items():
            cookies[name] = value
        return cookies

    async def read(self) -> bytes:
        return self._response.body

    async def text(self, encoding: str | None = None) -> str:
        return self._response.body.decode(encoding or "utf-8", errors="replace")

    async def json(self, *, content_type: str | None = None, loads: Any = None) -> Any:
        return (loads or orjson.loads)(self._response.body)

    def raise_for_status(self) -> None:
        if not self.ok:
            inner = self._response
            raise HTTPStatusError(inner.status, inner.url, inner.body, inner.failure_class, inner.headers)

    def release(self) -> None:
        """Nothing to release: the body was read whole."""

    async def __aenter__(self) -> NeMoGymClientResponse:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        return None


class HTTPStatusError(TransportError, aiohttp.ClientResponseError):
    """A non-2xx answer, as NeMo-Gym's `raise_for_status` raises it (`aiohttp.ClientResponseError` with
    `response_content`), and a gymfleet `TransportError` (status, URL, failure class)."""

    def __init__(self, status: int, url: str, content: bytes, failure_class: str, headers: Any = None):
        text = content.decode("utf-8", errors="replace")[:500]
        Exception.__init__(self, f"HTTP {status} from {url}: {text}")  # both bases' __init__ take other arguments
        self.status = status
        self.url = url
        self.response_content = content
        self.failure_class = failure_class
        self.request_info = None
        self.history = ()
        self.message = text
        self.headers = headers

    def __str__(self) -> str:
        return str(self.args[0])


class PayloadLostError(TransportError, aiohttp.ClientPayloadError):
    """The answer's body broke off (a gymfleet `TransportError`), catchable as aiohttp's `ClientPayloadError`, as a
    folder written for 0.7.0 catches it (genrm_compare retries its judge call on one)."""


class ConnectionLostError(TransportError, aiohttp.ClientConnectionError):
    """The connection could not be made or dropped (a gymfleet `TransportError`), catchable as aiohttp's
    `ClientConnectionError`, as a folder written for 0.7.0 catches it."""


def _as_aiohttp(exc: TransportError) -> TransportError:
    """`exc` as the aiohttp exception 0.7.0's client would have raised for it (`PayloadLostError`,
    `ConnectionLostError`), where there is one; else `exc` itself."""
    if isinstance(exc, aiohttp.ClientError):
        return exc
    if isinstance(exc.__cause__, aiohttp.ClientPayloadError):
        cls = PayloadLostError
    elif exc.failure_class == "connection_error":
        cls = ConnectionLostError
    else:
        return exc
    typed = cls(str(exc), status=exc.status, url=exc.url, response_content=exc.response_content,
                failure_class=exc.failure_class)
    typed.__cause__ = exc.__cause__
    return typed


async def raise_for_status(response: Any, content: bytes | None = None) -> None:
    """Raise `HTTPStatusError` (carrying `response_content`) unless `response` is a 2xx (NeMo-Gym reads `ok`).

    Another response object (an aiohttp `ClientResponse`, a test's stand-in) is treated as NeMo-Gym 0.7.0 treats
    it: its body read from `response.content.read()`, then its own `raise_for_status()`, whose
    `aiohttp.ClientResponseError` is raised with `response_content` set; if it raises none, `HTTPStatusError`."""
    if response.ok:
        return
    if isinstance(response, NeMoGymClientResponse):
        inner = response._response
        raise HTTPStatusError(inner.status, inner.url, inner.body, inner.failure_class, inner.headers)
    if content is None:
        stream = getattr(response, "content", None)
        content = await (stream.read() if hasattr(stream, "read") else response.read())
    if callable(getattr(response, "raise_for_status", None)):
        try:
            response.raise_for_status()
        except aiohttp.ClientResponseError as exc:
            exc.response_content = content
            raise
    status = int(response.status)
    url = getattr(response, "url", None) or getattr(getattr(response, "request_info", None), "url", "")
    raise HTTPStatusError(status, str(url), content, "http_5xx" if status >= 500 else "http_4xx")


async def get_response_json(response: Any) -> Any:
    """The answer's body parsed as JSON (from `await response.read()`, as NeMo-Gym reads it)."""
    return orjson.loads(await response.read())


def _cookies(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if isinstance(value, SimpleCookie):
        return {name: morsel.value for name, morsel in value.items()}
    return {str(name): getattr(item, "value", item) for name, item in dict(value).items()}


def _timeout_s(value: Any) -> float:
    if value is None:
        return http.DEFAULT_TIMEOUT_S
    if isinstance(value, aiohttp.ClientTimeout):
        return float(value.total or http.DEFAULT_TIMEOUT_S)
    return float(value)


ANSWERS_NOT_RETRIED = http.RetryPolicy(retry_statuses=frozenset())
"""A folder's calls: what never reached the server is retried (bounded, with backoff), an answer is never resent,
whatever its status: as under 0.7.0, a 429/503 goes back to the folder, which retries it within its own deadline
(genrm_compare's judge loop), instead of gymfleet's backoff spending that deadline first."""

_OPTIONS = frozenset({"json", "data", "cookies", "headers", "timeout", "params"})


def _with_query(url: str, params: Any) -> str:
    return f"{url}{'&' if '?' in url else '?'}{urlencode(params)}" if params else url


def _send_options(options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """NeMo-Gym's (aiohttp's) request options as `gymfleet.http.request` arguments, and the query `params`.

    Raises:
        TypeError: an option gymfleet does not send.
    """
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TypeError(f"request(): unsupported option(s) {unknown}; supported: {sorted(_OPTIONS)}")
    body = options.get("json")
    if isinstance(body, BaseModel):
        body = body.model_dump(mode="json", exclude_unset=True)
    data = options.get("data")
    return options.get("params"), {"json": body, "data": data.encode() if isinstance(data, str) else data,
                   "cookies": _cookies(options.get("cookies")), "headers": options.get("headers"),
                   "timeout_s": _timeout_s(options.get("timeout")), "retry": ANSWERS_NOT_RETRIED}


async def request(method: str, url: str, **options: Any) -> NeMoGymClientResponse:
    """Send one request through gymfleet's client (deadline, bounded retries, metrics); an aiohttp-shaped answer.

    Options: `json` (a pydantic model is dumped without its unset fields, as NeMo-Gym does), `data`, `cookies` (a
    dict or a `SimpleCookie`), `headers`, `timeout` (seconds or an `aiohttp.ClientTimeout`), `params`.

    Raises:
        TypeError: an option gymfleet does not send.
        TransportError: the server could not be reached or did not answer in time, retries spent or unsafe.
    """
    params, arguments = _send_options(options)
    return NeMoGymClientResponse(await _noted(http.request(method, _with_query(url, params), **arguments),
                                              url, "", to_model=False), method)


async def _noted(call: Awaitable[http.HttpResponse], server: str, path: str, *, to_model: bool) -> http.HttpResponse:
    """Await `call`; a non-2xx answer or a `TransportError` is noted in the request's record of failed calls
    (`gymfleet.serving.nemo_gym_upstream`), so an exception the folder raises after it is typed."""
    try:
        answer = await call
    except TransportError as exc:
        note_failed_call(FailedCall(server, path, exc.status, str(exc), to_model))
        typed = _as_aiohttp(exc)
        if typed is exc:
            raise
        raise typed from exc.__cause__
    if not answer.ok:
        note_failed_call(FailedCall(server, path, answer.status, answer.text[:500], to_model))
    return answer


class ServerClient(BaseModel):
    """Calls fleet servers by instance name (NeMo-Gym's `ServerClient`): `await client.post(server_name=...,
    url_path=..., json=..., cookies=...)`. Built from the fleet's global config; see the module docstring."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    head_server_config: Any = None
    global_config_dict: Any = None
    _client: http.ServerClient | None = PrivateAttr(default=None)
    _server_base_urls: dict[str, str] = PrivateAttr(default_factory=dict)
    """Base URLs by server name that win over the fleet config (0.7.0's cache of resolved URLs; tests fill it to point
    a name at a server they started). A call to one goes through gymfleet's client without the fleet's token."""

    @classmethod
    def load_from_global_config(cls, head_server_config: Any = None) -> ServerClient:
        """The client of the fleet this process serves in.

        Raises:
            RuntimeError: not inside a gymfleet-served NeMo-Gym server (there is no fleet config to read).
        """
        config = _server_utils_config()
        if config is None:
            raise RuntimeError("ServerClient.load_from_global_config(): this process serves no fleet; build "
                               "ServerClient(head_server_config=..., global_config_dict=...) instead")
        return cls(head_server_config=head_server_config or config.get("head_server"), global_config_dict=config)

    def _fleet(self) -> http.ServerClient:
        if self._client is None:
            self._client = http.ServerClient(plain_config(self.global_config_dict))
        return self._client

    def base_url(self, server_name: str) -> str:
        """`http://host:port` of instance `server_name` (this rollout's replica of it)."""
        return self._server_base_urls.get(server_name) or self._fleet().url_of(server_name)

    async def request(self, server_name: str, url_path: str, method: str, **options: Any) -> NeMoGymClientResponse:
        """Call `url_path` of instance `server_name` with `method` (options as `request`); a rollout prefix
        (`/ng-rollout/<id>/...`, `gymfleet.serving.nemo_gym_rollout`) is dropped: gymfleet's servers keep no
        per-rollout capture."""
        params, arguments = _send_options(options)
        path = _with_query(strip_rollout_prefix(url_path), params)
        if (base_url := self._server_base_urls.get(server_name)) is not None:
            call, to_model = http.request(method, f"{base_url.rstrip('/')}{path}", **arguments), False
        else:
            fleet = self._fleet()
            call, to_model = fleet.call(method, server_name, path, **arguments), is_model_server(fleet.config,
                                                                                                 server_name)
        answer = await _noted(call, server_name, path, to_model=to_model)
        return NeMoGymClientResponse(answer, method)

    def poll_for_status(self, server_name: str, *, timeout_seconds: float = 5) -> ServerStatus:
        """Whether instance `server_name` (or `head_server`) answers at all (NeMo-Gym's start-up wait: any HTTP
        answer is `"success"`, whatever its status); else `"connection_error"`, `"timeout"` or `"unknown_error"`.
        Blocking, as NeMo-Gym's: folders call it from `setup_webserver`."""
        import httpx

        try:
            if server_name == "head_server":
                url = self._build_server_base_url(plain_config(self.global_config_dict)["head_server"])
            else:
                url = self.base_url(server_name)
            httpx.get(url, timeout=timeout_seconds)
        except httpx.ConnectError:
            return "connection_error"
        except httpx.TimeoutException:
            return "timeout"
        except Exception:  # noqa: BLE001 - NeMo-Gym's answer for anything else (an unknown name included)
            log.warning("poll_for_status(%r) failed", server_name, exc_info=True)
            return "unknown_error"
        return "success"

    @staticmethod
    def _build_server_base_url(server_config_dict: Any) -> str:
        """`http://host:port` of one instance's fields (NeMo-Gym's helper; folders call it)."""
        return f"http://{server_config_dict['host']}:{server_config_dict['port']}"

    async def get(self, server_name: str, url_path: str, **options: Any) -> NeMoGymClientResponse:
        return await self.request(server_name, url_path, "GET", **options)

    async def post(self, server_name: str, url_path: str, **options: Any) -> NeMoGymClientResponse:
        return await self.request(server_name, url_path, "POST", **options)


FAILURE_REASON_CHARS = 2000


def failure_fields(failure_class: str, reason: str) -> dict[str, Any]:
    """What NeMo-Gym adds to a verify row whose reward is no measurement: `reward` 0.0, `mask_sample`,
    `failure_kind`, `failure_reason`, `_ng_failure_class` (and, for a judge, `_ng_failure_judge_error`)."""
    reason = reason[:FAILURE_REASON_CHARS]
    fields = {"reward": 0.0, "mask_sample": True, "failure_kind": failure_class, "failure_reason": reason,
              "_ng_failure_class": failure_class}
    if failure_class == "judge_failed":
        fields["_ng_failure_judge_error"] = reason
    return fields


def judge_failsafe(verify: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """`verify` answering a `JudgeError` with NeMo-Gym's `judge_failed` row (a JSON response: the request echoed
    with `failure_fields`) instead of raising. gymfleet's `/verify` does this for every folder already; this is for
    folders (and their tests) that wrap `verify` themselves. The signature is kept, so FastAPI injects the same."""
    from starlette.responses import JSONResponse

    @functools.wraps(verify)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return await verify(*args, **kwargs)
        except JudgeError as exc:
            body = kwargs.get("body") or next(
                (value for value in (*kwargs.values(), *args) if isinstance(value, BaseModel)), None)
            if body is None:
                raise RuntimeError("judge_failsafe: verify was called without a request body") from exc
            data = body.model_dump(mode="json")
            instance = data.get("instance_config")
            data |= failure_fields("judge_failed", str(exc))
            data["instance_config"] = {**(instance if isinstance(instance, dict) else {}), "mask_sample": True}
            return JSONResponse(data)

    return wrapper


async def reraise_judge_errors(call: Awaitable[Any]) -> Any:
    """Await a judge call; any exception it raises becomes a `JudgeError` naming it (a `JudgeError` passes)."""
    try:
        return await call
    except JudgeError:
        raise
    except Exception as exc:  # the boundary: whatever failed in the call is a failed judge call
        raise JudgeError(f"{type(exc).__name__}: {exc}") from exc


async def call_judge(server_client: ServerClient, *, server_name: str, url_path: str, json: Any,
                     response_model: type[ResponseT]) -> ResponseT:
    """POST to a judge model server, check the status, validate the answer into `response_model`.

    Raises:
        JudgeError: the call failed (transport, deadline, a non-2xx answer, a body that is not the model).
    """

    async def call() -> ResponseT:
        response = await server_client.post(server_name=server_name, url_path=url_path, json=json)
        await raise_for_status(response)
        return response_model.model_validate(await get_response_json(response))

    return await reraise_judge_errors(call())


def get_first_server_config_dict(global_config_dict: Any, top_level_path: str) -> Any:
    """The fields of instance `top_level_path` (`config[name][server type][implementation]`)."""
    block = global_config_dict[top_level_path]
    block = next(iter(block.values()))
    return next(iter(block.values()))


def is_nemo_gym_fastapi_entrypoint(file: str) -> bool:
    """False: under gymfleet a folder's `app.py` is imported by `ng_run`'s launcher, never run as NeMo-Gym's
    uvicorn worker entrypoint (folders guard their start-up stanza with this)."""
    return False


def get_server_url(server_name: str) -> str:
    """`http://host:port` of instance `server_name` in the fleet this process serves.

    Raises:
        RuntimeError: not inside a gymfleet-served NeMo-Gym server.
    """
    return ServerClient.load_from_global_config().base_url(server_name)
