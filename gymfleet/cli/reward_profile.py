"""`ng_reward_profile +input_jsonl_fpath=<rollouts.jsonl> [+output_jsonl_fpath=<profile.jsonl>]`: per-task rewards.

Groups the rollouts of a collection (`ng_collect_rollouts`' output) by task (`_ng_task_index`, one per input line)
and prints, for each task, how many rollouts were scored, their mean reward, the reward variance across the group
(population variance: 0 means every rollout got the same reward, so a GRPO group of it teaches nothing), and
pass@k; then a summary (tasks always passed, never passed, mixed). One JSON line per task is written to
`output_jsonl_fpath` (default `<rollouts stem>_reward_profiling.jsonl` beside the rollouts):
`{_ng_task_index, agent_ref, num_rollouts, num_failures, mean_reward, variance, pass_rate, pass@<k>...,
mean/reward, max/reward, min/reward, median/reward, std/reward, rollout_infos, [expected_num_rollouts,
missing_num_rollouts, sample]}`.

- A rollout passes when `reward >= pass_threshold` (default 1.0). pass@k is the unbiased estimator
  `1 - C(n-c, k) / C(n, k)` (n scored rollouts, c passes), for k = 1 and powers of two up to the largest group;
  null for a task with fewer than k rollouts. Override with `"+pass_at_k=[1,5,10]"`.
- Infrastructure failures (rows tagged `_ng_failure_class`: judge down, sandbox down, timeouts) are not rewards:
  they are left out of every statistic and counted per task (`num_failures`) and per class. They are read from
  the rollouts file itself and from the collector's `<stem>_failures.jsonl` beside it (rows marked
  `_ng_superseded`, whose rollout later succeeded, are not counted).
- When the collector's `<stem>_materialized_inputs.jsonl` is beside the rollouts (or `materialized_inputs_jsonl_fpath`
  names it), each task also gets `expected_num_rollouts`, `missing_num_rollouts` and `sample` (its input row), and
  tasks with no scored rollout are listed.
- NeMo-Gym's spelling works too: `+input_jsonl_fpath=<dataset> +rollouts_jsonl_fpath=<rollouts>`
  (`input_jsonl_fpath` is then the dataset, and gives `sample`); `allow_partial_rollouts` is accepted and has no
  effect (missing rollouts are always reported, never fatal).
- `+max_table_rows=50`: rows of the printed table (0: summary only); the JSONL has every task.

Exit code 0, or 2 for a missing file, a line that is not a JSON object, or a result without `_ng_task_index` or
a numeric `reward` (named `file:line`).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from gymfleet.cli import command, command_fields
from gymfleet.errors import DataError
from gymfleet.rollouts.collect_outputs import rollout_key
from gymfleet.rollouts.rows import read_jsonl
from gymfleet.serving.aggregate import describe


class RewardProfileConfig(BaseModel):
    """`ng_reward_profile`'s keys."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)

    input_jsonl_fpath: str
    """The rollouts (or, with `rollouts_jsonl_fpath`, the dataset they were collected from)."""
    rollouts_jsonl_fpath: str | None = None
    """NeMo-Gym's spelling: the rollouts, when `input_jsonl_fpath` is the dataset."""
    materialized_inputs_jsonl_fpath: str | None = None
    """The rows as dispatched (default: the collector's `<stem>_materialized_inputs.jsonl`, if present)."""
    output_jsonl_fpath: str | None = None
    """Where the per-task JSONL goes (default: `<rollouts stem>_reward_profiling.jsonl`)."""
    pass_threshold: float = 1.0
    """A rollout passes when its reward is at least this."""
    pass_at_k: list[int] | None = None
    """The k of pass@k (default: 1 and powers of two up to the largest group)."""
    max_table_rows: int = Field(default=50, ge=0)
    """Tasks printed in the table (the JSONL has all)."""
    allow_partial_rollouts: bool = True
    """Accepted for NeMo-Gym compatibility; missing rollouts are always reported, never fatal."""


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """Chance that at least one of k rollouts drawn without replacement from n (c of them passing) passes.

    Examples:
        >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 4), pass_at_k(4, 0, 2), pass_at_k(2, 1, 4)
        (0.25, 1.0, 0.0, None)
    """
    if k > n or k < 1:
        return None
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def default_ks(max_n: int) -> list[int]:
    """1, 2, 4, ... up to `max_n` (just [1] for groups of one)."""
    ks, k = [], 1
    while k <= max(max_n, 1):
        ks.append(k)
        k *= 2
    return ks


@dataclass
class _Task:
    rewards: list[tuple[Any, float]] = field(default_factory=list)
    """`(rollout index, reward)` of each scored rollout."""
    failures: Counter = field(default_factory=Counter)
    agent: str | None = None


