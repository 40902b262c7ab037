"""`ng_e2e_collect_rollouts "+config_paths=[...]" +input_jsonl_fpath=in.jsonl +output_jsonl_fpath=out.jsonl`

Starts the fleet of `config_paths` (as `ng_run` does, same supervisor), waits until every server and model
endpoint is ready, runs the collection (as `ng_collect_rollouts` does, same keys: `num_repeats`,
`num_samples_in_parallel`, `limit`, `"+responses_create_params={...}"`, `resume_from_cache`, `overwrite`, ...),
prints its report, and stops the fleet, also on an error or Ctrl-C.

- The head server gets a free port unless `+head_server.port=...` says otherwise, so a fleet already running on
  11000 is not in the way.
- Server logs go to `<output dir>/<output stem>_logs/` (set `+nemo_gym_log_dir=...` to move them).
- Rows without `agent_ref` go to `+agent_name=...`; when the config has exactly one agent, that one.
- Outputs are checked before the fleet starts: an earlier run's files are refused unless `+resume_from_cache=true`
  or `+overwrite=true`, and bad input lines are named `file:line`.

Exit code: the collection's (0 every rollout succeeded, 1 some failed, 3 the fleet went down), 2 for a config or
data error or a fleet that cannot start, 130 on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from gymfleet import http
from gymfleet.cli import command, reject_unknown_keys
from gymfleet.cli.collect import INTERRUPTED, finish
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.fleet.config_checks import validate_fields
from gymfleet.fleet.supervisor import Fleet
from gymfleet.rollouts.collect import CollectionSummary, collect
from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig, check_outputs, load_rows
from gymfleet.testing import free_port


async def _collect(config: RolloutCollectionConfig, rows: list[dict], host: str, port: int) -> CollectionSummary:
    try:
        client = await http.ServerClient.from_head(host, port)
        return await collect(config, client, rows=rows, head=(host, port))
    finally:
        await http.close()


def _run(argv: list[str]) -> int:
    probe = parse_global_config(GlobalConfigDictParserConfig(cli_args=argv), assign_ports=False)
    reject_unknown_keys(probe, "ng_e2e_collect_rollouts", RolloutCollectionConfig.model_fields)
    output = Path(str(probe.data.get("output_jsonl_fpath", "rollouts.jsonl")))
    initial = {"head_server": {"host": "127.0.0.1", "port": free_port()},
               "nemo_gym_log_dir": str(output.with_name(output.stem + "_logs"))}
    agents = [inst.name for inst in probe.instances_of("responses_api_agents")]
    if len(agents) == 1:
        initial["agent_name"] = agents[0]
    config = parse_global_config(GlobalConfigDictParserConfig(cli_args=argv, initial_global_config_dict=initial))
    collection = validate_fields(RolloutCollectionConfig, config.data, "")
    check_outputs(collection)
    rows = load_rows(collection)  # bad input fails before anything starts
    print(f"Starting the fleet: {', '.join(config.instances)} (logs in {config.data['nemo_gym_log_dir']})",
          flush=True)
    fleet = Fleet(config)
    try:
        fleet.start()
        summary = asyncio.run(_collect(collection, rows, config.head_host, config.head_port))
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 130
    finally:
        fleet.shutdown()
        print("Fleet stopped.", flush=True)
    return finish(summary)


main = command(_run, __doc__)


if __name__ == "__main__":
    main()
