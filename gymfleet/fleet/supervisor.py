"""Start, watch and stop a fleet: the head server plus one supervised process per server instance.

Every instance runs in this same Python environment (no per-server virtualenvs), in its own process group, and stops
itself if the supervisor dies (no orphans). How it starts is `server_start`: `zygote` (the default) forks it from one
pre-imported parent, `python -m gymfleet.fleet.zygote`, started as a fresh interpreter once per fleet (safe whichever
thread calls `start()`), which imports the shared stack and every instance's `app.py` once: the fleet is ready
in seconds and its servers share those pages copy-on-write (see `gymfleet.fleet.zygote`). `spawn` starts each server as
a fresh interpreter, `python -m gymfleet.fleet.launch`, importing everything again. Any other value is a `ConfigError`
naming the key and the choices. A zygote that dies is said so once; the servers it forked keep serving; a new one
is started (at most `ZYGOTE_RESTARTS` times, and only for one that had got ready), else servers are started as
fresh interpreters from then on. Crashed servers are restarted through whichever is current. Output lines are
prefixed `(<instance>) ` and the last lines of each are kept, so a server that dies is reported with its own last
words. `start()` returns once every instance answers `GET /` as this fleet's own server (the fleet's random token
and the instance name in its headers, see `gymfleet.serving.server`; another process on the same port never counts) and
every upstream `base_url` answers, if configured; `shutdown()` stops everything within seconds (SIGTERM, then
SIGKILL to the whole process group).

The fleet says what it does while it starts: one line per server as it is spawned (name, implementation, URL, pid,
log file), which servers are ready and which are not yet (`gymfleet.progress`: a bar on a terminal, a plain line
every `START_REPORT_EVERY_S` elsewhere), and the model endpoints it waits for. Those (every `*base_url` of a model
server, NeMo-Gym's readiness rule) are probed in the background from the first moment of `start()`, so an
unreachable policy URL is named within a second, then every `ENDPOINT_REPORT_EVERY_S` with the time so far and the
timeout (`model_endpoint_readiness_timeout_seconds`, default 600 s from the start; 0: no wait). Until its endpoints
answer, a model server's status in `/server_instances` is `waiting for upstream` rather than `running`.

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
environment (`gymfleet.fleet.launch`). The folder is removed on every way out: `shutdown()`, a failed `start()`, garbage
collection or interpreter exit, and, if the supervisor is killed outright, by its children's watchdog; if they are
killed too, the next fleet that starts removes it (its name carries the supervisor's pid).
"""

from __future__ import annotations

import collections
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
import urllib.error
import urllib.parse
import urllib.request
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_hex
from typing import IO, TYPE_CHECKING, Any

from gymfleet.errors import ConfigError, GymfleetError
from gymfleet.fleet.config import GlobalConfig, ServerInstance
from gymfleet.fleet.launch import (
    EXIT_PORT_IN_USE,
    SECRETS_ENV,
    WORKDIR_PREFIX,
    PortInUseError,
    bind_socket,
    build_server,
    split_secrets,
    write_resolved,
)
from gymfleet.fleet.zygote import EXIT_UNKNOWN, ForkedProcess, Zygote, ZygoteError
from gymfleet.fleet.zygote import READY_TIMEOUT_S as ZYGOTE_READY_TIMEOUT_S
from gymfleet.progress import Progress

if TYPE_CHECKING:  # imported where used, so `ng_run` names the model endpoints it waits for within a second
    import uvicorn

__all__ = ["Fleet", "PortInUseError", "ServerCrashedError"]

log = logging.getLogger(__name__)

