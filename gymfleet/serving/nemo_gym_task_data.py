"""NeMo-Gym's `nemo_gym.task_data`: a folder's `task_data.py` (one export, `TaskData`: a pydantic model or any type a
`TypeAdapter` accepts) describes the task-owned fields of its dataset rows, flat; these check rows against it.

- `load_task_data_schema(server_dir)`: a `TypeAdapter` for `<server_dir>/task_data.py`'s `TaskData`; None when the
  folder has no `task_data.py`; `TaskDataSchemaError` (naming the file and the fix) when it does not import or has
  no usable `TaskData`. The module is loaded under `nemo_gym_task_data.<folder>`, apart from the folder's own import
  name.
- `normalize_task_fields(row)`: the row without its framework keys (`RESERVED_ROW_KEYS`), with the contents of a
  legacy `verifier_metadata` dict and of a migrated `task_data` dict moved up to the top level; a key found in two
  places with different values is returned in `conflicts` (the top-level value is kept). A container that is not a
  dict stays as it is, for the schema to reject.
- `TaskDataValidator(server_name, adapter, dataset_fpath).validate_row(index, row)` accumulates a
  `TaskDataValidationReport`: rows, failed rows (the first `MAX_RECORDED_ERRORS` messages kept), keys not declared
  by the schema (a model with `extra="allow"` keeps them), conflicting keys, and misplaced keys (a field the schema
  marks `json_schema_extra={"legacy_location": "verifier_metadata"}` found only top-level in a row that has not
  migrated). A materialized task row (`task_id` a mapping, with `task_input`) is checked on its
  `task_input.task_data` plus the other `task_input` fields. `report.clean` and `report.summary()` say the result.
- `validate_jsonl_rows(server_name, adapter, dataset_fpath, lines)`: the same over JSONL lines.

Written from NeMo-Gym 0.7.0's behaviour.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import typing
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

__all__ = [
    "LEGACY_METADATA_KEY", "RESERVED_ROW_KEYS", "TASK_DATA_ROW_KEY", "TaskDataSchemaError", "TaskDataValidationReport",
    "TaskDataValidator", "legacy_metadata_fields", "load_task_data_schema", "normalize_task_fields",
    "validate_jsonl_rows",
]

RESERVED_ROW_KEYS = frozenset({"responses_create_params", "agent_ref", "task_source", "_ng_task_index",
                               "_ng_rollout_index"})
"""Framework-owned row keys: never part of a folder's `TaskData`."""
LEGACY_METADATA_KEY = "verifier_metadata"
TASK_DATA_ROW_KEY = "task_data"


class TaskDataSchemaError(Exception):
    """A folder's `task_data.py` exists but does not import, or exports no usable `TaskData`."""


