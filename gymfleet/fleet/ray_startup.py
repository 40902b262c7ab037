"""Start-up of a fleet under Ray placement (`gymfleet.fleet.ray_placement`): placing each instance's replicas as Ray
actors, publishing their addresses, serving, and waiting until every replica and model endpoint answers. The
`RayFleet` of `gymfleet.fleet.ray_fleet` is made of this and its own supervision.

Under Ray placement, per instance (its fields, next to `host`/`port`/`num_workers`):

```yaml
code_gen:
  resources_servers:
    code_gen:
      num_replicas: 2                 # default 1
      ray_resources: {num_cpus: 4, memory: 8GiB, resources: {cpu_node: 1}}   # default: the server class's
```

Each replica is a Ray actor reserving `ray_resources` (default: the server class's `ray_resources_default`; the sandbox
and the code/SWE environments ask for more CPUs) in a bundle of a SPREAD placement group per instance, so replicas land
on different nodes when the cluster has room, and only on nodes that have the resources asked for. Start-up has two
phases because each server's config must hold every other server's address: first every actor binds a free port on its
node's IP and reports `host:port`; then the config is completed with those addresses (each instance's `host`/`port` is
its first replica, `replicas: [{host, port}, ...]` lists them all, and URLs that named a server's pre-assigned address,
such as `policy_base_url: http://${scripted_llm...host}:${...port}/v1`, are rewritten to its first replica) and each
actor serves its instance in a child process, `python -m gymfleet.fleet.launch`, from a private copy of that config on
its own node (secrets masked on disk; the actor receives them and the fleet token as call arguments and hands them to
the child in an inherited memory file, as `gymfleet.fleet.supervisor` does: never in its environment). The head server
runs in this process and binds and publishes its configured host, as without Ray (a loopback one keeps it off the
network; `0.0.0.0` is the user's choice to make); it serves the real addresses (`gymfleet.fleet.head`):
`/server_instances` lists each instance's replicas (host, port, node, status, restarts), `/global_config_dict_yaml` the
addresses clients spread rollouts over (`gymfleet.http`). A `port` set in YAML is not used under Ray placement (a port
free here says nothing about a node's), and each server's output reaches `ng_run` through Ray's log forwarding, every
line prefixed `(<instance>#<n>)`, rather than `nemo_gym_log_dir`.
"""

from __future__ import annotations

import collections
import copy
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gymfleet.errors import ConfigError, GymfleetError
from gymfleet.fleet.config_instances import GlobalConfig, ServerInstance
from gymfleet.fleet.credential import check_failed, probe_server
from gymfleet.fleet.launch import bind_socket, own_secrets, split_secrets
from gymfleet.fleet.ray_cluster import NoRoomError, bundle_of, free_resources, is_loopback
from gymfleet.fleet.ray_replica import ReplicaProcess, set_address
from gymfleet.fleet.readiness import ServerCrashedError
from gymfleet.http_types import SERVER_KEEP_ALIVE_S

if TYPE_CHECKING:
    pass

__all__ = ["RayStartup"]

log = logging.getLogger(__name__)


PLACEMENT_TIMEOUT_S = 60.0
"""How long the cluster may take to find room for an instance's replicas before start-up fails naming them."""
ACTOR_CALL_TIMEOUT_S = 60.0
"""Deadline of one call to a replica's actor (bind, serve, status, restart); an actor that misses it counts as dead."""


