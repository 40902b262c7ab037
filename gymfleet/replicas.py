"""Where a fleet's instances answer, and which replica of an instance a rollout talks to.

`gymfleet.http.ServerClient` calls instances by name; this module holds what it needs to turn a name into a URL: the
instance's addresses in the global config (`instance_urls`; several for an instance placed as replicas by
`gymfleet.fleet.ray_placement`), and the choice of one replica per rollout (`rollout_scope`, `choose`): the first
call of a rollout to an instance picks the healthy replica with the fewest calls in flight in this process, and later
calls of the rollout stick to it, since the sessions they use live in that replica's memory.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gymfleet.errors import ServerRefError, did_you_mean

rollout_replicas: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "gymfleet_rollout_replicas", default=None
)
"""Instance name -> the replica URL this rollout (this request's task, and tasks it starts) talks to."""
REPLICA_AVOID_S = 5.0
"""A replica whose connection failed is not picked for new rollouts for this long (unless every replica failed)."""
REFRESH_MIN_INTERVAL_S = 1.0
"""A client asks the head server for the replicas' addresses at most this often (after connection failures)."""


@dataclass
class ReplicaLoad:
    """This process's view of every replica URL: calls in flight and when a failed one may be picked again."""

    in_flight: dict[str, int] = field(default_factory=dict)
    avoid_until: dict[str, float] = field(default_factory=dict)
    turn: int = 0

    def pick(self, urls: list[str]) -> str:
        """The healthy replica with the fewest calls in flight (turns taken among equals)."""
        now = time.monotonic()
        healthy = [url for url in urls if self.avoid_until.get(url, 0.0) <= now] or urls
        self.turn += 1
        rotated = healthy[self.turn % len(healthy):] + healthy[: self.turn % len(healthy)]
        return min(rotated, key=lambda url: self.in_flight.get(url, 0))

    def failed(self, url: str) -> None:
        self.avoid_until[url] = time.monotonic() + REPLICA_AVOID_S


replica_load = ReplicaLoad()


@contextlib.contextmanager
def rollout_scope() -> Iterator[None]:
    """Run the calls inside as one new rollout: its first call to each instance picks a replica, later ones reuse it.

    Each request a server handles (and each task started from a context without a scope) begins a rollout by itself;
    this is for a client that runs several rollouts one after another in one task.
    """
    token = rollout_replicas.set({})
    try:
        yield
    finally:
        rollout_replicas.reset(token)


def choose(name: str, urls: list[str]) -> str:
    """The replica of instance `name` (among `urls`) that this rollout uses, picked on its first call."""
    if len(urls) == 1:
        return urls[0]
    chosen = rollout_replicas.get()
    if chosen is None:  # outside a rollout (no call made yet in this task): a replica, remembered by nobody
        return replica_load.pick(urls)
    url = chosen.get(name)
    if url is None or url not in urls:
        url = chosen[name] = replica_load.pick(urls)
    return url


def instance_urls(config: dict[str, Any], name: str) -> list[str]:
    """Base URLs (`http://host:port`) of every replica of instance `name` in the global config dict `config`."""
    fields = instance_fields(config, name)
    replicas = fields.get("replicas") or [fields]
    return [f"http://{client_host(r.get('host'))}:{r['port']}" for r in replicas]


def instance_fields(config: dict[str, Any], name: str) -> dict[str, Any]:
    """The fields of instance `name` (`<name>.<server type>.<implementation>`, with its `port`) in the global config
    dict `config`; `ServerRefError` naming the known instances if there is none."""
    block = config.get(name)
    if isinstance(block, dict) and name != "head_server":
        for type_block in block.values():
            if isinstance(type_block, dict):
                for impl_block in type_block.values():
                    if isinstance(impl_block, dict) and "port" in impl_block:
                        return impl_block
    known = sorted(key for key, value in config.items() if isinstance(value, dict) and key != "head_server")
    raise ServerRefError(f"unknown server {name!r}; known: {known}.{did_you_mean(name, known)}")


def copy_addresses(published: Any, block: Any) -> None:
    """Copy `host`, `port` and `replicas` of an instance from the head server's config into ours (only those: the
    published config masks secrets)."""
    if not isinstance(published, dict) or not isinstance(block, dict):
        return
    for server_type, impls in published.items():
        ours = block.get(server_type)
        if not isinstance(impls, dict) or not isinstance(ours, dict):
            continue
        for impl, fields in impls.items():
            if isinstance(fields, dict) and isinstance(ours.get(impl), dict):
                ours[impl].update({key: fields[key] for key in ("host", "port", "replicas") if key in fields})


def client_host(host: str | None) -> str:
    """A bind-all address is not a destination: talk to loopback instead."""
    if host in (None, "", "0.0.0.0", "::"):
        return "127.0.0.1"
    return host
