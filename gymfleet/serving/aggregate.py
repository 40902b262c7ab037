"""Aggregate metrics over verify results, in NeMo-Gym's `/aggregate_metrics` shape.

For every numeric top-level field of the results (booleans count as 0/1; keys starting with `_` skipped) and every
numeric `response.usage` field, `agent_metrics` holds `mean/<k>`, `max/<k>`, `min/<k>`, `median/<k>` and `std/<k>`
(sample standard deviation; 0 with fewer than two values). `group_level_metrics` holds the same per
`_ng_task_index`. `key_metrics` are the `mean/*` entries. Rows tagged `_ng_failure_class` are excluded from all of
these.

More numbers in `agent_metrics` (flat numeric keys, so they pass through every consumer of NeMo-Gym's shape, the
collector's `_aggregate_metrics.json` and trainers' metric loggers included; no existing key changes):

- `infra_failure_count` and `infra_failure_share`: how many of the given rows are infrastructure failures
  (`_ng_failure_class`; superseded ones not counted) and their share of all rows; per environment
  (`reward_provenance.environment`, else the agent's) as `infra_failure_count/<env>` and `infra_failure_share/<env>`.
  The share is only as good as the rows passed in: a caller that passes successful rows only gets 0.
- per reward provenance (`gymfleet.serving.provenance`), keyed `provenance/<environment>/<version>/<config_hash>`:
  `.../rows` (scored rows), `.../mean_reward` and `.../infra_failures`, so a mix of environment versions or configs
  in one file shows. Rows without `reward_provenance` are not counted there.

`infra_failures(results)` and `provenance_counts(results)` give the same as lists of records.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from typing import Any

USAGE_FIELDS = ("input_tokens", "output_tokens", "total_tokens")


def numeric_fields(result: dict[str, Any]) -> dict[str, float]:
    """The numeric columns one result contributes."""
    values: dict[str, float] = {}
    for key, value in result.items():
        if key.startswith("_"):
            continue
        if isinstance(value, bool):
            values[key] = float(value)
        elif isinstance(value, int | float) and math.isfinite(value):
            values[key] = float(value)
    response = result.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    if isinstance(usage, dict):
        for key in USAGE_FIELDS:
            value = usage.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                values[key] = float(value)
    return values


def describe(columns: dict[str, list[float]]) -> dict[str, float]:
    """`mean/max/min/median/std` per column."""
    stats: dict[str, float] = {}
    for key, values in sorted(columns.items()):
        if not values:
            continue
        stats[f"mean/{key}"] = statistics.fmean(values)
        stats[f"max/{key}"] = max(values)
        stats[f"min/{key}"] = min(values)
        stats[f"median/{key}"] = statistics.median(values)
        stats[f"std/{key}"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return stats


def aggregate_metrics(results: list[dict[str, Any]]) -> dict[str, Any]:
    """`{agent_metrics, key_metrics, group_level_metrics}` over `results`."""
    overall: dict[str, list[float]] = defaultdict(list)
    groups: dict[Any, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for result in results:
        if result.get("_ng_failure_class"):
            continue
        fields = numeric_fields(result)
        task = result.get("_ng_task_index")
        for key, value in fields.items():
            overall[key].append(value)
            if task is not None:
                groups[task][key].append(value)
    agent_metrics = describe(overall)
    group_level = [
        {"_ng_task_index": task, **describe(columns)} for task, columns in sorted(groups.items(), key=_task_order)
    ]
    key_metrics = {key: value for key, value in agent_metrics.items() if key.startswith("mean/")}
    agent_metrics.update(_infra_and_provenance_metrics(results))
    return {"agent_metrics": agent_metrics, "key_metrics": key_metrics, "group_level_metrics": group_level}


def _infra_and_provenance_metrics(results: list[dict[str, Any]]) -> dict[str, float]:
    shares = infra_failures(results)
    failed = sum(entry["infra_failures"] for entry in shares)
    counted = sum(entry["rollouts"] for entry in shares)
    metrics = {"infra_failure_count": float(failed), "infra_failure_share": failed / counted if counted else 0.0}
    per_environment: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for entry in shares:
        if entry["environment"] is not None:
            per_environment[str(entry["environment"])][0] += entry["infra_failures"]
            per_environment[str(entry["environment"])][1] += entry["rollouts"]
    for environment, (env_failed, env_rows) in sorted(per_environment.items()):
        metrics[f"infra_failure_count/{environment}"] = float(env_failed)
        metrics[f"infra_failure_share/{environment}"] = env_failed / env_rows
    for entry in provenance_counts(results):
        prefix = f"provenance/{entry['environment']}/{entry['version']}/{entry['config_hash']}"
        metrics[f"{prefix}/rows"] = float(entry["rows"])
        metrics[f"{prefix}/infra_failures"] = float(entry["infra_failures"])
        if entry["mean_reward"] is not None:
            metrics[f"{prefix}/mean_reward"] = entry["mean_reward"]
    return metrics


def _provenance_of(result: dict[str, Any]) -> dict[str, Any]:
    provenance = result.get("reward_provenance")
    return provenance if isinstance(provenance, dict) else {}


def infra_failures(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (environment, agent): rollouts, infrastructure failures among them, their share, and failures by class.

    Rows marked `_ng_superseded` (a failure whose rollout later succeeded) are not counted.
    """
    rows = [result for result in results if not result.get("_ng_superseded")]
    environment_of_agent: dict[Any, Any] = {}
    for result in rows:
        environment = _provenance_of(result).get("environment")
        if environment is not None:
            environment_of_agent.setdefault(_agent_of(result), environment)
    groups: dict[tuple[Any, Any], dict[str, Any]] = {}
    for result in rows:
        agent = _agent_of(result)
        # a failure before /verify (the agent or the model failed) has no provenance: its agent's environment
        environment = _provenance_of(result).get("environment", environment_of_agent.get(agent))
        group = groups.setdefault((environment, agent), {"environment": environment, "agent": agent, "rollouts": 0,
                                                          "infra_failures": 0, "failure_classes": Counter()})
        group["rollouts"] += 1
        if failure_class := result.get("_ng_failure_class"):
            group["infra_failures"] += 1
            group["failure_classes"][str(failure_class)] += 1
    return [
        {**group, "infra_failure_share": group["infra_failures"] / group["rollouts"],
         "failure_classes": dict(sorted(group["failure_classes"].items()))}
        for group in groups.values()
    ]


