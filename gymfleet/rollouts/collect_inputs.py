"""What a rollout collection runs, checked before anything is sent: its config, the input rows, the outputs.

- `RolloutCollectionConfig`: `ng_collect_rollouts`' keys.
- `check_outputs`: an earlier run's outputs are never replaced silently (`resume_from_cache` / `overwrite`).
- `load_rows` / `read_tasks`: the input lines, read, checked (`file:line: reason` per bad line) and expanded into one
  row per rollout (`num_repeats`, `num_repeats_add_seed`).
- `check_task_fields`: every row against its environment's `/verify` request model, as `ng_prepare_data` does.

The collection itself is `gymfleet.rollouts.collect`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gymfleet.errors import ConfigError, DataError, GymfleetError
from gymfleet.fleet.config_instances import GlobalConfig
from gymfleet.http import ServerClient
from gymfleet.rollouts.rows import (
    describe_errors,
    placeholder_response,
    row_problems,
    task_fields_problem,
    verify_request_model,
    warn_unknown_params,
)
from gymfleet.wire import ResponseCreateParams

log = logging.getLogger(__name__)


class RolloutCollectionConfig(BaseModel):
    """`ng_collect_rollouts`' keys (top-level keys of the global config; any other key is ignored)."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)

    input_jsonl_fpath: str
    """Dataset rows, one JSON object per line."""
    output_jsonl_fpath: str
    """Where successful results go; the sidecar files are named after it."""
    agent_name: str | None = None
    """Agent for rows without an `agent_ref`."""
    limit: int | None = Field(default=None, ge=0)
    """Read at most this many lines."""
    num_repeats: int | dict[str, int] | None = 1
    """Rollouts per row: a number, or `{<agent>: n, _default: n}`."""
    num_repeats_add_seed: bool = False
    """Put `{"seed": <rollout index>}` into `responses_create_params.metadata.extra_body`."""
    num_samples_in_parallel: int | None = Field(default=None, ge=1)
    """Most `/run` requests in flight (None: all at once)."""
    responses_create_params: dict[str, Any] = Field(default_factory=dict)
    """Shallow-merged over every row's `responses_create_params` (e.g. `{temperature: 0.6}`)."""
    resume_from_cache: bool = False
    """Finish an earlier run into the same output: finished rollouts are kept and not redone, failed ones are
    retried (up to `max_attempts`), and the output files are appended to."""
    overwrite: bool = Field(default=False, description=(
        "Replace the outputs of an earlier run into the same `output_jsonl_fpath` (all four files). Without it, "
        "or `resume_from_cache`, a collection into existing outputs is refused before anything is sent."))
    stop_after_connection_failures: int | None = Field(default=20, ge=1, description=(
        "This many rollouts of one agent in a row failing with `connection_error` make the collector ask the head "
        "server whether the fleet is up; it stops (exit code 3, resume later) if the head does not answer or the "
        "failures go on to twice this many. null: never stop."))
    disable_aggregation: bool = False
    max_attempts: int = Field(default=3, ge=1)
    """With `resume_from_cache`, a rollout that failed this many times is not tried again."""
    request_timeout_s: float = Field(default=3600.0, gt=0)
    """Deadline for one `/run` (a long agentic episode takes minutes)."""
    connect_retry_s: float = Field(default=10.0, ge=0)
    """How long a `/run` (or `/aggregate_metrics`) that cannot connect to its agent keeps trying: an agent its
    supervisor restarts then costs only the rollouts in flight at its death. 0: three attempts, then a failure."""

    @field_validator("num_repeats")
    @classmethod
    def _positive_repeats(cls, value: int | dict[str, int] | None) -> int | dict[str, int] | None:
        counts = value.values() if isinstance(value, dict) else [value] if value is not None else []
        if any(count < 1 for count in counts):
            raise ValueError(f"repeat counts must be >= 1, got {value!r}")
        return value

    def repeats_for(self, agent: str) -> int:
        if isinstance(self.num_repeats, dict):
            return self.num_repeats.get(agent, self.num_repeats.get("_default", 1))
        return self.num_repeats or 1

    def sidecar(self, suffix: str) -> Path:
        """`<output dir>/<output stem><suffix>`."""
        output = Path(self.output_jsonl_fpath)
        return output.with_name(output.stem + suffix)

    def output_files(self) -> dict[str, Path]:
        """The four files a collection writes, by what they hold."""
        return {
            "rollouts": Path(self.output_jsonl_fpath),
            "failures": self.sidecar("_failures.jsonl"),
            "materialized inputs": self.sidecar("_materialized_inputs.jsonl"),
            "aggregate metrics": self.sidecar("_aggregate_metrics.json"),
        }


def check_outputs(config: RolloutCollectionConfig) -> None:
    """Refuse to replace an earlier run's outputs unless `overwrite` (or `resume_from_cache`) says what to do.

    Raises:
        ConfigError: both flags are set, or an output file exists and neither is.
    """
    if config.resume_from_cache and config.overwrite:
        raise ConfigError(
            "+resume_from_cache=true and +overwrite=true contradict each other: resuming keeps the earlier "
            "rollouts, overwriting replaces them.", path="overwrite", hint="Pass only one of them.")
    if config.resume_from_cache or config.overwrite:
        return
    existing = [str(path) for path in config.output_files().values() if path.exists()]
    if existing:
        raise ConfigError(
            f"the output of an earlier collection exists: {', '.join(existing)}. It is not replaced silently.",
            path="output_jsonl_fpath",
            hint="Rerun with +resume_from_cache=true to keep those rollouts and finish the rest, or with "
            "+overwrite=true to replace all four files (or choose another +output_jsonl_fpath).",
        )


