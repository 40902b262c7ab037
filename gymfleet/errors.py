"""The gymfleet error tree.

Every error a gymfleet component raises on purpose derives from `GymfleetError`:

```
GymfleetError
├── ConfigError          bad configuration (.path = dotted YAML path, .hint = how to fix)
│   └── ServerRefError   a {type, name} reference or instance name that does not exist
├── DataError            bad dataset row (.file, .line, .reason)
├── BadRequestError      a request a server cannot serve, by the caller's fault (answered 400)
├── BusyError            a server at one of its capacity bounds, the work not started (answered 429 + Retry-After)
├── TransportError       a network hop failed (.status, .url, .response_content)
│   └── UpstreamError    the upstream model returned an error
├── JudgeError           a judge call failed (infrastructure, not the model's fault)
└── SandboxError         a sandbox call failed (infrastructure, not the model's fault)
```

Messages name the thing that is wrong (a YAML path, a file and line, a URL) and say how to fix it.

`first_errors` and `too_many_errors` keep a request's validation errors short: a body of many wrong-typed items
is answered with its first `MAX_REPORTED_ERRORS` errors and a count, never with all of them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

__all__ = [
    "BadRequestError",
    "BusyError",
    "ConfigError",
    "DataError",
    "GymfleetError",
    "JudgeError",
    "SandboxError",
    "ServerRefError",
    "TransportError",
    "UpstreamError",
    "MAX_REPORTED_ERRORS",
    "did_you_mean",
    "first_errors",
    "too_many_errors",
]

MAX_REPORTED_ERRORS = 20
"""Validation errors one answer lists; the rest are counted (`too_many_errors`), not listed."""


def did_you_mean(name: object, candidates: Iterable[object]) -> str:
    """Return `" Did you mean 'x'?"` for the closest candidate to `name`, or `""` if none is close.

    Examples:
        >>> did_you_mean("grading_mod", ["grading_mode", "domain"])
        " Did you mean 'grading_mode'?"
        >>> did_you_mean("zzz", ["grading_mode"])
        ''
    """
    matches = difflib.get_close_matches(str(name), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" Did you mean {matches[0]!r}?" if matches else ""


def first_errors(
    model: type[BaseModel], data: Any, exc: ValidationError, limit: int = MAX_REPORTED_ERRORS
) -> list[dict[str, Any]]:
    """At most `limit` of the errors `exc` raised validating `data` into `model`, without building all of them.

    Each is pydantic's error dict without its URL (and, past `limit` errors, without `ctx` and `input`).
    `exc.errors()` builds every error: a 0.5 MB body of 250,000 wrong-typed list items holds 250,002 of them,
    about a second and hundreds of MB to build. So past `limit` errors, `data` is validated again with every list
    cut to its first `limit` items, a copy no larger than `data`, and its first errors are listed: they are errors
    of `data` too (only a `min_length` above `limit` could fail on the cut copy alone). If the cut copy is valid
    (the errors lie past the cut, or in a huge dict), `exc`'s own errors are listed.
    """
    from pydantic import ValidationError  # here: `gymfleet.errors` stays light for `ng_run`'s first milliseconds

    if exc.error_count() <= limit:
        return exc.errors(include_url=False)
    try:
        model.model_validate(_cut_lists(data, limit))
    except ValidationError as cut_exc:  # kept in no variable: a cycle through this frame would keep `exc` alive
        return cut_exc.errors(include_url=False, include_context=False, include_input=False)[:limit]
    return exc.errors(include_url=False, include_context=False, include_input=False)[:limit]


def too_many_errors(total: int, listed: int, loc: tuple[str | int, ...] = ()) -> list[dict[str, Any]]:
    """`[]`, or one last error entry saying how many of `total` errors were left out of the `listed` ones."""
    if total <= listed:
        return []
    return [
        {
            "type": "too_many_errors",
            "loc": loc,
            "msg": f"... and {total - listed} more errors ({total} in all); only the first {listed} are listed",
        }
    ]


def _cut_lists(value: Any, keep: int) -> Any:
    """`value` (parsed JSON) with every list, at any depth, cut to its first `keep` items."""
    if isinstance(value, list):
        return [_cut_lists(item, keep) for item in value[:keep]]
    if isinstance(value, dict):
        return {key: _cut_lists(item, keep) for key, item in value.items()}
    return value


class GymfleetError(Exception):
    """Base class of every error gymfleet raises on purpose."""


class ConfigError(GymfleetError):
    """Bad configuration: a YAML file, a CLI override or a field value."""

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        super().__init__(f"{message}\n{hint}" if hint else message)
        self.message = message
        self.path = path
        self.hint = hint


class ServerRefError(ConfigError):
    """A `{type, name}` server reference or an instance name that does not exist."""


class DataError(GymfleetError):
    """A bad dataset row."""

    def __init__(self, reason: str, *, file: str | None = None, line: int | None = None) -> None:
        where = ":".join(str(part) for part in (file, line) if part is not None)
        super().__init__(f"{where}: {reason}" if where else reason)
        self.reason = reason
        self.file = file
        self.line = line


class BadRequestError(GymfleetError):
    """A request a server understood but cannot serve, by the caller's fault; servers answer it with a 400."""


class BusyError(GymfleetError):
    """The server is at one of its capacity bounds and did not start the work; servers answer it with a 429 and
    `Retry-After: retry_after_s`, which clients may retry (nothing was done)."""

    def __init__(self, reason: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


class SessionLostError(GymfleetError):
    """The rollout's session is gone (evicted past a server's session cap, or never seeded): what a request needed
    of it cannot be had; servers answer it with a 410 `session_lost`, which agents turn into a failure row."""


class TransportError(GymfleetError):
    """A network hop failed (connection error, timeout or non-2xx status)."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        url: str | None = None,
        response_content: bytes | None = None,
        failure_class: str = "transport_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.url = url
        self.response_content = response_content
        self.failure_class = failure_class


class UpstreamError(TransportError):
    """The upstream model endpoint returned an error."""


class JudgeError(GymfleetError):
    """A judge call failed or its verdict was unparseable (infrastructure, not the model's fault)."""


class SandboxError(GymfleetError):
    """A sandbox call failed (infrastructure, not the model's fault)."""
