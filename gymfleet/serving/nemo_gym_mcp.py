"""NeMo-Gym 0.7.0's `nemo_gym.mcp_auto_exposure`: a resources server's `POST /<tool>` routes, also served over MCP.

A folder whose config sets `expose_tools_over_mcp: true` gets, on the app its `setup_webserver()` returned:

- `POST /mcp` (and `/mcp/...`): MCP's streamable-HTTP transport (stateless, JSON answers; the `mcp` SDK's low-level
  server), whose `tools/list` advertises each typed `POST /<tool>` route (name = the path, description = the
  handler's docstring, input schema = its body model's JSON schema) and whose `tools/call` runs that route;
- a `/seed_session` answer with an `mcp` block (`MCPServerMetadata`: server name, `url_path`, `transport`, and the
  header `X-NeMo-Gym-Session-Token` with a signed token naming the rollout's session and, where the folder's
  `mcp_allowed_tools_for_session(seed_body)` narrows it, the tools it may call). An Environment Server's seed
  (`ResourcesSeedSessionResponse`) gets it as `resources_tools` instead, from the seed's `task_data`;
- a `/verify` that scores MCP-namespaced tool calls (`mcp__<server>__<tool>`) under their bare names (the folder's
  `normalize_tool_name`) and echoes the names the model emitted.

A `tools/call` needs the token (without it, or with a forged one, or for a tool outside its list, the result is an
MCP error result, `isError: true`); it runs the route on the token's session, so the call lands in the state the
rollout's `/verify` scores. Unlike NeMo-Gym, which calls the handler itself with a fabricated request and therefore
refuses handler shapes it cannot reproduce, the call goes through the app's own router: FastAPI validates the body
(a bad one is the 422 text), injects what the handler declares, filters the answer through its response model and
maps errors with the app's handlers, exactly as over HTTP. What the router path skips is middleware, so a folder
that installs middleware of its own (gymfleet's are applied to the `/mcp` request itself) is refused at start-up,
naming it. The token is signed with a key derived from the fleet's secret (`gymfleet.serving.sessions.session_key`),
not with the server's public cookie name as NeMo-Gym does, so no one outside the fleet can mint one for another
rollout's session.

Folders tailor what is exposed with `mcp_tools(harvested, catchall)` (filter the harvested tools, add tools backed by
a parameterised catch-all route with `catchall.tool(name, input_schema, description)`, or return `None` for none).
The `mcp` package is an optional extra (`pip install 'gymfleet[mcp]'`); this module imports it only when a server
opts in, and says so in one line when it is absent.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.asyncexitstack import AsyncExitStackMiddleware
from fastapi.routing import APIRoute
from itsdangerous import BadSignature, URLSafeSerializer
from pydantic import BaseModel
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.routing import Mount, Route

from gymfleet.errors import ConfigError
from gymfleet.serving.nemo_gym_agent_tools import NEMO_GYM_MCP_METADATA_KEY
from gymfleet.serving.nemo_gym_types import MCPServerMetadata
from gymfleet.serving.sessions import SESSION_ID_KEY, new_session_id, session_key

log = logging.getLogger(__name__)

NEMO_GYM_MCP_SESSION_TOKEN_HEADER = "X-NeMo-Gym-Session-Token"
TOKEN_HEADER = NEMO_GYM_MCP_SESSION_TOKEN_HEADER
MCP_URL_PATH = "/mcp"
RESERVED_MCP_TOOL_NAMES = frozenset({"verify", "seed_session", "close_session", "aggregate_metrics", "mcp"})
"""Routes of every resources server that are never tools."""
PERMISSIVE_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": True}
MCP_EXTRA_HINT = "expose_tools_over_mcp needs the mcp package: pip install 'gymfleet[mcp]'"
_TOKEN_SALT = "nemo-gym-mcp-session-token"
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]+")
"""What MCP clients accept as a tool name (and what `mcp__<server>__<tool>` can carry back)."""


def normalize_tool_name(name: str, server_name: str | None = None) -> str:
    """A trajectory's tool name without its MCP namespace: `mcp__<server>__<tool>` -> `<tool>` (only `server_name`'s
    prefix when given; other names unchanged)."""
    if not name.startswith("mcp__"):
        return name
    if server_name is not None:
        prefix = f"mcp__{server_name}__"
        return name[len(prefix):] if name.startswith(prefix) else name
    _, separator, tool = name[len("mcp__"):].partition("__")
    return tool if separator else name


def _require_mcp() -> Any:
    try:
        import mcp.types
    except ImportError:
        raise ConfigError(MCP_EXTRA_HINT, path="expose_tools_over_mcp") from None
    return mcp.types


@dataclass
class MCPTool:
    """One exposed tool: its `tools/list` entry and the path its calls are posted to."""

    name: str
    tool: Any
    path: str


class CatchAll:
    """A folder's one parameterised route (`POST /{tool_name}`), for `mcp_tools` overrides to back tools with."""

    def __init__(self, route: APIRoute):
        self.route = route

    def tool(self, name: str, input_schema: dict | None = None, description: str | None = None) -> MCPTool:
        types = _require_mcp()
        return MCPTool(name, types.Tool(name=name, description=description,
                                        inputSchema=input_schema or dict(PERMISSIVE_SCHEMA)), "/" + name)


