"""The HTTP client's values: which failures a call retries (`RetryPolicy`) and the fully read answer it returns
(`HttpResponse`). `gymfleet.http` sends the requests and re-exports both, under the names callers use
(`http.RetryPolicy`, `http.HttpResponse`, `http.NO_RETRY`).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any

import orjson

from gymfleet.errors import TransportError

RETRY_STATUSES = frozenset({429, 502, 503, 504})
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
"""Methods HTTP defines as idempotent (RFC 9110 9.2.2): sending one twice does what sending it once does."""


CLIENT_LOOP_LAG_S = 120.0
"""The longest event-loop lag measured in a client of gymfleet's servers: 65,536 rollouts posted at once from one
process on 2 loaded cores (`bench/rollouts_at_scale.py`, load 13-22) kept its loop from reading answers for up to
about two minutes at a time."""

SERVER_KEEP_ALIVE_S = 300
"""How long gymfleet's own servers keep an idle connection open: longer than any client's pool keeps one (aiohttp's
default 15 s, which NeMo-RL's client uses; `gymfleet.connections.CLIENT_KEEP_ALIVE_S`), so clients close first, even
a client whose loop lags (`CLIENT_LOOP_LAG_S`). The server's idle clock starts when it has written an answer, the
client's only once its loop has read it; with 30 s, a client lagging that long picked a connection from its pool,
found it open, and wrote its `/run` one loop pass later, by which time the server had closed it: "Server
disconnected" on a POST that may not be retried (36 of 65,536 rollouts). An idle connection costs the server a
socket and a few KiB; clients close theirs within seconds."""

@dataclass(frozen=True)
class RetryPolicy:
    """How a call is retried. Only failures where retrying is safe and useful are retried (see `gymfleet.http`'s
    docstring)."""

    max_attempts: int = 4
    """Total attempts, the first included."""
    backoff_s: float = 0.25
    """First backoff; doubles each attempt (full jitter)."""
    max_backoff_s: float = 8.0
    retry_statuses: frozenset[int] = RETRY_STATUSES
    idempotent: bool = False
    """Running the call twice does no harm (a pure function of its body, or a receiver that de-duplicates), so a
    failure after the request may have reached the server (a dropped connection, a cut answer) is retried. Off by
    default for POST: `/run`, sandbox runs and judge calls must not run twice. GET/HEAD/OPTIONS/PUT/DELETE calls are
    idempotent whatever this says."""
    retry_timeouts: bool = False
    """Also retry an idempotent call after its deadline passed with no answer. Off by default: the server may still
    be working on it, and each retry waits a whole deadline again. Ignored for calls that are not idempotent."""
    connect_retry_s: float = 0.0
    """Keep retrying a call that could not connect (nothing was sent, so any call may be resent) until this many
    seconds after its first attempt, past `max_attempts`: a server its supervisor is restarting (1 s backoff plus
    start-up) then costs only the calls that were in flight when it died. 0: `max_attempts` alone bounds it."""

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.max_backoff_s)
            except ValueError:
                pass
        return random.uniform(0, min(self.max_backoff_s, self.backoff_s * 2**attempt))


    def is_idempotent(self, method: str) -> bool:
        """Whether a `method` call under this policy may be sent again after it may have reached the server."""
        return self.idempotent or method.upper() in IDEMPOTENT_METHODS


NO_RETRY = RetryPolicy(max_attempts=1)


@functools.lru_cache(maxsize=4096)
def _set_cookie_pairs(header: str) -> tuple[tuple[str, str], ...]:
    """The `(name, value)` pairs of one `Set-Cookie` header, as `http.cookies` reads them. Cached: a server sends a
    session's cookie again with every answer (as Starlette's sessions do), so an agent reads the same header on each
    of a rollout's calls, and parsing one costs 20-50 µs."""
    parsed = SimpleCookie()
    parsed.load(header)
    return tuple((name, morsel.value) for name, morsel in parsed.items())


@dataclass
class HttpResponse:
    """A fully read HTTP response. `cookies` are parsed from `Set-Cookie` on first use (most callers never look)."""

    status: int
    body: bytes
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    _set_cookie: list[str] = field(default_factory=list, repr=False)

    @functools.cached_property
    def cookies(self) -> dict[str, str]:
        cookies: dict[str, str] = {}
        for header in self._set_cookie:
            cookies.update(_set_cookie_pairs(header))
        return cookies

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def raise_for_status(self) -> HttpResponse:
        if not self.ok:
            raise _http_error(self)
        return self

    @property
    def failure_class(self) -> str:
        """What failed, for a non-2xx answer: the `error_type` a gymfleet server put in its JSON error body
        (`timeout`, `connection_error`, `upstream_error`, ...; a hop passes on the class of the hop behind it), else
        `http_5xx` / `http_4xx`."""
        try:
            inner = self.json()
        except ValueError:
            inner = None
        error_type = inner.get("error_type") if isinstance(inner, dict) else None
        if isinstance(error_type, str) and error_type:
            return error_type
        return "http_5xx" if self.status >= 500 else "http_4xx"


def _http_error(response: HttpResponse) -> TransportError:
    return TransportError(
        f"HTTP {response.status} from {response.url}: {response.text[:500]}",
        status=response.status,
        url=response.url,
        response_content=response.body,
        failure_class=response.failure_class,
    )
