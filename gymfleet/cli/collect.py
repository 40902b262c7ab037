"""`ng_collect_rollouts +input_jsonl_fpath=data.jsonl +output_jsonl_fpath=results/out.jsonl [+key=value ...]`

Runs every row of the input through its agent's `/run` on a running fleet (`ng_run`) and writes the results.

Keys: `agent_name` (for rows without `agent_ref`), `limit`, `num_repeats` (n or `{<agent>: n, _default: n}`),
`num_repeats_add_seed`, `num_samples_in_parallel` (requests in flight; default unbounded),
`"+responses_create_params={temperature: 0.6}"` (merged into every row's params), `resume_from_cache`
(finish an earlier run: keep its rollouts, append), `overwrite` (replace an earlier run's four files),
`max_attempts` (3; with resume), `disable_aggregation`, `request_timeout_s` (3600),
`stop_after_connection_failures` (20; null: never stop), `connect_retry_s` (10: how long a `/run` that cannot
connect keeps trying), `"+head_server={host: 127.0.0.1, port: 11000}"` (where
the fleet's head server is).

Writes `<out>.jsonl` (results), `<out>_materialized_inputs.jsonl`, `<out>_failures.jsonl` and
`<out>_aggregate_metrics.json`; existing ones are refused unless `+resume_from_cache=true` or `+overwrite=true`.
Before the first rollout every row is checked against its environment's request model (bad rows: `file:line`).
A failed rollout is written to the failures file and does not stop the others; after a resume finishes it, its
failure rows are marked `"_ng_superseded": true`. If the fleet dies (a run of connection failures, and the head
server gone), nothing more is sent and the collection stops with one message.
Every line is written whole: when an output cannot be written (disk full, file size limit), the line being written is
removed and the collection stops with one message naming the file and the reason.
`+rollout_collection_driver=module.path:function` (NeMo-Gym 0.7.0's hook) hands the whole collection to that
function instead, awaited with NeMo-Gym's `RolloutCollectionConfig` and the fleet's config under this command's keys
(every key is the driver's to read): `gymfleet.rollouts.nemo_gym_driver`. A driver that cannot be loaded is one
error naming the key (exit code 2); one that raises exits 1.
Exit code: 0 when every rollout succeeded, 1 when some failed, 2 for a config or data error, 3 when the fleet went
down (restart it and rerun with `+resume_from_cache=true`), 4 when an output file could not be written (free space and
rerun with `+resume_from_cache=true`), 130 on Ctrl-C (finished rollouts are kept: rerun with
`+resume_from_cache=true`).
"""

from __future__ import annotations

import asyncio
import sys

from gymfleet import http
from gymfleet.cli import command, reject_unknown_keys
from gymfleet.errors import ConfigError, TransportError
from gymfleet.rollouts.collect import CollectionSummary, collect
from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig, check_outputs, load_rows
from gymfleet.rollouts.collect_outputs import OutputError
from gymfleet.rollouts.fleet_watch import head_address
from gymfleet.rollouts.nemo_gym_collect import RolloutCollectionConfig as NeMoGymCollectionConfig
from gymfleet.rollouts.nemo_gym_driver import DRIVER_KEY, run_driver

OUTPUT_ERROR_EXIT_CODE = 4


async def _collect(config: RolloutCollectionConfig, host: str, port: int) -> CollectionSummary:
    check_outputs(config)  # like bad data, fails before the fleet is even contacted
    rows = load_rows(config)
    try:
        try:
            client = await http.ServerClient.from_head(host, port)
        except TransportError as exc:
            raise ConfigError(
                f"cannot reach the head server at {host}:{port}: {exc}",
                path="head_server",
                hint="Start the fleet with ng_run, or point +head_server={host: <host>, port: <port>} at it.",
            ) from None
        return await collect(config, client, rows=rows, head=head_address({"host": host, "port": port}))
    finally:
        await http.close()


INTERRUPTED = "Interrupted: finished rollouts are saved; rerun with +resume_from_cache=true to finish."


def report(summary: CollectionSummary, max_rewards: int = 50) -> str:
    """The end-of-run summary: counts, mean reward per agent, per-rollout rewards (if few), key metrics, files."""
    lines = [f"Rollouts: {summary.ok} ok, {summary.failed} failed ({summary.dispatched} dispatched now, "
             f"{summary.already_done} already done)."]
    if summary.failure_classes:
        lines.append("Failures by class: " + ", ".join(f"{k}: {v}" for k, v in summary.failure_classes.items()))
    if summary.exhausted:
        lines.append(f"Not retried, failed max_attempts times (task, rollout): {summary.exhausted}")
    if summary.not_finished:
        lines.append(f"Not run (left for +resume_from_cache=true): {summary.not_finished}")
    if summary.superseded:
        lines.append(f"Failure rows marked _ng_superseded (their rollout has a result now): {summary.superseded}")
    for agent, mean in summary.mean_reward.items():
        lines.append(f"  {agent}: mean reward {'n/a' if mean is None else f'{mean:.4f}'}")
    if summary.rewards and len(summary.rewards) <= max_rewards:
        lines.append("task  rollout  reward")
        lines += [f"{task!s:>4}  {rollout!s:>7}  {reward}" for task, rollout, reward in summary.rewards]
    for entry in summary.aggregate_metrics or []:
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in entry["key_metrics"].items() if isinstance(v, int | float))
        lines.append(f"Key metrics of {entry['agent_ref']['name']}: {metrics}")
    lines += [f"Wrote {what}: {path}" for what, path in summary.output_paths.items()]
    return "\n".join(lines)


def _run(argv: list[str]) -> int:
    from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
    from gymfleet.fleet.config_checks import validate_fields

    global_config = parse_global_config(GlobalConfigDictParserConfig(cli_args=argv), assign_ports=False)
    if global_config.data.get(DRIVER_KEY) is not None:  # a NeMo-Gym folder's driver runs the collection
        return run_driver(global_config.data, global_config.head_host, global_config.head_port,
                          global_config.unknown_cli_keys(set(RolloutCollectionConfig.model_fields)
                                                         | set(NeMoGymCollectionConfig.model_fields)))
    reject_unknown_keys(global_config, "ng_collect_rollouts", [*RolloutCollectionConfig.model_fields, DRIVER_KEY])
    config = validate_fields(RolloutCollectionConfig, global_config.data, "")
    try:
        summary = asyncio.run(_collect(config, global_config.head_host, global_config.head_port))
    except OutputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return OUTPUT_ERROR_EXIT_CODE
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 130
    return finish(summary)


def finish(summary: CollectionSummary) -> int:
    """Print the end-of-run report (and why the run stopped early, if it did); return the exit code."""
    print(report(summary), flush=True)
    if summary.stopped:
        print(f"error: {summary.stop_message()}", file=sys.stderr)
    return summary.exit_code


main = command(_run, __doc__)


if __name__ == "__main__":
    main()
