"""`ng_prepare_data "+config_paths=[resources_servers/<env>/configs/<env>.yaml]" +output_dirpath=data/<env> +mode=...`

Checks every line of the datasets declared on the config's agents, writes their metrics, and collates them into
`<output_dirpath>/<type>.jsonl` with `agent_ref` set. Modes: `example_validation` (`example` datasets) and
`train_preparation` (`train` and `validation` datasets; each must name a `license`).

Options: `+skip_invalid_rows=true` (leave out and list invalid lines instead of failing),
`+overwrite_metrics_conflicts=true` (accept metrics that differ from an existing `*_metrics.json`).
No model server is needed: `policy_*` values may be absent. Exit code 2 on any invalid line, missing file or
metrics conflict; every problem is listed as `file:line: reason`.
"""

from __future__ import annotations

from gymfleet.cli import command, reject_unknown_keys
from gymfleet.fleet.config_checks import validate_fields
from gymfleet.rollouts.prepare_data import TrainDataProcessorConfig, parse_prepare_config, prepare


def _run(argv: list[str]) -> int:
    global_config = parse_prepare_config(argv)
    reject_unknown_keys(global_config, "ng_prepare_data", TrainDataProcessorConfig.model_fields)
    config = validate_fields(TrainDataProcessorConfig, global_config.data, "")
    print(f"##### Preparing data ({config.mode})", flush=True)
    prepare(global_config, config, say=lambda line: print(line, flush=True))
    print("View your final data!", flush=True)
    return 0


main = command(_run, __doc__)


if __name__ == "__main__":
    main()
