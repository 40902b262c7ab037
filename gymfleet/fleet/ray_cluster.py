"""The Ray cluster side of Ray placement (`gymfleet.fleet.ray_placement`): attaching to a cluster, and what each
replica of an instance reserves on it.

`attach_ray(config)` connects this process to the cluster `ray_head_node_address` (or `$RAY_ADDRESS`, or an existing
`ray.init`) names, never starting one, and fails fast with a `ConfigError` naming the key when nothing answers there
(Ray itself retries for minutes).

Which network the fleet uses is chosen by that address. A loopback host (127.0.0.0/8, `localhost`, `::1`: a cluster
from `ray start --head --node-ip-address=127.0.0.1`, or a `ray.cluster_utils.Cluster` whose nodes were given
`node_ip_address='127.0.0.1'`) makes `connect_ray` attach as a node on that loopback address (Ray alone resolves
`127.0.0.1` to this machine's interface address and looks for the cluster there); replicas then bind and publish
their node's loopback address and the head server binds its configured host. Any other address (a real multi-node
cluster) attaches as Ray always did: replicas on their nodes' addresses, a loopback head host bound on every interface
and published as this node's address (`gymfleet.fleet.ray_startup`).

`ray_options(instance)` is what each replica reserves (`{num_cpus, memory, resources}`, Ray's actor options): the
instance's `ray_resources` fields over its server class's `ray_resources_default`, validated and named by their YAML
path; `bundle_of` turns them into a placement-group bundle. `NoRoomError` is a cluster that cannot give an instance's
replicas what they ask for.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
from typing import Any

from gymfleet.errors import ConfigError
from gymfleet.fleet.config_checks import validate_fields
from gymfleet.fleet.config_instances import GlobalConfig, ServerInstance
from gymfleet.fleet.launch import load_server_class

__all__ = ["NoRoomError", "attach_ray", "bundle_of", "connect_ray", "free_resources", "is_loopback",
           "loopback_node_ip", "memory_bytes", "ray_module", "ray_options"]

log = logging.getLogger(__name__)

RAY_ADDRESS_ENV = "RAY_ADDRESS"


class NoRoomError(ConfigError):
    """The Ray cluster cannot give an instance's replicas the resources they ask for (named by their YAML path)."""



def free_resources(available: dict[str, float]) -> dict[str, float]:
    """Ray's available resources without the per-placement-group and per-node bookkeeping entries."""
    return {name: amount for name, amount in sorted(available.items())
            if "_group_" not in name and not name.startswith(("node:", "bundle_group"))}


def ray_module() -> Any:
    try:
        import ray
    except ImportError:
        return None
    return ray


def attach_ray(config: GlobalConfig) -> Any:
    """Connect this process to the Ray cluster `config` names (never start one); returns the `ray` module.

    Raises:
        ConfigError: no cluster to attach to, or it does not answer, naming the key and the fix.
    """
    ray = ray_module()
    address = config.data.get("ray_head_node_address")
    if address:
        _check_reachable(str(address))
        try:
            connect_ray(ray, str(address))
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError, ... for a bad address
            raise ConfigError(
                f"cannot attach to the Ray cluster at ray_head_node_address={address!r}: {type(exc).__name__}: "
                f"{exc}",
                path="ray_head_node_address",
                hint="Give the GCS address of a running cluster (host:port), or use +placement=local.",
            ) from exc
        log.info("attached to the Ray cluster at %s", address)
        return ray
    if getattr(ray, "is_initialized", lambda: False)():
        return ray
    if not os.environ.get(RAY_ADDRESS_ENV):
        raise ConfigError(
            "placement: ray, but there is no Ray cluster to attach to: ray_head_node_address is not set, "
            f"${RAY_ADDRESS_ENV} is empty and this process is not connected to Ray",
            path="placement",
            hint="Start a cluster (`ray start --head` on one node, `ray start --address=<head>:6379` on the others) "
            "and set +ray_head_node_address=<head>:6379, or use +placement=local.",
        )
    _check_reachable(os.environ[RAY_ADDRESS_ENV], key=f"${RAY_ADDRESS_ENV}")
    env_address = os.environ[RAY_ADDRESS_ENV]
    try:
        connect_ray(ray, env_address if loopback_node_ip(env_address) else "auto")
    except Exception as exc:
        raise ConfigError(
            f"placement: ray: cannot attach to the Ray cluster at ${RAY_ADDRESS_ENV}="
            f"{os.environ[RAY_ADDRESS_ENV]!r}: {type(exc).__name__}: {exc}",
            path="placement",
            hint="Fix $RAY_ADDRESS or set +ray_head_node_address=<head>:6379, or use +placement=local.",
        ) from exc
    return ray


