"""NeMo-Gym's `reward_profile` helpers that environment folders call from `compute_metrics` / `get_key_metrics`.

- `compute_pass_majority_metrics(tasks, score_fn, answer_key)`: for every score a rollout has (default: `accuracy`,
  its reward) and every k up to the most rollouts of a task: `pass@k/<score>` (binary scores: the unbiased
  estimator 1 - C(wrong, k) / C(n, k); continuous ones: the best of the first k), `pass@1[avg-of-k]/<score>` (the
  mean of the first k), `majority@k/<score>` when `answer_key` names the extracted answer (the score of the most
  frequent answer among the first k, ties averaged; a task with no answer counts 0), a `no_answer` score, and for
  k >= 2 the spread of the per-run means (`.../std_dev_across_runs`, `.../std_err_across_runs`). Percentages
  (0-100). Returns `(metrics, score_dicts, score_names, max_k)`, as NeMo-Gym does.
- `add_avg_sample_std_dev`, `compute_subset_metrics` (the same per value of a row field), `highest_k_metrics` (the
  entries of a pattern such as `pass@{k}` at the highest k).
- `compute_aggregate_metrics(verify_responses, compute_metrics_fn, get_key_metrics_fn)`: `/aggregate_metrics` of a
  folder, an `AggregateMetrics`. The baseline statistics are gymfleet's (`gymfleet.serving.aggregate`:
  mean/max/min/median/std of every numeric field, overall and per `_ng_task_index`); rows with `mask_sample` (or
  `_ng_failure_class`) are left out of them and counted, and a false `mask_sample` is dropped from the rest (no
  `mean/mask_sample`, as 0.7.0's `select_measured`); the folder's `compute_metrics(tasks)` (rows grouped by
  task) is merged into `agent_metrics`, its `per_task_metrics` into the groups; `key_metrics` is the folder's
  `get_key_metrics(agent_metrics)`.

Written from NeMo-Gym 0.7.0's documented behaviour; `RewardProfiler`'s per-repeat tables (`repeat_level_metrics`,
`compute_repeat_metrics`) are not reproduced: `repeat_level_metrics` is empty.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from gymfleet.serving.aggregate import aggregate_metrics
from gymfleet.serving.nemo_gym_types import ROLLOUT_INDEX_KEY_NAME as ROLLOUT_INDEX_KEY
from gymfleet.serving.nemo_gym_types import TASK_INDEX_KEY_NAME as TASK_INDEX_KEY
from gymfleet.serving.nemo_gym_types import AggregateMetrics

STD_DEV_ACROSS_RUNS = "/std_dev_across_runs"
STD_ERR_ACROSS_RUNS = "/std_err_across_runs"
AVG_SAMPLE_STD_DEV = "/avg_sample_std_dev"
STAT_SUFFIXES = (STD_DEV_ACROSS_RUNS, STD_ERR_ACROSS_RUNS, AVG_SAMPLE_STD_DEV)

Tasks = list[list[dict[str, Any]]]
Scores = list[list[dict[str, float]]]


def _default_score(row: dict[str, Any]) -> dict[str, float]:
    return {"accuracy": row["reward"]}


def _pass_at_k(values: list[float], k: int) -> float:
    if all(value in (0, 1) for value in values):
        wrong = sum(1 for value in values if not value)
        return 1.0 if wrong < k else 1.0 - math.comb(wrong, k) / math.comb(len(values), k)
    return max(values[:k])


def _majority(answers: list[Any], scores: list[float]) -> float:
    votes = Counter((answer, score) for answer, score in zip(answers, scores, strict=True) if answer is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    winners = [score for (_, score), count in votes.items() if count == top]
    return sum(winners) / len(winners)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _sample_std(values: list[float]) -> float:
    mean = _mean(values)
    return math.sqrt(sum((value - mean) ** 2 for value in values) / (len(values) - 1))


def compute_pass_majority_metrics(
    tasks: Tasks, score_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None, answer_key: str | None = None
) -> tuple[dict[str, Any], Scores, list[str], int]:
    """pass@k, pass@1[avg-of-k], majority@k and their spread over tasks of rollouts (module docstring)."""
    if not tasks:
        return {}, [], [], 0
    score_fn = score_fn or _default_score
    scores: Scores = []
    answers: list[list[Any]] = []
    for rollouts in tasks:
        task_scores = []
        for rollout in rollouts:
            row_scores = {name: int(value) if isinstance(value, bool) else value
                          for name, value in score_fn(rollout).items()}
            if answer_key is not None:
                row_scores["no_answer"] = int(rollout.get(answer_key) is None)
            task_scores.append(row_scores)
        scores.append(task_scores)
        answers.append([rollout.get(answer_key) for rollout in rollouts] if answer_key is not None else [])
    names = sorted({name for task in scores for row in task for name in row})
    max_k = max(len(rollouts) for rollouts in tasks)
    metrics: dict[str, Any] = {}
    for k in range(1, max_k + 1):
        for name in names:
            passes = []
            for task in scores:
                values = [row[name] for row in task if name in row]
                if values and k <= len(values):
                    passes.append(_pass_at_k(values, k))
            if passes:
                metrics[f"pass@{k}/{name}"] = 100.0 * _mean(passes)
            firsts = [[row[name] for row in task[:k] if name in row] for task in scores]
            averages = [_mean(values) for values in firsts if values]
            if averages:
                metrics[f"pass@1[avg-of-{k}]/{name}"] = 100.0 * _mean(averages)
            if answer_key is not None:
                majorities = []
                for task, task_answers in zip(scores, answers, strict=True):
                    pairs = [(answer, row[name]) for answer, row in zip(task_answers[:k], task[:k], strict=False)
                             if name in row]
                    majorities.append(_majority([a for a, _ in pairs], [s for _, s in pairs]))
                metrics[f"majority@{k}/{name}"] = 100.0 * _mean(majorities)
    per_run: dict[str, list[float]] = {}
    for run in range(max_k):
        for name in names:
            values = [task[run][name] for task in scores if run < len(task) and name in task[run]]
            if values:
                per_run.setdefault(name, []).append(100.0 * _mean(values))
    metrics["per_sample_aggregate"] = per_run
    for k in range(2, max_k + 1):
        for name in names:
            runs = per_run.get(name, [])[:k]
            if len(runs) >= 2:
                spread = _sample_std(runs)
                metrics[f"pass@1[avg-of-{k}]/{name}{STD_DEV_ACROSS_RUNS}"] = spread
                metrics[f"pass@1[avg-of-{k}]/{name}{STD_ERR_ACROSS_RUNS}"] = spread / math.sqrt(len(runs))
    return metrics, scores, names, max_k


def add_avg_sample_std_dev(metrics: dict[str, Any], all_score_dicts: Scores, score_names: list[str],
                           max_k: int) -> None:
    """Add `pass@1[avg-of-k]/<score>/avg_sample_std_dev`: the mean over tasks of the spread of their first k scores."""
    for k in range(2, max_k + 1):
        for name in score_names:
            spreads = []
            for task in all_score_dicts:
                values = [row[name] for row in task[:k] if name in row]
                if len(values) >= 2:
                    spreads.append(_sample_std(values))
            if spreads:
                metrics[f"pass@1[avg-of-{k}]/{name}{AVG_SAMPLE_STD_DEV}"] = _mean(spreads)


def compute_subset_metrics(tasks: Tasks, subset_key: str, score_fn: Callable | None = None,
                           answer_key: str | None = None) -> dict[str, Any]:
    """`compute_pass_majority_metrics` per value of `subset_key` (the first rollout of a task that has one), with
    keys prefixed `<value>/`; `per_sample_aggregate` left out."""
    subsets: dict[Any, Tasks] = defaultdict(list)
    for rollouts in tasks:
        value = next((rollout[subset_key] for rollout in rollouts if rollout.get(subset_key)), None)
        if value:
            subsets[value].append(rollouts)
    metrics: dict[str, Any] = {}
    for value, subset in subsets.items():
        found, _, _, _ = compute_pass_majority_metrics(subset, score_fn=score_fn, answer_key=answer_key)
        metrics.update({f"{value}/{key}": number for key, number in found.items() if key != "per_sample_aggregate"})
    return metrics


def highest_k_metrics(agent_metrics: dict[str, Any], pattern: str, score_names: list[str] | None = None,
                      exclude_names: list[str] | None = None) -> dict[str, Any]:
    """The entries `<pattern with k>/<score>` at the highest k present (spread statistics never included).

    Examples:
        >>> highest_k_metrics({"pass@1/accuracy": 50.0, "pass@4/accuracy": 75.0}, "pass@{k}")
        {'pass@4/accuracy': 75.0}
    """
    regex = re.compile("^" + re.escape(pattern).replace(r"\{k\}", r"(\d+)") + "/(.+)$")
    found = []
    for key in agent_metrics:
        match = regex.match(key)
        if not match:
            continue
        name = match.group(2)
        if name.endswith(STAT_SUFFIXES) or (score_names is not None and name not in score_names):
            continue
        if exclude_names is not None and name in exclude_names:
            continue
        found.append((int(match.group(1)), key))
    if not found:
        return {}
    top = max(k for k, _ in found)
    return {key: agent_metrics[key] for k, key in found if k == top}


def group_by_task(rows: list[dict[str, Any]]) -> Tasks:
    """Rows grouped by `_ng_task_index` (0 when absent), in task order."""
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row.get(TASK_INDEX_KEY, 0)].append(row)
    return [groups[key] for key in sorted(groups, key=lambda key: (not isinstance(key, int), str(key)))]


def _masked(row: dict[str, Any]) -> bool:
    return bool(row.get("mask_sample") or row.get("_ng_failure_class"))


def compute_aggregate_metrics(verify_responses: list[dict[str, Any]],
                              compute_metrics_fn: Callable[[Tasks], dict[str, Any]] | None = None,
                              get_key_metrics_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                              ) -> AggregateMetrics:
    """A folder's `/aggregate_metrics` answer (module docstring), an `AggregateMetrics` as NeMo-Gym returns."""
    return AggregateMetrics(**_aggregate(verify_responses, compute_metrics_fn, get_key_metrics_fn))


