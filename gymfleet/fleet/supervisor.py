"""Start, watch and stop a fleet: the head server plus one supervised process per server instance.

Every instance runs in this same Python environment (no per-server virtualenvs), in its own process group, and stops
itself if the supervisor dies (no orphans). The pieces: this module holds the `Fleet` itself (its process table, the
head server, supervision and restarts, shutdown); how each server process is started (`server_start: zygote` or
`spawn`, and the copying of its output) is `gymfleet.fleet.server_start`; waiting until every server and model endpoint
answers while the fleet starts is `gymfleet.fleet.readiness`. Crashed servers are restarted through whichever start
strategy is current. Output lines are prefixed `(<instance>) ` and the last lines of each are kept, so a server that
dies is reported with its own last words. `shutdown()` stops everything within seconds (SIGTERM, then SIGKILL to the
whole process group).

A fleet outlives its parts (ARCHITECTURE decision 5b). Once started, a watcher thread restarts a server that dies:
its whole process group is killed (workers of `num_workers > 1` too), and once its port is free again it is started
on the SAME port, so clients and the head server's published addresses stay valid; calls in flight to it fail as
the client's typed failures (`connection_error`) while the other servers keep serving. Each crash is reported once
(name, exit code or signal, attempt n/N, last output lines) and so is each return. Restarts back off exponentially
(1 s, 2 s, 4 s, ... capped at 30 s) and each server gets `restart_crashed_servers` (default 5) within 10 minutes; a
server that dies past that budget, or does not answer within 180 s of a restart, cannot be brought back: `poll()`
raises `ServerCrashedError` for it (a `PortInUseError` if its port was taken meanwhile) and `ng_run` stops the
fleet. `exit_on_server_failure: true` (or `restart_crashed_servers: 0`) restores stop-at-the-first-crash. The head
server's `/server_instances` shows each instance's `status` (starting, running, waiting for upstream, restarting,
failed) and `restarts`.

A port taken by another process (checked before anything is spawned, and again when a child fails to bind) is a
`PortInUseError` naming the port, its YAML path and the `++path=<free port>` override. The children read the
resolved config from a private work folder (0700, the file 0600) holding no secrets: those reach each child in its
environment (`gymfleet.fleet.launch`). The folder is removed on every way out: `shutdown()`, a failed `start()`,
garbage collection or interpreter exit, and, if the supervisor is killed outright, by its children's watchdog; if
they are killed too, the next fleet that starts removes it (its name carries the supervisor's pid).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gymfleet.errors import ConfigError
from gymfleet.fleet import ports
from gymfleet.fleet.config_instances import GlobalConfig, ServerInstance
from gymfleet.fleet.credential import FleetCredential, probe_server
from gymfleet.fleet.folders import describe
from gymfleet.fleet.launch import (
    EXIT_PORT_IN_USE,
    WORKDIR_PREFIX,
    PortInUseError,
    bind_socket,
    split_secrets,
    validate_instance,
    write_resolved,
)
from gymfleet.fleet.lean_imports import import_fastapi
from gymfleet.fleet.readiness import (
    POLL_INTERVAL_S,
    WAITING_FOR_UPSTREAM,
    Readiness,
    ServerCrashedError,
    _Child,
    _EndpointWatch,
    _exit_text,
    _last_error,
)
from gymfleet.fleet.server_start import ServerStart, _server_start
from gymfleet.fleet.watch import Watched
from gymfleet.fleet.zygote import ForkedProcess, Zygote
from gymfleet.http_types import SERVER_KEEP_ALIVE_S
from gymfleet.progress import Progress

if TYPE_CHECKING:  # imported where used, so `ng_run` names the model endpoints it waits for within a second
    import uvicorn

__all__ = ["Fleet", "PortInUseError", "ServerCrashedError"]

log = logging.getLogger(__name__)

DEFAULT_RESTARTS = 5
"""Restarts each server gets within `RESTART_WINDOW_S` unless `restart_crashed_servers` says otherwise."""
RESTART_WINDOW_S = 600.0
RESTART_BACKOFF_S = 1.0
"""Wait before the first restart of a server in the window; doubles with each further one."""
RESTART_BACKOFF_CAP_S = 30.0
RESTART_READY_TIMEOUT_S = 180.0
"""A restarted server that does not answer `GET /` within this long counts as crashed again."""
PORT_FREE_TIMEOUT_S = 10.0
"""How long a restart waits for the dead server's port to be free before it gives up."""