TAIL_LINES = 40
POLL_INTERVAL_S = 0.1
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
START_REPORT_EVERY_S = 5.0
"""While the fleet starts and its output is not a terminal: seconds between progress lines."""
WAITING_FOR_UPSTREAM = "waiting for upstream"
"""A model server's status while one of its upstream endpoints does not answer yet (`/server_instances`)."""
ENDPOINT_PROBE_TIMEOUT_S = 2.0
ENDPOINT_PROBE_INTERVAL_S = 1.0
INTERNAL_PROBE_INTERVAL_S = 0.1
"""Between probes of a model endpoint the fleet serves itself (a scripted policy): a refused local connect is free."""
ENDPOINT_ANNOUNCE_AFTER_S = 0.5
"""A model endpoint that has not answered this long (or refused) is named as waited for at once."""
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1")
ENDPOINT_REPORT_EVERY_S = 10.0
"""Seconds between "still waiting for" lines about a model endpoint."""
SERVER_START_CHOICES = ("zygote", "spawn")
"""`server_start`: fork each server from the pre-imported zygote (default), or start a fresh interpreter each."""
ZYGOTE_RESTARTS = 3
"""Zygotes started again after one dies, per fleet; past that, servers start as fresh interpreters."""


class ServerCrashedError(GymfleetError, RuntimeError):
    """A server process of the fleet exited (a RuntimeError too, as NeMo-Gym's `poll()` raises)."""


@dataclass
class _Child:
    """One supervised server instance; kept across restarts (its `process` is replaced)."""

    instance: ServerInstance
    process: subprocess.Popen | ForkedProcess
    start_time: float
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    restarts: int = 0
    """Restarts done so far (all time)."""
    ready: bool = False
    state: str = "starting"
    """starting (first start), running, restarting (dead and due back, or back and not answering yet), failed."""
    crashes: collections.deque = field(default_factory=collections.deque)
    """Monotonic times of the crashes restarted within the last `RESTART_WINDOW_S`."""
    restart_at: float | None = None
    """When a dead server is due to be started again (monotonic); None while a process is meant to run."""
    deadline: float = 0.0
    """While restarting: when waiting for its port (before the spawn) or its answer (after) gives up."""
    failure: GymfleetError | None = None
    """Why it cannot be brought back (state failed)."""


