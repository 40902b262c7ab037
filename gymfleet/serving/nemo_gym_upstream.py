"""Failed `ServerClient` calls, remembered per request, so that what a folder raises after one is typed.

A NeMo-Gym folder often reads a judge's answer without checking its status
(`NeMoGymResponse.model_validate(await get_response_json(response))`): when the judge answers an error, the folder
raises a `ValidationError` (or a `KeyError`, an `IndexError`, ...) that says nothing about the judge. NeMo-Gym 0.7.0
answers any such exception with an untyped 500 (`repr(e)`, from its exception middleware), which a trainer cannot tell
from a bug in the folder. Here every `ServerClient` call that failed (a non-2xx answer, or no answer: a
`TransportError`) is noted in the request it was made for (`note_failed_call`; `watch_calls` opens the record, and
`UpstreamWatchMiddleware` opens one per HTTP request, shared by the tasks the request's handler starts), and an
exception out of a handler whose request holds such a note is an infrastructure failure (`classify`):

- `/verify` answers NeMo-Gym's failure row (`failure_fields`: `reward` 0.0, `mask_sample`, `failure_kind`,
  `_ng_failure_class`), the shape of its `judge_failsafe` row, never a reward;
- any other route (a tool, `/seed_session`) answers a 502 with `error_type` set to that class, as a `TransportError`
  out of a handler does (`gymfleet.serving.server`).

The class is `judge_failed` when a failed call went to a model server (a resources server calls a model to judge), else
`transport_failed`; the reason names the exception, then the failed call (instance, path, status, the start of its
body). An exception raised in a request with no failed call stays the folder's own (an untyped 500: a bug to fix).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

SCOPE_KEY = "gymfleet.failed_calls"
"""Where `UpstreamWatchMiddleware` leaves a request's record in its ASGI scope (for the error handler)."""
DETAIL_CHARS = 300


@dataclass(frozen=True)
class FailedCall:
    """One `ServerClient` call that failed: the instance and path called, the status (None: no answer), what came
    back (the start of the body, or the transport error), and whether that instance is a model server."""

    server: str
    path: str
    status: int | None
    detail: str
    to_model: bool

    def describe(self) -> str:
        answer = f"HTTP {self.status}" if self.status is not None else "no answer"
        return f"{self.server} {self.path} failed ({answer}: {self.detail[:DETAIL_CHARS]})"


_failed_calls: ContextVar[list[FailedCall] | None] = ContextVar("gymfleet_failed_calls", default=None)


def is_model_server(config: Mapping[str, Any] | None, server: str) -> bool:
    """Whether instance `server` of the fleet config is a model server (`responses_api_models`)."""
    block = (config or {}).get(server)
    return isinstance(block, Mapping) and "responses_api_models" in block


def note_failed_call(call: FailedCall) -> None:
    """Remember `call` in the current request's record (nothing outside a watched request)."""
    record = _failed_calls.get()
    if record is not None:
        record.append(call)


@contextlib.contextmanager
def watch_calls() -> Iterator[list[FailedCall]]:
    """The current request's record of failed calls: the open one, else a new one for the block."""
    record = _failed_calls.get()
    if record is not None:
        yield record
        return
    record = []
    token = _failed_calls.set(record)
    try:
        yield record
    finally:
        _failed_calls.reset(token)


def classify(exc: BaseException, failed: list[FailedCall]) -> tuple[str, str] | None:
    """(failure class, reason) for `exc` raised in a request that holds `failed` calls; None when none failed."""
    if not failed:
        return None
    failure_class = "judge_failed" if any(call.to_model for call in failed) else "transport_failed"
    calls = "; ".join(call.describe() for call in failed[-3:])
    return failure_class, f"{type(exc).__name__}: {exc} (raised after a failed call: {calls})"


class UpstreamWatchMiddleware:
    """Opens a record of failed calls per HTTP request (in a context variable, and in the scope under
    `SCOPE_KEY` for the app's error handler)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record: list[FailedCall] = []
        scope[SCOPE_KEY] = record
        token = _failed_calls.set(record)
        try:
            await self.app(scope, receive, send)
        finally:
            _failed_calls.reset(token)
