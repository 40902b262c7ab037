"""The gymfleet error tree.

Every error a gymfleet component raises on purpose derives from `GymfleetError`:

```
GymfleetError
├── ConfigError          bad configuration (.path = dotted YAML path, .hint = how to fix)
│   └── ServerRefError   a {type, name} reference or instance name that does not exist
├── DataError            bad dataset row (.file, .line, .reason)
├── BadRequestError      a request a server cannot serve, by the caller's fault (answered 400)
├── TransportError       a network hop failed (.status, .url, .response_content)
│   └── UpstreamError    the upstream model returned an error
├── JudgeError           a judge call failed (infrastructure, not the model's fault)
└── SandboxError         a sandbox call failed (infrastructure, not the model's fault)
```

Messages name the thing that is wrong (a YAML path, a file and line, a URL) and say how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "BadRequestError",
    "ConfigError",
    "DataError",
    "GymfleetError",
    "JudgeError",
    "SandboxError",
    "ServerRefError",
    "TransportError",
    "UpstreamError",
    "did_you_mean",
]


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
