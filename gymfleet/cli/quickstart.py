"""`ng_quickstart [+key=value ...]`: the embedded default, end to end, in one command.

Starts the fleet of `configs/quickstart.yaml` (head server, scripted LLM, `vllm_model` policy server,
`simple_agent`, the `mcqa` environment) with no GPU and no network, collects one rollout per example row through
the real chain (collector → agent → policy server → scripted LLM; agent → mcqa), prints each reward, and shuts the
fleet down. Server logs go to `<output dir>/logs/`. Overrides: `+output_dir=results/quickstart`,
`+num_repeats=N`, `"+config_paths=[...]"` (other fleets), `+input_jsonl_fpath=...`, `+agent_name=...`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gymfleet import http
from gymfleet.cli import command, reject_unknown_keys
from gymfleet.cli.collect import report
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.fleet.config_instances import repository_root
from gymfleet.fleet.supervisor import Fleet
from gymfleet.rollouts.collect import collect
from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig, load_rows
from gymfleet.testing import free_port

DEFAULTS = {
    "config_paths": ["configs/quickstart.yaml"],
    "agent_name": "mcqa_simple_agent",
    "input_jsonl_fpath": "resources_servers/mcqa/data/example.jsonl",
    "output_dir": "results/quickstart",
}


async def _collect(config: RolloutCollectionConfig, host: str, port: int):
    try:
        client = await http.ServerClient.from_head(host, port)
        return await collect(config, client, progress=False)
    finally:
        await http.close()


def _quickstart(argv: list[str]) -> int:
    root = repository_root()
    probe = parse_global_config(GlobalConfigDictParserConfig(cli_args=argv, initial_global_config_dict=DEFAULTS,
                                                             skip_load_from_dotenv=True), assign_ports=False)
    output_dir = Path(probe.data["output_dir"])
    initial = {**DEFAULTS, "head_server": {"host": "127.0.0.1", "port": free_port()},
               "nemo_gym_log_dir": str(output_dir / "logs")}
    config = parse_global_config(GlobalConfigDictParserConfig(cli_args=argv, initial_global_config_dict=initial,
                                                              skip_load_from_dotenv=True))
    reject_unknown_keys(config, "ng_quickstart", [*DEFAULTS, "num_repeats"])
    input_path = Path(config.data["input_jsonl_fpath"])
    collection = RolloutCollectionConfig(
        input_jsonl_fpath=str(input_path if input_path.exists() else root / input_path),
        output_jsonl_fpath=str(output_dir / "rollouts.jsonl"),
        agent_name=config.data["agent_name"],
        num_repeats=config.data.get("num_repeats", 1),
        overwrite=True,  # a demo: each run replaces the last one's rollouts
    )
    load_rows(collection)  # bad input fails before anything starts
    print(f"Starting the fleet: {', '.join(config.instances)} (logs in {output_dir / 'logs'})", flush=True)
    fleet = Fleet(config)
    try:
        fleet.start()
        summary = asyncio.run(_collect(collection, config.head_host, config.head_port))
    finally:
        fleet.shutdown()
        print("Fleet stopped.", flush=True)
    print()
    for line in Path(collection.output_jsonl_fpath).read_text().splitlines():
        result = json.loads(line)
        print(f"task {result['_ng_task_index']} rollout {result['_ng_rollout_index']}: reward "
              f"{result['reward']}  (expected {result.get('expected_answer')!r}, extracted "
              f"{result.get('extracted_answer')!r})")
    print()
    print(report(summary, max_rewards=0), flush=True)
    return summary.exit_code


main = command(_quickstart, __doc__)


if __name__ == "__main__":
    main()
