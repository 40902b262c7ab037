"""Aggregate metrics over verify results, in NeMo-Gym's `/aggregate_metrics` shape.

For every numeric top-level field of the results (booleans count as 0/1; keys starting with `_` skipped) and every
numeric `response.usage` field, `agent_metrics` holds `mean/<k>`, `max/<k>`, `min/<k>`, `median/<k>` and `std/<k>`
(sample standard deviation; 0 with fewer than two values). `group_level_metrics` holds the same per
`_ng_task_index`. `key_metrics` are the `mean/*` entries. Rows tagged `_ng_failure_class` are excluded.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
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
    return {"agent_metrics": agent_metrics, "key_metrics": key_metrics, "group_level_metrics": group_level}


def _task_order(item: tuple[Any, Any]) -> tuple[int, Any]:
    task = item[0]
    return (0, task) if isinstance(task, int) and not isinstance(task, bool) else (1, str(task))
