"""The fleet's token on a NeMo-Gym folder's own HTTP clients, for the fleet's servers only.

NeMo-Gym's servers take any request; gymfleet's require the fleet's token (`gymfleet.serving.guard`). A folder that
calls a fleet server through `ServerClient` sends it (`gymfleet.http` adds it for every address the fleet granted,
`gymfleet.auth.grant`), but some folders build a client of their own on the address the fleet gives them: gdpval's
rubric judges are `openai.AsyncOpenAI(base_url=get_server_url(judge) + "/v1", api_key="sk-dummy")`. Under gymfleet
that call was refused (401, "no valid fleet token"), where under NeMo-Gym it reached the judge.

`send_fleet_token_from_own_clients()` (called when a folder's server starts serving; `stop_sending_...` when it stops)
makes httpx's transports (httpx, or its
successor httpx2, is what the OpenAI SDK and most async clients use) add the fleet's token header to a request whose
URL is a granted fleet address, as `gymfleet.http` does: never to any other URL, and never over a token header the
request already has. A folder's `requests` or `aiohttp` clients of its own do not get it (none of NeMo-Gym 0.7.0's
folders calls a fleet server with them).
"""

from __future__ import annotations

import functools
from typing import Any

from gymfleet import auth

_installed: list[tuple[Any, str, Any]] = []
"""(class, attribute, the original method) for every transport method the hook replaced: empty when not installed."""
_users = 0
"""Callers of `send_fleet_token_from_own_clients()` not yet matched by a stop."""


def _add_fleet_token(request: Any) -> None:
    if auth.TOKEN_HEADER not in request.headers:
        token = auth.token_of(str(request.url))
        if token:
            request.headers[auth.TOKEN_HEADER] = token


def send_fleet_token_from_own_clients() -> None:
    """Install the hook on httpx, and on httpx2 (which recent OpenAI SDKs use instead) where it is installed (see
    the module docstring). Counted: each call is matched by one `stop_sending_fleet_token_from_own_clients()`, and
    the hook stays while any caller still needs it (several folder servers in one process, as in tests)."""
    global _users
    _users += 1
    if _installed:
        return
    import importlib

    for name in HTTPX_MODULES:
        try:
            _hook(importlib.import_module(name))
        except ImportError:
            continue


def stop_sending_fleet_token_from_own_clients() -> None:
    """One caller no longer needs the hook; the last one puts httpx's transports back as they were, so a process
    that served a folder for a while (a test) sends no token from then on."""
    global _users
    _users = max(0, _users - 1)
    while not _users and _installed:
        cls, attribute, original = _installed.pop()
        setattr(cls, attribute, original)


HTTPX_MODULES = ("httpx", "httpx2")


def _hook(httpx: Any) -> None:
    sync_send = httpx.HTTPTransport.handle_request
    async_send = httpx.AsyncHTTPTransport.handle_async_request

    @functools.wraps(sync_send)
    def handle_request(self: Any, request: Any) -> Any:
        _add_fleet_token(request)
        return sync_send(self, request)

    @functools.wraps(async_send)
    async def handle_async_request(self: Any, request: Any) -> Any:
        _add_fleet_token(request)
        return await async_send(self, request)

    _installed.append((httpx.HTTPTransport, "handle_request", sync_send))
    _installed.append((httpx.AsyncHTTPTransport, "handle_async_request", async_send))
    httpx.HTTPTransport.handle_request = handle_request
    httpx.AsyncHTTPTransport.handle_async_request = handle_async_request