class Fleet:
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
        self.token = token_hex(16)
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
            build_server(instance, self.config)

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
        self._endpoints = _EndpointWatch.for_config(self.config, self._say)
        try:
            self._write_workdir()
            if self.server_start == "zygote":
                self._start_zygote()  # it imports everything while this process starts the head server
                self._start_head()
                self._validate_in_zygote()
            else:
                self.validate()
                self._start_head()
            self._check_ports_free()
            for instance in self.config.instances.values():
                self._spawn(instance)
            self._wait_ready(timeout_s, report=True)
            self._wait_model_endpoints()
        except BaseException:
            self.shutdown()
            raise
        self._started = True
        self._watcher = threading.Thread(target=self._watch, name="fleet-watcher", daemon=True)
        self._watcher.start()
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

    def _check_ports_free(self) -> None:
        """Fail before spawning anything if another process holds a server's port (`PortInUseError`)."""
        for instance in self.config.instances.values():
            bind_socket(instance.host, instance.port, f"{instance.path}.port").close()

    def _start_head(self) -> None:
        host, port = self.config.head_host, self.config.head_port
        self._head_socket = bind_socket(host, port, "head_server.port", assigned_if_unset=False)
        import uvicorn

        from gymfleet.fleet.head import create_head_app

        app = create_head_app(self.config, self.process_table)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
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

    def _spawn(self, instance: ServerInstance) -> None:
        """Start `instance` for the first time and say so: name, what it is, URL, pid, where its output goes."""
        child = self.children[instance.name] = _Child(instance, self._popen(instance), time.time())
        self._start_pump(child)
        self._say(f"started {instance.name} ({instance.server_type}/{instance.impl}) on {instance.url}, "
                  f"pid {child.process.pid}, log: {self.log_target(instance.name)}")

    # ------------------------------------------------------------------------------------------ zygote

    def _start_zygote(self) -> None:
        """Start a zygote (`gymfleet.fleet.zygote`): a fresh interpreter that imports every server once, then forks them."""
        self._zygote_starts += 1
        prestarted, self._prestarted = self._prestarted, None
        if prestarted is not None:
            self._zygote = prestarted
            if prestarted.adopt(self._config_path, output=self._zygote_output, on_death=self._zygote_died):
                return
            prestarted.close()
        self._zygote = Zygote(self._config_path, output=self._zygote_output, on_death=self._zygote_died)

    def _zygote_output(self, line: str) -> None:
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_dir / "zygote.log", "a") as sink:
                sink.write(line + "\n")
        else:
            self._say(f"(zygote) {line}")

    def _validate_in_zygote(self) -> None:
        """Validate every server in a child of the zygote (no second import of everything here); on any doubt,
        `validate()` here, which raises the real error. A zygote that cannot serve leaves fresh interpreters."""
        zygote = self._zygote
        if zygote is None:  # it died while importing (its reader thread said so already)
            self.validate()
            return
        try:
            error = zygote.validate(json.loads(self._secrets_env), dict(os.environ))
        except ZygoteError as exc:
            self._zygote_lost(zygote, str(exc))
            self.validate()
            return
        if error is not None:
            self.validate()  # raises the error, typed and with its YAML path
            self._zygote_lost(zygote, f"failed to build a server where this process did not: {error}", restart=False)

    def _zygote_died(self, zygote: Zygote) -> None:
        """The zygote exited on its own (its reader thread calls this)."""
        self._zygote_lost(zygote, f"(pid {zygote.pid}) {zygote.death_text()}")

    def _zygote_lost(self, zygote: Zygote, why: str, restart: bool = True) -> None:
        """Replace a zygote that died or failed: start another (at most `ZYGOTE_RESTARTS` times, and only if it
        had served), else start servers as fresh interpreters from now on. Says so once, either way."""
        with self._zygote_lock:
            if self._zygote is not zygote or self._stopping:
                return
            zygote.close()
            # One that died while importing would die again: no restart for it.
            if restart and zygote.was_ready and self._zygote_starts <= ZYGOTE_RESTARTS:
                self._start_zygote()
                then = (f"starting a new one ({self._zygote_starts - 1}/{ZYGOTE_RESTARTS}); running servers keep "
                        "serving")
            else:
                self._zygote = None
                then = "servers start as fresh interpreters from now on (as with server_start=spawn)"
                if self.children:
                    then += "; running servers keep serving"
            self._say(f"the zygote {why}; {then}")

    def _zygote_starting(self) -> bool:
        """Whether a (re)started zygote is still importing: a restart waits for it rather than paying twice."""
        zygote = self._zygote
        if zygote is None or zygote.ready or not zygote.alive:
            return False
        if time.monotonic() - zygote.started_at > ZYGOTE_READY_TIMEOUT_S:
            self._zygote_lost(zygote, f"(pid {zygote.pid}) was not ready within {ZYGOTE_READY_TIMEOUT_S:g}s")
            return False
        return True

    def log_target(self, name: str) -> str:
        """Where the output of server `name` goes: its log file under `nemo_gym_log_dir`, or this output."""
        if self.log_dir:
            return str(self.log_dir / f"{name}.log")
        return f"this output, lines prefixed ({name})"

    def _popen(self, instance: ServerInstance) -> subprocess.Popen | ForkedProcess:
        """The server process of `instance`, in its own process group, output piped to the supervisor: forked by
        the zygote, or (`server_start: spawn`, or no zygote left) a fresh interpreter."""
        zygote = self._zygote
        if zygote is not None:
            from gymfleet.serving.server import FLEET_TOKEN_ENV

            env = {**os.environ, FLEET_TOKEN_ENV: self.token}
            try:
                return zygote.spawn(instance.name, json.loads(self._secrets_env), env)
            except ZygoteError as exc:
                self._zygote_lost(zygote, str(exc))
        return self._spawn_popen(instance)

    def _spawn_popen(self, instance: ServerInstance) -> subprocess.Popen:
        """`instance` as a fresh interpreter: `python -m gymfleet.fleet.launch`."""
        command = [
            sys.executable,
            "-m",
            "gymfleet.fleet.launch",
            "--config",
            str(self._config_path),
            "--instance",
            instance.name,
            "--parent-pid",
            str(os.getpid()),
            "--workdir",
            str(self.workdir),
        ]
        from gymfleet.serving.server import FLEET_TOKEN_ENV

        # Secrets and the fleet token go in the child's environment: not on disk, not in `ps` (owner-only).
        env = {**os.environ, SECRETS_ENV: self._secrets_env, FLEET_TOKEN_ENV: self.token}
        return subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
            bufsize=1,
            errors="replace",
        )

    def _start_pump(self, child: _Child) -> None:
        """Copy the output of `child`'s current process to the fleet's output (or its log file) and its tail."""
        name = f"log-{child.instance.name}"
        threading.Thread(target=self._pump, args=(child, child.process), name=name, daemon=True).start()

    def _pump(self, child: _Child, process: subprocess.Popen) -> None:
        sink = None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            sink = open(self.log_dir / f"{child.instance.name}.log", "a")  # noqa: SIM115
        try:
            for line in process.stdout:
                child.tail.append(line.rstrip("\n"))
                if sink:
                    sink.write(line)
                    sink.flush()
                else:
                    self._say(f"({child.instance.name}) {line.rstrip()}")
        finally:
            process.stdout.close()
            if sink:
                sink.close()

    def _say(self, text: str) -> None:
        with self._lock:
            if self._progress is not None:
                self._progress.write(text)  # above the bar, on a terminal
            else:
                print(text, file=self.output, flush=True)

    def _wait_ready(self, timeout_s: float, report: bool = False) -> None:
        """Return once every server answers. While starting, any exit raises; once started, crashed servers are
        restarted (see `poll()`) and waited for, and only one that cannot be brought back raises. With `report`,
        show which servers are ready and which are not yet (`gymfleet.progress`)."""
        deadline = time.monotonic() + timeout_s
        progress = self._open_progress(len(self.children), "Servers ready", "server") if report else None
        try:
            while pending := self._not_ready():
                if time.monotonic() > deadline:
                    names = ", ".join(sorted(child.instance.name for child in pending))
                    raise ServerCrashedError(
                        f"servers not ready after {timeout_s:g}s: {names}"
                        + "".join(self._tail_text(c) for c in pending)
                    )
                if progress is not None:
                    progress.update(len(self.children) - len(pending) - progress.done)
                    progress.set_status(f"not yet: {_names(c.instance.name for c in pending)} (timeout "
                                        f"{timeout_s:g} s){self._endpoints_status()}")
                    progress.tick()
                time.sleep(POLL_INTERVAL_S)
            if progress is not None:
                progress.update(len(self.children) - progress.done)
                progress.set_status(self._endpoints_status().removeprefix("; "))
        finally:
            self._close_progress(progress)

    def _open_progress(self, total: int, desc: str, unit: str) -> Progress:
        progress = Progress(total, desc, unit=unit, file=self.output, every_s=START_REPORT_EVERY_S)
        with self._lock:
            self._progress = progress
        return progress

    def _close_progress(self, progress: Progress | None) -> None:
        if progress is None:
            return
        with self._lock:
            self._progress = None
            progress.close()

    def _endpoints_status(self) -> str:
        """`; waiting for model endpoint(s) URL, ... (N s so far, timeout T s)`, or nothing."""
        watch = self._endpoints
        if watch is None or not (pending := watch.pending()):
            return ""
        return (f"; waiting for model endpoint(s) {_names(pending)} ({watch.elapsed_s():.0f} s so far, timeout "
                f"{watch.timeout_s:g} s)")

    def _not_ready(self) -> list[_Child]:
        """The servers that do not answer yet (marking those that now do)."""
        if self._started:
            self.poll()
            return [child for child in self.children.values() if child.state != "running"]
        pending = []
        for child in self.children.values():
            if not child.ready:
                self._check_alive(child)
                if _is_own_server(child.instance.url, self.token, child.instance.name):
                    child.ready, child.state = True, "running"
                else:
                    pending.append(child)
        return pending

    def _wait_model_endpoints(self) -> None:
        """Wait until every model endpoint answers (probed since `start()` began), showing which are pending.

        Raises:
            ConfigError: some did not answer within `model_endpoint_readiness_timeout_seconds` of the start.
        """
        watch = self._endpoints
        if watch is None or not watch.pending():
            return
        progress = self._open_progress(len(watch.urls), "Model endpoints answering", "endpoint")
        try:
            while pending := watch.pending():
                if watch.elapsed_s() > watch.timeout_s:
                    raise ConfigError(
                        f"model endpoints not reachable after {watch.timeout_s:g}s: {sorted(pending)}"
                        f"{watch.errors_text()}; check policy_base_url / base_url (or set "
                        "model_endpoint_readiness_timeout_seconds=0)"
                    )
                progress.update(len(watch.urls) - len(pending) - progress.done)
                progress.set_status(self._endpoints_status().removeprefix("; "))
                progress.tick()
                time.sleep(POLL_INTERVAL_S)
            progress.update(len(watch.urls) - progress.done)
            progress.set_status("")
        finally:
            self._close_progress(progress)

    # ------------------------------------------------------------------------------------------ watch

    def _tail_text(self, child: _Child) -> str:
        lines = "\n".join(f"    {line}" for line in child.tail) or "    (no output)"
        return f"\n  last output of {child.instance.name}:\n{lines}"

    def _check_alive(self, child: _Child) -> None:
        """While the fleet starts: raise if `child` exited (`PortInUseError` for a taken port)."""
        code = child.process.poll()
        if code is None:
            return
        if code == EXIT_PORT_IN_USE:
            raise PortInUseError(child.instance.port, f"{child.instance.path}.port")
        time.sleep(0.1)  # let the log pump drain the last lines
        raise ServerCrashedError(
            f"server {child.instance.name!r} exited unexpectedly with {_exit_text(code)}" + self._tail_text(child)
        )

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

    def run_forever(self, interval_s: float = 1.0) -> None:
        """Block, polling, until a server cannot be brought back (raises) or the process is told to stop."""
        while not self._stopping:
            self.poll()
            time.sleep(interval_s)

    def _watch(self) -> None:
        """The watcher thread: supervise every `POLL_INTERVAL_S` until shutdown, whether anyone polls or not."""
        while not self._wake.wait(POLL_INTERVAL_S):
            with self._supervise_lock:
                if self._stopping:
                    return
                try:
                    self._supervise()
                except Exception:  # a bug here must not end supervision silently; poll() would raise it again
                    log.exception("fleet watcher: supervising the servers failed")

    def _supervise(self) -> None:
        """One round: notice crashes, start servers whose backoff is over, mark restarted servers that answer."""
        now = time.monotonic()
        for child in self.children.values():
            if child.state == "failed":
                continue
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._respawn(child, now)
                continue
            code = child.process.poll()
            if code is not None:
                self._crashed(child, _exit_text(code), code == EXIT_PORT_IN_USE, now)
            elif child.state == "restarting":
                if _is_own_server(child.instance.url, self.token, child.instance.name):
                    child.state = "running"
                    self._say(f"server {child.instance.name!r} is back on port {child.instance.port} "
                              f"(restart {len(child.crashes)}/{self.max_restarts})")
                elif now > child.deadline:
                    _signal_group(child.process, signal.SIGKILL)
                    self._crashed(child, f"no answer within {RESTART_READY_TIMEOUT_S:g}s of its restart", False, now)

    def _crashed(self, child: _Child, how: str, port_taken: bool, now: float) -> None:
        """Handle a server found dead (`how`: its exit code or signal): schedule its restart, or mark it failed."""
        name = child.instance.name
        _signal_group(child.process, signal.SIGKILL)  # its workers (num_workers > 1) would still hold the port
        child.process.wait()
        time.sleep(0.1)  # let the log pump drain the last lines
        _forget_old_crashes(child, now)
        what = f"server {name!r} exited unexpectedly with {how}"
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
            bind_socket(instance.host, instance.port, f"{instance.path}.port").close()
        except PortInUseError as exc:
            if now < child.deadline:
                child.restart_at = now + POLL_INTERVAL_S
                return
            child.state, child.restart_at, child.failure = "failed", None, exc
            return
        child.process = self._popen(instance)
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


