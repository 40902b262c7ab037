"""Start, watch and stop a fleet: the head server plus one supervised process per server instance.

Every instance runs as `python -m gymfleet.launch` in this same Python environment (no per-server virtualenvs), in
its own process group; each child asks the kernel to kill it if the supervisor dies (no orphans). Output lines are
prefixed `(<instance>) ` and the last lines of each are kept, so a server that dies is reported with its own last
words. `start()` returns once every instance answers `GET /` as this fleet's own server (the fleet's random token
and the instance name in its headers, see `gymfleet.server`; another process on the same port never counts) and
every upstream `base_url` answers, if configured; `poll()` raises `ServerCrashedError` if anything died;
`shutdown()` stops everything within seconds (SIGTERM, then SIGKILL to the whole process group).

A port taken by another process (checked before anything is spawned, and again when a child fails to bind) is a
`PortInUseError` naming the port, its YAML path and the `++path=<free port>` override. The children read the
resolved config from a private work folder (0700, the file 0600) holding no secrets: those reach each child in its
environment (`gymfleet.launch`). The folder is removed on every way out: `shutdown()`, a failed `start()`, garbage
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
import urllib.request
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from secrets import token_hex
from typing import IO, Any

import uvicorn

from gymfleet.config import GlobalConfig, ServerInstance
from gymfleet.errors import ConfigError, GymfleetError
from gymfleet.head import create_head_app
from gymfleet.launch import (
    EXIT_PORT_IN_USE,
    SECRETS_ENV,
    WORKDIR_PREFIX,
    PortInUseError,
    bind_socket,
    build_server,
    split_secrets,
    write_resolved,
)
from gymfleet.server import FLEET_HEADER, FLEET_TOKEN_ENV, INSTANCE_HEADER

__all__ = ["Fleet", "PortInUseError", "ServerCrashedError"]

log = logging.getLogger(__name__)

TAIL_LINES = 40
POLL_INTERVAL_S = 0.2


class ServerCrashedError(GymfleetError, RuntimeError):
    """A server process of the fleet exited (a RuntimeError too, as NeMo-Gym's `poll()` raises)."""


@dataclass
class _Child:
    instance: ServerInstance
    process: subprocess.Popen
    start_time: float
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    restarts: int = 0
    ready: bool = False


class Fleet:
    """A running fleet. NeMo-Gym's `RunHelper` is a thin wrapper around this."""

    def __init__(self, config: GlobalConfig, *, output: IO[str] | None = None, max_restarts: int | None = None):
        self.config = config
        self.output = output or sys.stdout
        restarts = config.data.get("restart_crashed_servers", 0)
        self.max_restarts = int(restarts if max_restarts is None else max_restarts)
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
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------ start

    def validate(self) -> None:
        """Build every server in this process once, so config mistakes stop start-up with their YAML path."""
        for instance in self.config.instances.values():
            build_server(instance, self.config)

    def start(self, timeout_s: float = 180.0) -> None:
        """Start the head server and every instance; return when all answer. Raises on any failure."""
        if not self.config.instances:
            raise ConfigError("no server instances in the config: pass +config_paths=[...] with at least one server")
        self.validate()
        try:
            self._write_workdir()
            self._start_head()
            self._check_ports_free()
            for instance in self.config.instances.values():
                self._spawn(instance)
            self._wait_ready(timeout_s)
            self._wait_model_endpoints()
        except BaseException:
            self.shutdown()
            raise
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

    def _spawn(self, instance: ServerInstance, restarts: int = 0) -> None:
        command = [
            sys.executable,
            "-m",
            "gymfleet.launch",
            "--config",
            str(self._config_path),
            "--instance",
            instance.name,
            "--parent-pid",
            str(os.getpid()),
            "--workdir",
            str(self.workdir),
        ]
        # Secrets and the fleet token go in the child's environment: not on disk, not in `ps` (owner-only).
        env = {**os.environ, SECRETS_ENV: self._secrets_env, FLEET_TOKEN_ENV: self.token}
        process = subprocess.Popen(
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
        child = _Child(instance, process, time.time(), restarts=restarts)
        self.children[instance.name] = child
        threading.Thread(target=self._pump, args=(child,), name=f"log-{instance.name}", daemon=True).start()

    def _pump(self, child: _Child) -> None:
        sink = None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            sink = open(self.log_dir / f"{child.instance.name}.log", "a")  # noqa: SIM115
        try:
            for line in child.process.stdout:
                child.tail.append(line.rstrip("\n"))
                if sink:
                    sink.write(line)
                    sink.flush()
                else:
                    self._say(f"({child.instance.name}) {line.rstrip()}")
        finally:
            child.process.stdout.close()
            if sink:
                sink.close()

    def _say(self, text: str) -> None:
        with self._lock:
            print(text, file=self.output, flush=True)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = dict(self.children)
        while pending:
            for name, child in list(pending.items()):
                self._check_alive(child)
                if _is_own_server(child.instance.url, self.token, name):
                    child.ready = True
                    del pending[name]
            if pending and time.monotonic() > deadline:
                names = ", ".join(sorted(pending))
                raise ServerCrashedError(
                    f"servers not ready after {timeout_s:g}s: {names}"
                    + "".join(self._tail_text(c) for c in pending.values())
                )
            if pending:
                time.sleep(POLL_INTERVAL_S)

    def _wait_model_endpoints(self) -> None:
        timeout_s = float(self.config.data.get("model_endpoint_readiness_timeout_seconds", 600))
        urls = _model_endpoint_urls(self.config)
        if timeout_s <= 0 or not urls:
            return
        deadline = time.monotonic() + timeout_s
        pending = set(urls)
        while pending:
            pending = {url for url in pending if not _answers(url, any_status=True)}
            if pending and time.monotonic() > deadline:
                raise ConfigError(
                    f"model endpoints not reachable after {timeout_s:g}s: {sorted(pending)}; check "
                    "policy_base_url / base_url (or set model_endpoint_readiness_timeout_seconds=0)"
                )
            if pending:
                time.sleep(1.0)

    # ------------------------------------------------------------------------------------------ watch

    def _tail_text(self, child: _Child) -> str:
        lines = "\n".join(f"    {line}" for line in child.tail) or "    (no output)"
        return f"\n  last output of {child.instance.name}:\n{lines}"

    def _check_alive(self, child: _Child) -> None:
        code = child.process.poll()
        if code is None:
            return
        if code == EXIT_PORT_IN_USE:
            raise PortInUseError(child.instance.port, f"{child.instance.path}.port")
        time.sleep(0.1)  # let the log pump drain the last lines
        raise ServerCrashedError(
            f"server {child.instance.name!r} exited unexpectedly with code {code}" + self._tail_text(child)
        )

    def poll(self) -> None:
        """Raise `ServerCrashedError` if the head server or any instance died (restarting it if configured)."""
        if self._head_thread is not None and not self._head_thread.is_alive():
            raise ServerCrashedError("the head server thread died")
        for child in list(self.children.values()):
            try:
                self._check_alive(child)
            except ServerCrashedError as exc:
                if child.restarts >= self.max_restarts:
                    raise
                self._say(f"{exc}\nrestarting {child.instance.name} ({child.restarts + 1}/{self.max_restarts})")
                _signal_group(child.process, signal.SIGKILL)  # its workers (num_workers > 1) still hold the port
                child.process.wait()
                self._spawn(child.instance, child.restarts + 1)

    def run_forever(self, interval_s: float = 1.0) -> None:
        """Block, polling, until a server dies (raises) or the process is told to stop."""
        while not self._stopping:
            self.poll()
            time.sleep(interval_s)

    def process_table(self) -> dict[str, dict[str, Any]]:
        return {
            name: {
                "pid": child.process.pid,
                "start_time": child.start_time,
                "status": "running" if child.process.poll() is None else f"exited({child.process.returncode})",
            }
            for name, child in self.children.items()
        }

    # ------------------------------------------------------------------------------------------ stop

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Stop every instance (SIGTERM, then SIGKILL to the process group) and the head server, and remove the
        work folder. Safe to call more than once."""
        self._stopping = True
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


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _is_own_server(url: str, token: str, name: str, timeout_s: float = 2.0) -> bool:
    """Whether `GET url/` answers 200 as instance `name` of the fleet holding `token` (not just anything there)."""
    try:
        with urllib.request.urlopen(url + "/", timeout=timeout_s) as response:
            identity = (response.headers.get(FLEET_HEADER), response.headers.get(INSTANCE_HEADER))
            return response.status == 200 and identity == (token, name)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _answers(url: str, any_status: bool = False, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return any_status or response.status < 500
    except urllib.error.HTTPError:
        return any_status
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _model_endpoint_urls(config: GlobalConfig) -> list[str]:
    """Probe URLs for every `*base_url` value under model servers (NeMo-Gym's readiness rule)."""
    urls: list[str] = []
    for instance in config.instances_of("responses_api_models"):
        for key, value in instance.fields.items():
            if not key.endswith("base_url"):
                continue
            for url in value if isinstance(value, list) else [value]:
                if isinstance(url, str) and url.startswith("http"):
                    url = url.rstrip("/")
                    urls.append(url + "/models" if url.endswith("/v1") else url)
    return urls
