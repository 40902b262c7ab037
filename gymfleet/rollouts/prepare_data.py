"""Data preparation (`ng_prepare_data`): check the datasets declared on agents, measure them, collate them.

Datasets are declared on agent instances (`datasets: [{name, type, jsonl_fpath, num_repeats, license}]`). The mode
picks which: `example_validation` takes `example` datasets, `train_preparation` takes `train` and `validation` ones
(those must name a `license`). `jsonl_fpath` is relative to the working directory, else to the repository root.

Every line of every dataset is checked: it must be a JSON object whose `responses_create_params` is a valid
Responses request and which the agent's resources server would accept at `/verify` (its request model, with a
placeholder `response`). All bad lines are reported as `file:line: reason`; the run fails unless
`skip_invalid_rows` is set, in which case they are left out, listed, and counted in the metrics.

Outputs: `<jsonl dir>/<stem>_metrics.json` next to each dataset (its config plus its metrics);
`<output_dirpath>/<type>.jsonl` (every row repeated `num_repeats` times consecutively, with
`agent_ref` set to its agent; agents in config order, then datasets in declaration order) and
`<output_dirpath>/<type>_metrics.json`. A metrics file that already exists and disagrees (floats with tolerance) is
a conflict: the new metrics go to `<stem>_metrics_conflict.json` and the run fails unless
`overwrite_metrics_conflicts` is set.

Checking a dataset of `PROGRESS_MIN_BYTES` or more shows progress on stderr (`gymfleet.progress`): a bar on a
terminal, else a line every `PROGRESS_EVERY_S` seconds (`Checking train.jsonl: 96.0 MB/410.2 MB (23%), 5 s elapsed`).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gymfleet.errors import ConfigError, DataError, GymfleetError, ServerRefError
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.fleet.config_checks import validate_fields
from gymfleet.fleet.config_instances import GlobalConfig, repository_root
from gymfleet.fleet.config_merge import join_path
from gymfleet.progress import Progress
from gymfleet.rollouts.rows import (  # noqa: F401  (check_row, placeholder_response: this module's API)
    PROGRESS_EVERY_S,
    PROGRESS_MIN_BYTES,
    check_row,
    placeholder_response,
    verify_request_model,
    warn_unknown_params,
)
from gymfleet.wire import Response

log = logging.getLogger(__name__)

MODE_TYPES = {"example_validation": ("example",), "train_preparation": ("train", "validation")}
# Data preparation starts no server, so a missing policy model is stood in for (spec/protocol.md §3.2.8).
POLICY_SEEDS = {"policy_base_url": "", "policy_api_key": "", "policy_model_name": ""}
PLACEHOLDER_MODEL = {"responses_api_models": {"dummy_model": {"entrypoint": "app.py"}}}
REL_TOL, ABS_TOL = 5e-3, 5e-4


class DatasetConfig(BaseModel):
    """One entry of an agent's `datasets:` list."""

    model_config = ConfigDict(extra="allow")
    name: str
    type: Literal["train", "validation", "example", "benchmark"]
    jsonl_fpath: str
    num_repeats: int = Field(default=1, ge=1)
    license: str | None = None


