"""A fleet whose servers run as Ray actors on a cluster's nodes (`RayFleet`, chosen by `gymfleet.fleet.ray_placement`):
once started (`gymfleet.fleet.ray_startup`), it supervises the replicas, restarts the dead ones and stops
everything on `shutdown()`; it has the local `Fleet`'s surface (`validate()`, `start(timeout_s)`, `poll()`,
`run_forever()`, `shutdown()`, `process_table()`).

A replica whose server process dies is started again by its actor on the same port; one whose actor dies (killed,
or its node lost) gets a new actor in the same bundle, which tries the old port first (the bundle keeps it on the
same node, so addresses stay valid, even URLs that other servers' fields name), else a new one, published through
the head server. Restarts follow the local fleet's budget (`restart_crashed_servers` within 10 minutes per
replica, backoff 1 s, 2 s, 4 s, ...; `exit_on_server_failure`), each logged in one line and counted in `ng_status`
and the head's `/metrics`; calls in flight to a dead replica fail as `connection_error`. `shutdown()` stops every
server process, kills every actor and removes the placement groups; a server whose actor dies kills itself
(`gymfleet.fleet.launch`'s parent watchdog), and Ray kills the actors of a driver that dies.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any

from gymfleet.errors import ConfigError
from gymfleet.fleet.config_instances import GlobalConfig
from gymfleet.fleet.credential import FleetCredential, answers_as
from gymfleet.fleet.ray_cluster import attach_ray, ray_options
from gymfleet.fleet.ray_replica import PORT_FREE_TIMEOUT_S
from gymfleet.fleet.ray_startup import ACTOR_CALL_TIMEOUT_S, RayStartup, _Replica
from gymfleet.fleet.readiness import ServerCrashedError
from gymfleet.fleet.supervisor import (
    RESTART_BACKOFF_CAP_S,
    RESTART_BACKOFF_S,
    RESTART_READY_TIMEOUT_S,
    RESTART_WINDOW_S,
    _restart_budget,
)
from gymfleet.fleet.watch import Watched

if TYPE_CHECKING:
    import uvicorn

__all__ = ["RayFleet"]

log = logging.getLogger(__name__)


POLL_INTERVAL_S = 0.5


class RayFleet(RayStartup, Watched):
    """A fleet whose servers run as Ray actors on a cluster's nodes (see the module docstring)."""

    def __init__(self, config: GlobalConfig, *, output: IO[str] | None = None, max_restarts: int | None = None):
        self.config = config
        self.output = output or sys.stdout
        self.max_restarts = _restart_budget(config) if max_restarts is None else max_restarts
        self.credential = FleetCredential(config, placed_remotely=True)
        self.token = self.credential.token
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
        self._begin_watching("ray-fleet-watcher")
        total = sum(len(replicas) for replicas in self.replicas.values())
        self._say(f"All {total} / {total} replicas of {len(self.replicas)} servers ready on the Ray cluster! Head "
                  f"server: http://{self.config.head_host}:{self.config.head_port}")

    # ------------------------------------------------------------------------------------------ watch

    def _all(self) -> list[_Replica]:
        return [replica for replicas in self.replicas.values() for replica in replicas]

    def _watch(self) -> None:
        self._watch_rounds(self._stop, self._lock, POLL_INTERVAL_S, "ray fleet")

    def _supervise(self) -> None:
        now = time.monotonic()
        live = [replica for replica in self._all() if replica.state != "failed" and replica.restart_at is None]
        refs = {id(replica): replica.actor.poll.remote() for replica in live}
        for replica in self._to_check(self._all(), now, self._restart):
            try:
                status = self._ray.get(refs[id(replica)], timeout=ACTOR_CALL_TIMEOUT_S)
            except Exception as exc:  # the actor died (or its node): a new actor takes its place
                self._crashed(replica, f"its Ray actor died ({type(exc).__name__})", now, new_actor=True)
                continue
            if status["returncode"] is not None:
                self._crashed(replica, f"its server exited with {_exit_text(status['returncode'])}", now)
            elif replica.state == "restarting":
                if answers_as(replica.url, self.token, replica.instance.name):
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
        self.credential.withdraw()
        if self._head_socket is not None:
            self._head_socket.close()


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"code {code} ({signal.Signals(-code).name})"
    return f"code {code}"
