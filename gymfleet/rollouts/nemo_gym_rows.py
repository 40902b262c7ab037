"""NeMo-Gym 0.7.0's `RolloutCollectionConfig` and its row preparation for a rollout collection
(`RolloutCollectionHelper._preprocess_rows_from_config`): input lines to the rollouts to dispatch
(`gymfleet.rollouts.nemo_gym_collect`).

`RolloutCollectionConfig`: 0.7.0's fields, defaults and checks (`agent_name` folded into `agent_map._default`,
`num_repeats` >= 1, `dispatch_budget_s` only with `num_samples_in_parallel`, no empty or repeated `fan_out` list), and
gymfleet's `request_timeout_s`; the `retry_*` fields are read by a resume (`nemo_gym_collect`).

`read_raw_rows(path, limit)`: the first `limit` lines (0 or None: all), each `(index, line, row)`; a line that is
not a JSON object is a `DataError` naming the file and line. `preprocess_raw_rows(raw, config)`, in 0.7.0's order:

- routing: `agent_map[<row's agent_ref.name or task_source>]`, else `agent_map._default` (`agent_name` is that),
  else the row's own `agent_ref`; `environment_routing_mode=legacy` stamps `_ng_environment_server` instead;
- `fan_out[<routing key>]`: the row once per listed agent;
- `responses_create_params` merged over the row's; `num_repeats_add_seed`: `{"seed": <rollout index>}` in
  `responses_create_params.metadata.extra_body` (a JSON string, as vLLM reads it);
- `_ng_task_index`: the row's own, else the same for identical lines; `_ng_rollout_index`: 0, 1, ... per task;
- `num_repeats`: a number, or per dispatched agent or routing key (the agent wins), `_default` as fallback;
- `interleave_repeats`: abcabc instead of aabbcc.

Refused, each with the key and the fix: a row with no agent (no `agent_ref`, no `agent_name`); a row routed by
`task_source` alone (0.7.0 resolves it from the datasets' config; gymfleet does not); materialized taskset rows
(`task_id.taskset` with `task_input`); a `num_repeats` dict without an entry for a row.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from pydantic import Field, field_validator, model_validator

from gymfleet.errors import ConfigError, DataError
from gymfleet.serving.nemo_gym_client import plain_config
from gymfleet.serving.nemo_gym_collection import SharedRolloutCollectionConfig
from gymfleet.serving.nemo_gym_records import materialized_path_for
from gymfleet.serving.nemo_gym_types import AGENT_REF_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

log = logging.getLogger(__name__)

PARAMS = "responses_create_params"


class RolloutCollectionConfig(SharedRolloutCollectionConfig):
    """0.7.0's `RolloutCollectionConfig` (see the module docstring and `gymfleet.rollouts.nemo_gym_collect`)."""

    agent_name: str | None = None
    agent_map: dict[str, str] | None = None
    fan_out: dict[str, list[str]] | None = None
    input_jsonl_fpath: str
    limit: int | None = None
    num_repeats: int | dict[str, int] = 1
    num_repeats_add_seed: bool = False
    interleave_repeats: bool = False
    resume_from_cache: bool = False
    prompt_config: str | None = None
    skills: Any = None
    dispatch_budget_s: float | None = Field(default=None, ge=0)
    drain_margin_s: float | None = Field(default=None, ge=0)
    dispatch_longest_first: bool = False
    retry_terminal_timeouts: bool = False
    """On resume, retry sidecar rows of class `timeout_exceeded` (and the repairable environment faults) even when
    stamped `_ng_failure_terminal`, up to `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`."""
    retry_invalid_judge_responses: bool = False
    """On resume, move `out.jsonl` rows flagged `invalid_judge_response` into the sidecar as retryable
    `judge_invalid` attempts, so they are judged again."""
    request_timeout_s: float = Field(default=3600.0, gt=0)
    """gymfleet's: the deadline of one `/run` (0.7.0 sets none; the key is `ng_collect_rollouts`' own). A `/run` past
    it is a `timeout` failure: a sidecar row with `route_failures_to_sidecar`, else the end of the run."""

    @field_validator("num_repeats", mode="before")
    @classmethod
    def _null_is_one(cls, value: Any) -> Any:
        return 1 if value is None else value

    @model_validator(mode="after")
    def _check(self) -> RolloutCollectionConfig:
        if self.agent_name is not None:
            default = (self.agent_map or {}).get("_default")
            if default is not None and default != self.agent_name:
                raise ValueError(f"agent_name={self.agent_name!r} conflicts with agent_map._default={default!r}; "
                                 "set only one of them")
            self.agent_map = {**(self.agent_map or {}), "_default": self.agent_name}
        repeats = self.num_repeats if isinstance(self.num_repeats, dict) else {"": self.num_repeats}
        if bad := {name: n for name, n in repeats.items() if n < 1}:
            raise ValueError(f"num_repeats must be >= 1, got {bad.get('', bad)}")
        if self.dispatch_budget_s is not None and self.num_samples_in_parallel is None:
            raise ValueError("dispatch_budget_s requires a finite positive num_samples_in_parallel; unbounded "
                             "dispatch can POST the entire queue before the budget is re-checked")
        for key, agents in (self.fan_out or {}).items():
            if not agents:
                raise ValueError(f"fan_out[{key!r}] is an empty list, which would drop every matching row; remove "
                                 "the key or list at least one agent")
            if len(set(agents)) != len(agents):
                raise ValueError(f"fan_out[{key!r}] lists the same agent more than once; use num_repeats to repeat")
        return self

    @property
    def materialized_jsonl_fpath(self) -> Path:
        return materialized_path_for(Path(self.output_jsonl_fpath))



