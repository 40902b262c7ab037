"""NeMo-Gym's `nemo_gym.task_data` (a folder's `TaskData` schema and the row checks against it), re-exported from
gymfleet (`gymfleet.serving.nemo_gym_task_data`; no code of its own)."""

from gymfleet.serving.nemo_gym_task_data import (
    LEGACY_METADATA_KEY,
    RESERVED_ROW_KEYS,
    TASK_DATA_ROW_KEY,
    TaskDataSchemaError,
    TaskDataValidationReport,
    TaskDataValidator,
    legacy_metadata_fields,
    load_task_data_schema,
    normalize_task_fields,
    validate_jsonl_rows,
)

__all__ = [
    "LEGACY_METADATA_KEY", "RESERVED_ROW_KEYS", "TASK_DATA_ROW_KEY", "TaskDataSchemaError", "TaskDataValidationReport",
    "TaskDataValidator", "legacy_metadata_fields", "load_task_data_schema", "normalize_task_fields",
    "validate_jsonl_rows",
]
