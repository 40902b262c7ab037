"""NeMo-Gym's `nemo_gym.reward_profile.RewardProfiler`: the per-rollout view of a `/run` result that its reward
profile (and environment folders' tests) build on.

- `rollout_info_from_result(result)`: `rollout_id` (`"<task>:<rollout>"`), the task and rollout indexes
  (`_ng_task_index`, `_ng_rollout_index`), `reward` when present, every numeric field of the response's `usage`,
  then every numeric top-level field whose name does not start with `_` (booleans as 0/1; `reward` and `response`
  themselves are not repeated). A result without the two index keys is a `KeyError` naming the missing key.
- `align_rows_and_results(rows, results, allow_partial_rollouts=False)`: pairs materialized input rows with their
  results by `(task index, rollout index)`, sorted; a duplicate key on either side, a result with no input row, or
  (unless `allow_partial_rollouts`) an input row with no result is a `ValueError` naming the keys.

Written from NeMo-Gym 0.7.0's behaviour; its W&B histograms and per-repeat tables (pandas, scipy, wandb) are not
reproduced: gymfleet's `/aggregate_metrics` (`gymfleet.serving.nemo_gym_metrics`) computes a fleet's metrics.
"""

from __future__ import annotations

from typing import Any

from gymfleet.serving.nemo_gym_types import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

__all__ = ["RewardProfiler"]

RolloutKey = tuple[Any, Any]


def _key(row: dict[str, Any]) -> RolloutKey:
    return row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME]


def _numeric(value: Any) -> int | float | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    return None


class RewardProfiler:
    """The per-rollout half of NeMo-Gym's reward profiler (see the module docstring)."""

    def rollout_info_from_result(self, result: dict[str, Any]) -> dict[str, Any]:
        task, rollout = _key(result)
        info: dict[str, Any] = {"rollout_id": f"{task}:{rollout}", TASK_INDEX_KEY_NAME: task,
                                ROLLOUT_INDEX_KEY_NAME: rollout}
        if "reward" in result:
            info["reward"] = result["reward"]
        usage = (result.get("response") or {}).get("usage") or {}
        fields = [*usage.items(), *((k, v) for k, v in result.items()
                                    if not k.startswith("_") and k not in ("reward", "response"))]
        for name, value in fields:
            number = _numeric(value)
            if number is not None:
                info[name] = number
        return info

    def align_rows_and_results(self, rows: list[dict[str, Any]], results: list[dict[str, Any]],
                               allow_partial_rollouts: bool = False) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        by_row, by_result = _index(rows, "materialized input"), _index(results, "result")
        extra = sorted(by_result.keys() - by_row.keys())
        if extra:
            raise ValueError(f"rollout results contain {len(extra)} rows with no matching materialized input row; "
                             f"extra rollout keys: {extra[:10]}")
        missing = sorted(by_row.keys() - by_result.keys())
        if missing and not allow_partial_rollouts:
            raise ValueError(f"no rollout result for {len(missing)} materialized input rows; missing rollout keys: "
                             f"{missing[:10]}. Use ++allow_partial_rollouts=True to profile a partial collection.")
        return [(by_row[key], by_result[key]) for key in sorted(by_row.keys() & by_result.keys())]


def _index(rows: list[dict[str, Any]], what: str) -> dict[RolloutKey, dict[str, Any]]:
    indexed: dict[RolloutKey, dict[str, Any]] = {}
    for row in rows:
        key = _key(row)
        if key in indexed:
            raise ValueError(f"duplicate {what} row for rollout key {key}")
        indexed[key] = row
    return indexed
