"""The one HTTP client every server-to-server call goes through.

One pooled `aiohttp.ClientSession` per process and event loop (aiohttp: ~115-160 µs of client CPU per request where
httpx spends 1.2-6 ms; see ARCHITECTURE decision 5). Every call has a deadline; failures are retried a bounded
number of times with exponential backoff and full jitter (honouring `Retry-After`) when retrying cannot run the call
twice (`RetryPolicy` says which); other 4xx answers are returned to the caller untouched. No cookie jar: cookies are
passed and returned explicitly, as NeMo-Gym's agents expect.

Which failures are retried:
- the connection could not be made (refused, DNS, connect deadline): always: the request never left;
- a 429/502/503/504 answer (`retry_statuses`): always: the server answered, refusing the work;
- the connection dropped, or the answer was cut, after the request may have been sent: only for idempotent calls
  (GET/HEAD/OPTIONS/PUT/DELETE, or a policy with `idempotent=True`). A POST such as `/run`, a sandbox run or a judge
  call may have run: it ends as a `TransportError` (`connection_error`) saying it was not retried;
- the deadline passed with no answer: only for idempotent calls whose policy also sets `retry_timeouts`.

`ServerClient` resolves instance names from the global config to URLs, so callers say `await client.post("mcqa",
"/verify", json=row, cookies=cookies)`. An instance placed as several replicas (Ray placement,
`gymfleet.fleet.ray_placement`) resolves to one replica per rollout: rollouts spread over the replicas, the calls of
one rollout stick to one (see `ServerClient` and `gymfleet.replicas`). Every request to a server of the fleet carries
the fleet's token (`gymfleet.auth`: `ServerClient` grants it to the fleet's addresses, and to nothing else).

Every attempt is counted in `gymfleet.metrics`' `gymfleet_upstream_seconds{target}` and
`gymfleet_upstream_requests_total{target, outcome}`: `target` is the instance name for calls by name, else the
base URL (a model server's vLLM or OpenAI endpoint, the sandbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gymfleet import auth, connections, metrics
from gymfleet.errors import ServerRefError, TransportError
from gymfleet.http_types import (  # noqa: F401  (re-exported: callers use http.RetryPolicy, http.HttpResponse)
    IDEMPOTENT_METHODS,
    NO_RETRY,
    RETRY_STATUSES,
    HttpResponse,
    RetryPolicy,
)
from gymfleet.replicas import (  # noqa: F401  (re-exported: callers use http.rollout_scope)
    REFRESH_MIN_INTERVAL_S,
    REPLICA_AVOID_S,
    choose,
    client_host,
    copy_addresses,
    instance_urls,
    replica_load,
    rollout_replicas,
    rollout_scope,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0
CONNECT_TIMEOUT_S = 20.0
"""Connecting is retried (safe: nothing was sent); the bound covers a SYN backlog overflowing in a 4k-rollout burst.
It bounds the TCP connect only. A request waiting for a free connection of a full pool has not started: its deadline
(`timeout_s`) starts once it has one (`gymfleet.connections.pool_slot`)."""


@dataclass(frozen=True)
class ClientLimits:
    """Connection-pool limits (NeMo-Gym's `global_aiohttp_connector_limit[_per_host]` keys)."""

    limit: int = 102_400
    limit_per_host: int = 16_384
    keepalive_timeout_s: float = connections.CLIENT_KEEP_ALIVE_S
    """Idle pooled connections live this long: under every server's keep-alive, so the client never reuses a
    connection the server is closing (`gymfleet.connections.CLIENT_KEEP_ALIVE_S`)."""


_limits = ClientLimits()
_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = weakref.WeakKeyDictionary()


def configure(limits: ClientLimits) -> None:
    """Set pool limits for sessions created from now on (call once at process start)."""
    global _limits
    _limits = limits


def _session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        limit = min(_limits.limit or connections.OPEN_FILES_TARGET, connections.budget())  # past it: EMFILE
        connector = connections.PacedConnector(
            limit=limit,
            limit_per_host=min(_limits.limit_per_host or limit, limit),
            keepalive_timeout=_limits.keepalive_timeout_s,
            ttl_dns_cache=300,
        )
        session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            json_serialize=lambda obj: orjson.dumps(obj).decode(),
            timeout=aiohttp.ClientTimeout(total=None),
        )
        _sessions[loop] = session
        connections.make_room(loop, limit)
    return session