def _body_schema(route: APIRoute) -> dict[str, Any]:
    params = route.dependant.body_params
    if len(params) == 1:
        annotation = params[0].field_info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation.model_json_schema()
    return dict(PERMISSIVE_SCHEMA)


def harvest_tools(server: Any, app: FastAPI) -> dict[str, MCPTool]:
    """The tools `server` exposes: its typed `POST /<tool>` routes, as its `mcp_tools` override selects them."""
    types = _require_mcp()
    foreign = [f"{item.cls.__module__}.{item.cls.__name__}" for item in app.user_middleware
               if not item.cls.__module__.startswith("gymfleet.")]
    if foreign:
        raise ConfigError(f"{type(server).__name__} installs middleware of its own {foreign}, which MCP tool calls "
                          "(dispatched through the app's router) would skip; remove it or leave expose_tools_over_mcp "
                          "off", path="expose_tools_over_mcp")
    harvested: list[MCPTool] = []
    catchalls: list[APIRoute] = []
    for route in app.router.routes:
        if not isinstance(route, APIRoute) or "POST" not in route.methods:
            continue
        name = route.path.lstrip("/")
        if name in RESERVED_MCP_TOOL_NAMES:
            continue
        if "{" in route.path:
            catchalls.append(route)
            continue
        description = (route.description or route.summary or "").strip() or None
        harvested.append(MCPTool(name, types.Tool(name=name, description=description, inputSchema=_body_schema(route)),
                                 route.path))
    if len(catchalls) > 1:
        raise ConfigError(f"{type(server).__name__} has several parameterised routes "
                          f"{sorted(r.path for r in catchalls)}; MCP exposure cannot tell which backs its tools: keep "
                          "one, or leave expose_tools_over_mcp off", path="expose_tools_over_mcp")
    selected = server.mcp_tools(harvested, CatchAll(catchalls[0]) if catchalls else None) or []
    tools: dict[str, MCPTool] = {}
    for tool in selected:
        if not _TOOL_NAME.fullmatch(tool.name):
            raise ConfigError(f"{type(server).__name__} exposes MCP tool {tool.name!r}: MCP tool names are "
                              "[A-Za-z0-9_-]+; rename the route", path="expose_tools_over_mcp")
        if tool.name in RESERVED_MCP_TOOL_NAMES or tool.name in tools:
            raise ConfigError(f"{type(server).__name__} exposes MCP tool {tool.name!r} twice or under a reserved name "
                              f"{sorted(RESERVED_MCP_TOOL_NAMES)}; rename it", path="expose_tools_over_mcp")
        tools[tool.name] = tool
    log.info("%s: %d tool(s) over MCP at %s", type(server).__name__, len(tools), MCP_URL_PATH)
    return tools


class _Captured:
    """The status and body an ASGI app sent."""

    def __init__(self):
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")


def _receive_of(body: bytes) -> Callable:
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return receive


