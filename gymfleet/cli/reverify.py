"""`ng_reverify +input_jsonl_fpath=<rollouts.jsonl> [+key=value ...]`: re-score stored rollouts, report changes.

Re-POSTs every row's `/verify` to its environment (the resources server its `agent_ref` agent names) and reports
which rewards changed and why (`gymfleet.rollouts.reverify` has the rules). Against a running fleet by default
(`"+head_server={host: 127.0.0.1, port: 11000}"`), or, given `"+config_paths=[...]"`, in this process with the
environments built from those files (for environments that call no other server; `+in_process=false` uses the
fleet even then).

Keys: `output_jsonl_fpath` (changed rows; default `<stem>_reverify.jsonl`), `cache_jsonl_fpath` (default
`<stem>_reverify_cache.jsonl`), `concurrency` (32), `reverify_unknown` (re-score environments whose
`reverify_mode` is `unknown`), `agent_name` (for rows without `agent_ref`), `request_timeout_s` (600), `limit`.

Rows already re-scored under the same environment provenance come from the cache: a second run sends nothing, and
an interrupted run rerun continues. Exit code 0, 1 when some rows failed to re-verify (infrastructure, counted by
class), 2 for a config or data error (a malformed line is named `file:line`), 130 on Ctrl-C (the cache keeps what
was done: rerun to continue).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from gymfleet import http
from gymfleet.cli import command, command_fields
from gymfleet.errors import ConfigError, TransportError
from gymfleet.fleet.config_instances import GlobalConfig
from gymfleet.rollouts.reverify import (
    FleetBackend,
    InProcessBackend,
    ReverifyConfig,
    ReverifySummary,
    read_rollouts,
    reverify,
)


async def _reverify(config: ReverifyConfig, global_config: GlobalConfig) -> ReverifySummary:
    rows = read_rollouts(Path(config.input_jsonl_fpath), config.limit)  # bad data fails before any contact
    in_process = config.in_process if config.in_process is not None else bool(global_config.instances)
    try:
        if in_process:
            if not global_config.instances:
                raise ConfigError("+in_process=true needs the environments' configs", path="config_paths",
                                  hint='Give "+config_paths=[resources_servers/<env>/configs/<env>.yaml,...]".')
            async with InProcessBackend(global_config, config.request_timeout_s) as backend:
                return await reverify(config, backend, rows=rows)
        host, port = global_config.head_host, global_config.head_port
        try:
            client = await http.ServerClient.from_head(host, port)
        except TransportError as exc:
            raise ConfigError(
                f"cannot reach the head server at {host}:{port}: {exc}", path="head_server",
                hint="Start the fleet with ng_run, point +head_server={host: <host>, port: <port>} at it, or give "
                '"+config_paths=[...]" to re-score in this process.',
            ) from None
        async with FleetBackend(client, config.request_timeout_s) as backend:
            return await reverify(config, backend, rows=rows)
    finally:
        await http.close()


def _run(argv: list[str]) -> int:
    global_config, config = command_fields(argv, "ng_reverify", ReverifyConfig)
    try:
        summary = asyncio.run(_reverify(config, global_config))
    except KeyboardInterrupt:
        print("Interrupted: re-scored rows are in the cache; rerun the same command to continue.", file=sys.stderr)
        return 130
    print(summary.table(), flush=True)
    return summary.exit_code


main = command(_run, __doc__)


if __name__ == "__main__":
    main()