@dataclass
class _Replica:
    """One replica of an instance, kept across restarts (its actor or server process is replaced)."""

    instance: ServerInstance
    index: int
    options: dict[str, Any]
    actor: Any = None
    host: str = ""
    port: int = 0
    node: str = ""
    actor_pid: int | None = None
    """The actor's worker process (on its node)."""
    pid: int | None = None
    """The server process (on its node)."""
    start_time: float = 0.0
    state: str = "starting"
    """starting, running, restarting, failed (as a local fleet's servers)."""
    restarts: int = 0
    crashes: collections.deque = field(default_factory=collections.deque)
    restart_at: float | None = None
    new_actor: bool = False
    """The pending restart needs a new actor (the old one died), not only a new server process."""
    deadline: float = 0.0
    failure: GymfleetError | None = None
    tail: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.instance.name}#{self.index}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class RayStartup:
    """The start-up half of `RayFleet`: place the replicas, publish their addresses, serve, wait until all answer."""

    def _place(self, timeout_s: float) -> None:
        """Reserve a SPREAD placement group per instance, start one actor per replica and bind their ports."""
        from ray.util.placement_group import placement_group

        for name, instance in self.config.instances.items():
            bundle = bundle_of(self._options[name])
            self._groups[name] = placement_group([bundle] * instance.num_replicas, strategy="SPREAD",
                                                 name=f"gymfleet-{self.token[:8]}-{name}")
        for name, group in self._groups.items():
            ready, _ = self._ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
            if not ready:
                instance = self.config.instances[name]
                raise NoRoomError(
                    f"{instance.path}.ray_resources: the Ray cluster has no room for {instance.num_replicas} "
                    f"replica(s) of {name!r} asking for {bundle_of(self._options[name])} each (waited "
                    f"{PLACEMENT_TIMEOUT_S:g}s); the cluster has {free_resources(self._ray.available_resources())} "
                    "free",
                    path=f"{instance.path}.ray_resources",
                    hint="Lower ray_resources or num_replicas, or add nodes with those resources.",
                )
        for name, instance in self.config.instances.items():
            self.replicas[name] = [_Replica(instance, index, self._options[name])
                                   for index in range(instance.num_replicas)]
            for replica in self.replicas[name]:
                replica.actor = self._new_actor(replica)
        for replica in self._all():
            self._record_bind(replica, self._call(replica, replica.actor.bind.remote(), "bind a port"))
        self._publish_addresses()

    def _new_actor(self, replica: _Replica) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options = replica.options
        strategy = PlacementGroupSchedulingStrategy(self._groups[replica.instance.name],
                                                    placement_group_bundle_index=replica.index)
        if self._actor_class is None:
            self._actor_class = self._ray.remote(ReplicaProcess)
        return self._actor_class.options(num_cpus=options["num_cpus"], memory=options["memory"] or None,
                              resources=options["resources"] or None, scheduling_strategy=strategy,
                              max_concurrency=4, max_restarts=0).remote(replica.instance.name, replica.index)

    def _record_bind(self, replica: _Replica, bound: dict[str, Any]) -> None:
        replica.host, replica.port, replica.node = bound["host"], bound["port"], bound["node"]
        replica.actor_pid = bound["actor_pid"]

    def _call(self, replica: _Replica, ref: Any, what: str, timeout_s: float = ACTOR_CALL_TIMEOUT_S) -> Any:
        """The result of an actor call; a dead or silent actor is a `ServerCrashedError` naming the replica."""
        try:
            return self._ray.get(ref, timeout=timeout_s)
        except Exception as exc:  # RayActorError, GetTimeoutError, a RayTaskError wrapping the actor's exception
            raise ServerCrashedError(f"replica {replica.label} could not {what}: {type(exc).__name__}: {exc}") from exc

    def _publish_addresses(self) -> None:
        """Write every instance's first replica and replica list into the config, and rewrite URLs that named a
        server's pre-assigned address."""
        moved: dict[str, str] = {}
        for name, replicas in self.replicas.items():
            instance = self.config.instances[name]
            first = replicas[0]
            old = f"{instance.host}:{instance.port}"
            if old != f"{first.host}:{first.port}":
                moved[old] = f"{first.host}:{first.port}"
        data = _rewrite(self.config.data, moved) if moved else self.config.data
        for name, replicas in self.replicas.items():
            instance = self.config.instances[name]
            fields = data[name][instance.server_type][instance.impl]
            fields["host"], fields["port"] = replicas[0].host, replicas[0].port
            fields["replicas"] = [{"host": r.host, "port": r.port} for r in replicas]
        self.config.data.clear()
        self.config.data.update(data)
        for name, instance in self.config.instances.items():
            instance.fields = data[name][instance.server_type][instance.impl]

    def _start_head(self) -> None:
        """The head server in this process, bound to and published at its configured host, as without Ray: a
        loopback host keeps it on this machine (said once when the cluster's nodes are elsewhere), `0.0.0.0` or
        this node's address lets the other nodes reach it (the user's choice, never made for them)."""
        import uvicorn

        from gymfleet.fleet.head import create_head_app

        head = self.config.data["head_server"]
        bind_host = head["host"] or "127.0.0.1"
        self.credential.publish()
        node_ip = self._ray.util.get_node_ip_address()
        if is_loopback(bind_host) and not is_loopback(node_ip):
            log.warning("head_server.host=%s: the head server listens on this machine only, so clients and "
                        "replicas on other nodes cannot reach it (replicas then keep the addresses they started "
                        "with); set +head_server.host=%s (or 0.0.0.0) to publish it to the cluster",
                        bind_host, node_ip)
        self._head_socket = bind_socket(bind_host, int(head["port"]), "head_server.port", assigned_if_unset=False)
        app = create_head_app(self.config, self.process_table, self.replica_table, token=self.credential.head_token)
        server_config = uvicorn.Config(app, log_level="warning", lifespan="off", proxy_headers=False,
                                       timeout_keep_alive=SERVER_KEEP_ALIVE_S)
        self._head = uvicorn.Server(server_config)
        self._head_thread = threading.Thread(target=self._head.run, kwargs={"sockets": [self._head_socket]},
                                             name="head-server", daemon=True)
        self._head_thread.start()
        deadline = time.monotonic() + 10
        while not self._head.started:
            if not self._head_thread.is_alive() or time.monotonic() > deadline:
                raise ServerCrashedError(f"head server could not start on {bind_host}:{head['port']}")
            time.sleep(0.02)

    def _serve_all(self) -> None:
        refs = [(replica, self._serve(replica)) for replica in self._all()]
        for replica, ref in refs:
            replica.pid = self._call(replica, ref, "start its server")
            replica.start_time = time.time()
            self._say(f"started {replica.label} ({replica.instance.server_type}/{replica.instance.impl}) on "
                      f"{replica.url}, node {replica.node[:12]}, pid {replica.pid}, asking {replica.options}")

    def _serve(self, replica: _Replica) -> Any:
        """Start `replica`'s server from the fleet's config with its own address in its instance."""
        data = copy.deepcopy(self.config.data)
        set_address(data, replica.instance.name, replica.host, replica.port)
        masked, secrets = split_secrets(data)
        return replica.actor.serve.remote(masked, own_secrets(secrets, replica.instance.name), self.token)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(self._all())
        while pending:
            for replica in list(pending):
                answer = probe_server(replica.url, self.token, replica.instance.name)
                if answer is not None and answer.failure is not None:
                    raise check_failed(replica.label, replica.instance.path, answer.failure)
                if answer is not None and answer.ready:
                    replica.state = "running"
                    pending.remove(replica)
                    continue
                status = self._call(replica, replica.actor.poll.remote(), "report its server")
                if status["returncode"] is not None:
                    tail = self._tail_text(replica)
                    raise ServerCrashedError(f"replica {replica.label} exited with code {status['returncode']} "
                                             f"while starting{tail}")
            if pending and time.monotonic() > deadline:
                names = ", ".join(replica.label for replica in pending)
                raise ServerCrashedError(f"replicas not ready after {timeout_s:g}s: {names}")
            if pending:
                time.sleep(0.2)

    def _wait_model_endpoints(self) -> None:
        """Wait until every model server's upstream `*base_url` answers (NeMo-Gym's readiness rule).

        Raises:
            ConfigError: one did not answer within `model_endpoint_readiness_timeout_seconds`.
        """
        timeout_s = float(self.config.data.get("model_endpoint_readiness_timeout_seconds", 600))
        urls = _endpoint_urls(self.config)
        deadline = time.monotonic() + timeout_s
        announced: set[str] = set()
        while timeout_s > 0 and urls:
            urls = [url for url in urls if not _answers(url)]
            if not urls:
                return
            for url in set(urls) - announced:
                self._say(f"waiting for model endpoint {url}; timeout {timeout_s:g} s "
                          "(model_endpoint_readiness_timeout_seconds)")
                announced.add(url)
            if time.monotonic() > deadline:
                raise ConfigError(f"model endpoints not reachable after {timeout_s:g}s: {sorted(urls)}; check "
                                  "policy_base_url / base_url (or set model_endpoint_readiness_timeout_seconds=0)")
            time.sleep(1.0)


def _rewrite(node: Any, moved: dict[str, str]) -> Any:
    """`node` with every `host:port` in `moved` replaced in its strings (one pass, so no chain of replacements)."""
    pattern = re.compile("|".join(re.escape(old) + r"(?!\d)" for old in sorted(moved, key=len, reverse=True)))

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, str):
            return pattern.sub(lambda match: moved[match.group(0)], value)
        return value

    return walk(node)


def _answers(url: str, timeout_s: float = 2.0) -> bool:
    """Whether `url` gives any HTTP answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _endpoint_urls(config: GlobalConfig) -> list[str]:
    """Probe URLs of every model server's `*base_url` (`.../v1` probed as `.../v1/models`)."""
    urls: list[str] = []
    for instance in config.instances_of("responses_api_models"):
        for key, value in instance.fields.items():
            if key.endswith("base_url"):
                for url in value if isinstance(value, list) else [value]:
                    if isinstance(url, str) and url.startswith("http"):
                        url = url.rstrip("/")
                        urls.append(url + "/models" if url.endswith("/v1") else url)
    return list(dict.fromkeys(urls))