async def call_route(app: FastAPI, path: str, session: str, arguments: dict | None) -> Any:
    """POST `arguments` to `path` through `app`'s router (and exception handlers) on session `session`.

    Returns:
        The answer's JSON (or its text).

    Raises:
        ValueError: the route answered a non-2xx status (`HTTP <status> from POST <path>: <detail>`).
    """
    body = json.dumps(arguments or {}).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 0), "server": ("mcp", 80), "app": app, "state": {},
        "session": {SESSION_ID_KEY: session},
    }
    captured = _Captured()
    routed = ExceptionMiddleware(AsyncExitStackMiddleware(app.router), handlers=app.exception_handlers)
    await routed(scope, _receive_of(body), captured.send)
    text = bytes(captured.body).decode("utf-8", errors="replace")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        payload = text
    if not 200 <= captured.status < 300:
        detail = payload.get("detail", payload) if isinstance(payload, dict) else payload
        raise ValueError(f"HTTP {captured.status} from POST {path}: "
                         f"{detail if isinstance(detail, str) else json.dumps(detail)}")
    return payload


async def _read_body(receive: Callable) -> bytes:
    chunks = bytearray()
    while True:
        message = await receive()
        chunks += message.get("body", b"")
        if not message.get("more_body"):
            return bytes(chunks)