# ---------------------------------------------------------------------------------------------- rows


def load_rows(config: RolloutCollectionConfig) -> list[dict[str, Any]]:
    """Read, check and expand the input rows (every rollout to run, in dispatch order).

    Raises:
        DataError: the file is missing, or lines are bad (every bad line is named as `file:line: reason`).
    """
    return [rollout for _, base in read_tasks(config) for rollout in _repeat(base, config)]


def read_tasks(config: RolloutCollectionConfig) -> list[tuple[int, dict[str, Any]]]:
    """The input rows before repeating, with their line numbers (`load_rows` without the expansion).

    Raises:
        DataError: as `load_rows`.
    """
    path = Path(config.input_jsonl_fpath)
    if not path.is_file():
        raise DataError("input file does not exist", file=str(path))
    problems: list[tuple[int, str]] = []
    tasks_by_text: dict[str, int] = {}
    bases: list[tuple[int, dict[str, Any]]] = []
    with path.open(encoding="utf-8") as lines:
        read = 0
        for lineno, line in enumerate(lines, 1):
            text = line.strip()
            if not text:
                continue
            if config.limit is not None and read >= config.limit:
                break
            read += 1
            row, reason = _parse_row(text, config)
            if reason is not None:
                problems.append((lineno, reason))
                continue
            if "_ng_task_index" not in row:
                row["_ng_task_index"] = tasks_by_text.setdefault(text, len(tasks_by_text))
            bases.append((lineno, row))
    if problems:
        raise row_problems(path, problems)
    warn_unknown_params(path, bases)
    return bases


def _parse_row(text: str, config: RolloutCollectionConfig) -> tuple[dict[str, Any], str | None]:
    try:
        row = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return {}, f"not valid JSON ({exc})"
    if not isinstance(row, dict):
        return {}, f"expected a JSON object, got {type(row).__name__}"
    if "agent_ref" not in row:
        if config.agent_name is None:
            return row, "no agent_ref, and no +agent_name=<agent> to default to"
        row["agent_ref"] = {"type": "responses_api_agents", "name": config.agent_name}
    ref = row["agent_ref"]
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
        return row, f"agent_ref must be {{type, name}}, got {ref!r}"
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        return row, "missing responses_create_params (an object with at least `input`)"
    row["responses_create_params"] = {**params, **config.responses_create_params}
    try:
        ResponseCreateParams.model_validate(row["responses_create_params"])
    except ValidationError as exc:
        return row, "responses_create_params: " + describe_errors(exc)
    return row, None


def _repeat(base: dict[str, Any], config: RolloutCollectionConfig) -> Iterator[dict[str, Any]]:
    encoded = orjson.dumps(base)
    for rollout_index in range(config.repeats_for(base["agent_ref"]["name"])):
        row = orjson.loads(encoded)
        row["_ng_rollout_index"] = rollout_index
        if config.num_repeats_add_seed:
            params = row["responses_create_params"]
            metadata = dict(params.get("metadata") or {})
            try:
                extra = json.loads(metadata.get("extra_body") or "{}")
            except json.JSONDecodeError:
                extra = None
            if not isinstance(extra, dict):
                raise DataError(f"task {base['_ng_task_index']}: metadata.extra_body is not a JSON object string")
            metadata["extra_body"] = json.dumps({**extra, "seed": rollout_index})
            params["metadata"] = metadata
        yield row


# ---------------------------------------------------------------------------------- environments' request models


def check_task_fields(config: RolloutCollectionConfig, client: ServerClient) -> None:
    """Check every input row against its environment's `/verify` request model, as `ng_prepare_data` does.

    Which environment an agent uses comes from the fleet's config (`client.config`, the head server's). An
    environment whose code cannot be imported here is not checked (logged): the fleet still checks at `/verify`.

    Raises:
        DataError: rows the environment would refuse, each named as `file:line: reason`.
    """

    tasks = read_tasks(config)
    models = _request_models(client, {row["agent_ref"]["name"] for _, row in tasks})
    if not any(models.values()):
        return
    placeholder = placeholder_response()
    problems = [(lineno, problem) for lineno, row in tasks
                if (problem := task_fields_problem(row, models.get(row["agent_ref"]["name"]), placeholder))]
    if problems:
        raise row_problems(
            Path(config.input_jsonl_fpath), problems,
            f"{len(problems)} rows do not fit their environment's request model, so nothing was sent. Fix the "
            "rows (ng_prepare_data checks a dataset the same way) and rerun.",
        )


def _request_models(client: ServerClient, agents: set[str]) -> dict[str, type[BaseModel] | None]:
    """Each agent's environment `/verify` request model (None where there is none to check with)."""

    try:
        fleet_config = GlobalConfig.from_data(client.config)
    except GymfleetError as exc:
        log.warning("rows are not checked against their environments' request models: the fleet's config does "
                    "not parse here (%s)", exc)
        return {}
    return {agent: verify_request_model(fleet_config, fleet_config.instances[agent])
            for agent in sorted(agents) if agent in fleet_config.instances}

