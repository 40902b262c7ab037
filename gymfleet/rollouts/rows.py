"""Row checks `ng_collect_rollouts`, `ng_prepare_data`, `ng_reverify` and the offline tools share: reading JSONL
with line numbers, validating a row's `responses_create_params` and task fields against the environment's `/verify`
model, and reporting bad lines as `file:line: reason`."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from gymfleet.errors import DataError, GymfleetError, did_you_mean
from gymfleet.fleet.config_checks import resolve_server_ref
from gymfleet.fleet.config_instances import GlobalConfig, ServerInstance
from gymfleet.progress import Progress
from gymfleet.wire import Response, ResponseCreateParams, known_params, make_response

log = logging.getLogger(__name__)

MAX_LISTED_ROWS = 50
"""Bad lines named one by one in an error; the rest are counted."""
PROGRESS_MIN_BYTES = 16 << 20
"""Files at least this large (bytes) show progress while they are read (a few seconds of work and up)."""
PROGRESS_EVERY_S = 5.0
"""Seconds between plain progress lines when stderr is not a terminal."""


def warn_unknown_params(path: Path, rows: Iterable[tuple[int, dict[str, Any]]]) -> list[str]:
    """Log one warning per `responses_create_params` key that neither gymfleet nor the `openai` package knows.

    Such keys are passed on (a newer client's parameters must not break the fleet), so a typo (`temprature`)
    would otherwise pass silently and be dropped or refused by the model server. Returns the names warned about.
    """
    first_seen: dict[str, tuple[int, int]] = {}  # name -> (first line, count)
    for lineno, row in rows:
        params = row.get("responses_create_params")
        for name in params if isinstance(params, dict) else ():
            if name not in known_params():
                line, count = first_seen.get(name, (lineno, 0))
                first_seen[name] = (line, count + 1)
    for name, (line, count) in first_seen.items():
        log.warning("%s:%d: responses_create_params.%s (in %d rows) is not a Responses API parameter gymfleet or "
                    "the installed openai package knows; model servers pass it on, drop it or refuse it.%s",
                    path, line, name, count, did_you_mean(name, known_params()))
    return list(first_seen)


def row_problems(path: Path, problems: list[tuple[int, str]], why: str = "") -> DataError:
    """One error naming every bad line as `file:line: reason` (the first `MAX_LISTED_ROWS`; the rest counted)."""
    (first, reason), rest = problems[0], problems[1:MAX_LISTED_ROWS]
    more = "".join(f"\n{path}:{lineno}: {problem}" for lineno, problem in rest)
    if len(problems) > MAX_LISTED_ROWS:
        more += f"\n... and {len(problems) - MAX_LISTED_ROWS} more bad lines"
    return DataError(reason + more + (f"\n{why}" if why else ""), file=str(path), line=first)


def describe_errors(exc: ValidationError, limit: int = 3) -> str:
    """`a.b: msg; c: msg` for the first `limit` errors of a pydantic validation error."""
    errors = exc.errors(include_url=False)
    parts = [f"{'.'.join(map(str, e['loc'])) or '(row)'}: {e['msg']}" for e in errors[:limit]]
    if len(errors) > limit:
        parts.append(f"... {len(errors) - limit} more")
    return "; ".join(parts)


def verify_request_model(global_config: GlobalConfig, agent: ServerInstance) -> type[BaseModel] | None:
    """The `/verify` request model of the agent's resources server (`agent.resources_server`), or None when the
    agent names none, it cannot be loaded (logged), or it takes any row (the base `VerifyRequest`).

    `ng_prepare_data` and `ng_collect_rollouts` check rows with it (`task_fields_problem`)."""
    from gymfleet.fleet.launch import load_server_class
    from gymfleet.serving.resources import ResourcesServer, VerifyRequest

    ref = agent.fields.get("resources_server")
    if ref is None:
        return None
    try:
        name = resolve_server_ref(ref, "resources_servers", global_config, f"{agent.path}.resources_server")
        server_class = load_server_class(global_config.instance(name))
    except (GymfleetError, ImportError, SyntaxError) as exc:  # the row check is extra; ng_run reports these too
        log.warning("%s: rows are checked without the resources server's verify model: %s", agent.name, exc)
        return None
    if not issubclass(server_class, ResourcesServer):
        return None
    model = server_class.verify_request_model()
    return None if model is VerifyRequest else model


def check_row(line: str, verify_model: type[BaseModel] | None, placeholder: Response) -> tuple[Any, str | None]:
    """`(row, None)` for a valid line, else `(None, reason)`."""
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc})"
    if not isinstance(row, dict):
        return None, f"expected a JSON object, got {type(row).__name__}"
    if not isinstance(row.get("responses_create_params"), dict):
        return None, "missing responses_create_params (an object with at least `input`)"
    try:
        ResponseCreateParams.model_validate(row["responses_create_params"])
    except ValidationError as exc:
        return None, "responses_create_params: " + describe_errors(exc)
    reason = task_fields_problem(row, verify_model, placeholder)
    return (row, None) if reason is None else (None, reason)


def task_fields_problem(
    row: dict[str, Any], verify_model: type[BaseModel] | None, placeholder: Response
) -> str | None:
    """Why the environment's `/verify` would refuse `row` (with `placeholder` as the model's response), or None.

    Example: `not a valid MCQARequest: expected_answer: Input should be a valid string`.
    """
    if verify_model is None:
        return None
    try:
        verify_model.model_validate({**row, "response": placeholder})
    except ValidationError as exc:
        return f"not a valid {verify_model.__name__}: " + describe_errors(exc)
    return None


def placeholder_response() -> Response:
    """An empty model response, standing in for the one a row's rollout will have when its fields are checked."""
    return Response.model_validate(make_response(""))


def json_object(line: bytes | str) -> dict[str, Any] | None:
    """The JSON object `line` holds; None when it holds another JSON value or no valid JSON."""
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """`(line number, object)` for every non-blank line.

    Raises:
        DataError: the file does not exist, or a line is not a JSON object.
    """
    if not path.is_file():
        raise DataError("no such file", file=str(path))
    rows = []
    size = path.stat().st_size
    with path.open("rb") as handle, Progress(size, f"Reading {path.name}", unit="B", every_s=PROGRESS_EVERY_S,
                                             enabled=size >= PROGRESS_MIN_BYTES) as progress:
        for lineno, line in enumerate(handle, 1):
            progress.update(len(line))
            if not line.strip():
                continue
            row = json_object(line)
            if row is None:
                raise DataError("not a JSON object", file=str(path), line=lineno)
            rows.append((lineno, row))
    return rows
