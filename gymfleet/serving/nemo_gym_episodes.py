"""NeMo-Gym 0.7.0's Environment Server episode contracts (`nemo_gym.episode_types`, `nemo_gym.task_materialization`).

An Environment Server runs one episode per request: `BaseEpisodeRequest{episode_id, task: MaterializedTask{task_id,
task_input}}` in, `BaseEpisodeResponse{episode_id, task_id, result | failure}` out, where a handled failure is an
`EpisodeFailure` (`failure_reason`, `terminal`: whether collection must not try the episode again, and optionally a
registered `failure_kind` and the `stage` it happened in; unset ones are left out of the JSON). Folders subclass these
generics with their task input and result types.

`materialize_task(row, taskset=...)` turns a flat dataset row into that envelope: the task's id is the row's
`task_id`, `problem_id` or `instance_id` (the first present), else its position (`_ng_task_index`, or `task_index`);
`task_input` is the row without routing keys (`agent_ref`, `task_source`, `skills_ref`, `_ng_*`). A row that is
already materialized, or has no id and no valid position, is a `ValueError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from gymfleet.serving.nemo_gym_failures import FailureStage, validate_failure_kind
from gymfleet.serving.nemo_gym_types import (
    AGENT_REF_KEY_NAME,
    SKILLS_REF_KEY_NAME,
    TASK_INDEX_KEY_NAME,
    TASK_SOURCE_KEY_NAME,
    EpisodeId,
    TaskId,
)

TaskInputT = TypeVar("TaskInputT", bound=BaseModel)
EpisodeResultT = TypeVar("EpisodeResultT")
ROUTING_KEYS = frozenset({AGENT_REF_KEY_NAME, TASK_SOURCE_KEY_NAME, SKILLS_REF_KEY_NAME})
"""Row keys that route a task rather than describe it: never part of `task_input`."""
_ID_KEYS = ("task_id", "problem_id", "instance_id")


def is_materialized_task_row(row: Mapping[str, object]) -> bool:
    """Whether `row` has the materialized envelope (`task_id` mapping and `task_input`), valid or not."""
    return isinstance(row.get("task_id"), Mapping) and "task_input" in row


class EpisodeFailure(BaseModel):
    """A handled failure of an episode, the same on the wire and in saved records."""

    model_config = ConfigDict(extra="forbid")
    failure_reason: str = Field(max_length=2000)
    terminal: bool = Field(description="Whether rollout collection must not attempt this episode again.")
    failure_kind: str | None = None
    stage: FailureStage | None = None

    @field_validator("failure_kind")
    @classmethod
    def _registered_kind(cls, value: str | None) -> str | None:
        return validate_failure_kind(value)

    @model_serializer(mode="wrap")
    def _without_unknowns(self, handler: Any) -> Any:  # the producer could not classify it: say nothing
        data = handler(self)
        for key in ("failure_kind", "stage"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class MaterializedTask(BaseModel, Generic[TaskInputT]):
    """A task's durable id and its typed input."""

    model_config = ConfigDict(extra="forbid")
    task_id: TaskId
    task_input: TaskInputT


class BaseEpisodeRequest(BaseModel, Generic[TaskInputT]):
    """One episode to run: which attempt, of which task."""

    model_config = ConfigDict(extra="forbid")
    episode_id: EpisodeId
    task: MaterializedTask[TaskInputT]


class BaseEpisodeResponse(BaseModel, Generic[EpisodeResultT]):
    """An episode's outcome: exactly one of a typed `result` or a handled `failure`."""

    model_config = ConfigDict(extra="forbid")
    episode_id: EpisodeId
    task_id: TaskId
    result: EpisodeResultT | None = None
    failure: EpisodeFailure | None = None

    @model_validator(mode="after")
    def _one_outcome(self) -> BaseEpisodeResponse:
        if (self.result is None) == (self.failure is None):
            raise ValueError("exactly one of result or failure is required")
        return self


def materialize_task(row: Mapping[str, Any], *, taskset: str, task_index: int | None = None) -> dict[str, Any]:
    """A flat dataset row as `{task_id: {taskset, task_id}, task_input}` (module docstring); `row` is not changed.

    Raises:
        ValueError: the row is already materialized, or has no id and no non-negative integer position.
    """
    if "task_input" in row or isinstance(row.get("task_id"), Mapping):
        raise ValueError("Expected a flat dataset row, not an already materialized task")
    task_id = next((str(row[key]) for key in _ID_KEYS if row.get(key) is not None), None)
    if task_id is None:
        index = row.get(TASK_INDEX_KEY_NAME, task_index)
        if type(index) is not int or index < 0:
            raise ValueError(f"A flat row without a task ID ({', '.join(_ID_KEYS)}) requires a non-negative "
                             f"task_index (or {TASK_INDEX_KEY_NAME}); got {index!r}")
        task_id = str(index)
    return {"task_id": TaskId(taskset=taskset, task_id=task_id).model_dump(mode="json"),
            "task_input": {key: value for key, value in row.items()
                           if key not in ROUTING_KEYS and not key.startswith("_ng_")}}
