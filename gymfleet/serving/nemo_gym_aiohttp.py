"""NeMo-Gym 0.7.0's process-level HTTP plumbing in `nemo_gym.server_utils`, for folders and tests that reach for it:
the global aiohttp client's names and the client-disconnect cancellation middleware.

- `GlobalAIOHTTPAsyncClientConfig` (0.7.0's fields and bounds), `set_global_aiohttp_client(cfg)`,
  `get_global_aiohttp_client()`, `is_global_aiohttp_client_setup()`,
  `is_global_aiohttp_client_request_debug_enabled()`, `global_aiohttp_client_exit()` and the module attribute
  `nemo_gym.server_utils._GLOBAL_AIOHTTP_CLIENT` (read through `global_aiohttp_client()`). The session they
  hand out is a real `aiohttp.ClientSession` (no cookie jar, no total timeout, as 0.7.0's) for code that uses it
  directly; `ServerClient` and `request` never do: every call of the surface goes through gymfleet's one client
  (`gymfleet.http`: per-loop pools, deadlines, bounded retries). As under 0.7.0, setting one up while another is
  open is refused (`AssertionError`); a session its owner closed counts as none, so a test that closes the session it
  made, then resets the module attribute (genrm_compare's fixtures do), can make the next one.
- `DisconnectCancelMiddleware` (`SimpleServer.setup_cancellation_middleware`): the request's handler is cancelled
  when its client disconnects before the answer is sent, as 0.7.0's `ClientDisconnectCancellationMiddleware`
  does; a NeMo-Gym server's own tests install it on the app they build. `ng_run` does not add it: gymfleet's
  servers decide per route what a disconnect cancels (gymfleet's agents stop a rollout whose caller left).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

_session: aiohttp.ClientSession | None = None
_request_debug = False


class GlobalAIOHTTPAsyncClientConfig(BaseModel):
    """0.7.0's settings of its global aiohttp client (connection budget, debug, TCP keep-alive)."""

    global_aiohttp_connector_limit: int = Field(default=100 * 1024, ge=0)
    global_aiohttp_connector_limit_per_host: int = Field(default=1024, ge=0)
    global_aiohttp_intended_concurrency: int | None = Field(default=None, gt=0)
    global_aiohttp_intended_concurrency_per_host: int | None = Field(default=None, gt=0)
    global_aiohttp_client_request_debug: bool = False
    global_aiohttp_tcp_keepalive_idle_seconds: int = Field(default=60, ge=1, le=32767)
    global_aiohttp_tcp_keepalive_interval_seconds: int = Field(default=10, ge=1, le=32767)
    global_aiohttp_tcp_keepalive_probes: int = Field(default=3, ge=1, le=127)


def global_aiohttp_client() -> aiohttp.ClientSession | None:
    """The session `set_global_aiohttp_client` made, while it is open."""
    return _session if _session is not None and not _session.closed else None


def is_global_aiohttp_client_setup() -> bool:
    return global_aiohttp_client() is not None


def is_global_aiohttp_client_request_debug_enabled() -> bool:
    """The `global_aiohttp_client_request_debug` setting of the last `set_global_aiohttp_client`."""
    return _request_debug


def set_global_aiohttp_client(cfg: GlobalAIOHTTPAsyncClientConfig) -> aiohttp.ClientSession:
    """Make the process's global aiohttp session (inside a running event loop, as aiohttp requires).

    Raises:
        AssertionError: one is set up and still open (0.7.0's refusal; close it or call `global_aiohttp_client_exit`).
    """
    global _session, _request_debug
    assert not is_global_aiohttp_client_setup(), (
        "There is already a global aiohttp client setup: close it (or call global_aiohttp_client_exit) first")
    limit = cfg.global_aiohttp_connector_limit
    per_host = cfg.global_aiohttp_connector_limit_per_host
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=per_host, keepalive_timeout=15.0)
    _request_debug = cfg.global_aiohttp_client_request_debug
    _session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(),
                                     cookie_jar=aiohttp.DummyCookieJar())
    return _session


def get_global_aiohttp_client(*_: Any, **__: Any) -> aiohttp.ClientSession:
    """The open global session, else a new one with the default settings (0.7.0 reads them from the global config;
    gymfleet's calls do not use this session, so its settings change nothing of theirs)."""
    return global_aiohttp_client() or set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())


def global_aiohttp_client_exit() -> None:
    """Forget the global session (0.7.0 closes it at interpreter exit; an open one is closed where a loop allows)."""
    global _session
    session, _session = _session, None
    if session is None or session.closed:
        return
    try:
        asyncio.get_running_loop().create_task(session.close())
    except RuntimeError:  # no running loop: close it on a loop of its own
        asyncio.run(session.close())


class DisconnectCancelMiddleware:
    """Cancel a request's handler when its client disconnects before the whole answer was sent (pure ASGI)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.num_cancelled = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        answered, left = asyncio.Event(), asyncio.Event()

        async def send_unless_left(message: dict[str, Any]) -> None:
            if left.is_set():
                return
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered.set()

        handler = asyncio.ensure_future(self.app(scope, inbox.get, send_unless_left))

        async def listen() -> None:  # the only reader of the server's receive channel
            while True:
                message = await receive()
                await inbox.put(message)
                if message["type"] == "http.disconnect":
                    if not answered.is_set():
                        left.set()
                        self.num_cancelled += 1
                        handler.cancel()
                    return

        listener = asyncio.ensure_future(listen())
        try:
            await handler
        except asyncio.CancelledError:
            if not left.is_set():
                raise
            log.info("%s %s: the client disconnected; its handler was cancelled", scope["method"], scope["path"])
        finally:
            listener.cancel()


ClientDisconnectCancellationMiddleware = DisconnectCancelMiddleware
"""0.7.0's name for it (`nemo_gym.server_utils.ClientDisconnectCancellationMiddleware`)."""
