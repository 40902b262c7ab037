"""Run the fleet's servers on a Ray cluster's nodes: each instance as `num_replicas` Ray actors (ARCHITECTURE 3).

Where servers run is the top-level `placement` key: `local` (every server a child process of `ng_run`, as
`gymfleet.fleet.supervisor.Fleet` does) or `ray`. Unset, it is `ray` when `ray_head_node_address` is set (NeMo-RL
passes its cluster's address) and the `ray` package is importable, else `local`; an address without Ray installed is
one warning and local placement. `placement: ray` without the package, or with no cluster to attach to (no
`ray_head_node_address`, no `RAY_ADDRESS`, this process not connected), or an address where nothing answers, is a
`ConfigError` saying how to fix it. `num_replicas` > 1 needs Ray placement (a `ConfigError` otherwise): local
replicas would share one machine's CPUs, which `num_workers` already uses.

When Ray placement is only implied by `ray_head_node_address` and the cluster has no room for a server's
`ray_resources` (within `PLACEMENT_TIMEOUT_S`, `gymfleet.fleet.ray_startup`), `start_fleet` runs the fleet on this
machine with one warning; under an explicit `placement: ray` that is a `NoRoomError` (a `ConfigError`) naming the
instance and what it asked for.

`make_fleet(config)` returns the right supervisor; both have the same surface (`validate()`, `start(timeout_s)`,
`poll()`, `run_forever()`, `shutdown()`, `process_table()`).

This module chooses where the servers run (`placement_of`, `make_fleet`, `start_fleet`). The Ray fleet itself is
`gymfleet.fleet.ray_fleet` (`RayFleet`: supervision, restarts, shutdown) with its start-up in
`gymfleet.fleet.ray_startup` (placing the replicas, publishing their addresses, waiting until they answer);
attaching to the cluster and what replicas reserve are `gymfleet.fleet.ray_cluster`; the actor is
`gymfleet.fleet.ray_replica`.
"""

from __future__ import annotations

import logging
from typing import IO, TYPE_CHECKING

from gymfleet.errors import ConfigError
from gymfleet.fleet.config_instances import GlobalConfig
from gymfleet.fleet.ray_cluster import NoRoomError, ray_module
from gymfleet.fleet.ray_fleet import RayFleet
from gymfleet.fleet.supervisor import Fleet

if TYPE_CHECKING:
    from gymfleet.fleet.zygote import Zygote

__all__ = ["NoRoomError", "RayFleet", "make_fleet", "placement_of", "start_fleet"]

log = logging.getLogger(__name__)


def placement_of(config: GlobalConfig) -> str:
    """`local` or `ray` for `config` (see the module docstring); warns once for an address without Ray.

    Raises:
        ConfigError: `placement: ray` without the `ray` package, naming the key and the install command.
    """
    value = config.data.get("placement")
    address = config.data.get("ray_head_node_address")
    if value == "local":
        return "local"
    if value is None and not address:
        return "local"
    if ray_module() is not None:
        return "ray"
    if value == "ray":
        raise ConfigError(
            "placement: ray needs the ray package, which is not installed",
            path="placement",
            hint="pip install -e '.[ray]' (or pip install 'ray>=2.30'), or use +placement=local.",
        )
    log.warning("ray_head_node_address=%s is set but Ray is not installed; every server runs on this machine "
                "(pip install -e '.[ray]' to place them on the cluster)", address)
    return "local"


def make_fleet(config: GlobalConfig, *, output: IO[str] | None = None, zygote: Zygote | None = None
               ) -> Fleet | RayFleet:
    """The supervisor for `config`: a local `Fleet`, or a `RayFleet` under Ray placement. `zygote`, one started
    before the config was parsed (`Zygote(None)`), goes to a local fleet that forks its servers; Ray placement closes
    it at once (its caller still owns it when this raises).

    Raises:
        ConfigError: `placement` cannot be served (see `placement_of`), or `num_replicas` > 1 without Ray placement.
    """
    if placement_of(config) == "ray":
        if zygote is not None:
            zygote.close()
        return RayFleet(config, output=output)
    for instance in config.instances.values():
        if instance.num_replicas > 1:
            path = f"{instance.path}.num_replicas"
            raise ConfigError(
                f"{path}: {instance.num_replicas} replicas need Ray placement; this fleet runs on one machine",
                path=path,
                hint="Set +placement=ray (with +ray_head_node_address=<host:port> of a running Ray cluster), or "
                "use num_workers for more processes behind one port on this machine.",
            )
    return Fleet(config, output=output, zygote=zygote)


def start_fleet(config: GlobalConfig, *, output: IO[str] | None = None, timeout_s: float = 180.0,
                zygote: Zygote | None = None) -> Fleet | RayFleet:
    """`make_fleet(config)`, started. When Ray placement was only implied (`ray_head_node_address` set, `placement`
    unset: NeMo-RL's case) and the cluster has no room for a server, the fleet runs on this machine instead, with
    one warning: a training job that ran under NeMo-Gym, which never placed servers on Ray, must not stop here.

    Raises:
        NoRoomError: no room on the cluster under an explicit `placement: ray`.
        (and whatever `Fleet.start` / `RayFleet.start` raise)
    """
    fleet = make_fleet(config, output=output, zygote=zygote)
    try:
        fleet.start(timeout_s=timeout_s)
    except NoRoomError as exc:
        if config.data.get("placement") is not None:
            raise
        log.warning("%s ray_head_node_address put this fleet on the Ray cluster (placement is unset), which has no "
                    "room for it: every server runs on this machine instead. Set +placement=ray to make this an "
                    "error, or +placement=local to skip Ray.", exc)
        fleet = Fleet(config, output=output)
        fleet.start(timeout_s=timeout_s)
    return fleet
