"""`RunHelper`: start, watch and stop a fleet from Python, the way NeMo-RL drives NeMo-Gym (`nemo_gym.cli.RunHelper`).

NeMo-RL's Gym actor does `RunHelper().start(global_config_dict_parser_config=GlobalConfigDictParserConfig(
dotenv_path=..., initial_global_config_dict=DictConfig(d), skip_load_from_cli=True))`, calls `poll()` as its health
check and `shutdown()` at the end (`spec/protocol.md` §6.2). Config semantics it relies on:

- `initial_global_config_dict` (a dict or DictConfig) wins over the YAML files and `env.yaml`; a `dotenv_path`
  that does not exist is fine;
- `head_server: {host: "0.0.0.0", port: P}` binds the head server on every interface (clients reach it through
  the node address or 127.0.0.1); `default_host` and `port_range_low/high` place the servers;
- `ray_head_node_address` (NeMo-RL passes its own cluster's GCS address) places the servers on that Ray cluster's
  nodes when the `ray` package is importable (`gymfleet.fleet.ray_placement`: each instance and its `num_replicas` as
  Ray actors, the real addresses published by the head server); a cluster is never started. `placement: local`
  keeps every server on this machine; `placement: ray` without an address uses the cluster this process is
  connected to (NeMo-RL's Gym actor is). An address nothing answers at is a `ConfigError` naming the key; without
  the `ray` package the key is logged once and every server runs locally;
- `global_aiohttp_connector_limit[_per_host]` set every fleet process's HTTP pool limits (see
  `gymfleet.fleet.config.client_limits`); `uv_venv_dir`, `uv_cache_dir`, `skip_venv_if_present` are accepted and unused
  (one Python environment serves the whole fleet), and unknown top-level scalars (`num_gpu_nodes`) are ignored;
- `dry_run: true` validates the config and builds every server in this process, then returns without starting
  anything;
- a server that dies is restarted on its own port and `poll()` raises only when one cannot be brought back
  (`restart_crashed_servers`, `exit_on_server_failure`: see `poll()`).

`get_global_config_dict()` (NeMo-Gym's `nemo_gym.global_config.get_global_config_dict`, which newer NeMo-RL calls
after `start()` to list the entries it spawned) returns the resolved config of the last `start()` in this process.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import DictConfig

from gymfleet.errors import ConfigError
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.fleet.config_instances import BaseServerConfig, GlobalConfig
from gymfleet.fleet.ray_fleet import RayFleet
from gymfleet.fleet.ray_placement import make_fleet, start_fleet
from gymfleet.fleet.supervisor import Fleet
from gymfleet.serving.nemo_gym_paths import FOLDER_TREE_ENV

__all__ = ["RunHelper", "get_global_config_dict"]

log = logging.getLogger(__name__)

_started: GlobalConfig | None = None
"""The config of the last `RunHelper.start()` in this process (what `get_global_config_dict` returns)."""


class RunHelper:
    """A fleet started from a parser config: `start()`, then `poll()` now and then, then `shutdown()`."""

    def __init__(self) -> None:
        self.config: GlobalConfig | None = None
        self._fleet: Fleet | RayFleet | None = None

    def start(self, global_config_dict_parser_config: GlobalConfigDictParserConfig | None = None) -> None:
        """Parse the config, start the head server and every server; return once all answer.

        Returns once every server answers `GET /` and every upstream model endpoint (`*base_url` under a model
        server) answers, or right after validation with `dry_run: true`.

        Raises:
            ConfigError: a bad config (named by its YAML path), model endpoints that never answered, a
                `ray_head_node_address` Ray cannot attach to, or Ray resources the cluster cannot give. A port
                another process holds is its subclass `PortInUseError` (also a RuntimeError), naming the port and
                the `++<path>.port=` override.
            ServerCrashedError: a server died or did not come up; everything started is stopped again.
            RuntimeError: `start()` called twice.
        """
        if self._fleet is not None:
            raise RuntimeError("RunHelper.start() was already called; call shutdown() first")
        global _started
        config = parse_global_config(global_config_dict_parser_config)
        fleet = make_fleet(config)
        if config.data.get("dry_run"):
            if not config.instances:
                raise ConfigError("no server instances in the config: pass config_paths with at least one server")
            fleet.validate()
            log.info("dry run: %d server instances validated; nothing started", len(config.instances))
            self.config = _started = config
            return
        fleet = start_fleet(config)  # Ray placement implied by the address, with no room on the cluster: local
        self.config, self._fleet = config, fleet
        _started = config

    @property
    def head_server_config(self) -> BaseServerConfig:
        """Where clients reach the head server (a bind-all host becomes 127.0.0.1)."""
        if self.config is None:
            raise RuntimeError("RunHelper.start() has not been called")
        host = self.config.head_host
        return BaseServerConfig(host="127.0.0.1" if host in ("", "0.0.0.0", "::") else host,
                                port=self.config.head_port)

    def poll(self) -> None:
        """NeMo-RL's health check: restart any server that died, raise only for one that cannot be brought back.

        A watcher thread restarts crashed servers on their own ports whether or not `poll()` is called; the policy
        (`restart_crashed_servers`, default 5 restarts per server within 10 minutes, backoff 1 s, 2 s, 4 s, ...;
        `exit_on_server_failure: true` to raise at the first crash) is `gymfleet.fleet.supervisor`'s.

        Raises:
            ServerCrashedError: the head server died, or a server died past its restart budget, or did not answer
                after a restart (a RuntimeError too, as NeMo-Gym's `poll()` raises).
            PortInUseError: a crashed server's port was taken by another process before it could be restarted.
        """
        if self._fleet is not None:
            self._fleet.poll()

    def shutdown(self) -> None:
        """Stop every server and the head server. Safe to call more than once, or without a start."""
        fleet, self._fleet = self._fleet, None
        if fleet is not None:
            fleet.shutdown()


def get_global_config_dict(
    global_config_dict_parser_config: GlobalConfigDictParserConfig | None = None,
) -> DictConfig:
    """The resolved global config (hosts and ports filled in) of the last `RunHelper.start()` in this process; in a
    NeMo-Gym folder's server process, the config of the fleet that started it; else the config
    `global_config_dict_parser_config` describes (default: CLI overrides and env.yaml)."""
    if _started is None and global_config_dict_parser_config is None:
        from gymfleet.serving.nemo_gym_server import served_global_config

        served = served_global_config()
        if served is not None:  # inside a NeMo-Gym folder's server process: the fleet config it was started with
            return DictConfig(served)
    config = _started or parse_global_config(global_config_dict_parser_config, assign_ports=False)
    return DictConfig(config.data)


def maybe_get_global_config_dict() -> DictConfig | None:
    """The global config this process already has (a `RunHelper.start()`, or the fleet serving this NeMo-Gym
    folder), or None in a bare process; never parses the command line (NeMo-Gym's `maybe_get_global_config_dict`)."""
    if _started is not None:
        return DictConfig(_started.data)
    from gymfleet.serving.nemo_gym_server import served_global_config

    served = served_global_config()
    return None if served is None else DictConfig(served)


EXTRA_ROOTS_ENV = "NEMO_GYM_EXTRA_ROOTS"
"""NeMo-Gym's variable naming the tree(s) (`os.pathsep`-separated) whose `resources_servers/...` relative config paths
resolve against; `GlobalConfigDictParser` resolves against the first, after the working directory."""


class GlobalConfigDictParser:
    """NeMo-Gym's `GlobalConfigDictParser`: `parse(GlobalConfigDictParserConfig(...))` builds the global config from
    its sources (config files, `env.yaml`, the initial dict, CLI overrides) with gymfleet's parser, hosts and free
    ports filled in as NeMo-Gym's parse does (nothing is started), and returns it as a DictConfig. Relative config
    paths resolve against the working directory, then the first root of `$NEMO_GYM_EXTRA_ROOTS` (a NeMo-Gym tree,
    which `ng_test` sets to the staged folder's tree) or, without it, NeMo-Gym's `PARENT_DIR`: the tree of the folder
    this process serves or tests (a verifier fixture's `benchmarks/<env>/config.yaml` and the
    `resources_servers/<env>/configs/...` it lists are that tree's), else gymfleet's checkout."""

    def parse(self, parse_config: GlobalConfigDictParserConfig | None = None) -> DictConfig:
        """The global config `parse_config` describes (default: CLI overrides and env.yaml).

        Raises:
            ConfigError: a problem in the config, named by its dotted path and file.
        """
        extra = [root for root in os.environ.get(EXTRA_ROOTS_ENV, "").split(os.pathsep) if root]
        tree = os.environ.get(FOLDER_TREE_ENV)
        root = Path(extra[0]) if extra else Path(tree) if tree else None
        return DictConfig(parse_global_config(parse_config, root=root).data)