def _rewrite_answer(route: APIRoute, rewrite: Callable[..., Any],
                    rewrite_request: Callable[[bytes], tuple[bytes | None, Any]] | None = None) -> None:
    """Wrap `route`'s ASGI app so that `rewrite(scope, answer_json, request_body, state)` may change a 2xx JSON
    answer in place. `rewrite_request(request_body)` may first give the route another body and a `state` for
    `rewrite`; when it gives None, the request is passed through untouched."""
    inner = route.app

    async def wrapped(scope: dict, receive: Callable, send: Callable) -> None:
        request_body = await _read_body(receive)
        routed, state = rewrite_request(request_body) if rewrite_request else (request_body, None)
        if routed is None:
            await inner(scope, _receive_of(request_body), send)
            return
        captured = _Captured()
        await inner(scope, _receive_of(routed), captured.send)
        body = bytes(captured.body)
        answer = _parse_object(body) if 200 <= captured.status < 300 else None
        if answer is not None:  # an empty object too: a seed answering `{}` still gets its token
            await rewrite(scope, answer, request_body, state)
            body = json.dumps(answer).encode()
        headers = [(k, v) for k, v in captured.headers if k.lower() != b"content-length"]
        await send({"type": "http.response.start", "status": captured.status,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    route.app = wrapped


def _route(app: FastAPI, path: str) -> APIRoute:
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.path == path:
            return route
    raise ConfigError(f"expose_tools_over_mcp needs a {path} route, and the app has none",
                      path="expose_tools_over_mcp")


def _parse_object(raw: bytes) -> dict | None:
    """`raw` as a JSON object, or None when it is not one."""
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _json_object(raw: bytes) -> dict:
    """`raw` as a JSON object, or `{}`."""
    parsed = _parse_object(raw) if raw else None
    return {} if parsed is None else parsed


def _function_calls(row: dict) -> list[dict]:
    response = row.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    return [item for item in output or () if isinstance(item, dict) and item.get("type") == "function_call"]


def _normalizing_verify(route: APIRoute, server: Any) -> None:
    """`/verify` scores `mcp__<server>__<tool>` calls under their bare names and echoes the emitted ones."""

    def bare_names(raw: bytes) -> tuple[bytes | None, dict]:
        row = _json_object(raw)
        emitted = {item.get("call_id"): item.get("name") for item in _function_calls(row)}
        renamed = False
        for item in _function_calls(row):
            if isinstance(item.get("name"), str):
                bare = server.normalize_tool_name(item["name"])
                renamed |= bare != item["name"]
                item["name"] = bare
        return (json.dumps(row).encode() if renamed else None), emitted

    async def emitted_names(scope: dict, answer: dict, request_body: bytes, emitted: dict) -> None:
        for item in _function_calls(answer):
            item["name"] = emitted.get(item.get("call_id"), item.get("name"))

    _rewrite_answer(route, emitted_names, bare_names)


class _ASGIEndpoint:
    """An ASGI app object (a plain function would be taken for a request -> response endpoint by Starlette)."""

    def __init__(self, handle: Callable):
        self.handle = handle

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        await self.handle(scope, receive, send)


def maybe_auto_expose(server: Any, app: FastAPI) -> dict[str, MCPTool] | None:
    """`install_auto_exposure` for a server whose config sets `expose_tools_over_mcp: true`; else None."""
    if not getattr(getattr(server, "config", None), "expose_tools_over_mcp", False):
        return None
    return install_auto_exposure(server, app)


def install_auto_exposure(server: Any, app: FastAPI) -> dict[str, MCPTool]:
    """Serve `server`'s tool routes over MCP on `app` (module docstring); returns the exposed tools."""
    types = _require_mcp()
    from mcp.server.lowlevel import Server as LowLevelServer
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings

    if any(getattr(route, "path", None) == MCP_URL_PATH for route in app.router.routes):
        raise ConfigError(f"{type(server).__name__} already serves {MCP_URL_PATH}; remove it to use "
                          "expose_tools_over_mcp", path="expose_tools_over_mcp")
    tools = harvest_tools(server, app)
    server_name = server.config.name or type(server).__name__
    signer = URLSafeSerializer(session_key(server.get_session_middleware_key()), salt=_TOKEN_SALT)

    def metadata(scope: dict, seed_body: dict) -> dict:
        session = scope.setdefault("session", {})
        if not session.get(SESSION_ID_KEY):
            session[SESSION_ID_KEY] = new_session_id()
        allowed = server.mcp_allowed_tools_for_session(seed_body)
        token = signer.dumps({"sid": session[SESSION_ID_KEY], "tools": allowed})
        return MCPServerMetadata(server_name=server_name,
                                 headers={NEMO_GYM_MCP_SESSION_TOKEN_HEADER: token}).model_dump()

    async def add_token(scope: dict, answer: dict, request_body: bytes, _: Any) -> None:
        seed = _json_object(request_body)
        if "resources_session_id" in answer:  # an Environment Server's seed: the typed field, from its task_data
            if answer.get("resources_tools") is None:
                task_data = seed.get("task_data")
                answer["resources_tools"] = metadata(scope, task_data if isinstance(task_data, dict) else {})
        else:
            answer.setdefault(NEMO_GYM_MCP_METADATA_KEY, metadata(scope, seed))

    _rewrite_answer(_route(app, "/seed_session"), add_token)
    _normalizing_verify(_route(app, "/verify"), server)

    mcp_server = LowLevelServer(server_name)

    def claims(required: bool) -> tuple[str | None, frozenset | None]:
        request = mcp_server.request_context.request
        token = request.headers.get(NEMO_GYM_MCP_SESSION_TOKEN_HEADER) if request is not None else None
        if not token:
            if required:
                raise ValueError(f"a tool call needs the {NEMO_GYM_MCP_SESSION_TOKEN_HEADER} header that "
                                 "/seed_session answered")
            return None, None
        try:
            payload = signer.loads(token)
        except BadSignature:
            if required:
                raise ValueError(f"invalid {NEMO_GYM_MCP_SESSION_TOKEN_HEADER}") from None
            return None, None
        allowed = payload.get("tools")
        return payload["sid"], None if allowed is None else frozenset(allowed)

    @mcp_server.list_tools()
    async def list_tools() -> list:
        _, allowed = claims(required=False)
        return [tool.tool for name, tool in tools.items() if allowed is None or name in allowed]

    @mcp_server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict) -> Any:
        tool = tools.get(name)
        if tool is None:
            return types.CallToolResult(isError=True, content=[
                types.TextContent(type="text", text=f"Unknown tool: {name!r}. Available tools: {sorted(tools)}")])
        session, allowed = claims(required=True)
        if allowed is not None and name not in allowed:
            raise ValueError(f"tool {name!r} is not allowed for this session")
        payload = await call_route(app, tool.path, session, arguments)
        text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
        content = [types.TextContent(type="text", text=text)]
        return (content, payload) if isinstance(payload, dict) else content

    # Sandboxed agents reach /mcp at the server's advertised address, not a browser origin: no Host allowlist.
    manager = StreamableHTTPSessionManager(
        app=mcp_server, json_response=True, stateless=True,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False))

    endpoint = _ASGIEndpoint(manager.handle_request)
    # First, so a catch-all POST /{tool} cannot shadow it; the Mount takes /mcp/ and subpaths without a redirect.
    app.router.routes[:0] = [Route(MCP_URL_PATH, endpoint, include_in_schema=False), Mount(MCP_URL_PATH, app=endpoint)]
    lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def with_mcp(app_: FastAPI):
        async with manager.run(), lifespan(app_) as state:
            yield state

    app.router.lifespan_context = with_mcp
    return tools