def _aggregate(verify_responses: list[dict[str, Any]], compute_metrics_fn: Callable[[Tasks], dict[str, Any]] | None,
               get_key_metrics_fn: Callable[[dict[str, Any]], dict[str, Any]] | None) -> dict[str, Any]:
    empty = {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}, "repeat_level_metrics": []}
    if not verify_responses:
        return empty
    # As 0.7.0's `select_measured`: the flag leaves the rows it kept (a flag is not a measurement: no mean/mask_sample)
    scored = [{key: value for key, value in row.items() if key != "mask_sample"}
              for row in verify_responses if not _masked(row)]
    coverage = {"masked_samples": float(len(verify_responses) - len(scored))} if len(scored) < len(
        verify_responses) else {}
    if not scored:
        return {**empty, "agent_metrics": dict(coverage), "key_metrics": dict(coverage)}
    baseline = aggregate_metrics(scored)
    agent_metrics = {**baseline["agent_metrics"], **coverage}
    groups = baseline["group_level_metrics"]
    if compute_metrics_fn is not None:
        custom = dict(compute_metrics_fn(group_by_task(scored)))
        per_task = {entry.get(TASK_INDEX_KEY): entry for entry in custom.pop("per_task_metrics", None) or []}
        for group in groups:
            extra = per_task.get(group.get(TASK_INDEX_KEY))
            if extra:
                group.update({key: value for key, value in extra.items() if key != TASK_INDEX_KEY})
        agent_metrics.update(custom)
    agent_metrics["num_repeats"] = len({row.get(ROLLOUT_INDEX_KEY, 0) for row in verify_responses})
    if get_key_metrics_fn is not None:
        key_metrics = dict(get_key_metrics_fn(agent_metrics))
    else:
        key_metrics = {key: value for key, value in agent_metrics.items() if key.startswith("mean/")}
    key_metrics.update(coverage)
    return {"group_level_metrics": groups, "agent_metrics": agent_metrics, "key_metrics": key_metrics,
            "repeat_level_metrics": []}


class AggregateMetricsMixin:
    """The metric hooks a NeMo-Gym server may override: `compute_metrics(tasks)`, `compute_repeat_metrics(tasks)`
    and `get_key_metrics(agent_metrics)` (default: the `mean/*` entries)."""

    def compute_metrics(self, tasks: Tasks) -> dict[str, Any]:
        return {}

    def compute_repeat_metrics(self, tasks: Tasks) -> dict[str, Any]:
        return {}

    def get_key_metrics(self, agent_metrics: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in agent_metrics.items() if key.startswith("mean/")}