class Fleet(ServerStart, Readiness, Watched):
    """A running fleet. NeMo-Gym's `RunHelper` is a thin wrapper around this."""

    def __init__(self, config: GlobalConfig, *, output: IO[str] | None = None, max_restarts: int | None = None,
                 zygote: Zygote | None = None):
        self.config = config
        self.output = output or sys.stdout
        self.max_restarts = _restart_budget(config) if max_restarts is None else max_restarts
        """Restarts each server gets within `RESTART_WINDOW_S`; 0 when `exit_on_server_failure` is set."""
        self.children: dict[str, _Child] = {}
        self._head: uvicorn.Server | None = None
        self._head_thread: threading.Thread | None = None
        self._head_socket: socket.socket | None = None
        self.credential = FleetCredential(config)
        self.token = self.credential.token
        """This fleet's identity: its servers answer `GET /` with it, so readiness never counts a stranger."""
        self.workdir: Path | None = None
        """Private folder (0700) holding the secret-free resolved config the children read; set by `start()`."""
        self._config_path: Path | None = None
        self._secrets_env = "[]"
        self._remove_workdir: weakref.finalize | None = None
        log_dir = config.data.get("nemo_gym_log_dir")
        self.log_dir = Path(log_dir) if log_dir else None
        self._stopping = False
        self._started = False
        self._lock = threading.Lock()
        self._supervise_lock = threading.RLock()
        self._wake = threading.Event()
        self._watcher: threading.Thread | None = None
        self._endpoints: _EndpointWatch | None = None
        """Probes the model endpoints while the fleet starts (see `_EndpointWatch`)."""
        self._progress: Progress | None = None
        """The progress shown while the fleet starts (lines from `_say` go above its bar)."""
        self.server_start = _server_start(config)
        """How servers start: `zygote` (forked from one pre-imported parent) or `spawn` (a fresh interpreter each)."""
        self._zygote: Zygote | None = None
        self._prestarted = zygote if self.server_start == "zygote" else None
        """A zygote started before the config was parsed (`Zygote(None)`, `ng_run` does): `start()` adopts it."""
        if zygote is not None and self._prestarted is None:
            zygote.close()
        self._zygote_starts = 0
        self._zygote_lock = threading.Lock()

    # ------------------------------------------------------------------------------------------ start

    def validate(self) -> None:
        """Build every server in this process once, so config mistakes stop start-up with their YAML path."""
        for instance in self.config.instances.values():
            validate_instance(instance, self.config, self._say)

    def start(self, timeout_s: float = 180.0) -> None:
        """Start the head server and every instance; return when all answer. Raises on any failure.

        Says what it does on `output`: one line per server as it is spawned (name, URL, pid, log file), which
        servers are ready and which are not yet, and which model endpoints (`*base_url`) it waits for, how long so
        far and the timeout (a bar on a terminal, a line every few seconds elsewhere). The model endpoints are
        probed from the start, in the background, so an unreachable policy URL is named at once rather than after
        every server came up.
        """
        if not self.config.instances:
            raise ConfigError("no server instances in the config: pass +config_paths=[...] with at least one server")
        self._endpoints = _EndpointWatch.for_config(self.config, self._say, self.token)
        try:
            self._write_workdir()
            if self.server_start == "zygote":
                self._start_zygote()  # it imports everything while this process starts the head server
                self._start_head()
                self._validate_in_zygote()
            else:
                self.validate()
                self._start_head()
            listening = self._bind_ports()
            for instance in self.config.instances.values():
                self._spawn(instance, listening.pop(instance.name))
            self._wait_ready(timeout_s, report=True)
            self._wait_model_endpoints()
        except BaseException:
            self.shutdown()
            raise
        self._begin_watching("fleet-watcher")
        total = len(self.children)
        self._say(
            f"All {total} / {total} servers ready! Head server: http://{self.config.head_host}:{self.config.head_port}"
        )

    def _write_workdir(self) -> None:
        """Create the private work folder and the resolved config the children read, secrets masked."""
        remove_stale_workdirs(Path(tempfile.gettempdir()))
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))  # mode 0700
        self._remove_workdir = weakref.finalize(self, shutil.rmtree, self.workdir, ignore_errors=True)
        masked, hidden = split_secrets(self.config.data)
        self._config_path = self.workdir / "resolved_config.json"
        write_resolved(masked, self._config_path)
        self._secrets_env = json.dumps(hidden)

    def _bind_ports(self) -> dict[str, socket.socket]:
        """Every server's bound socket, handed to its process (`gymfleet.fleet.ports`): the one reserved when its
        port was chosen, else bound now. Fails before spawning anything if another process holds a server's port
        (`PortInUseError`)."""
        bound: dict[str, socket.socket] = {}
        try:
            for instance in self.config.instances.values():
                bound[instance.name] = ports.take_for_listening(instance.host, instance.port) or bind_socket(
                    instance.host, instance.port, f"{instance.path}.port")
        except BaseException:
            for sock in bound.values():
                sock.close()
            raise
        return bound

    def _start_head(self) -> None:
        host, port = self.config.head_host, self.config.head_port
        self._head_socket = bind_socket(host, port, "head_server.port", assigned_if_unset=False)
        self.credential.publish()
        import_fastapi()  # its OpenAPI models built on first use: `ng_run` shares the CPU with the zygote now
        import uvicorn

        from gymfleet.fleet.head import create_head_app

        app = create_head_app(self.config, self.process_table, token=self.credential.head_token)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", proxy_headers=False,
                                timeout_keep_alive=SERVER_KEEP_ALIVE_S)
        self._head = uvicorn.Server(config)
        self._head_thread = threading.Thread(
            target=self._head.run, kwargs={"sockets": [self._head_socket]}, name="head-server", daemon=True
        )
        self._head_thread.start()
        deadline = time.monotonic() + 10
        while not self._head.started:
            if not self._head_thread.is_alive():
                raise ServerCrashedError(f"head server could not start on {host}:{port}")
            if time.monotonic() > deadline:
                raise ServerCrashedError("head server did not start within 10s")
            time.sleep(0.02)

    def _spawn(self, instance: ServerInstance, sock: socket.socket) -> None:
        """Start `instance` for the first time on its bound socket `sock` (closed here once handed over) and say so:
        name, what it is, URL, pid, where its output goes (and, for a folder of another tree, which folder serves
        it).

        The socket listens from here on: a readiness probe's connection waits in its queue until the server accepts
        and answers it, so the fleet sees each server the moment it serves, with no probe refused and retried a
        poll later (a server that dies first closes it: the probe fails at once)."""
        with sock:
            sock.listen()
            process = self._popen(instance, sock)
        if instance.folder is not None:
            self._say(describe(instance, self.how_started(process)))
        child = self.children[instance.name] = _Child(instance, process, time.time())
        self._start_pump(child)
        self._say(f"started {instance.name} ({instance.server_type}/{instance.impl}) on {instance.url}, "
                  f"pid {child.process.pid}, log: {self.log_target(instance.name)}")

    def _say(self, text: str) -> None:
        with self._lock:
            if self._progress is not None:
                self._progress.write(text)  # above the bar, on a terminal
            else:
                print(text, file=self.output, flush=True)

    # ------------------------------------------------------------------------------------------ watch


    def poll(self) -> None:
        """Restart any server that died (see the module docstring); raise if one cannot be brought back.

        Raises:
            ServerCrashedError: the head server died, or a server died past its restart budget (or at all, with
                `exit_on_server_failure`), or did not answer after a restart; its last output lines are included.
            PortInUseError: a dead server's port was taken by another process before it could be restarted.
        """
        if self._head_thread is not None and not self._head_thread.is_alive():
            raise ServerCrashedError("the head server thread died")
        with self._supervise_lock:
            if self._stopping:
                return
            if not self._started:
                for child in self.children.values():
                    self._check_alive(child)
                return
            self._supervise()
            failed = [child.failure for child in self.children.values() if child.failure is not None]
        if failed:
            raise failed[0]

    def _watch(self) -> None:
        """The watcher thread: supervise every `POLL_INTERVAL_S` until shutdown (`gymfleet.fleet.watch`)."""
        self._watch_rounds(self._wake, self._supervise_lock, POLL_INTERVAL_S, "fleet")

    def _supervise(self) -> None:
        """One round: notice crashes, start servers whose backoff is over, mark restarted servers that answer."""
        now = time.monotonic()
        for child in self._to_check(self.children.values(), now, self._respawn):
            code = child.process.poll()
            if code is not None:
                self._crashed(child, _exit_text(code), code == EXIT_PORT_IN_USE, now)
            elif child.state == "restarting":
                answer = probe_server(child.instance.url, self.token, child.instance.name)
                if answer is not None and answer.failure is not None:
                    self._crashed(child, f"failed its start-up check: {answer.failure}", False, now, alive=True)
                elif answer is not None and answer.ready:
                    child.state = "running"
                    self._say(f"server {child.instance.name!r} is back on port {child.instance.port} "
                              f"(restart {len(child.crashes)}/{self.max_restarts})")
                elif now > child.deadline:
                    _signal_group(child.process, signal.SIGKILL)
                    self._crashed(child, f"no answer within {RESTART_READY_TIMEOUT_S:g}s of its restart", False, now)

    def _crashed(self, child: _Child, how: str, port_taken: bool, now: float, *, alive: bool = False) -> None:
        """Handle a server found dead (`how`: its exit code or signal), or `alive` but unable to serve (`how`: why;
        it is stopped): schedule its restart, or mark it failed."""
        name = child.instance.name
        _signal_group(child.process, signal.SIGKILL)  # its workers (num_workers > 1) would still hold the port
        child.process.wait()
        time.sleep(0.1)  # let the log pump drain the last lines
        _forget_old_crashes(child, now)
        what = (f"server {name!r} {how}" if alive else
                f"server {name!r} exited unexpectedly with {how}{_last_error(child.tail)}")
        if port_taken:
            what = f"server {name!r} could not listen: port {child.instance.port} is taken ({how})"
        if len(child.crashes) >= self.max_restarts:
            child.state, child.restart_at = "failed", None
            if port_taken:
                child.failure = PortInUseError(child.instance.port, f"{child.instance.path}.port")
            else:
                child.failure = ServerCrashedError(what + self._no_restart_reason(child) + self._tail_text(child))
            return
        child.crashes.append(now)
        attempt = len(child.crashes)
        delay = min(RESTART_BACKOFF_CAP_S, RESTART_BACKOFF_S * 2 ** (attempt - 1))
        child.state, child.restart_at, child.deadline = "restarting", now + delay, now + delay + PORT_FREE_TIMEOUT_S
        self._say(f"{what}; restarting it in {delay:g}s (attempt {attempt}/{self.max_restarts} within "
                  f"{RESTART_WINDOW_S:g}s); the other servers keep serving" + self._tail_text(child))

    def _no_restart_reason(self, child: _Child) -> str:
        if self.max_restarts == 0:
            key = "exit_on_server_failure=true" if _exit_on_failure(self.config) else "restart_crashed_servers=0"
            return f"; not restarted ({key}): stopping the fleet"
        return (f"; it was restarted {len(child.crashes)} time(s) within {RESTART_WINDOW_S:g}s, the limit "
                f"(restart_crashed_servers={self.max_restarts}): it cannot be brought back, stopping the fleet")

    def _respawn(self, child: _Child, now: float) -> None:
        """Start a dead server again on its own port, once the port is free (give up when it stays taken)."""
        instance = child.instance
        if self._zygote_starting():
            child.restart_at, child.deadline = now + POLL_INTERVAL_S, child.deadline + POLL_INTERVAL_S
            return
        try:
            sock = bind_socket(instance.host, instance.port, f"{instance.path}.port")
        except PortInUseError as exc:
            if now < child.deadline:
                child.restart_at = now + POLL_INTERVAL_S
                return
            child.state, child.restart_at, child.failure = "failed", None, exc
            return
        with sock:
            child.process = self._popen(instance, sock)
        child.start_time = time.time()
        child.restarts += 1
        child.restart_at, child.deadline = None, now + RESTART_READY_TIMEOUT_S
        self._start_pump(child)

    def process_table(self) -> dict[str, dict[str, Any]]:
        """Per instance: `pid`, `start_time`, `status` (starting, running, waiting for upstream, restarting, failed)
        and `restarts`."""
        return {
            name: {
                "pid": child.process.pid,
                "start_time": child.start_time,
                "status": self._status(child),
                "restarts": child.restarts,
            }
            for name, child in self.children.items()
        }

    def _status(self, child: _Child) -> str:
        if child.state == "running" and self._endpoints is not None and self._endpoints.pending(child.instance.name):
            return WAITING_FOR_UPSTREAM
        if child.state in ("running", "starting") and child.process.poll() is not None:
            # Dead, and the watcher has not handled it yet: say what it will do.
            now = time.monotonic()  # the head server's thread: read the crashes, leave them to the watcher
            recent = [at for at in list(child.crashes) if now - at <= RESTART_WINDOW_S]
            budget_left = self._started and not self._stopping and len(recent) < self.max_restarts
            return "restarting" if budget_left else "failed"
        return child.state

    # ------------------------------------------------------------------------------------------ stop

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Stop every instance (SIGTERM, then SIGKILL to the process group) and the head server, and remove the
        work folder. Safe to call more than once."""
        with self._supervise_lock:  # no restart may start while (or after) the fleet stops
            self._stopping = True
        self._wake.set()
        if self._endpoints is not None:
            self._endpoints.stop()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(10)
        for child in self.children.values():
            _signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children.values():
            try:
                child.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(child.process, signal.SIGKILL)
            try:
                child.process.wait(2)
            except subprocess.TimeoutExpired:
                log.error("process %s (%s) did not die", child.process.pid, child.instance.name)
        with self._zygote_lock:
            zygote, self._zygote = self._zygote, None
            prestarted, self._prestarted = self._prestarted, None
        for unused in (zygote, prestarted):
            if unused is not None:
                unused.close()
        if self._head is not None:
            self._head.should_exit = True
            if self._head_thread is not None:
                self._head_thread.join(5)
        if self._head_socket is not None:
            self._head_socket.close()
        if self._remove_workdir is not None:
            self._remove_workdir()
        self.credential.withdraw()


def remove_stale_workdirs(tempdir: Path) -> list[Path]:
    """Remove this user's fleet work folders (`gymfleet-<pid>-*`) whose supervisor process is gone; return them.

    A supervisor killed together with all its servers leaves its folder behind (no secrets in it, but clutter).
    """
    removed = []
    for path in tempdir.glob(f"{WORKDIR_PREFIX}*-*"):
        pid = path.name[len(WORKDIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and path.is_dir() and path.stat().st_uid == os.getuid() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _forget_old_crashes(child: _Child, now: float) -> None:
    """Drop `child`'s crashes older than `RESTART_WINDOW_S`: they no longer count against its budget."""
    while child.crashes and now - child.crashes[0] > RESTART_WINDOW_S:
        child.crashes.popleft()


def _restart_budget(config: GlobalConfig) -> int:
    """Restarts per server within `RESTART_WINDOW_S`: `restart_crashed_servers`, or 0 with `exit_on_server_failure`.

    Raises:
        ConfigError: either key has a value of the wrong type, named with the fix.
    """
    if _exit_on_failure(config):
        return 0
    value = config.data.get("restart_crashed_servers", DEFAULT_RESTARTS)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"restart_crashed_servers: expected a whole number >= 0, got {value!r}",
            path="restart_crashed_servers",
            hint=f"Use +restart_crashed_servers=N (restarts per server within {RESTART_WINDOW_S:g}s; default "
            f"{DEFAULT_RESTARTS}), or +exit_on_server_failure=true to stop the fleet at the first crash.",
        )
    return value


def _exit_on_failure(config: GlobalConfig) -> bool:
    value = config.data.get("exit_on_server_failure", False)
    if not isinstance(value, bool):
        raise ConfigError(
            f"exit_on_server_failure: expected true or false, got {value!r}",
            path="exit_on_server_failure",
            hint="Use +exit_on_server_failure=true to stop the fleet when a server dies (default false: restart it).",
        )
    return value


def _signal_group(process: subprocess.Popen | ForkedProcess, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


