"""Run the fleet's servers on a Ray cluster's nodes: each instance as `num_replicas` Ray actors (ARCHITECTURE 3).

Where servers run is the top-level `placement` key: `local` (every server a child process of `ng_run`, as
`gymfleet.fleet.supervisor.Fleet` does) or `ray`. Unset, it is `ray` when `ray_head_node_address` is set (NeMo-RL passes its
cluster's address) and the `ray` package is importable, else `local`; an address without Ray installed is one
warning and local placement. `placement: ray` without the package, or with no cluster to attach to (no
`ray_head_node_address`, no `RAY_ADDRESS`, this process not connected), or an address where nothing answers, is a
`ConfigError` saying how to fix it. `num_replicas` > 1 needs Ray placement (a `ConfigError` otherwise): local
replicas would share one machine's CPUs, which `num_workers` already uses.

When Ray placement is only implied by `ray_head_node_address` and the cluster has no room for a server's
`ray_resources` (within `PLACEMENT_TIMEOUT_S`), `start_fleet` runs the fleet on this machine with one warning; under
an explicit `placement: ray` that is a `NoRoomError` (a `ConfigError`) naming the instance and what it asked for.

`make_fleet(config)` returns the right supervisor; both have the same surface (`validate()`, `start(timeout_s)`,
`poll()`, `run_forever()`, `shutdown()`, `process_table()`).

Under Ray placement, per instance (its fields, next to `host`/`port`/`num_workers`):

```yaml
code_gen:
  resources_servers:
    code_gen:
      num_replicas: 2                 # default 1
      ray_resources: {num_cpus: 4, memory: 8GiB, resources: {cpu_node: 1}}   # default: the server class's
```

Each replica is a Ray actor reserving `ray_resources` (default: the server class's `ray_resources_default`; the
sandbox and the code/SWE environments ask for more CPUs) in a bundle of a SPREAD placement group per instance, so
replicas land on different nodes when the cluster has room, and only on nodes that have the resources asked for.
Start-up has two phases because each server's config must hold every other server's address: first every actor
binds a free port on its node's IP and reports `host:port`; then the config is completed with those addresses
(each instance's `host`/`port` is its first replica, `replicas: [{host, port}, ...]` lists them all, and URLs that
named a server's pre-assigned address, such as `policy_base_url: http://${scripted_llm...host}:${...port}/v1`, are
rewritten to its first replica) and each actor serves its instance in a child process, `python -m
gymfleet.fleet.launch`, from a private copy of that config on its own node (secrets masked on disk; the actor receives
them as call arguments and hands them to the child in its environment, as `gymfleet.fleet.supervisor` does). The head server
runs in this process, listens on every interface when its host is a loopback one and publishes this node's IP, and
serves the real addresses (`gymfleet.fleet.head`): `/server_instances` lists each instance's replicas (host, port, node,
status, restarts), `/global_config_dict_yaml` the addresses clients spread rollouts over (`gymfleet.http`). A
`port` set in YAML is not used under Ray placement (a port free here says nothing about a node's), and each
server's output reaches `ng_run` through Ray's log forwarding, every line prefixed `(<instance>#<n>)`, rather than
`nemo_gym_log_dir`.

A replica whose server process dies is started again by its actor on the same port; one whose actor dies (killed,
or its node lost) gets a new actor in the same bundle, which tries the old port first (the bundle keeps it on the
same node, so addresses stay valid, even URLs that other servers' fields name), else a new one, published through
the head server. Restarts follow the local fleet's budget (`restart_crashed_servers` within 10 minutes per
replica, backoff 1 s, 2 s, 4 s, ...; `exit_on_server_failure`), each logged in one line and counted in `ng_status`
and the head's `/metrics`; calls in flight to a dead replica fail as `connection_error`. `shutdown()` stops every
server process, kills every actor and removes the placement groups; a server whose actor dies kills itself
(`gymfleet.fleet.launch`'s parent watchdog), and Ray kills the actors of a driver that dies.

Attaching to the cluster and what replicas reserve are `gymfleet.fleet.ray_cluster`; the actor is `gymfleet.fleet.ray_replica`.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import logging
import re
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from secrets import token_hex
from typing import IO, TYPE_CHECKING, Any

from gymfleet.errors import ConfigError, GymfleetError
from gymfleet.fleet.config import GlobalConfig, ServerInstance
from gymfleet.fleet.launch import bind_socket, split_secrets
from gymfleet.fleet.ray_cluster import NoRoomError, attach_ray, bundle_of, free_resources, ray_module, ray_options
from gymfleet.fleet.ray_replica import PORT_FREE_TIMEOUT_S, ReplicaProcess, set_address
from gymfleet.fleet.supervisor import (
    RESTART_BACKOFF_CAP_S,
    RESTART_BACKOFF_S,
    RESTART_READY_TIMEOUT_S,
    RESTART_WINDOW_S,
    Fleet,
    ServerCrashedError,
    _restart_budget,
)

if TYPE_CHECKING:
    import uvicorn

    from gymfleet.fleet.zygote import Zygote

__all__ = ["NoRoomError", "RayFleet", "make_fleet", "placement_of", "ray_options", "start_fleet"]

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
PLACEMENT_TIMEOUT_S = 60.0
"""How long the cluster may take to find room for an instance's replicas before start-up fails naming them."""
ACTOR_CALL_TIMEOUT_S = 60.0
"""Deadline of one call to a replica's actor (bind, serve, status, restart); an actor that misses it counts as dead."""
LOOPBACK = ("127.0.0.1", "localhost", "0.0.0.0", "::", "::1", "")


