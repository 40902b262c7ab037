"""`ng_run "+config_paths=[a.yaml,b.yaml]" [+key=value ...]`: start the head server and every server; block.

Ctrl-C or SIGTERM stops everything within seconds. A server that dies is reported with its last output lines and
restarted on its own port (backing off 1 s, 2 s, 4 s, ...) while the others keep serving; `ng_status` shows its
restarts. Each server gets `+restart_crashed_servers=N` restarts within 10 minutes (default 5); one that dies past
that, or does not come back, stops the whole fleet with one message (exit code 1). `+exit_on_server_failure=true`
stops the fleet at the first crash.

With `+ray_head_node_address=<head>:6379` (and Ray installed) or `+placement=ray`, every server instance and its
`num_replicas` run as Ray actors on the cluster's nodes (`gymfleet.fleet.ray_placement`); the head server publishes
their real addresses. `+placement=local` keeps them all on this machine.

`+dry_run=true` resolves and validates the config (every server's fields against its config class, every server
reference), prints the plan (each instance, where it would listen, what it talks to) and starts nothing.
"""

from __future__ import annotations

import functools
import signal
import sys
from typing import TYPE_CHECKING

from gymfleet.cli import reject_unknown_keys, run_cli, wants_help
from gymfleet.errors import ConfigError
from gymfleet.fleet.zygote import Zygote

# The config stack, the fleet and Ray placement are imported in the functions that use them: `main` starts the
# zygote first, so it imports the servers' shared stack while this process imports these (~1 s) and parses the config.
if TYPE_CHECKING:
    from gymfleet.fleet.config_instances import GlobalConfig

NO_PRESTART = {"dry_run": "true", "server_start": "spawn", "placement": "ray", "ray_head_node_address": None}
"""`+key=value` arguments under which `ng_run` forks no servers here (`None`: any value): no zygote before the
config."""


def prestart_zygote(argv: list[str]) -> Zygote | None:
    """A zygote started now, before the config is parsed (`Zygote(None)`; the fleet adopts it), unless the arguments
    say the fleet will not fork its servers here; one the config turns out not to need is closed unused."""
    if wants_help(argv):
        return None
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key in NO_PRESTART and NO_PRESTART[key] in (None, value.strip().lower()):
            return None
    return Zygote(None)


def _run(argv: list[str], zygote: Zygote | None = None) -> int:
    try:
        return _run_fleet(argv, zygote)
    finally:
        if zygote is not None:
            zygote.close()  # a no-op once the fleet has closed it; here, one nobody adopted


def _run_fleet(argv: list[str], zygote: Zygote | None) -> int:
    if wants_help(argv):
        print(__doc__)
        return 0
    from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
    from gymfleet.fleet.lean_imports import gc_paused
    from gymfleet.fleet.ray_placement import make_fleet, start_fleet
    from gymfleet.fleet.readiness import ServerCrashedError

    with gc_paused():  # while the zygote imports on the other core: no collector passes over what this imports
        config = parse_global_config(GlobalConfigDictParserConfig(cli_args=argv))
    reject_unknown_keys(config, "ng_run", ("dry_run", "restart_crashed_servers", "exit_on_server_failure",
                                           "placement", "server_start"))
    if config.data.get("dry_run"):
        print(dry_run(config), flush=True)
        return 0
    make_fleet(config)  # checks placement, num_replicas, restart_crashed_servers and exit_on_server_failure
    fleet = None

    def stop(signum, frame):
        raise KeyboardInterrupt

    # SIGINT explicitly too: a shell without job control starts background commands with SIGINT ignored, and a
    # supervisor's `kill -INT` (NeMo-Gym's own shutdown signal) must still stop the fleet.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        with gc_paused():  # what the start builds (the head server, its imports) lives as long as the fleet
            fleet = start_fleet(config, zygote=zygote)  # Ray placement implied, with no room on the cluster: local
        fleet.run_forever()
    except KeyboardInterrupt:
        print("Stopping the fleet...", flush=True)
        return 0
    except ServerCrashedError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if fleet is not None:  # one that failed to start has stopped what it started
            fleet.shutdown()
    return 0


def dry_run(config: GlobalConfig) -> str:
    """Validate every instance as its server would (its config class, its references) and describe the plan.

    Raises:
        ConfigError: no instances, or the first invalid instance, named by its YAML path.
    """
    from gymfleet.fleet.folders import describe
    from gymfleet.fleet.launch import validate_instance

    if not config.instances:
        raise ConfigError("no server instances in the config: pass +config_paths=[...] with at least one server")
    for instance in config.instances.values():
        if instance.folder is not None:
            print(describe(instance, "validated in a fresh interpreter"), flush=True)
        validate_instance(instance, config)
    rows = [("INSTANCE", "TYPE", "IMPL", "LISTENS ON", "WORKERS", "REPLICAS", "USES")]
    for inst in config.instances.values():
        uses = ", ".join(sorted(set(_references(inst.fields)))) or "-"
        rows.append((inst.name, inst.server_type, inst.impl, inst.url, str(inst.num_workers), str(inst.num_replicas),
                     uses))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.append(f"head server: http://{config.head_host}:{config.head_port}")
    lines.append(f"Dry run: {len(config.instances)} server instances validated; nothing started.")
    return "\n".join(lines)


def _references(node: object) -> list[str]:
    """Instance names that `{type, name}` references under `node` point to."""
    from gymfleet.fleet.config_instances import SERVER_TYPES

    if isinstance(node, dict):
        if set(node) == {"type", "name"} and node["type"] in SERVER_TYPES:
            return [node["name"]]
        return [name for value in node.values() for name in _references(value)]
    if isinstance(node, list):
        return [name for value in node for name in _references(value)]
    return []


def main(argv: list[str] | None = None) -> None:
    zygote = prestart_zygote(sys.argv[1:] if argv is None else argv)
    sys.exit(run_cli(functools.partial(_run, zygote=zygote), argv))


if __name__ == "__main__":
    main()
