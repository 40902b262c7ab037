"""NeMo-Gym 0.7.0's `RolloutAggregationHelper.run_from_config` (`nemo_gym.rollout_collection`): metrics over shards
collected with `disable_aggregation` (or any rollout files), as one run's.

`input_glob` (a glob, or several separated by commas; each shard's `_failures` and `_materialized_inputs` files
left out) names the shards; their rows are sorted by task and rollout, merged into `output_jsonl_fpath`
(`merge_shards`), and sent to each Environment Server's (else agent's) `/aggregate_metrics`, written to
`<output>_aggregate_metrics.json` as `run_from_config` writes it. `count_failure_classes_as_zero` and
`count_missing_rollouts_as_zero` read each shard's own sidecars against that shard's own rows, as 0.7.0's do.
NeMo-Gym's rollout health checks are not run (logged).
"""

from __future__ import annotations

import glob
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, Field

from gymfleet.errors import ConfigError
from gymfleet.rollouts import nemo_gym_sidecars as sidecars
from gymfleet.rollouts.nemo_gym_collect import RolloutCollectionHelper
from gymfleet.serving.nemo_gym_client import plain_config
from gymfleet.serving.nemo_gym_records import NG_FAILURE_CLASS_KEY, failures_path_for, materialized_path_for

log = logging.getLogger(__name__)


class RolloutAggregationConfig(BaseModel):
    """0.7.0's `RolloutAggregationConfig` (its fields and defaults)."""

    input_glob: str
    output_jsonl_fpath: str
    merge_shards: bool = True
    count_failure_classes_as_zero: list[str] = Field(default_factory=list)
    count_missing_rollouts_as_zero: bool = False
    disable_health_check: bool = False
    health_check_workers: int | None = Field(default=None, ge=1)
    health_check_ignored_checks: list[str] = Field(default_factory=list)


def expand_input_glob(input_glob: str) -> list[str]:
    """The shard files `input_glob` matches, sorted per pattern, deduplicated, without sidecars."""
    found: dict[str, None] = {}
    for pattern in (p.strip() for p in input_glob.split(",") if p.strip()):
        for path in sorted(glob.glob(pattern)):
            if not Path(path).stem.endswith(("_failures", "_materialized_inputs")):
                found.setdefault(path, None)
    return list(found)


class RolloutAggregationHelper(BaseModel):
    """0.7.0's `RolloutAggregationHelper`."""

    async def run_from_config(self, config: RolloutAggregationConfig) -> Path | None:
        """Aggregate the shards (see the module docstring); the metrics file, or None when nothing was scored.

        Raises:
            ConfigError: no file matches `input_glob`. DataError: a shard line is not JSON.
        """
        paths = expand_input_glob(config.input_glob)
        if not paths:
            raise ConfigError(f"no shards match input_glob={config.input_glob!r}", path="input_glob",
                              hint="check the pattern (several are separated by commas)")
        results: list[dict[str, Any]] = []
        shard_keys: dict[str, set] = {}
        for path in paths:
            shard = sidecars.read_jsonl(Path(path))
            shard_keys[path] = set(map(sidecars.rollout_key, shard))
            results.extend(shard)
        log.info("aggregating %d rollout(s) from %d shard(s): %s", len(results), len(paths), paths)
        results.sort(key=sidecars.rollout_key)
        output = Path(config.output_jsonl_fpath)
        output.parent.mkdir(parents=True, exist_ok=True)
        if config.merge_shards:
            output.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in results))
        helper = RolloutCollectionHelper()
        by_agent: dict[str, list[str]] | None = None

        def group(row: Any) -> str | None:
            nonlocal by_agent
            if isinstance(stamp := row.get(sidecars.NG_ENVIRONMENT_SERVER_KEY), str):
                return stamp
            agent = (row.get("agent_ref") or {}).get("name")
            if by_agent is None:
                by_agent = sidecars.environment_servers_by_agent(plain_config(
                    helper.setup_server_client().global_config_dict))
            servers = by_agent.get(agent, []) if agent else []
            return servers[0] if len(servers) == 1 else agent

        def identity(row: Any) -> tuple[Any, ...]:
            return group(row), *sidecars.rollout_key(row)

        latest: dict[tuple[Any, ...], dict[str, Any]] = {}
        for path in paths:
            for key, row in sidecars.latest_failure_rows([failures_path_for(Path(path))]).items():
                if key not in shard_keys[path]:
                    latest[identity(row)] = row
        landed = {identity(row) for row in results} if latest or config.count_missing_rollouts_as_zero else set()
        wanted = set(config.count_failure_classes_as_zero)
        counted = [sidecars.counted_failure_row(row) for key, row in latest.items()
                   if key not in landed and row.get(NG_FAILURE_CLASS_KEY) in wanted
                   and sidecars.routing_identity(row) is not None]
        materialized = [materialized_path_for(Path(path)) for path in paths]
        missing: list[dict[str, Any]] = []
        if config.count_missing_rollouts_as_zero:
            accounted = landed | set(latest)
            for path, inputs in zip(paths, materialized, strict=True):
                for zero in sidecars.missing_rollout_rows_counted_as_zero(
                        [inputs], [failures_path_for(Path(path))], set(shard_keys[path])):
                    if identity(zero) not in accounted:
                        accounted.add(identity(zero))
                        missing.append(zero)
            counted.extend(missing)
        if counted:
            sidecars.fill_task_fields(counted, results, materialized, group)
        scored = sorted(results + counted, key=sidecars.rollout_order_key)
        metrics_path = await helper._call_aggregate_metrics(scored, scored, output)
        counted_ids = {identity(row) for row in counted}
        dropped = Counter(row.get(NG_FAILURE_CLASS_KEY) or "unknown" for key, row in latest.items()
                          if key not in landed and key not in counted_ids)
        coverage = sidecars.coverage_report(len(scored) + sum(dropped.values()), len(scored), dropped,
                                            "the shards' _failures.jsonl sidecars", imputed=len(missing))
        log.info("aggregation done: merged rollouts %s, aggregate metrics %s%s",
                 output if config.merge_shards else "<not merged>", metrics_path, coverage)
        if not config.disable_health_check:
            log.info("NeMo-Gym's rollout health checks are not run by gymfleet")
        return metrics_path