def _agent_of(result: dict[str, Any]) -> Any:
    ref = result.get("agent_ref")
    return ref.get("name") if isinstance(ref, dict) else None


PROVENANCE_GROUP = ("environment", "instance", "version", "config_hash")


def provenance_counts(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Scored rows, their mean reward and infrastructure failures per reward provenance (first-seen order)."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for result in results:
        provenance = _provenance_of(result)
        if not provenance or result.get("_ng_superseded"):
            continue
        key = tuple(provenance.get(field) for field in PROVENANCE_GROUP)
        group = groups.setdefault(key, {**dict(zip(PROVENANCE_GROUP, key, strict=True)), "rows": 0,
                                        "reward_sum": 0.0, "infra_failures": 0})
        if result.get("_ng_failure_class"):
            group["infra_failures"] += 1
            continue
        reward = result.get("reward")
        group["rows"] += 1
        if isinstance(reward, int | float) and not isinstance(reward, bool) and math.isfinite(reward):
            group["reward_sum"] += reward
    return [
        {**{k: v for k, v in group.items() if k != "reward_sum"},
         "mean_reward": group["reward_sum"] / group["rows"] if group["rows"] else None}
        for group in groups.values()
    ]


def _task_order(item: tuple[Any, Any]) -> tuple[int, Any]:
    task = item[0]
    return (0, task) if isinstance(task, int) and not isinstance(task, bool) else (1, str(task))
