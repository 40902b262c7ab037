"""NeMo-Gym 0.7.0's `SharedRolloutCollectionConfig` (`nemo_gym.rollout_collection`): the settings its rollout
collection commands share, with 0.7.0's fields, defaults and checks, so code written against it imports and builds
one (gdpval's multi-stage orchestrator and its tests).

`check_completion(expected=, results=)` is 0.7.0's completion rule: with `require_complete`, a run whose distinct
completed samples (`stage_index`, task index, rollout index; failure rows and rows not to persist left out) number
fewer than `expected` raises `RuntimeError` naming the count and where the partial outputs are.

`attach_ng_perf` (0.7.0's `_attach_ng_perf`, which the orchestrator calls on each result) adds nothing when
observability is off, as 0.7.0's; on, it raises `NotImplementedError`: a rollout's `ng_perf` is assembled from
NeMo-Gym's per-call model capture, which gymfleet's model servers do not keep.

gymfleet's own collector (`ng_collect_rollouts`) reads its keys with `gymfleet.rollouts.collect_inputs`; this class
describes NeMo-Gym's and drives nothing here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from gymfleet.serving.nemo_gym_records import NG_FAILURE_CLASS_KEY, NG_NO_PERSIST_KEY
from gymfleet.serving.nemo_gym_types import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = ["SharedRolloutCollectionConfig", "attach_ng_perf"]


class SharedRolloutCollectionConfig(BaseModel):
    """NeMo-Gym's shared rollout-collection settings (its `upload_rollouts` too)."""

    output_jsonl_fpath: str
    require_complete: bool = False
    num_samples_in_parallel: int | None = Field(default=None, gt=0)
    max_resident_rollout_tasks: int | None = Field(default=None, ge=1)
    retain_results_in_memory: bool = True
    responses_create_params: dict[str, Any] = Field(default_factory=dict)
    disable_aggregation: bool = False
    disable_health_check: bool = False
    health_check_workers: int | None = Field(default=None, ge=1)
    health_check_ignored_checks: list[str] = Field(default_factory=list)
    count_failure_classes_as_zero: list[str] = Field(default_factory=list)
    count_missing_rollouts_as_zero: bool = False
    route_failures_to_sidecar: bool = False
    rollout_collection_driver: str | None = None
    environment_routing_mode: Literal["agent", "legacy", "taskset"] = "agent"
    environment_server_name: str | None = None
    environment_server_routes: dict[str, str] = Field(default_factory=dict)
    upload_rollouts: bool = True

    @model_validator(mode="after")
    def _routing(self) -> SharedRolloutCollectionConfig:
        if self.environment_routing_mode == "legacy" and self.environment_server_name is None:
            raise ValueError("environment_server_name is required when environment_routing_mode=legacy")
        if self.environment_routing_mode == "taskset" and not self.environment_server_routes:
            raise ValueError("environment_server_routes are required when environment_routing_mode=taskset")
        return self

    def check_completion(self, *, expected: int, results: list[dict[str, Any]]) -> None:
        """Refuse an incomplete run when `require_complete` (its partial outputs stay where they were written).

        Raises:
            RuntimeError: fewer than `expected` distinct samples completed.
        """
        if not self.require_complete:
            return
        done = [row for row in results if row.get(NG_FAILURE_CLASS_KEY) is None and not row.get(NG_NO_PERSIST_KEY)]
        completed = len({(row.get("stage_index"), row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME])
                         for row in done})
        if completed < expected:
            raise RuntimeError(f"EVAL FAILED: {completed}/{expected} samples completed. "
                               f"Partial artifacts retained at {self.output_jsonl_fpath}.")


def attach_ng_perf(result: dict[str, Any], *, observability_enabled: bool,
                   rollout_latency_ms: float | None = None) -> None:
    """Nothing without observability (0.7.0 leaves `ng_perf` out then).

    Raises:
        NotImplementedError: observability is on: gymfleet keeps no per-call model capture to build `ng_perf` from.
    """
    if observability_enabled:
        raise NotImplementedError(
            "observability_enabled=true: a rollout's ng_perf is built from NeMo-Gym's per-call model capture, which "
            "gymfleet's model servers do not keep; run with observability_enabled=false (gymfleet's /metrics and "
            "the collector's latencies are its view of performance)")


_attach_ng_perf = attach_ng_perf
"""0.7.0's name for it (`nemo_gym.rollout_collection._attach_ng_perf`)."""