_ADDRESS = re.compile(r"(?:[a-z]+://)?\[?([^\]/]+?)\]?:(\d+)/?")
"""A Ray `host:port` address (optionally `scheme://`, an IPv6 host in brackets)."""


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (127.0.0.0/8, `::1`) or `localhost`.

    Examples:
        >>> [is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "0.0.0.0", "192.0.2.2", "")]
        [True, True, True, True, False, False, False]
    """
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_node_ip(address: str) -> str | None:
    """The node address to attach as for a Ray `address` (`host:port`, optionally `scheme://`) on loopback: its
    host (`127.0.0.1` for `localhost`); None for any other address, `auto` and Ray Client (`ray://`) ones.

    Examples:
        >>> loopback_node_ip("127.0.0.1:6379"), loopback_node_ip("localhost:6379"), loopback_node_ip("10.0.0.1:6379")
        ('127.0.0.1', '127.0.0.1', None)
    """
    match = _ADDRESS.fullmatch(address.strip())
    if match is None or address.startswith("ray://") or not is_loopback(match.group(1)):
        return None
    host = match.group(1)
    return "127.0.0.1" if host.lower() == "localhost" else host


def connect_ray(ray: Any, address: str) -> None:
    """`ray.init(address)`, attaching as a node on loopback when `address` is a loopback one.

    Ray (2.x) turns a loopback bootstrap address and `_node_ip_address` into this machine's interface address unless
    its multi-node switch (`ray._private.ray_constants.ENABLE_RAY_CLUSTER`, read per call) is off, and then finds no
    cluster there; the switch is turned off only around this `ray.init`, which then looks for the cluster, and
    registers this driver, at the loopback address the cluster's nodes use. Any other address is `ray.init` as is.
    """
    node_ip = loopback_node_ip(address)
    if node_ip is None:
        ray.init(address=address, ignore_reinit_error=True)
        return
    ray_constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if ray_constants is None:  # a Ray without the switch: nothing to turn off
        ray.init(address=address, _node_ip_address=node_ip, ignore_reinit_error=True)
        return
    saved = getattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(address=address, _node_ip_address=node_ip, ignore_reinit_error=True)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
    log.info("attached to the loopback Ray cluster at %s as node %s", address, node_ip)


def _check_reachable(address: str, key: str = "ray_head_node_address") -> None:
    """Fail fast when nothing listens at a `host:port` address (Ray itself retries for minutes)."""
    match = _ADDRESS.fullmatch(address.strip())
    if match is None or address.startswith("ray://"):
        return
    host, port = match.group(1), int(match.group(2))
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        raise ConfigError(
            f"no Ray cluster answers at {key}={address!r}: {exc.strerror or exc}",
            path=key.lstrip("$"),
            hint="Start the cluster first (`ray start --head --port=6379`), fix the address, or use "
            "+placement=local.",
        ) from None


# ---------------------------------------------------------------------------------------------- resources

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
# "2GiB" -> 2 * 2**30, "4GB" / "4g" -> 4e9, "512" -> 512 bytes; "2 gigs" and "-1GiB" do not match.
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def memory_bytes(value: int | str | None, path: str) -> int | None:
    """`memory` of `ray_resources` in bytes: an integer, or a size such as `2GiB`, `512MiB`, `4GB`.

    Examples:
        >>> memory_bytes("2GiB", "x"), memory_bytes("1.5k", "x"), memory_bytes(1024, "x"), memory_bytes(None, "x")
        (2147483648, 1500, 1024, None)

    Raises:
        ConfigError: anything else, naming `path`.
    """
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    match = _SIZE.match(str(value)) if isinstance(value, str) else None
    if match is None:
        raise ConfigError(f"{path}: expected bytes or a size such as 2GiB, 512MiB or 4GB; got {value!r}", path=path)
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    base = 1024 if "i" in unit else 1000
    power = "bkmgt".index(unit[0]) if unit else 0
    return int(number * (base**power if unit[:1] != "b" else 1))


def ray_options(instance: ServerInstance, server_class: Any | None = None) -> dict[str, Any]:
    """What each replica of `instance` reserves: `{num_cpus, memory, resources}` (Ray's actor options).

    The instance's `ray_resources` fields override its server class's `ray_resources_default` one by one.

    Raises:
        ConfigError: an unknown or invalid field, named by its YAML path.
    """
    from gymfleet.serving.server import RayResources

    cls = server_class or load_server_class(instance)
    merged = {**getattr(cls, "ray_resources_default", {}), **(instance.ray_resources or {})}
    path = f"{instance.path}.ray_resources"
    resources = validate_fields(RayResources, merged, path)
    return {"num_cpus": resources.num_cpus, "memory": memory_bytes(resources.memory, f"{path}.memory"),
            "resources": dict(resources.resources)}


def bundle_of(options: dict[str, Any]) -> dict[str, float]:
    bundle = {"CPU": options["num_cpus"], "memory": options["memory"] or 0, **options["resources"]}
    bundle = {key: value for key, value in bundle.items() if value}
    return bundle or {"CPU": 0.001}  # Ray refuses an empty bundle; a replica asking for nothing gets a sliver
