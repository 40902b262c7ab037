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
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
