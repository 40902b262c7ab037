"""`ng_aggregate_rollouts +input_jsonl_fpath=<rollouts.jsonl> [+output_json_fpath=<metrics.json>]`: aggregate metrics.

Computes, with no fleet running, what `ng_collect_rollouts` writes to `<out>_aggregate_metrics.json`: per agent
(`agent_ref.name`), `gymfleet.serving.aggregate`'s `agent_metrics` (`mean/max/min/median/std` of every numeric
result field and of `response.usage` tokens), `key_metrics` (the means) and `group_level_metrics` (the same per
`_ng_task_index`). It is the computation every agent's `/aggregate_metrics` runs, so the numbers equal the
collector's. Use it after `+disable_aggregation=true`, or over several shards of one collection:
`"+input_jsonl_fpaths=[shard0.jsonl,shard1.jsonl]"`.

Rows tagged `_ng_failure_class` (infrastructure failures), in the input or in the collector's `<stem>_failures.jsonl`
beside it (superseded ones excepted), are left out of every reward statistic and counted (`infra_failure_share`).
The output defaults to `<first input stem>_aggregate_metrics.json`; an existing file is refused unless
`+overwrite=true`.
Exit code 0, or 2 for a missing file, a line that is not a JSON object, or an existing output.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from gymfleet.cli import command, command_fields
from gymfleet.errors import ConfigError
from gymfleet.rollouts.collect import for_aggregation
from gymfleet.rollouts.rows import read_jsonl
from gymfleet.serving.aggregate import aggregate_metrics


class AggregateRolloutsConfig(BaseModel):
    """`ng_aggregate_rollouts`' keys."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)

    input_jsonl_fpath: str | None = None
    """One rollouts file."""
    input_jsonl_fpaths: list[str] | None = None
    """Several rollouts files (shards of one collection), aggregated together."""
    output_json_fpath: str | None = None
    """Where the metrics go (default: `<first input stem>_aggregate_metrics.json`)."""
    overwrite: bool = False
    """Replace an existing output file."""

    @model_validator(mode="after")
    def _some_input(self) -> AggregateRolloutsConfig:
        if not self.inputs():
            raise ValueError("give +input_jsonl_fpath=<rollouts.jsonl> or \"+input_jsonl_fpaths=[a.jsonl,b.jsonl]\"")
        return self

    def inputs(self) -> list[Path]:
        return [Path(p) for p in ([self.input_jsonl_fpath] if self.input_jsonl_fpath else [])
                + (self.input_jsonl_fpaths or [])]

    def output(self) -> Path:
        if self.output_json_fpath:
            return Path(self.output_json_fpath)
        first = self.inputs()[0]
        return first.with_name(first.stem + "_aggregate_metrics.json")


def aggregate_by_agent(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The collector's aggregate entries (`{agent_ref, agent_metrics, key_metrics, group_level_metrics}` per agent,
    in first-seen order) over `results`."""
    by_agent: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        ref = result.get("agent_ref")
        by_agent[ref.get("name") if isinstance(ref, dict) else str(ref)].append(for_aggregation(result))
    return [{"agent_ref": {"name": agent}, **aggregate_metrics(rows)} for agent, rows in by_agent.items()]


def _run(argv: list[str]) -> int:
    global_config, config = command_fields(argv, "ng_aggregate_rollouts", AggregateRolloutsConfig)
    output = config.output()
    if output.exists() and not config.overwrite:
        raise ConfigError(f"{output} exists", path="output_json_fpath",
                          hint="Pass +overwrite=true to replace it, or +output_json_fpath=<another file>.")
    results = [row for path in config.inputs() for _, row in read_jsonl(path)]
    sidecars = [path.with_name(path.stem + "_failures.jsonl") for path in config.inputs()]
    results += [row for path in sidecars if path.exists() for _, row in read_jsonl(path)
                if row.get("_ng_failure_class") and not row.get("_ng_superseded")]
    failures = Counter(row["_ng_failure_class"] for row in results if row.get("_ng_failure_class"))
    # Failure rows go along: `aggregate_metrics` counts them (`infra_failure_share`) and keeps them out of rewards.
    entries = aggregate_by_agent(results)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(entries, indent=2) + "\n")
    print(f"Rollouts: {len(results) - sum(failures.values())} aggregated"
          + (f", {sum(failures.values())} infrastructure failures left out ("
             + ", ".join(f"{cls}: {n}" for cls, n in sorted(failures.items())) + ")" if failures else "") + ".")
    for entry in entries:
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in entry["key_metrics"].items())
        print(f"Key metrics of {entry['agent_ref']['name']}: {metrics}")
    print(f"Wrote aggregate metrics: {output}", flush=True)
    return 0


main = command(_run, __doc__)


if __name__ == "__main__":
    main()