def plan_in_flight(count: int, what: str = "requests") -> int:
    """`connections.plan_in_flight` for this process's pool (`configure`'s limits)."""
    return connections.plan_in_flight(count, what, _limits.limit)


async def close() -> None:
    """Close this event loop's session (servers call it on shutdown)."""
    session = _sessions.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()


def _cookie_header(cookies: dict[str, str]) -> str:
    return "; ".join(f"{name}={value}" for name, value in cookies.items())


async def request(
    method: str,
    url: str,
    *,
    json: Any = None,
    data: bytes | None = None,
    cookies: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    retry: RetryPolicy = RetryPolicy(),
    target: str | None = None,
) -> HttpResponse:
    """Send one request with a deadline per attempt and bounded retries.

    Args:
        method: HTTP method.
        url: Absolute URL.
        json: Body to send as JSON (orjson).
        data: Raw body (mutually exclusive with `json`).
        cookies: Cookies to send (explicitly; there is no jar).
        headers: Extra headers.
        timeout_s: Deadline for one attempt, connect included, counted from when the request holds a connection
            slot of this process's pool (waiting for one when the pool is full is not counted).
        retry: Which failures are retried and how long to back off; whether the call is idempotent.
        target: The `target` label of this call's `gymfleet_upstream_*` metrics (`ServerClient` passes the instance
            name); default: the instance serving `url` if known, else its base URL.

    Returns:
        The response, whatever its status once retries are spent (call `raise_for_status()` to insist on 2xx).

    Raises:
        TransportError: the server could not be reached, the connection was lost, or no answer came in time
            (`failure_class` is `connection_error` or `timeout`), and retrying was spent or unsafe.
    """
    _session()  # this loop's pool, its connection slots and its connect turns
    try:
        async with connections.pool_slot():  # a full pool: wait here, not started, off the clock
            began = time.monotonic()  # the deadline counts from here
            async with connections.first_turn(timeout_s):  # before anything is built
                return await _send(method, url, json=json, data=data, cookies=cookies, headers=headers,
                                   timeout_s=timeout_s, retry=retry, target=target, began=began)
    except connections.NoTurn:
        raise TransportError(f"no connection to {url} could be started within {timeout_s:g}s (this process has "
                             f"{connections.CONNECTS_AT_ONCE} connect turns; all were taken the whole time)", url=url,
                             failure_class="timeout") from None