class TrainDataProcessorConfig(BaseModel):
    """`ng_prepare_data`' keys (top-level keys of the global config)."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)
    output_dirpath: str
    mode: Literal["train_preparation", "example_validation"]
    should_download: bool = False
    """Not supported: gymfleet never downloads data; fetch missing files yourself."""
    data_source: Literal["huggingface", "gitlab"] = "huggingface"
    overwrite_metrics_conflicts: bool = False
    skip_invalid_rows: bool = False
    """Leave out (and list) invalid lines instead of failing."""


@dataclass
class Dataset:
    """A dataset in scope, with its rows once read."""

    agent: str
    config: DatasetConfig
    where: str
    """YAML path of its declaration."""
    path: Path
    verify_model: type[BaseModel] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    invalid: list[tuple[int, str]] = field(default_factory=list)

    def repeated(self) -> Iterator[dict[str, Any]]:
        """Its rows, each `num_repeats` times in a row, with `agent_ref` set to its agent."""
        ref = {"type": "responses_api_agents", "name": self.agent}
        for row in self.rows:
            stamped = {**row, "agent_ref": ref}
            for _ in range(self.config.num_repeats):
                yield stamped

    def sidecar(self, suffix: str) -> Path:
        return self.path.with_name(self.path.stem + suffix)


def parse_prepare_config(argv: list[str]) -> GlobalConfig:
    """The global config, with empty `policy_*` values and a placeholder `policy_model` when the files lack one."""

    def parse(initial: dict[str, Any]) -> GlobalConfig:
        parser_config = GlobalConfigDictParserConfig(cli_args=argv, initial_global_config_dict=initial)
        return parse_global_config(parser_config, assign_ports=False)

    try:
        return parse(dict(POLICY_SEEDS))
    except ServerRefError as first:
        try:
            return parse({**POLICY_SEEDS, "policy_model": PLACEHOLDER_MODEL})
        except GymfleetError:
            raise first from None


# ---------------------------------------------------------------------------------------------- finding


def find_datasets(global_config: GlobalConfig, mode: str, say: Callable[[str], None] = print) -> list[Dataset]:
    """The datasets in scope for `mode`, in agent then declaration order.

    Raises:
        ConfigError: a malformed declaration, a train/validation dataset without `license`, or none in scope.
    """
    types = MODE_TYPES[mode]
    found: list[Dataset] = []
    for agent in global_config.instances_of("responses_api_agents"):
        base = f"{agent.path}.datasets"
        declared = agent.fields.get("datasets") or []
        if not isinstance(declared, list):
            raise ConfigError(f"{base}: must be a list of datasets, got {declared!r}.", path=base)
        mine = []
        for index, entry in enumerate(declared):
            where = join_path(base, index)
            dataset_config = validate_fields(DatasetConfig, entry, where)
            if dataset_config.type == "benchmark" and mode == "train_preparation":
                say(f"Skipping benchmark dataset {agent.name}/{dataset_config.name}: benchmarks are not supported")
            if dataset_config.type not in types:
                continue
            if dataset_config.type in ("train", "validation") and not dataset_config.license:
                raise ConfigError(f"{where}.license: {dataset_config.type} datasets must name a license.",
                                  path=f"{where}.license", hint="Add e.g. `license: Apache 2.0` to the dataset.")
            mine.append(Dataset(agent.name, dataset_config, where, _resolve_path(dataset_config.jsonl_fpath)))
        model = verify_request_model(global_config, agent) if mine else None
        for dataset in mine:
            dataset.verify_model = model
        names = ", ".join(f"{d.config.name} ({d.config.type})" for d in mine) or f"no {'/'.join(types)} datasets"
        say(f"Agent {agent.name}: {names}")
        found += mine
    if not found:
        raise ConfigError(
            f"no {' or '.join(types)} datasets declared on any agent (mode {mode}).",
            hint="Pass the config that declares them, e.g. "
            '"+config_paths=[resources_servers/<env>/configs/<env>.yaml]".',
        )
    return found


def _resolve_path(jsonl_fpath: str) -> Path:
    path = Path(jsonl_fpath)
    if path.is_absolute() or path.exists():
        return path
    in_repo = repository_root() / path
    return in_repo if in_repo.exists() else path


# ---------------------------------------------------------------------------------------------- checking


def read_dataset(dataset: Dataset, placeholder: Response) -> None:
    """Fill `dataset.rows` with its valid rows and `dataset.invalid` with `(line, reason)` for the others; warn about
    `responses_create_params` keys nobody knows (`warn_unknown_params`)."""
    numbered: list[tuple[int, dict[str, Any]]] = []
    size = dataset.path.stat().st_size
    read = 0
    bar = Progress(size, f"Checking {dataset.path.name}", unit="B", enabled=size >= PROGRESS_MIN_BYTES,
                   every_s=PROGRESS_EVERY_S)
    with bar, dataset.path.open("rb") as lines:
        for lineno, raw in enumerate(lines, 1):
            read += len(raw)
            if lineno % 256 == 0:
                bar.update(read - bar.done)
            line = raw.decode("utf-8")
            if not line.strip():
                continue
            row, reason = check_row(line, dataset.verify_model, placeholder)
            if reason is None:
                dataset.rows.append(row)
                numbered.append((lineno, row))
            else:
                dataset.invalid.append((lineno, reason))
        bar.update(read - bar.done)
    warn_unknown_params(dataset.path, numbered)


# ---------------------------------------------------------------------------------------------- metrics


class _Stat:
    def __init__(self) -> None:
        self.count, self.mean, self.m2 = 0, 0.0, 0.0
        self.min, self.max = math.inf, -math.inf

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)
        self.min, self.max = min(self.min, value), max(self.max, value)

    def block(self) -> dict[str, float | int]:
        if not self.count:
            return {"Total # non-null values": 0, "Average": 0.0, "Min": 0.0, "Max": 0.0, "Standard deviation": 0.0}
        std = math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 0.0
        return {"Total # non-null values": self.count, "Average": _round(self.mean), "Min": _round(self.min),
                "Max": _round(self.max), "Standard deviation": _round(std)}


def _round(value: float) -> float:
    return round(float(value), 4)


def _scalars(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [item for element in value for item in _scalars(element)]
    return [value] if isinstance(value, bool | int | float | str) else []


def dataset_metrics(rows: Iterable[dict[str, Any]], skipped: int = 0) -> dict[str, Any]:
    """NeMo-Gym's dataset metrics over `rows` (see `spec/protocol.md` §4)."""
    fixed = {name: _Stat() for name in ("Number of tools", "Json-dumped number of words (proxy for token count)",
                                        "Number of turns", "Temperature")}
    numbers: dict[str, _Stat] = {}
    strings: dict[str, tuple[set[str], list[int]]] = {}
    count = 0
    for row in rows:
        count += 1
        params = row["responses_create_params"]
        fixed["Number of tools"].add(len(params.get("tools") or []))
        fixed["Json-dumped number of words (proxy for token count)"].add(len(json.dumps(params).split()))
        items = params.get("input")
        turns = 1 if isinstance(items, str) else sum(isinstance(i, dict) and i.get("role") == "user" for i in items)
        fixed["Number of turns"].add(turns)
        if isinstance(params.get("temperature"), int | float):
            fixed["Temperature"].add(params["temperature"])
        for key, value in row.items():
            if key in ("responses_create_params", "agent_ref"):
                continue
            for scalar in _scalars(value):
                if isinstance(scalar, str):
                    seen, total = strings.setdefault(key, (set(), [0]))
                    seen.add(scalar)
                    total[0] += 1
                else:
                    numbers.setdefault(key, _Stat()).add(float(scalar))
    metrics: dict[str, Any] = {"Number of examples": count}
    if skipped:
        metrics["Number of skipped rows"] = skipped
    metrics.update({name: stat.block() for name, stat in fixed.items()})
    metrics.update({key: stat.block() for key, stat in numbers.items()})
    metrics.update({key: {"unique_count": len(seen), "total_count": total[0]}
                    for key, (seen, total) in strings.items() if key not in numbers})
    return metrics