def _server_start(config: GlobalConfig) -> str:
    """`server_start`: `zygote` (default) or `spawn`.

    Raises:
        ConfigError: any other value, naming the key and the choices.
    """
    value = config.data.get("server_start", SERVER_START_CHOICES[0])
    if value not in SERVER_START_CHOICES:
        raise ConfigError(
            f"server_start: expected one of {', '.join(SERVER_START_CHOICES)}, got {value!r}",
            path="server_start",
            hint="Use +server_start=zygote (default: every server forked from one pre-imported parent, fast and "
            "light) or +server_start=spawn (a fresh Python interpreter per server).",
        )
    return value


def _exit_text(code: int) -> str:
    """`code -9 (SIGKILL)` for a process killed by a signal, `code 3` otherwise."""
    if code == EXIT_UNKNOWN:
        return "an unknown code (it was forked by a zygote that died before it, so nobody could collect it)"
    if code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"code {code}"
    return f"code {code}"


def _signal_group(process: subprocess.Popen | ForkedProcess, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _is_own_server(url: str, token: str, name: str, timeout_s: float = 2.0) -> bool:
    """Whether `GET url/` answers 200 as instance `name` of the fleet holding `token` (not just anything there)."""
    from gymfleet.serving.server import FLEET_HEADER, INSTANCE_HEADER

    try:
        with urllib.request.urlopen(url + "/", timeout=timeout_s) as response:
            identity = (response.headers.get(FLEET_HEADER), response.headers.get(INSTANCE_HEADER))
            return response.status == 200 and identity == (token, name)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _model_endpoint_urls(config: GlobalConfig) -> dict[str, list[str]]:
    """Probe URL -> the model server instances using it, for every `*base_url` value under model servers
    (NeMo-Gym's readiness rule)."""
    urls: dict[str, list[str]] = {}
    for instance in config.instances_of("responses_api_models"):
        for key, value in instance.fields.items():
            if not key.endswith("base_url"):
                continue
            for url in value if isinstance(value, list) else [value]:
                if isinstance(url, str) and url.startswith("http"):
                    url = url.rstrip("/")
                    users = urls.setdefault(url + "/models" if url.endswith("/v1") else url, [])
                    if instance.name not in users:
                        users.append(instance.name)
    return urls


def _names(names: Any, limit: int = 6) -> str:
    """`a, b, c` (sorted), or `a, b, c, ... (+4 more)` past `limit`."""
    names = sorted(names)
    more = f", ... (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


class _EndpointWatch:
    """Probes every model endpoint (one thread per URL, any HTTP answer counts) until each answers or `stop()`.

    It says (through `say`) which URL it waits for as soon as a probe fails or `ENDPOINT_ANNOUNCE_AFTER_S` pass
    without an answer, then every `ENDPOINT_REPORT_EVERY_S` how long so far and the timeout, and when one answers.
    Giving up is the fleet's decision (`Fleet._wait_model_endpoints`); the watch only observes.
    """

    def __init__(self, urls: dict[str, list[str]], timeout_s: float, say: Any, internal: frozenset[str] = frozenset()):
        self.urls = urls
        self.internal = internal
        """URLs served by the fleet's own servers (a scripted policy): their start is reported as theirs, not here."""
        self.timeout_s = timeout_s
        self._say = say
        self.started = time.monotonic()
        self._answered: dict[str, float] = {}
        self._errors: dict[str, str] = {}
        self._announced: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._probe, args=(url,), name=f"probe-{url}", daemon=True)
                         for url in urls]
        self._threads.append(threading.Thread(target=self._report, name="probe-report", daemon=True))
        for thread in self._threads:
            thread.start()

    @classmethod
    def for_config(cls, config: GlobalConfig, say: Any) -> _EndpointWatch | None:
        """A running watch over `config`'s model endpoints; None when there are none or the check is off."""
        timeout_s = float(config.data.get("model_endpoint_readiness_timeout_seconds", 600))
        urls = _model_endpoint_urls(config)
        own = {(host, instance.port) for instance in config.instances.values()
               for host in (instance.host, *LOCAL_HOSTS)}
        internal = frozenset(url for url in urls if (urllib.parse.urlsplit(url).hostname,
                                                     urllib.parse.urlsplit(url).port) in own)
        return cls(urls, timeout_s, say, internal) if timeout_s > 0 and urls else None

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def pending(self, instance: str | None = None) -> list[str]:
        """URLs that have not answered yet (only those `instance` uses, if given)."""
        with self._lock:
            return [url for url, users in self.urls.items()
                    if url not in self._answered and (instance is None or instance in users)]

    def errors_text(self) -> str:
        with self._lock:
            errors = [f"{url}: {error}" for url, error in self._errors.items() if url not in self._answered]
        return f" ({'; '.join(errors)})" if errors else ""

    def stop(self) -> None:
        self._stop.set()

    def _probe(self, url: str) -> None:
        while not self._stop.is_set():
            error = _probe_error(url, ENDPOINT_PROBE_TIMEOUT_S)
            with self._lock:
                if error is None:
                    self._answered[url] = self.elapsed_s()
                    announced = url in self._announced
                else:
                    self._errors[url] = error
            if error is None:
                if announced:
                    self._say(f"model endpoint {url} answers (after {self._answered[url]:.1f} s)")
                return
            self._announce(url, error)
            # The fleet's own (scripted) model comes up with its servers: asked often, the fleet is ready with it.
            self._stop.wait(INTERNAL_PROBE_INTERVAL_S if url in self.internal else ENDPOINT_PROBE_INTERVAL_S)

    def _announce(self, url: str, error: str | None) -> bool:
        """Name `url` as waited for, once; whether this call did."""
        with self._lock:
            if url in self._announced or url in self._answered or url in self.internal:
                return False
            self._announced.add(url)
        users = ", ".join(self.urls[url])
        self._say(f"waiting for model endpoint {url} (used by {users}): {error or 'no answer yet'}; "
                  f"timeout {self.timeout_s:g} s (model_endpoint_readiness_timeout_seconds)")
        return True

    def _report(self) -> None:
        last_report: dict[str, float] = {}
        while not self._stop.wait(0.1):
            pending = self.pending()
            if not pending:
                return
            elapsed = self.elapsed_s()
            for url in pending:
                with self._lock:
                    error = self._errors.get(url)
                    first = url not in self._announced
                if url in self.internal:
                    continue
                if first:
                    if elapsed >= ENDPOINT_ANNOUNCE_AFTER_S and self._announce(url, error):
                        last_report[url] = elapsed
                    continue
                last_report.setdefault(url, elapsed)
                if elapsed - last_report[url] >= ENDPOINT_REPORT_EVERY_S:
                    last_report[url] = elapsed
                    self._say(f"still waiting for model endpoint {url}: {error or 'no answer yet'} "
                              f"({elapsed:.0f} s so far, timeout {self.timeout_s:g} s)")


def _probe_error(url: str, timeout_s: float) -> str | None:
    """None when `url` gives any HTTP answer, else why not (`connection refused`, `timed out`, ...)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as exc:
        reason = exc.reason
        return str(getattr(reason, "strerror", None) or reason).lower()
    except (OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__