async def _send(method: str, url: str, *, json: Any, data: bytes | None, cookies: dict[str, str] | None,
                headers: dict[str, str] | None, timeout_s: float, retry: RetryPolicy, target: str | None,
                began: float) -> HttpResponse:
    """`request`, holding a connect turn taken at `began` (see `request`)."""
    body = orjson.dumps(json) if json is not None else data
    send_headers = {"Content-Type": "application/json"} if json is not None else {}
    if headers:
        send_headers.update(headers)
    if cookies:
        send_headers["Cookie"] = _cookie_header(cookies)
    token = auth.token_of(url)
    if token is not None and auth.TOKEN_HEADER not in send_headers:
        send_headers[auth.TOKEN_HEADER] = token
    session = _session()
    idempotent = retry.is_idempotent(method)
    target = target or metrics.target_of(url)
    attempt = 0
    first_attempt = time.monotonic()
    while True:
        start = time.perf_counter()
        never_connected = False
        try:
            async with connections.attempt_turn(timeout_s, began if attempt == 0 else time.monotonic()) as left_s, \
                    session.request(method, url, data=_payload(body), headers=send_headers,
                                    timeout=_deadline(left_s)) as resp:
                payload = await resp.read()
                result = HttpResponse(
                    status=resp.status,
                    body=payload,
                    url=url,
                    headers=resp.headers,
                    _set_cookie=resp.headers.getall("Set-Cookie", []),
                )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:  # never connected: nothing sent
            never_connected = True
            failure = TransportError(f"cannot reach {url}: {_describe(exc)}", url=url,
                                     failure_class="connection_error")
            metrics.observe_upstream(target, time.perf_counter() - start, failure.failure_class)
        except TimeoutError as exc:  # sent, no answer in time (aiohttp's read timeouts are TimeoutErrors too)
            failure = TransportError(f"no answer from {url} within {timeout_s:g}s", url=url, failure_class="timeout")
            metrics.observe_upstream(target, time.perf_counter() - start, failure.failure_class)
            if not (idempotent and retry.retry_timeouts):
                raise failure from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:  # may have been sent
            forgone = not idempotent and attempt + 1 < retry.max_attempts
            failure = _connection_lost(method, url, exc, forgone_retry=forgone)
            metrics.observe_upstream(target, time.perf_counter() - start, failure.failure_class)
            if not idempotent:
                raise failure from exc
        else:
            outcome = _STATUS_CLASSES[min(result.status // 100, 5)]
            metrics.observe_upstream(target, time.perf_counter() - start, outcome)
            if result.status not in retry.retry_statuses or attempt + 1 >= retry.max_attempts:
                return result
            delay = retry.delay(attempt, result.headers.get("Retry-After"))
            log.warning(
                "%s %s -> %s; retry %d/%d in %.2fs",
                method,
                url,
                result.status,
                attempt + 1,
                retry.max_attempts - 1,
                delay,
            )
            attempt += 1
            await asyncio.sleep(delay)
            continue
        if attempt + 1 >= retry.max_attempts:
            waited_s = time.monotonic() - first_attempt
            if not never_connected or waited_s >= retry.connect_retry_s:
                raise failure
            if attempt + 1 == retry.max_attempts:
                log.warning("%s %s: %s; retrying for up to %gs more (a server being restarted)", method, url, failure,
                            retry.connect_retry_s - waited_s)
            attempt += 1
            await asyncio.sleep(min(retry.delay(attempt), retry.connect_retry_s - waited_s, 1.0))
            continue
        delay = retry.delay(attempt)
        log.warning(
            "%s %s failed (%s); retry %d/%d in %.2fs", method, url, failure, attempt + 1, retry.max_attempts - 1, delay
        )
        attempt += 1
        await asyncio.sleep(delay)


def _deadline(timeout_s: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(CONNECT_TIMEOUT_S, timeout_s))


_STATUS_CLASSES = ("0xx", "1xx", "2xx", "3xx", "4xx", "5xx")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}{connections.out_of_files_hint(exc)}"


def _connection_lost(method: str, url: str, exc: BaseException, *, forgone_retry: bool) -> TransportError:
    """The failure of a call whose connection dropped after the request may have been sent. When a retry is forgone
    because the call is not idempotent, the message says so and it is logged here, once."""
    message = f"lost the connection to {url} after the request may have reached it: {_describe(exc)}"
    if forgone_retry:
        message += (
            f"; not retried: the server may have run it ({method} is not idempotent; a RetryPolicy with "
            "idempotent=True retries it)"
        )
        log.warning("%s %s: %s", method, url, message)
    return TransportError(message, url=url, failure_class="connection_error")


class ServerClient:
    """Calls fleet servers by instance name, resolving URLs from the global config dict.

    An instance placed as several replicas (Ray placement: its config lists `replicas: [{host, port}, ...]`) is
    resolved to one of them per rollout: the first call to the instance within a rollout (the first call a task
    makes begins one, shared by the tasks it starts afterwards: a request being handled and the calls it makes;
    see `rollout_scope`; `url_of` alone begins none) picks the replica with the fewest
    calls in flight among those not recently failed, and later calls of the rollout to that instance go to the same
    replica, since its sessions (seed_session, tools, verify; a sandbox session) live in that replica's memory. A
    replica whose connection fails is avoided by new rollouts for `REPLICA_AVOID_S` and the client asks the head
    server (`head_server` in the config) for the current addresses: a replica restarted elsewhere is found there.
    The rollout's own call still fails (`TransportError`, `connection_error`): its session is gone with the replica.
    """

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self._replicas: dict[str, list[str]] = {}
        head = config.get("head_server")
        head = head if isinstance(head, dict) else {}
        self.token = auth.token_for(head.get("host"), head.get("port"))
        """The fleet's token (`gymfleet.auth`), sent on every call to the fleet's servers (and to no other URL)."""
        if self.token:
            if head.get("port") is not None:
                auth.grant(f"http://{client_host(head.get('host'))}:{head['port']}", self.token)
            for name in config:  # a fleet server reached by URL (a model server's upstream may be one) gets it too
                with contextlib.suppress(ServerRefError, KeyError, TypeError, ValueError):
                    for url in instance_urls(self.config, name):
                        auth.grant(url, self.token)
        self._refresh: asyncio.Future | None = None
        self._refreshed_at = 0.0

    def url_of(self, name: str) -> str:
        """Base URL (`http://host:port`) of instance `name`: the replica this rollout uses (see the class docstring).
        """
        return choose(name, self.urls_of(name))

    def urls_of(self, name: str) -> list[str]:
        """Base URLs of every replica of instance `name` (one, unless it is placed as several replicas)."""
        urls = self._replicas.get(name)
        if urls is None:
            urls = self._replicas[name] = instance_urls(self.config, name)
            for url in urls:
                metrics.name_instance(url, name)
                auth.grant(url, self.token)
        return urls

    async def call(self, method: str, server: str, path: str, **kwargs: Any) -> HttpResponse:
        """Send `method` to `path` on instance `server` (this rollout's replica of it); `kwargs` as `request`'s."""
        if rollout_replicas.get() is None:  # the first call of this task (a request, a rollout) begins a rollout
            rollout_replicas.set({})
        base = self.url_of(server)
        replica_load.in_flight[base] = replica_load.in_flight.get(base, 0) + 1
        try:
            return await request(method, base + path, target=server, **kwargs)
        except TransportError as exc:
            if exc.failure_class == "connection_error":
                self.replica_failed(server, base)
            raise
        finally:
            replica_load.in_flight[base] -= 1

    def replica_failed(self, name: str, base_url: str) -> None:
        """Note that a connection to `base_url`, a replica of `name`, failed: new rollouts avoid it for a while and
        the replicas' addresses are asked of the head server (for callers that send requests themselves)."""
        if len(self.urls_of(name)) > 1:
            replica_load.failed(base_url)
            self._refresh_soon()

    def _refresh_soon(self) -> None:
        """Ask the head server for the replicas' addresses in the background (at most every few moments)."""
        head = self.config.get("head_server")
        now = time.monotonic()
        if not isinstance(head, dict) or head.get("port") is None or now - self._refreshed_at < REFRESH_MIN_INTERVAL_S:
            return
        if self._refresh is not None and not self._refresh.done():
            return
        self._refreshed_at = now
        self._refresh = asyncio.ensure_future(self._refresh_from_head(head["host"], int(head["port"])))

    async def _refresh_from_head(self, host: str, port: int) -> None:
        import yaml

        try:
            response = await request("GET", f"http://{client_host(host)}:{port}/global_config_dict_yaml",
                                     timeout_s=10.0, retry=NO_RETRY)
            published = published_config(response.raise_for_status().json())
        except (TransportError, ValueError, yaml.YAMLError) as exc:
            log.warning("could not refresh the replicas' addresses from the head server: %s", exc)
            return
        if isinstance(published, dict):
            for name in list(self._replicas):
                copy_addresses(published.get(name), self.config.get(name))
            self._replicas.clear()

    async def post(
        self,
        server: str,
        path: str,
        *,
        json: Any = None,
        cookies: dict[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy = RetryPolicy(),
    ) -> HttpResponse:
        """POST `json` to `path` on instance `server` (on this rollout's replica of it)."""
        return await self.call("POST", server, path, json=json, cookies=cookies, timeout_s=timeout_s, retry=retry)

    async def get(self, server: str, path: str, *, timeout_s: float = 30.0) -> HttpResponse:
        return await self.call("GET", server, path, timeout_s=timeout_s)

    @classmethod
    async def from_head(cls, host: str, port: int, *, timeout_s: float = 30.0) -> ServerClient:
        """Bootstrap from the head server, as every out-of-process NeMo-Gym client does."""
        head = f"http://{client_host(host)}:{port}"
        auth.grant(head, auth.token_for(host, port))
        response = await request("GET", f"{head}/global_config_dict_yaml", timeout_s=timeout_s)
        response.raise_for_status()
        return cls(published_config(response.json()))


def published_config(text: str) -> Any:
    """The fleet's config as the head server publishes it (`/global_config_dict_yaml`, a YAML document), read with
    libyaml's parser where PyYAML has it: the same objects as `yaml.safe_load` (the resolver and constructor are
    PyYAML's own either way) for about an eighth of the CPU, paid by every client that bootstraps from the head.

    Raises:
        yaml.YAMLError: not YAML.
    """
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


LARGE_BODY_BYTES = 1 << 20


def _payload(body: Any) -> Any:
    """A large `bytes` body as a fresh stream per attempt: aiohttp warns that writing a big `bytes` object at once
    "might lock the event loop" (an error under `-W error`), and streams it in chunks instead."""
    if isinstance(body, bytes) and len(body) > LARGE_BODY_BYTES:
        return io.BytesIO(body)
    return body
