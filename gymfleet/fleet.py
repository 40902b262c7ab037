"""Start, watch and stop a fleet: the head server plus one supervised process per server instance.

Every instance runs as `python -m gymfleet.launch` in this same Python environment (no per-server virtualenvs), in
its own process group; each child asks the kernel to kill it if the supervisor dies (no orphans). Output lines are
prefixed `(<instance>) ` and the last lines of each are kept, so a server that dies is reported with its own last
words. `start()` returns once every instance answers `GET /` (and every upstream `base_url` answers, if
configured); `poll()` raises `ServerCrashedError` if anything died; `shutdown()` stops everything within seconds
(SIGTERM, then SIGKILL to the whole process group).
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import uvicorn

from gymfleet.config import GlobalConfig, ServerInstance
from gymfleet.errors import ConfigError, GymfleetError
from gymfleet.head import create_head_app
from gymfleet.launch import build_server, write_resolved

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
        self._workdir = Path(tempfile.mkdtemp(prefix="gymfleet-"))
        self._config_path = self._workdir / "resolved_config.json"
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
        write_resolved(self.config, self._config_path)
        self._start_head()
        for instance in self.config.instances.values():
            self._spawn(instance)
        try:
            self._wait_ready(timeout_s)
            self._wait_model_endpoints()
        except BaseException:
            self.shutdown()
            raise
        total = len(self.children)
        self._say(
            f"All {total} / {total} servers ready! Head server: http://{self.config.head_host}:{self.config.head_port}"
        )

    def _start_head(self) -> None:
        app = create_head_app(self.config, self.process_table)
        config = uvicorn.Config(
            app, host=self.config.head_host, port=self.config.head_port, log_level="warning", lifespan="off"
        )
        self._head = uvicorn.Server(config)
        self._head_thread = threading.Thread(target=self._head.run, name="head-server", daemon=True)
        self._head_thread.start()
        deadline = time.monotonic() + 10
        while not self._head.started:
            if not self._head_thread.is_alive():
                raise ConfigError(
                    f"head server could not start on {self.config.head_host}:{self.config.head_port} "
                    "(port in use?); set +head_server.port=<free port>",
                    path="head_server.port",
                )
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
        ]
        process = subprocess.Popen(
            command,
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
                if _answers(child.instance.url + "/"):
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
        """Stop every instance (SIGTERM, then SIGKILL to the process group) and the head server."""
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


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


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