def read_raw_rows(path: Path, limit: int | None) -> list[tuple[int, bytes, dict[str, Any]]]:
    """The input's lines as `(index, line, row)` (at most `limit` of them; blank lines count, as in 0.7.0).

    Raises:
        ConfigError: the file does not exist. DataError: a line is not a JSON object.
    """
    if not path.exists():
        raise ConfigError(f"input file not found: {str(path)!r}", path="input_jsonl_fpath",
                          hint="check the path (relative paths are from the current directory)")
    rows = []
    with path.open("rb") as file:
        for index, line in enumerate(file):
            if limit and index >= limit:
                break
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise DataError(f"malformed JSON ({exc})", file=str(path), line=index + 1) from None
            if not isinstance(row, dict):
                raise DataError(f"a row must be a JSON object, not {type(row).__name__}", file=str(path),
                                line=index + 1)
            rows.append((index, line.strip(), row))
    return rows


def preprocess_raw_rows(raw_rows: list[tuple[int, bytes, dict[str, Any]]], config: Any) -> list[dict[str, Any]]:
    """The rollouts to dispatch (see the module docstring).

    Raises:
        ConfigError: a row no agent can be found for, a row kind gymfleet does not dispatch, or a `num_repeats`
            dict that misses a row's agent.
    """
    overrides = plain_config(config.responses_create_params)
    if overrides:
        log.info("overriding responses_create_params fields with %s", overrides)
    fixed = config.num_repeats if isinstance(config.num_repeats, int) else None
    per_key = {} if fixed is not None else {k: v for k, v in config.num_repeats.items() if k != "_default"}
    default = None if fixed is not None else config.num_repeats.get("_default")
    legacy = config.environment_routing_mode == "legacy"
    if config.environment_routing_mode == "taskset" or config.environment_server_routes:
        raise ConfigError("taskset routing (materialized task rows) is not supported by gymfleet's NeMo-Gym "
                          "collector", path="environment_routing_mode", hint="use environment_routing_mode=agent")
    task_of: dict[bytes, int] = {}
    next_rollout: Counter = Counter()
    no_agent, missing_repeats, seen, overridden = [], set(), set(), set()
    rows: list[dict[str, Any]] = []
    for index, line, row in raw_rows:
        if isinstance(row.get("task_id"), dict) and "task_input" in row:
            raise ConfigError(f"row {index}: materialized taskset rows are not supported by gymfleet's NeMo-Gym "
                              "collector", path="input_jsonl_fpath", hint="give the rows as flat agent rows")
        agent = (row.get(AGENT_REF_KEY_NAME) or {}).get("name")
        source = row.get("task_source")
        basis = agent if agent is not None else source
        if legacy:
            row["_ng_environment_server"] = config.environment_server_name
        elif config.agent_map:
            mapped = next((config.agent_map[k] for k in (agent, source) if k is not None and k in config.agent_map),
                          config.agent_map.get("_default"))
            if mapped is not None:
                if agent is not None and agent != mapped:
                    overridden.add((agent, mapped))
                agent = mapped
                row[AGENT_REF_KEY_NAME] = {"name": mapped}
        if legacy:
            targets: list[str | None] = [None]
        elif config.fan_out and basis is not None and basis in config.fan_out:
            targets = list(config.fan_out[basis])
        elif agent is not None:
            targets = [agent]
        elif source is not None:
            raise ConfigError(f"row {index} names only task_source {source!r}; gymfleet does not resolve task "
                              "sources to agents", path="agent_map", hint=f"set +agent_map={{{source}: <agent>}}")
        else:
            no_agent.append(index)
            continue
        if PARAMS in row or overrides:
            row[PARAMS] = {**(row.get(PARAMS) or {}), **overrides}
        if TASK_INDEX_KEY_NAME not in row:
            row[TASK_INDEX_KEY_NAME] = task_of.setdefault(line, len(task_of))
        for target in targets:
            keys = [k for k in dict.fromkeys((target, basis)) if k is not None]
            seen.update(keys)
            count = fixed if fixed is not None else next((per_key[k] for k in keys if k in per_key), default)
            if count is None:
                missing_repeats.add(" / ".join(keys))
                continue
            for _ in range(count):
                copy = dict(row)
                if target is not None and (copy.get(AGENT_REF_KEY_NAME) or {}).get("name") != target:
                    copy[AGENT_REF_KEY_NAME] = {"name": target}
                copy[ROLLOUT_INDEX_KEY_NAME] = next_rollout[copy[TASK_INDEX_KEY_NAME]]
                next_rollout[copy[TASK_INDEX_KEY_NAME]] += 1
                if config.num_repeats_add_seed:
                    _add_seed(copy)
                rows.append(copy)
    if overridden:
        log.warning("agent_map overrode agent_ref values already in the data: %s", sorted(overridden))
    if no_agent:
        raise ConfigError(f"no agent for rows {no_agent}", path="agent_name",
                          hint="set +agent_name (or +agent_map with a _default entry), or give the rows agent_ref")
    if missing_repeats:
        raise ConfigError(f"num_repeats has no entry for {sorted(missing_repeats)} and no _default",
                          path="num_repeats", hint=f"add them or _default (listed: {sorted(per_key)})")
    if unknown := set(per_key) - seen:
        log.warning("num_repeats names agents no input row has (a typo?): %s", sorted(unknown))
    if config.interleave_repeats:
        rows.sort(key=lambda row: row[ROLLOUT_INDEX_KEY_NAME])
    return rows


def _add_seed(row: dict[str, Any]) -> None:
    params = dict(row.get(PARAMS) or {})
    metadata = dict(params.get("metadata") or {})
    extra_body = json.loads(metadata.get("extra_body", "{}"))
    extra_body["seed"] = row[ROLLOUT_INDEX_KEY_NAME]
    metadata["extra_body"] = json.dumps(extra_body)
    params["metadata"] = metadata
    row[PARAMS] = params