def load_task_data_schema(server_dir: Path) -> TypeAdapter | None:
    path = Path(server_dir) / "task_data.py"
    if not path.is_file():
        return None
    name = f"nemo_gym_task_data.{path.parent.name}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and typing look their module up there
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise TaskDataSchemaError(f"{path}: does not import: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, "TaskData"):
        raise TaskDataSchemaError(f"{path}: exports no `TaskData`; export the rows' pydantic model (or a type a "
                                  "TypeAdapter accepts, such as a discriminated union) under that name")
    try:
        return TypeAdapter(module.TaskData)
    except Exception as exc:
        raise TaskDataSchemaError(f"{path}: `TaskData` is not a type pydantic's TypeAdapter accepts: {exc}") from exc


def normalize_task_fields(row: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    fields = {key: value for key, value in row.items() if key not in RESERVED_ROW_KEYS}
    conflicts: list[str] = []
    for container_key in (LEGACY_METADATA_KEY, TASK_DATA_ROW_KEY):
        if container_key not in fields:
            continue
        container = fields.pop(container_key)
        if not isinstance(container, dict):
            fields[container_key] = container
            continue
        for key, value in container.items():
            if key in fields and fields[key] != value:
                conflicts.append(key)
            else:
                fields[key] = value
    return fields, conflicts


def _models(annotation: Any) -> Iterable[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for argument in typing.get_args(annotation):
        yield from _models(argument)


def legacy_metadata_fields(adapter: TypeAdapter) -> frozenset[str]:
    """The schema's fields marked `legacy_location: verifier_metadata` (today's servers read them only there)."""
    return frozenset(
        name for model in _models(getattr(adapter, "_type", None)) for name, info in model.model_fields.items()
        if isinstance(info.json_schema_extra, dict)
        and info.json_schema_extra.get("legacy_location") == LEGACY_METADATA_KEY
    )


@dataclass
class TaskDataValidationReport:
    server_name: str
    dataset_fpath: str
    rows: int = 0
    error_rows: int = 0
    errors: list[str] = field(default_factory=list)
    unknown_keys: dict[str, int] = field(default_factory=dict)
    conflicting_keys: dict[str, int] = field(default_factory=dict)
    misplaced_keys: dict[str, int] = field(default_factory=dict)

    MAX_RECORDED_ERRORS = 5

    @property
    def clean(self) -> bool:
        return not (self.error_rows or self.unknown_keys or self.conflicting_keys or self.misplaced_keys)

    def fail(self, index: int, why: str) -> None:
        self.error_rows += 1
        if len(self.errors) < self.MAX_RECORDED_ERRORS:
            self.errors.append(f"{index}: {why}")

    def summary(self) -> str:
        lines = [f"{self.dataset_fpath}: {self.error_rows}/{self.rows} rows failed task_data validation against the "
                 f"`{self.server_name}` schema."]
        lines += [f"  row {error}" for error in self.errors]
        if self.error_rows > len(self.errors):
            lines.append(f"  ... and {self.error_rows - len(self.errors)} more rows")
        for counts, what in (
            (self.conflicting_keys, "keys with DIFFERENT values top-level and nested (ambiguous)"),
            (self.misplaced_keys, "keys the server reads from verifier_metadata, found only top-level (it will not "
                                  "see them)"),
            (self.unknown_keys, "keys the schema does not declare (a typo, or a missing schema field?)"),
        ):
            if counts:
                lines.append(f"  {what}: " + ", ".join(f"{key} ({n} rows)" for key, n in sorted(counts.items())))
        return "\n".join(lines)


def _count(counts: dict[str, int], keys: Iterable[str]) -> None:
    for key, n in Counter(keys).items():
        counts[key] = counts.get(key, 0) + n


class TaskDataValidator:
    """Checks rows against one folder's `TaskData`, accumulating `report` (see the module docstring)."""

    def __init__(self, server_name: str, adapter: TypeAdapter, dataset_fpath: str):
        self._adapter = adapter
        self._legacy = legacy_metadata_fields(adapter)
        self.report = TaskDataValidationReport(server_name=server_name, dataset_fpath=dataset_fpath)

    def validate_row(self, row_index: int, row: Mapping[str, Any]) -> None:
        report = self.report
        report.rows += 1
        migrated = False
        if isinstance(row.get("task_id"), Mapping) and "task_input" in row:  # a materialized task
            task_input = row["task_input"]
            if not isinstance(task_input, Mapping):
                report.fail(row_index, f"task_input must be an object, got {type(task_input).__name__}")
                return
            nested = task_input.get(TASK_DATA_ROW_KEY, {})
            if not isinstance(nested, Mapping):
                report.fail(row_index, f"task_input.task_data must be an object, got {type(nested).__name__}")
                return
            migrated = TASK_DATA_ROW_KEY in task_input
            row = dict(nested)
            for key, value in task_input.items():
                if key == TASK_DATA_ROW_KEY:
                    continue
                if key in row and row[key] != value:
                    _count(report.conflicting_keys, [key])
                else:
                    row[key] = value
        if self._legacy and not migrated and TASK_DATA_ROW_KEY not in row:
            nested = row.get(LEGACY_METADATA_KEY)
            inside = set(nested) if isinstance(nested, dict) else set()
            _count(report.misplaced_keys, (row.keys() & self._legacy) - inside)
        fields, conflicts = normalize_task_fields(row)
        _count(report.conflicting_keys, conflicts)
        try:
            validated = self._adapter.validate_python(fields)
        except Exception as exc:  # noqa: BLE001 - any schema failure is this row's error, reported, never raised
            report.fail(row_index, str(exc).strip().replace("\n", "; ")[:400])
            return
        if isinstance(validated, BaseModel):
            _count(report.unknown_keys, list(validated.__pydantic_extra__ or ()))


def validate_jsonl_rows(server_name: str, adapter: TypeAdapter, dataset_fpath: str,
                        lines: Iterable[str]) -> TaskDataValidationReport:
    validator = TaskDataValidator(server_name, adapter, dataset_fpath)
    for index, line in enumerate(lines):
        if line.strip():
            validator.validate_row(index, json.loads(line))
    return validator.report