def metric_differences(old: Any, new: Any, at: str = "") -> list[str]:
    """Paths where two metrics documents disagree (numbers within tolerance agree; lists compare as multisets)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [diff for key in dict.fromkeys([*old, *new])
                for diff in (metric_differences(old.get(key), new.get(key), join_path(at, key))
                             if key in old and key in new else [f"{join_path(at, key)}: only in one of them"])]
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{at}: {len(old)} items vs {len(new)}"]
        old, new = sorted(old, key=_canonical), sorted(new, key=_canonical)
        return [diff for i, (a, b) in enumerate(zip(old, new, strict=True))
                for diff in metric_differences(a, b, join_path(at, i))]
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (old, new))
    if numeric and math.isclose(old, new, rel_tol=REL_TOL, abs_tol=ABS_TOL):
        return []
    return [] if old == new else [f"{at}: {old!r} -> {new!r}"]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


# ---------------------------------------------------------------------------------------------- the command


@dataclass
class _MetricsFile:
    path: Path
    content: dict[str, Any]

    @property
    def conflict_path(self) -> Path:
        return self.path.with_name(self.path.stem + "_conflict.json")

    def differences(self) -> list[str]:
        if not self.path.exists():
            return []
        try:
            old = json.loads(self.path.read_text())
        except json.JSONDecodeError as exc:
            return [f"existing file is not JSON ({exc})"]
        return metric_differences(old, self.content)


def _write_json(path: Path, content: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=4, ensure_ascii=False) + "\n")


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def prepare(
    global_config: GlobalConfig, config: TrainDataProcessorConfig, say: Callable[[str], None] = print
) -> dict[str, Path]:
    """Check, measure and collate the datasets in scope; return `{type: collated jsonl path}`.

    Raises:
        ConfigError: bad dataset declarations, or no dataset in scope.
        DataError: missing files, invalid lines (without `skip_invalid_rows`), or metrics conflicts (without
            `overwrite_metrics_conflicts`). Nothing is written when a check fails, except conflict files.
    """
    datasets = find_datasets(global_config, config.mode, say)
    missing = [f"{d.where}.jsonl_fpath: {d.config.jsonl_fpath} does not exist"
               for d in datasets if not d.path.is_file()]
    if missing:
        hint = "gymfleet does not download datasets (should_download): fetch them to these paths first."
        raise DataError("missing dataset files:\n  " + "\n  ".join(missing) + "\n" + hint)

    placeholder = placeholder_response()
    for dataset in datasets:
        read_dataset(dataset, placeholder)
    invalid = [f"{d.path}:{line}: {reason}" for d in datasets for line, reason in d.invalid]
    if invalid and not config.skip_invalid_rows:
        raise DataError(f"{len(invalid)} invalid rows (fix them, or skip them with +skip_invalid_rows=true):\n"
                        + "\n".join(invalid))
    for line in invalid:
        say(f"skipped invalid row {line}")

    metrics_files: list[_MetricsFile] = []
    for dataset in datasets:
        declared = dataset.config.model_dump(mode="json", exclude_none=True)
        metrics = dataset_metrics(dataset.repeated(), skipped=len(dataset.invalid))
        metrics_files.append(_MetricsFile(dataset.sidecar("_metrics.json"), {**declared, **metrics}))
    output_dir = Path(config.output_dirpath)
    by_type: dict[str, list[Dataset]] = {}
    for dataset in datasets:
        by_type.setdefault(dataset.config.type, []).append(dataset)
    for kind, members in by_type.items():
        rows = itertools.chain.from_iterable(d.repeated() for d in members)
        metrics = dataset_metrics(rows, sum(len(d.invalid) for d in members))
        content = {"type": kind, "datasets": [f"{d.agent}/{d.config.name}" for d in members], **metrics}
        metrics_files.append(_MetricsFile(output_dir / f"{kind}_metrics.json", content))

    by_path: dict[Path, _MetricsFile] = {}
    for metrics_file in metrics_files:
        other = by_path.setdefault(metrics_file.path.resolve(), metrics_file)
        if other is not metrics_file and metric_differences(other.content, metrics_file.content):
            raise DataError(f"two datasets would write different metrics to {metrics_file.path}: "
                            f"{other.content.get('name')!r} and {metrics_file.content.get('name')!r}; "
                            "give each dataset its own file")
    conflicts = [(f, diffs) for f in metrics_files if (diffs := f.differences())]
    if conflicts and not config.overwrite_metrics_conflicts:
        for metrics_file, _ in conflicts:
            _write_json(metrics_file.conflict_path, metrics_file.content)
        raise DataError(
            "metrics differ from the existing files:\n  "
            + "\n  ".join(f"{f.path} (new: {f.conflict_path.name}): {'; '.join(d[:5])}" for f, d in conflicts)
            + "\nCheck the data; rerun with +overwrite_metrics_conflicts=true to accept the new metrics."
        )
    for metrics_file, differences in conflicts:
        say(f"overwriting {metrics_file.path}: {'; '.join(differences[:5])}")
    for metrics_file in metrics_files:
        _write_json(metrics_file.path, metrics_file.content)
        metrics_file.conflict_path.unlink(missing_ok=True)
    for dataset in datasets:
        say(f"{dataset.agent}/{dataset.config.name}: {len(dataset.rows)} rows x {dataset.config.num_repeats} "
            f"({len(dataset.invalid)} skipped) from {dataset.path}")
    written = {}
    for kind, members in by_type.items():
        written[kind] = output_dir / f"{kind}.jsonl"
        count = _write_jsonl(written[kind], itertools.chain.from_iterable(d.repeated() for d in members))
        say(f"Wrote {count} {kind} rows to {written[kind]} (metrics: {output_dir / f'{kind}_metrics.json'})")
    return written
