"""The rollout-record names NeMo-Gym 0.7.0's folders import from `nemo_gym.rollout_collection`, `nemo_gym.path_utils`
and `nemo_gym.deliverables` (gdpval's server and its orchestrator read them).

- The record keys: `NG_FAILURE_CLASS_KEY` (`_ng_failure_class`, gymfleet's own failure tag), `NG_TERMINAL_KEY`
  (`_ng_failure_terminal`: collection must not retry the row), `NG_NO_PERSIST_KEY`, `NG_ELAPSED_KEY`.
- `is_terminal_failure(record, retry_terminal_timeouts=False)`: a failure row is terminal iff stamped so; with the
  opt-in, a `timeout_exceeded` row and the environment faults `reference_missing`, `eval_missing` and
  `transport_ineligible` are retryable and a `skipped` one is always terminal (those labels predate
  `failure_kinds`, as in NeMo-Gym).
- `observed_elapsed(record)`: the row's positive `elapsed_seconds` (at the top, else in `response.metadata`), or None.
- `get_max_rollout_attempts()`: `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS` (a positive integer; anything else is logged and
  the default, 3, used).
- Sidecar paths beside an output file `out.jsonl`: `out_failures.jsonl` (gymfleet's collector writes the same),
  `out_materialized_inputs.jsonl`, `out_aggregate_metrics.json`.
- `IGNORE_FILES` / `is_deliverable(path)`: an agent's run-state files, never graded as its deliverables.
- `DispatchLatencyTracker`: the per-task latencies a dispatcher saw (quantiles interpolated between the sorted
  values), the drain margin (a configured one, else the p75 once 5 tasks finished, else None), the drained count and a
  summary for the log.
- `migrate_invalid_judge_main_rows(out.jsonl)`: rows an older collector kept in the main file with
  `invalid_judge_response` set move to the failures sidecar (classed `judge_invalid` unless classed already, not
  terminal, `reuse_cached_deliverable` where their `deliverables_dir` holds a deliverable, marked migrated so a second
  run adds nothing), the main file rewritten atomically after the sidecar is on disk; returns how many it found.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gymfleet.serving.nemo_gym_types import ATTEMPT_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

ROLLOUT_COLLECTION_NAMES = [
    "NG_ELAPSED_KEY", "NG_FAILURE_CLASS_KEY", "NG_NO_PERSIST_KEY", "NG_TERMINAL_KEY", "DispatchLatencyTracker",
    "get_max_rollout_attempts", "is_terminal_failure", "migrate_invalid_judge_main_rows", "observed_elapsed",
]
"""What `nemo_gym.rollout_collection` takes from here (beside gymfleet's collection config and helper)."""
__all__ = [*ROLLOUT_COLLECTION_NAMES, "IGNORE_FILES", "aggregate_metrics_path_for", "failures_path_for",
           "is_deliverable", "materialized_path_for"]

log = logging.getLogger(__name__)

NG_FAILURE_CLASS_KEY = "_ng_failure_class"
NG_TERMINAL_KEY = "_ng_failure_terminal"
NG_NO_PERSIST_KEY = "_ng_no_persist"
NG_ELAPSED_KEY = "elapsed_seconds"
DEFAULT_MAX_ROLLOUT_ATTEMPTS = 3
RETRYABLE_WITH_OPT_IN = frozenset({"timeout_exceeded", "reference_missing", "eval_missing", "transport_ineligible"})
ALWAYS_TERMINAL = frozenset({"skipped"})
IGNORE_FILES = frozenset({"finish_params.json", "history.json", "history.pkl", "inprogress_history.json",
                          "metadata.json", "log.txt", "reference_files"})
"""Run state an agent may leave beside its output: never a deliverable."""


def is_terminal_failure(record: Mapping[str, Any], *, retry_terminal_timeouts: bool = False) -> bool:
    """Whether a stored failure row must not be run again on resume (module docstring)."""
    if retry_terminal_timeouts:
        failure_class = record.get(NG_FAILURE_CLASS_KEY)
        if failure_class in RETRYABLE_WITH_OPT_IN:
            return False
        if failure_class in ALWAYS_TERMINAL:
            return True
    return bool(record.get(NG_TERMINAL_KEY))


def observed_elapsed(record: Mapping[str, Any]) -> float | None:
    """A row's wall-clock seconds, where it recorded a positive one."""
    response = record.get("response")
    metadata = response.get("metadata") if isinstance(response, Mapping) else None
    for candidate in (record.get(NG_ELAPSED_KEY), metadata.get(NG_ELAPSED_KEY) if isinstance(metadata, Mapping)
                      else None):
        try:
            value = float(candidate) if candidate is not None else 0.0
        except (TypeError, ValueError):
            continue
        if value > 0:
            return value
    return None


def get_max_rollout_attempts() -> int:
    """`NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`, or 3 when unset or not a positive integer (logged)."""
    raw = os.environ.get("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "")
    if not raw:
        return DEFAULT_MAX_ROLLOUT_ATTEMPTS
    try:
        attempts = int(raw)
    except ValueError:
        attempts = 0
    if attempts < 1:
        log.warning("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS=%r is not a positive integer; using %d", raw,
                    DEFAULT_MAX_ROLLOUT_ATTEMPTS)
        return DEFAULT_MAX_ROLLOUT_ATTEMPTS
    return attempts


def failures_path_for(output_fpath: Path) -> Path:
    """`out.jsonl` -> `out_failures.jsonl`."""
    return output_fpath.with_name(output_fpath.stem + "_failures.jsonl")


def materialized_path_for(output_fpath: Path) -> Path:
    """`out.jsonl` -> `out_materialized_inputs.jsonl`."""
    return output_fpath.with_name(output_fpath.stem + "_materialized_inputs.jsonl")


def aggregate_metrics_path_for(output_fpath: Path) -> Path:
    """`out.jsonl` -> `out_aggregate_metrics.json`."""
    return output_fpath.with_name(output_fpath.stem + "_aggregate_metrics.json")


def is_deliverable(path: Path) -> bool:
    """Whether `path` is a file an agent produced as output (not its run state)."""
    return path.is_file() and path.name not in IGNORE_FILES


class DispatchLatencyTracker:
    """Per-task latency seen by a dispatcher and the drain margin it implies (module docstring)."""

    MIN_FOR_MARGIN = 5

    def __init__(self) -> None:
        self._durations: list[float] = []  # sorted
        self._drained = 0

    def record(self, seconds: float) -> None:
        if seconds > 0:
            bisect.insort(self._durations, seconds)

    def record_drained(self) -> None:
        self._drained += 1

    @property
    def drained(self) -> int:
        return self._drained

    def quantile(self, q: float) -> float | None:
        if not self._durations:
            return None
        at = (len(self._durations) - 1) * q
        low = int(at)
        high = min(low + 1, len(self._durations) - 1)
        return self._durations[low] + (self._durations[high] - self._durations[low]) * (at - low)

    def drain_margin(self, configured: float | None) -> float | None:
        if configured is not None:
            return configured
        return self.quantile(0.75) if len(self._durations) >= self.MIN_FOR_MARGIN else None

    def summary(self) -> str:
        if self._durations:
            minutes = {name: self.quantile(q) / 60 for name, q in (("median", 0.5), ("p90", 0.9), ("p99", 0.99))}
            lines = [f"Per-task latency over {len(self._durations)} completed rollout(s): "
                     + ", ".join(f"{name} {value:.1f} min" for name, value in minutes.items())
                     + f", max {self._durations[-1] / 60:.1f} min",
                     f"Task-time delivered: {sum(self._durations) / 3600:.1f} task-hours"]
        else:
            lines = ["No completed rollouts to report latency for."]
        if self._drained:
            lines.append(f"Drained (not dispatched, no time left in the budget): {self._drained}. "
                         "These wrote no row and will be re-dispatched on resume.")
        return "\n".join(lines)


MIGRATED_INVALID_JUDGE_KEY = "_ng_migrated_invalid_judge_response"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open("rb") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _dumps(row: Mapping[str, Any]) -> bytes:
    return json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _migration_key(row: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    return (int(row.get("stage_index", 0) or 0), row.get(TASK_INDEX_KEY_NAME), row.get(ROLLOUT_INDEX_KEY_NAME),
            int(row.get(ATTEMPT_INDEX_KEY_NAME, 0) or 0))


def _has_deliverable(folder: Any) -> bool:
    try:
        return bool(folder) and Path(folder).is_dir() and any(is_deliverable(p) for p in Path(folder).iterdir())
    except (OSError, TypeError):
        return False


def _migrated(row: Mapping[str, Any]) -> dict[str, Any]:
    moved = {**row, NG_FAILURE_CLASS_KEY: row.get(NG_FAILURE_CLASS_KEY) or "judge_invalid",
             MIGRATED_INVALID_JUDGE_KEY: True}
    moved.pop(NG_TERMINAL_KEY, None)
    moved.pop("reuse_cached_deliverable", None)
    if _has_deliverable(row.get("deliverables_dir")):
        moved["reuse_cached_deliverable"] = True
    return moved


def migrate_invalid_judge_main_rows(output_fpath: Path) -> int:
    """Move invalid-judge rows from `output_fpath` to its failures sidecar (module docstring); how many it found."""
    output_fpath = Path(output_fpath)
    if not output_fpath.exists():
        return 0
    rows = _jsonl(output_fpath)
    found = sum(bool(row.get("invalid_judge_response")) for row in rows)
    if not found:
        return 0
    failures = failures_path_for(output_fpath)
    failures.parent.mkdir(parents=True, exist_ok=True)
    done = {_migration_key(row) for row in (_jsonl(failures) if failures.exists() else [])
            if row.get(MIGRATED_INVALID_JUDGE_KEY)}
    mode = output_fpath.stat().st_mode & 0o7777
    handle = tempfile.NamedTemporaryFile("wb", dir=output_fpath.parent, prefix=f".{output_fpath.name}.migrate-",
                                         delete=False)
    temp = Path(handle.name)
    try:
        with handle, failures.open("ab") as sidecar:
            for row in rows:
                if not row.get("invalid_judge_response"):
                    handle.write(_dumps(row))
                elif _migration_key(row) not in done:
                    sidecar.write(_dumps(_migrated(row)))
                    done.add(_migration_key(row))
            for written in (sidecar, handle):  # the retry records are on disk before the main rows go
                written.flush()
                os.fsync(written.fileno())
        os.chmod(temp, mode)
        os.replace(temp, output_fpath)
    finally:
        temp.unlink(missing_ok=True)
    return found
