"""Checks that a test's traffic stays on loopback (127.0.0.0/8, `::1`): its processes' TCP sockets, read from `ss`.

`tree_pids()` is this process and every descendant (a `ray.cluster_utils.Cluster`'s GCS, raylets, workers and the
servers they start, `ng_run` subprocesses); `off_loopback(pids)` lists each socket of those processes that listens on,
or is connected to, an address outside loopback (a wildcard `0.0.0.0`/`*`/`::` listener counts: it accepts on every
interface). `off_loopback_hosts(value)` walks a published config or replica table for hosts and URLs outside loopback.
`loopback_cluster(*nodes)` is a local multi-node Ray cluster (`ray.cluster_utils.Cluster`) whose every node is on
`127.0.0.1`, for tests and benches.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil

from gymfleet.fleet.ray_cluster import connect_ray, is_loopback

__all__ = ["LOOPBACK_NODE", "loopback_cluster", "off_loopback", "off_loopback_hosts", "on_loopback", "tree_pids"]

LOOPBACK_NODE = {"node_ip_address": "127.0.0.1"}
"""A Ray node's arguments that keep its services, and the replicas placed on it, on loopback."""

_PIDS = re.compile(r"pid=(\d+)")
_URL_HOST = re.compile(r"^[a-z][a-z0-9+.-]*://\[?([^\]/:]+|[0-9a-f:]+)\]?(?::\d+)?", re.IGNORECASE)


def on_loopback(host: str) -> bool:
    """Whether `host` (as `ss` prints it: `127.0.0.1`, `[::1]`, `[::ffff:127.0.0.1]`, `*`, `127.0.0.53%lo`) is on
    loopback; wildcards are not.

    Examples:
        >>> [on_loopback(h) for h in ("127.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "*", "0.0.0.0", "[::]", "10.0.0.1")]
        [True, True, True, False, False, False, False]
    """
    host = host.split("%", 1)[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return is_loopback(host)
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def tree_pids(pid: int | None = None) -> set[int]:
    """`pid` (default: this process) and all its living descendants."""
    root = psutil.Process(pid or os.getpid())
    pids = {root.pid}
    for child in root.children(recursive=True):
        pids.add(child.pid)
    return pids


def off_loopback(pids: set[int]) -> list[str]:
    """Every TCP socket of `pids` (`ss -tanp`) that listens on, or is connected to, an address outside loopback,
    as `ss` prints it."""
    out = subprocess.run(["ss", "-tanpH"], capture_output=True, text=True, timeout=60, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 6 or not pids & {int(pid) for pid in _PIDS.findall(line)}:
            continue
        state, local, peer = fields[0], fields[3], fields[4]
        local_host = local.rsplit(":", 1)[0]
        peer_host = peer.rsplit(":", 1)[0]
        if not on_loopback(local_host) or (state != "LISTEN" and not on_loopback(peer_host)):
            found.append(line)
    return found


def off_loopback_hosts(value: Any, path: str = "") -> list[str]:
    """`path: value` of every `host` field and URL in `value` (a config dict, a replica table) outside loopback."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "host" and isinstance(item, str) and not on_loopback(item):
                found.append(f"{where}: {item}")
            else:
                found.extend(off_loopback_hosts(item, where))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(off_loopback_hosts(item, f"{path}[{index}]"))
    elif isinstance(value, str) and (match := _URL_HOST.match(value)) and not on_loopback(match.group(1)):
        found.append(f"{path}: {value}")
    return found


@contextmanager
def loopback_cluster(*nodes: dict[str, Any], connect: bool = True) -> Iterator[Any]:
    """A local Ray cluster (`ray.cluster_utils.Cluster`), one node per dict of `Cluster.add_node` arguments (the
    first is the head), every node on `127.0.0.1`; this process is attached to it (`connect_ray`) when `connect`.
    Yields the `Cluster` (`.address` is `127.0.0.1:<port>`); shuts it down (and detaches) on exit."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**nodes[0], "node_ip_address": "127.0.0.1"})
    try:
        for node in nodes[1:]:
            cluster.add_node(**{**node, "node_ip_address": "127.0.0.1"})
        if connect:
            connect_ray(ray, cluster.address)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if connect:
            ray.shutdown()
        cluster.shutdown()