@dataclass
class Profile:
    """What `profile` found: the per-task rows and the counts the summary prints."""

    tasks: list[dict[str, Any]]
    ks: list[int]
    scored: int = 0
    failures: Counter = field(default_factory=Counter)
    expected: int | None = None
    """Rollouts the materialized inputs planned (None: unknown)."""
    tasks_without_rollouts: list[Any] = field(default_factory=list)


def _task_order(task: Any) -> tuple[int, Any]:
    return (0, task) if isinstance(task, int) and not isinstance(task, bool) else (1, str(task))


def _agent_name(row: dict[str, Any]) -> str | None:
    ref = row.get("agent_ref")
    return ref.get("name") if isinstance(ref, dict) else None


def profile(
    rollouts: list[tuple[int, dict[str, Any]]],
    *,
    path: str = "<rollouts>",
    failures: list[tuple[int, dict[str, Any]]] = (),
    inputs: list[dict[str, Any]] | None = None,
    samples: dict[Any, dict[str, Any]] | None = None,
    pass_threshold: float = 1.0,
    ks: list[int] | None = None,
) -> Profile:
    """Per-task statistics of `rollouts` (`(line, row)` pairs, as `read_jsonl` returns them).

    Args:
        rollouts: results; rows tagged `_ng_failure_class` among them are counted as failures.
        path: the rollouts file, for error messages.
        failures: the collector's failure rows (superseded ones are skipped).
        inputs: the materialized inputs (one row per planned rollout), for expected counts and samples.
        samples: task -> its dataset row (NeMo-Gym's dataset-plus-rollouts spelling).
        pass_threshold: a reward at least this passes.
        ks: the k of pass@k (default `default_ks` of the largest group).

    Raises:
        DataError: a result without `_ng_task_index`, or whose `reward` is not a finite number.
    """
    by_task: dict[Any, _Task] = defaultdict(_Task)
    result = Profile(tasks=[], ks=[])
    seen: set[tuple[bytes, bytes]] = set()
    for lineno, row in rollouts:
        if "_ng_task_index" not in row:
            raise DataError("no _ng_task_index: not a rollouts file written by ng_collect_rollouts?", file=path,
                            line=lineno)
        task = by_task[orjson.dumps(row["_ng_task_index"])]
        task.agent = task.agent or _agent_name(row)
        if row.get("_ng_failure_class"):
            task.failures[row["_ng_failure_class"]] += 1
            continue
        reward = row.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise DataError(f"reward {reward!r} is not a finite number", file=path, line=lineno)
        task.rewards.append((row.get("_ng_rollout_index"), float(reward)))
        seen.add(rollout_key(row))
    for _, row in failures:
        if row.get("_ng_superseded") or "_ng_task_index" not in row or rollout_key(row) in seen:
            continue
        task = by_task[orjson.dumps(row["_ng_task_index"])]
        task.agent = task.agent or _agent_name(row)
        task.failures[row.get("_ng_failure_class") or "unknown"] += 1

    planned: Counter = Counter()
    input_rows: dict[bytes, dict[str, Any]] = {}
    for row in inputs or []:
        key = orjson.dumps(row.get("_ng_task_index"))
        planned[key] += 1
        input_rows.setdefault(key, {k: v for k, v in row.items() if k not in ("_ng_task_index", "_ng_rollout_index")})
    if inputs is not None:
        result.expected = sum(planned.values())
        result.tasks_without_rollouts = sorted(
            (orjson.loads(key) for key in planned if key not in by_task or not by_task[key].rewards), key=_task_order
        )
    sample_rows = {orjson.dumps(task): row for task, row in (samples or {}).items()}

    largest = max((len(task.rewards) for task in by_task.values()), default=1)
    result.ks = ks = sorted(set(ks)) if ks else default_ks(largest)
    for key, task in sorted(by_task.items(), key=lambda item: _task_order(orjson.loads(item[0]))):
        rewards = [reward for _, reward in sorted(task.rewards, key=lambda item: _task_order(item[0]))]
        n, passed = len(rewards), sum(reward >= pass_threshold for reward in rewards)
        entry: dict[str, Any] = {
            "_ng_task_index": orjson.loads(key),
            "agent_ref": {"name": task.agent} if task.agent else None,
            "num_rollouts": n,
            "num_failures": sum(task.failures.values()),
            "failure_classes": dict(task.failures),
            "mean_reward": statistics.fmean(rewards) if rewards else None,
            "variance": statistics.pvariance(rewards) if rewards else None,
            "pass_rate": passed / n if n else None,
            **{f"pass@{k}": pass_at_k(n, passed, k) for k in ks},
            **describe({"reward": rewards}),
            "rollout_infos": [{"_ng_rollout_index": index, "reward": reward}
                              for index, reward in sorted(task.rewards, key=lambda item: _task_order(item[0]))],
        }
        if inputs is not None:
            entry["expected_num_rollouts"] = planned.get(key, 0)
            entry["missing_num_rollouts"] = max(planned.get(key, 0) - n, 0)
        if key in input_rows or key in sample_rows:
            entry["sample"] = sample_rows.get(key, input_rows.get(key))
        result.tasks.append(entry)
        result.scored += n
        result.failures.update(task.failures)
    return result


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(result: Profile, max_rows: int) -> str:
    """The per-task table (first `max_rows` tasks) and the summary lines."""
    lines = []
    if max_rows:
        header = ("TASK", "AGENT", "N", "FAILED", "MEAN", "VAR", *(f"PASS@{k}" for k in result.ks))
        rows = [header] + [
            (str(t["_ng_task_index"]), (t["agent_ref"] or {}).get("name") or "-", str(t["num_rollouts"]),
             str(t["num_failures"]), _number(t["mean_reward"]), _number(t["variance"]),
             *(_number(t[f"pass@{k}"]) for k in result.ks))
            for t in result.tasks[:max_rows]
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines += ["  ".join(cell.rjust(w) if i != 1 else cell.ljust(w) for i, (cell, w) in
                            enumerate(zip(row, widths, strict=True))).rstrip() for row in rows]
        if len(result.tasks) > max_rows:
            lines.append(f"... {len(result.tasks) - max_rows} more tasks in the JSONL")
    scored = [t for t in result.tasks if t["num_rollouts"]]
    always = sum(t["pass_rate"] == 1.0 for t in scored)
    never = sum(t["pass_rate"] == 0.0 for t in scored)
    mean = statistics.fmean(t["mean_reward"] for t in scored) if scored else None
    lines.append(f"Tasks: {len(scored)} scored ({always} always passed, {never} never passed, "
                 f"{len(scored) - always - never} mixed); mean of task mean rewards {_number(mean)}.")
    line = f"Rollouts: {result.scored} scored"
    if result.expected is not None:
        share = 100 * result.scored / result.expected if result.expected else 0.0
        line += f" of {result.expected} planned ({share:.1f}%)"
    failed = sum(result.failures.values())
    line += f"; {failed} infrastructure failures, left out"
    if failed:
        line += " (" + ", ".join(f"{cls}: {count}" for cls, count in sorted(result.failures.items())) + ")"
    lines.append(line + ".")
    if result.tasks_without_rollouts:
        shown = result.tasks_without_rollouts[:20]
        more = len(result.tasks_without_rollouts) - len(shown)
        lines.append(f"Tasks without a scored rollout: {shown}" + (f" and {more} more" if more else ""))
    return "\n".join(lines)


def _sidecar(rollouts: Path, suffix: str) -> Path:
    return rollouts.with_name(rollouts.stem + suffix)


def _dataset_samples(path: Path) -> dict[Any, dict[str, Any]]:
    """Task index -> dataset row, numbered as the collector numbers them (a row's own `_ng_task_index`, else one
    index per distinct line text, in order)."""
    read_jsonl(path)  # names a bad line
    samples: dict[Any, dict[str, Any]] = {}
    by_text: dict[str, int] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if text := line.strip():
            row = orjson.loads(text)
            task = row["_ng_task_index"] if "_ng_task_index" in row else by_text.setdefault(text, len(by_text))
            samples.setdefault(task, row)
    return samples


def run_profile(config: RewardProfileConfig) -> tuple[Profile, Path]:
    """Read the files `config` names, profile them, write the JSONL; return the profile and where it went."""
    rollouts_path = Path(config.rollouts_jsonl_fpath or config.input_jsonl_fpath)
    rollouts = read_jsonl(rollouts_path)
    failures_path = _sidecar(rollouts_path, "_failures.jsonl")
    failures = read_jsonl(failures_path) if failures_path.is_file() else []
    inputs_path = (Path(config.materialized_inputs_jsonl_fpath) if config.materialized_inputs_jsonl_fpath
                   else _sidecar(rollouts_path, "_materialized_inputs.jsonl"))
    explicit = config.materialized_inputs_jsonl_fpath is not None
    inputs = [row for _, row in read_jsonl(inputs_path)] if explicit or inputs_path.is_file() else None
    samples = _dataset_samples(Path(config.input_jsonl_fpath)) if config.rollouts_jsonl_fpath else None
    result = profile(rollouts, path=str(rollouts_path), failures=failures, inputs=inputs, samples=samples,
                     pass_threshold=config.pass_threshold, ks=config.pass_at_k)
    output = (Path(config.output_jsonl_fpath) if config.output_jsonl_fpath
              else _sidecar(rollouts_path, "_reward_profiling.jsonl"))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(b"".join(orjson.dumps(task) + b"\n" for task in result.tasks))
    return result, output


def _run(argv: list[str]) -> int:
    global_config, config = command_fields(argv, "ng_reward_profile", RewardProfileConfig)
    result, output = run_profile(config)
    print(table(result, config.max_table_rows))
    print(f"Wrote {len(result.tasks)} task rows: {output}", flush=True)
    return 0


main = command(_run, __doc__)


if __name__ == "__main__":
    main()