# ---------------------------------------------------------------------------------------------- choosing


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


# ---------------------------------------------------------------------------------------------- the fleet


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


class RayFleet:
    """A fleet whose servers run as Ray actors on a cluster's nodes (see the module docstring)."""

    def __init__(self, config: GlobalConfig, *, output: IO[str] | None = None, max_restarts: int | None = None):
        self.config = config
        self.output = output or sys.stdout
        self.max_restarts = _restart_budget(config) if max_restarts is None else max_restarts
        self.token = token_hex(16)
        self.replicas: dict[str, list[_Replica]] = {}
        self._options: dict[str, dict[str, Any]] = {}
        self._groups: dict[str, Any] = {}
        self._ray: Any = None
        self._actor_class: Any = None
        self._head: uvicorn.Server | None = None
        self._head_thread: threading.Thread | None = None
        self._head_socket: socket.socket | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._started = False
        self._stopping = False

    # ------------------------------------------------------------------------------------------ start

    def validate(self) -> None:
        """Attach to the cluster, and check every instance's fields and Ray resources (YAML paths on errors)."""
        from gymfleet.fleet.launch import build_server

        self._ray = attach_ray(self.config)
        for instance in self.config.instances.values():
            server = build_server(instance, self.config)
            self._options[instance.name] = ray_options(instance, type(server))

    def start(self, timeout_s: float = 180.0) -> None:
        """Place every replica, start the head server, serve, and return once every replica answers.

        Raises:
            ConfigError: a bad config, no cluster, or resources the cluster cannot give (named per instance).
            ServerCrashedError: a server died or did not answer within `timeout_s`; everything is stopped again.
        """
        if not self.config.instances:
            raise ConfigError("no server instances in the config: pass +config_paths=[...] with at least one server")
        try:
            self.validate()
            self._place(timeout_s)
            self._start_head()
            self._serve_all()
            self._wait_ready(timeout_s)
            self._wait_model_endpoints()
        except BaseException:
            self.shutdown()
            raise
        self._started = True
        self._watcher = threading.Thread(target=self._watch, name="ray-fleet-watcher", daemon=True)
        self._watcher.start()
        total = sum(len(replicas) for replicas in self.replicas.values())
        self._say(f"All {total} / {total} replicas of {len(self.replicas)} servers ready on the Ray cluster! Head "
                  f"server: http://{self.config.head_host}:{self.config.head_port}")

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
        """The head server in this process, reachable from every node (all interfaces for a loopback host)."""
        import uvicorn

        from gymfleet.fleet.head import create_head_app

        head = self.config.data["head_server"]
        host = head["host"]
        if host in LOOPBACK:
            bind_host, head["host"] = "0.0.0.0", self._ray.util.get_node_ip_address()
        else:
            bind_host = host
        self._head_socket = bind_socket(bind_host, int(head["port"]), "head_server.port", assigned_if_unset=False)
        app = create_head_app(self.config, self.process_table, self.replica_table)
        server_config = uvicorn.Config(app, log_level="warning", lifespan="off")
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
        return replica.actor.serve.remote(masked, secrets, self.token)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(self._all())
        while pending:
            for replica in list(pending):
                if _answers_as(replica.url, self.token, replica.instance.name):
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

    # ------------------------------------------------------------------------------------------ watch

    def _all(self) -> list[_Replica]:
        return [replica for replicas in self.replicas.values() for replica in replicas]

    def _watch(self) -> None:
        while not self._stop.wait(POLL_INTERVAL_S):
            with self._lock:
                if self._stopping:
                    return
                try:
                    self._supervise()
                except Exception:  # a bug here must not end supervision silently
                    log.exception("ray fleet watcher: supervising the replicas failed")

    def _supervise(self) -> None:
        now = time.monotonic()
        live = [replica for replica in self._all() if replica.state != "failed" and replica.restart_at is None]
        refs = {id(replica): replica.actor.poll.remote() for replica in live}
        for replica in self._all():
            if replica.state == "failed":
                continue
            if replica.restart_at is not None:
                if now >= replica.restart_at:
                    self._restart(replica, now)
                continue
            try:
                status = self._ray.get(refs[id(replica)], timeout=ACTOR_CALL_TIMEOUT_S)
            except Exception as exc:  # the actor died (or its node): a new actor takes its place
                self._crashed(replica, f"its Ray actor died ({type(exc).__name__})", now, new_actor=True)
                continue
            if status["returncode"] is not None:
                self._crashed(replica, f"its server exited with {_exit_text(status['returncode'])}", now)
            elif replica.state == "restarting":
                if _answers_as(replica.url, self.token, replica.instance.name):
                    replica.state = "running"
                    self._say(f"replica {replica.label} is back on {replica.url} (restart {replica.restarts})")
                elif now > replica.deadline:
                    self._crashed(replica, f"no answer within {RESTART_READY_TIMEOUT_S:g}s of its restart", now)

    def _crashed(self, replica: _Replica, how: str, now: float, *, new_actor: bool = False) -> None:
        with contextlib.suppress(Exception):  # the actor may be gone too; then there is no tail to show
            replica.tail = self._ray.get(replica.actor.tail.remote(), timeout=5)
        while replica.crashes and now - replica.crashes[0] > RESTART_WINDOW_S:
            replica.crashes.popleft()
        what = f"replica {replica.label} on node {replica.node[:12]} ({replica.url}): {how}"
        if len(replica.crashes) >= self.max_restarts:
            replica.state, replica.restart_at = "failed", None
            replica.failure = ServerCrashedError(
                f"{what}; not restarted (restart_crashed_servers={self.max_restarts} within {RESTART_WINDOW_S:g}s "
                f"spent): stopping the fleet{self._tail_text(replica)}"
            )
            self._say(str(replica.failure))
            return
        replica.crashes.append(now)
        attempt = len(replica.crashes)
        delay = min(RESTART_BACKOFF_CAP_S, RESTART_BACKOFF_S * 2 ** (attempt - 1))
        replica.state, replica.restart_at, replica.new_actor = "restarting", now + delay, new_actor
        self._say(f"{what}; restarting it in {delay:g}s (attempt {attempt}/{self.max_restarts} within "
                  f"{RESTART_WINDOW_S:g}s); the other replicas keep serving")

    def _restart(self, replica: _Replica, now: float) -> None:
        try:
            if replica.new_actor:
                with contextlib.suppress(Exception):
                    self._ray.kill(replica.actor, no_restart=True)
                replica.actor = self._new_actor(replica)
                # Its bundle keeps it on the same node, so its old port (free once the old server is gone) keeps
                # every address that names it valid, URLs baked into other servers' fields included.
                bound = self._call(replica, replica.actor.bind.remote(replica.port, PORT_FREE_TIMEOUT_S),
                                   "bind a port")
                moved = (bound["host"], bound["port"]) != (replica.host, replica.port)
                self._record_bind(replica, bound)
                if moved:
                    self._update_address(replica)
                replica.pid = self._call(replica, self._serve(replica), "start its server")
            else:
                started = self._call(replica, replica.actor.respawn.remote(), "restart its server")
                if (started["host"], started["port"]) != (replica.host, replica.port):
                    replica.host, replica.port = started["host"], started["port"]
                    self._update_address(replica)
                replica.pid = started["pid"]
        except ServerCrashedError as exc:
            replica.restart_at = None
            self._crashed(replica, str(exc), now, new_actor=True)
            return
        replica.restarts += 1
        replica.start_time = time.time()
        replica.restart_at, replica.deadline = None, now + RESTART_READY_TIMEOUT_S

    def _update_address(self, replica: _Replica) -> None:
        """A replica moved: publish its address (clients refresh from the head server on connection errors)."""
        instance = replica.instance
        fields = self.config.data[instance.name][instance.server_type][instance.impl]
        replicas = self.replicas[instance.name]
        fields["host"], fields["port"] = replicas[0].host, replicas[0].port
        fields["replicas"] = [{"host": r.host, "port": r.port} for r in replicas]
        self._say(f"replica {replica.label} now listens on {replica.url}")

    def poll(self) -> None:
        """Raise if the head server died or a replica cannot be brought back (restarts happen in a watcher thread).

        Raises:
            ServerCrashedError: naming the replica, its last output lines and the restart budget.
        """
        if self._head_thread is not None and not self._head_thread.is_alive():
            raise ServerCrashedError("the head server thread died")
        # Without the watcher's lock: a round of supervision may wait on a silent actor, a health check must not.
        failed = [replica.failure for replica in self._all() if replica.failure is not None]
        if failed:
            raise failed[0]

    def run_forever(self, interval_s: float = 1.0) -> None:
        """Block, polling, until a replica cannot be brought back (raises) or the process is told to stop."""
        while not self._stopping:
            self.poll()
            time.sleep(interval_s)

    # ------------------------------------------------------------------------------------------ report

    def replica_table(self) -> dict[str, list[dict[str, Any]]]:
        """Per instance, its replicas: `{host, port, node, status, restarts, pid}` (the head server publishes it)."""
        return {name: [{"host": r.host, "port": r.port, "node": r.node, "status": r.state, "restarts": r.restarts,
                        "pid": r.pid} for r in replicas]
                for name, replicas in self.replicas.items() if replicas and replicas[0].port}

    def process_table(self) -> dict[str, dict[str, Any]]:
        """Per instance: the first replica's `pid`, the earliest `start_time`, the worst `status` of its replicas
        (failed, restarting, starting, running) and the `restarts` of all of them."""
        order = ("failed", "restarting", "starting", "running")
        table = {}
        for name, replicas in self.replicas.items():
            if not replicas:
                continue
            states = {r.state for r in replicas}
            table[name] = {"pid": replicas[0].pid, "start_time": min(r.start_time for r in replicas) or None,
                           "status": next(state for state in order if state in states),
                           "restarts": sum(r.restarts for r in replicas)}
        return table

    def _tail_text(self, replica: _Replica) -> str:
        if not replica.tail:
            with contextlib.suppress(Exception):
                replica.tail = self._ray.get(replica.actor.tail.remote(), timeout=5)
        lines = "\n".join(f"    {line}" for line in replica.tail) or "    (no output)"
        return f"\n  last output of {replica.label}:\n{lines}"

    def _say(self, text: str) -> None:
        print(text, file=self.output, flush=True)
        log.debug("%s", text)

    # ------------------------------------------------------------------------------------------ stop

    def shutdown(self) -> None:
        """Stop every server process, kill every actor, remove the placement groups, stop the head server. Safe to
        call more than once."""
        with self._lock:
            self._stopping = True
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(30)
        ray = self._ray
        if ray is not None:
            replicas = [replica for replica in self._all() if replica.actor is not None]
            refs = []
            for replica in replicas:
                with contextlib.suppress(Exception):
                    refs.append(replica.actor.stop.remote())
            with contextlib.suppress(Exception):
                ray.wait(refs, num_returns=len(refs), timeout=15)
            for replica in replicas:
                with contextlib.suppress(Exception):
                    ray.kill(replica.actor, no_restart=True)
                replica.actor = None
            from ray.util.placement_group import remove_placement_group

            for group in self._groups.values():
                with contextlib.suppress(Exception):
                    remove_placement_group(group)
            self._groups.clear()
        if self._head is not None:
            self._head.should_exit = True
            if self._head_thread is not None:
                self._head_thread.join(5)
        if self._head_socket is not None:
            self._head_socket.close()


# ---------------------------------------------------------------------------------------------- helpers


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


def _answers_as(url: str, token: str, name: str, timeout_s: float = 2.0) -> bool:
    """Whether `GET url/` answers 200 as instance `name` of the fleet holding `token`."""
    from gymfleet.serving.server import FLEET_HEADER, INSTANCE_HEADER

    try:
        with urllib.request.urlopen(url + "/", timeout=timeout_s) as response:
            identity = (response.headers.get(FLEET_HEADER), response.headers.get(INSTANCE_HEADER))
            return response.status == 200 and identity == (token, name)
    except (urllib.error.URLError, OSError, ValueError):
        return False


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


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"code {code} ({signal.Signals(-code).name})"
    return f"code {code}"
