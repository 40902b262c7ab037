"""NeMo-Gym's rollout correlation (`nemo_gym.rollout_correlation`, 0.7.0): which rollout a server-side call belongs
to, carried in the URL path as `/ng-rollout/<id>/...` and, inside a request, in a context variable.

- `maybe_rollout_id_from_run_body(row)`: a row's rollout id. An explicit `_ng_rollout_id` wins (a malformed one is
  a `ValueError` naming the field, never rewritten into a key nobody can look up); else `"<task>-<rollout>"` from
  `_ng_task_index` / `_ng_rollout_index`; a re-dispatch (`_ng_attempt_index` > 0) appends `-a<n>`.
- `rollout_context(id)` / `current_rollout_id()`: the id for what runs inside the block.
- `RolloutContextMiddleware`: pure ASGI; a request to `/ng-rollout/<id>/<rest>` is served as `/<rest>` with `<id>`
  as the current rollout id; any other request passes untouched.
- `rollout_path_prefix(id)` / `apply_rollout_prefix(url, id)`: the path prefix a folder puts before a model
  server's route (`""` without an id; `/training-token-capture` after it with `token_capture=True`).

gymfleet's own model servers keep no per-rollout token capture, so `gymfleet.serving.nemo_gym_client.ServerClient`
sends a prefixed call to the route without the prefix (`strip_rollout_prefix`); a folder's own app that mounts the
middleware (NeMo-Gym's Gymnasium base does) gets the id as under NeMo-Gym.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pydantic import BaseModel

from gymfleet.serving.nemo_gym_types import ATTEMPT_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

ROLLOUT_ID_KEY_NAME = "_ng_rollout_id"
ROLLOUT_PATH_PREFIX = "ng-rollout"
TOKEN_CAPTURE_PATH_SEGMENT = "training-token-capture"
ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""A rollout id is one path segment and a file name part: letters, digits, `.`, `_`, `-`, not starting with a dot."""

_ROLLOUT_ID: ContextVar[str | None] = ContextVar("gymfleet_nemo_gym_rollout_id", default=None)
_PREFIXED = re.compile(rf"^/{ROLLOUT_PATH_PREFIX}/(?P<id>[A-Za-z0-9][A-Za-z0-9._-]*)(?P<rest>/.*)$")
_CAPTURE = f"/{TOKEN_CAPTURE_PATH_SEGMENT}/"


def _field(row: BaseModel | Mapping[str, Any], key: str) -> Any:
    if isinstance(row, Mapping):
        return row.get(key)
    if key == ROLLOUT_ID_KEY_NAME:  # BaseRunRequest holds it as `capture_rollout_id` (alias `_ng_rollout_id`)
        return getattr(row, "capture_rollout_id", None)
    value = getattr(row, key, None)
    return value if value is not None else (row.model_extra or {}).get(key)


def maybe_rollout_id_from_run_body(row: BaseModel | Mapping[str, Any] | None) -> str | None:
    """The rollout id of a run request or row (module docstring), or None when it carries none.

    Raises:
        ValueError: `_ng_rollout_id` is set but is not a valid id.
    """
    if not isinstance(row, BaseModel | Mapping):
        return None
    explicit = _field(row, ROLLOUT_ID_KEY_NAME)
    if explicit is not None:
        if not isinstance(explicit, str) or not ROLLOUT_ID_PATTERN.match(explicit):
            raise ValueError(f"{ROLLOUT_ID_KEY_NAME} must be letters, digits, '.', '_' or '-', starting with a letter "
                             f"or digit (it is a URL path segment and a file name part); got {explicit!r}")
        rollout_id = explicit
    else:
        task, rollout = _field(row, TASK_INDEX_KEY_NAME), _field(row, ROLLOUT_INDEX_KEY_NAME)
        if task is None or rollout is None:
            return None
        rollout_id = f"{task}-{rollout}"
    attempt = _field(row, ATTEMPT_INDEX_KEY_NAME)
    return f"{rollout_id}-a{int(attempt)}" if attempt is not None and int(attempt) > 0 else rollout_id


def current_rollout_id() -> str | None:
    """The rollout id of the request (or `rollout_context` block) being served, if any."""
    return _ROLLOUT_ID.get()


@contextmanager
def rollout_context(rollout_id: str | None) -> Iterator[None]:
    """Make `rollout_id` the current rollout id inside the block (restored after it, also on error)."""
    token = _ROLLOUT_ID.set(rollout_id)
    try:
        yield
    finally:
        _ROLLOUT_ID.reset(token)


def rollout_path_prefix(rollout_id: str | None, *, token_capture: bool = False) -> str:
    """`/ng-rollout/<id>` (plus `/training-token-capture`), or `""` without an id."""
    if not rollout_id:
        return ""
    return f"/{ROLLOUT_PATH_PREFIX}/{rollout_id}" + (f"/{TOKEN_CAPTURE_PATH_SEGMENT}" if token_capture else "")


def apply_rollout_prefix(base_url: str, rollout_id: str | None, *, token_capture: bool = False) -> str:
    """A model server's root URL with the rollout's prefix after it (unchanged without an id)."""
    if not rollout_id:
        return base_url
    return base_url.rstrip("/") + rollout_path_prefix(rollout_id, token_capture=token_capture)


def split_rollout_prefix(path: str) -> tuple[str | None, str]:
    """`(id, rest)` of a `/ng-rollout/<id>/<rest>` path; `(None, path)` for any other."""
    match = _PREFIXED.match(path)
    return (match.group("id"), match.group("rest")) if match else (None, path)


def strip_rollout_prefix(path: str) -> str:
    """`path` without its rollout prefix nor the token-capture segment after it (gymfleet's servers serve the same
    route for every rollout)."""
    rollout_id, rest = split_rollout_prefix(path)
    return rest[len(_CAPTURE) - 1:] if rollout_id is not None and rest.startswith(_CAPTURE) else rest


class RolloutContextMiddleware:
    """Pure ASGI: serve `/ng-rollout/<id>/<rest>` as `/<rest>` with `<id>` as the current rollout id."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        rollout_id, rest = split_rollout_prefix(scope.get("path", "")) if scope.get("type") == "http" else (None, "")
        if rollout_id is None:
            await self.app(scope, receive, send)
            return
        with rollout_context(rollout_id):
            await self.app({**scope, "path": rest, "raw_path": rest.encode()}, receive, send)
