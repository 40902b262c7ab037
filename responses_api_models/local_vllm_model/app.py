"""local_vllm_model: vllm_model in front of a vLLM server it starts, watches and stops itself.

## What it does
At start-up the server runs `<executable> serve <model_path> --host <vllm_host> --port <vllm_port>
--served-model-name <model> --tensor-parallel-size <tp> --data-parallel-size <dp> [vllm_serve_kwargs as flags]
[extra_args]` in a process group of its own, with `vllm_serve_env_vars` (and `HF_HOME` from `hf_home`) added to
its environment, and copies its output into this server's log (`vllm| ` lines). It then polls `GET
http://<vllm_host>:<vllm_port>/health` until it answers 200: the log says what it waits for (command, pid, URL,
timeout) at once, then every `HEALTH_LOG_EVERY_S` with the time so far and the last probe error. The server itself
listens at once, but its liveness route `GET /` answers 503 `{"status": "vLLM starting"}` until vLLM is healthy
(and again while vLLM restarts), so "servers ready" in a fleet means vLLM serves; model calls made before then fail
at once with HTTP 502 `error_type: connection_error` ("vLLM is starting"). Serving is `vllm_model`'s (this class
subclasses it): Responses ⇄ Chat conversion, reasoning options, retries, token capture
(`return_token_id_information`, with vLLM's `/tokenize`), `GET /upstream_status`; `base_url` is this server's own
vLLM (`http://<vllm_host>:<vllm_port>/v1`).

## Supervision
A watcher notices when vLLM exits. It logs the exit code (or signal) and vLLM's last output lines, kills what is
left of its process group (engine workers), and starts it again on the same port, waiting for its health as at
start-up: at most `max_restarts` times in this server's life. Requests that arrive while vLLM is down are answered
at once with HTTP 502 `error_type: connection_error` naming the state ("restarting", "failed"), never held. When
vLLM cannot be brought back (restarts spent, or a restart not healthy in time) the state becomes `failed`, logged
as an error; inside a fleet (`ng_run`) the server then stops itself, so the fleet's supervisor restarts it (and vLLM
with it) or stops the fleet, within its own bounded budget. `GET /vllm_status` reports `{state, pid, url, command,
restarts, max_restarts, last_exit, ready_after_s, failure}`; `state` is `starting`, `ready`, `restarting`, `failed`
or `stopped`.

## Stopping
When the server stops (the fleet's SIGTERM, Ctrl-C, a test leaving `serve`), vLLM's whole process group gets
SIGTERM, then SIGKILL after `stop_grace_s` if anything in it is still alive. The child also asks the kernel to
send it SIGTERM if this server dies first (Linux `PR_SET_PDEATHSIG`), so a server killed outright leaves no vLLM
behind. `ng_run` gives a server 5 s between its SIGTERM and SIGKILL; keep `stop_grace_s` under that. Note that
`ng_run` waits 180 s for each server's `GET /` at start: a model that takes longer to load stops the fleet.

## Failures
- The executable is not found → `ConfigError` when the server is built (so `ng_run` stops before starting
  anything), naming it and the fix: `pip install 'gymfleet[vllm]'`, or `executable: <path>`.
- vLLM exits during start-up, or is not healthy within `health_timeout_s` → state `failed` with a
  `LocalVLLMStartError` message naming the command, the exit code or the last probe error, and vLLM's last output
  lines (logged, and in `/vllm_status`'s `failure`); in a fleet the server then stops, and `ng_run` reports that
  with the server's last output lines.
- vLLM dies later → see Supervision; requests fail typed (502) meanwhile, never hang.
- Everything else is vllm_model's (see its module docstring).

## Differences from NeMo-Gym
NeMo-Gym's `local_vllm_model` places vLLM with Ray (actors, placement across nodes, a router for data-parallel
ranks). Here vLLM is a child process on the server's own machine and vLLM's own `--data-parallel-size` spreads the
ranks; Ray placement of the whole server is the fleet's business. NeMo-Gym's field names `model`,
`vllm_serve_kwargs`, `vllm_serve_env_vars`, `hf_home` and `debug` are accepted with their meaning, so its configs
load; its parallel sizes inside `vllm_serve_kwargs` are honoured.

## Testing
`executable` left unset means `$GYMFLEET_VLLM_EXECUTABLE` when that environment variable is set (logged), else
`vllm`. `tests/test_shipped_configs.py` sets it to the stand-in `tests/fake_vllm.py` (which takes `vllm serve`'s
command line and serves the scripted model), so every shipped config starts on a machine without vLLM or a GPU.

## Config
`LocalVLLMModelConfig` below, plus every `VLLMModelConfig` field except `base_url` (derived). `num_workers` must
stay 1: one server owns one vLLM.

## Version history
- v1: start, health wait, vllm_model serving, bounded restarts, group stop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from pydantic import Field, field_validator, model_validator
from starlette.responses import Response as StarletteResponse

from gymfleet import auth, http
from gymfleet.errors import ConfigError, GymfleetError, TransportError, UpstreamError
from gymfleet.serving.model import ModelServer
from gymfleet.serving.server import JSONResponse, ServerConfig, add_route
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

__all__ = ["LocalVLLMModel", "LocalVLLMModelConfig", "LocalVLLMStartError"]

log = logging.getLogger(__name__)
vllm_log = logging.getLogger(__name__ + ".vllm")

DEFAULT_EXECUTABLE = "vllm"
STAND_IN = Path(__file__).parent / "tests" / "fake_vllm.py"
"""A stand-in for `vllm` that tests use (see "Testing")."""
EXECUTABLE_ENV = "GYMFLEET_VLLM_EXECUTABLE"
"""Environment variable naming the program an unset `executable` means (default `vllm`)."""
INSTALL_HINT = "install it with `pip install 'gymfleet[vllm]'` (a CUDA machine), or set executable: <path to vllm>"
HEALTH_POLL_S = 0.5
HEALTH_PROBE_TIMEOUT_S = 2.0
HEALTH_LOG_EVERY_S = 10.0
STOP_POLL_S = 0.05
TAIL_LINES = 30
RESERVED_KWARGS = {"host": "vllm_host", "port": "vllm_port", "served_model_name": "model", "model": "model_path"}
"""`vllm_serve_kwargs` keys that a field owns: name the field instead."""
PR_SET_PDEATHSIG = 1


class LocalVLLMStartError(GymfleetError):
    """vLLM did not become healthy: it exited, or did not answer `/health` within `health_timeout_s`."""


class LocalVLLMModelConfig(VLLMModelConfig):
    """local_vllm_model's fields (the `VLLMModelConfig` ones apply to serving)."""

    base_url: str | list[str] = ""
    """Derived: `http://<vllm_host>:<vllm_port>/v1`. Leave unset (to use a vLLM started elsewhere, use
    vllm_model)."""
    model_path: str | None = None
    """What `vllm serve` loads: a local folder or a Hugging Face name. Unset: `model` (NeMo-Gym's configs name the
    model once)."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """`--tensor-parallel-size`: GPUs one model copy spans."""
    data_parallel_size: int = Field(default=1, ge=1)
    """`--data-parallel-size`: model copies vLLM runs and balances itself (behind the one port)."""
    vllm_host: str = "127.0.0.1"
    """Interface vLLM listens on; only this server talks to it."""
    vllm_port: int = Field(default=0, ge=0, le=65535)
    """vLLM's port; 0: a free one, chosen when the server is built and kept across restarts."""
    extra_args: list[str] = []
    """Further `vllm serve` arguments, verbatim (e.g. `["--max-model-len", "32768", "--enforce-eager"]`)."""
    vllm_serve_kwargs: dict[str, Any] = {}
    """NeMo-Gym's form of further arguments: `key: value` → `--key value` (underscores become dashes), `true` →
    `--key`, `false`/null → left out, a mapping → its JSON. `tensor_parallel_size` / `data_parallel_size` here
    set those fields."""
    vllm_serve_env_vars: dict[str, str] = {}
    """Added to vLLM's environment (e.g. `VLLM_ATTENTION_BACKEND`)."""
    hf_home: str | None = None
    """`HF_HOME` for vLLM: where its Hugging Face cache (downloaded weights) lives."""
    executable: str | None = None
    """The vLLM program: a name on `PATH`, a path, or a `.py` file run with this interpreter. Unset:
    `$GYMFLEET_VLLM_EXECUTABLE` if set, else `vllm` (see "Testing" in the module docstring)."""
    health_timeout_s: float = Field(default=1800.0, gt=0)
    """How long vLLM may take to answer `GET /health` with 200 after each start (loading weights, compiling)."""
    max_restarts: int = Field(default=3, ge=0)
    """Restarts of a vLLM that died, in this server's life; past them the state is `failed`."""
    stop_grace_s: float = Field(default=3.0, ge=0)
    """Between SIGTERM and SIGKILL to vLLM's process group when stopping."""
    debug: bool = False
    """Accepted for NeMo-Gym configs; vLLM's output is always copied into this server's log."""

    @field_validator("base_url")
    @classmethod
    def _some_url(cls, value: str | list[str]) -> str | list[str]:  # replaces vllm_model's: derived here
        return value

    @field_validator("num_workers")
    @classmethod
    def _one_worker(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("local_vllm_model runs one vLLM per server: num_workers must be 1 (each worker would "
                             "start its own vLLM on the same GPUs); raise data_parallel_size instead")
        return value

    @model_validator(mode="after")
    def _check(self) -> LocalVLLMModelConfig:
        if self.base_url:
            raise ValueError("base_url is derived from vllm_host and vllm_port; leave it unset (to use a vLLM "
                             "started elsewhere, use vllm_model)")
        if not (self.model_path or self.model):
            raise ValueError("set model (the served name, also loaded when model_path is unset) or model_path")
        for key, field in RESERVED_KWARGS.items():
            if key in self.vllm_serve_kwargs:
                raise ValueError(f"vllm_serve_kwargs.{key}: set the field `{field}` instead")
        for key in ("tensor_parallel_size", "data_parallel_size"):
            if key in self.vllm_serve_kwargs:
                value = int(self.vllm_serve_kwargs[key])
                if getattr(self, key) not in (1, value):
                    raise ValueError(f"{key} is {getattr(self, key)} but vllm_serve_kwargs.{key} is {value}; "
                                     "give it once")
                setattr(self, key, value)
        return self

    def serve_args(self) -> list[str]:
        """`vllm serve`'s arguments after the program name."""
        args = ["serve", self.model_path or self.model, "--host", self.vllm_host, "--port", str(self.vllm_port),
                "--served-model-name", self.model or self.model_path,
                "--tensor-parallel-size", str(self.tensor_parallel_size),
                "--data-parallel-size", str(self.data_parallel_size)]
        for key, value in self.vllm_serve_kwargs.items():
            if key in ("tensor_parallel_size", "data_parallel_size") or value is None or value is False:
                continue
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif isinstance(value, dict | list):
                args += [flag, orjson.dumps(value).decode()]
            else:
                args += [flag, str(value)]
        return args + list(self.extra_args)


def resolve_executable(executable: str | None, path: str) -> list[str]:
    """The argv prefix that runs vLLM.

    Raises:
        ConfigError: the program is not found (the message names it and how to install vLLM).
    """
    if executable is None:
        executable = os.environ.get(EXECUTABLE_ENV) or DEFAULT_EXECUTABLE
        if executable != DEFAULT_EXECUTABLE:
            log.warning("executable unset: using %s from $%s", executable, EXECUTABLE_ENV)
    if executable.endswith(".py"):
        if not Path(executable).is_file():
            raise ConfigError(f"{path}: {executable} does not exist", path=path)
        return [sys.executable, executable]
    found = shutil.which(executable)
    if found is None:
        raise ConfigError(f"{path}: the vLLM executable {executable!r} is not found (not on PATH nor a file); "
                          f"{INSTALL_HINT}", path=path)
    return [found]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """In the forked child, before exec: SIGTERM me when my parent thread dies (Linux; elsewhere a no-op)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def _load_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the forked child only calls it
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


class VLLMProcess:
    """One run of vLLM: its process (in a group of its own), its output pump and the tail of its output."""

    def __init__(self, process: asyncio.subprocess.Process, command: list[str]):
        self.process = process
        self.command = command
        self.started = time.monotonic()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.pump = asyncio.create_task(self._pump(), name=f"vllm-output-{process.pid}")

    @classmethod
    async def start(cls, command: list[str], env: dict[str, str]) -> VLLMProcess:
        process = await asyncio.create_subprocess_exec(
            *command, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent,
        )
        return cls(process, command)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def _pump(self) -> None:
        async for raw in self.process.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            vllm_log.info("vllm| %s", line)

    def tail_text(self) -> str:
        lines = "\n".join(f"    {line}" for line in self.tail) or "    (no output)"
        return f"\n  last output of vLLM (pid {self.pid}):\n{lines}"

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a member we cannot signal: still there
            return True
        return True

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM the whole group, SIGKILL it after `grace_s` if any member lives; reap and drain the output."""
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self.process.returncode is not None and not self._group_alive():
                break
            await asyncio.sleep(STOP_POLL_S)
        else:
            if self._group_alive():
                log.warning("vLLM (pid %s) group still alive %g s after SIGTERM: SIGKILL", self.pid, grace_s)
            self._signal_group(signal.SIGKILL)
        await self.process.wait()
        # The output ends when every member is gone; wait_for cancels the pump if one we cannot see holds the pipe.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.pump, timeout=2.0)


class NotLiveUntilVLLM:
    """`GET /` answers 503 `{status: "vLLM <state>"}` until vLLM is healthy: a fleet counts the server ready then."""

    def __init__(self, app: Any, server: LocalVLLMModel):
        self.app = app
        self.server = server

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/" and self.server.state != "ready":
            detail = {"status": f"vLLM {self.server.state}", "failure": self.server.failure}
            await JSONResponse(detail, status_code=503)(scope, receive, send)
            return
        await self.app(scope, receive, send)


class LocalVLLMModel(VLLMModel):
    """vllm_model in front of a vLLM server this server starts, supervises and stops."""

    config: LocalVLLMModelConfig

    def __init__(self, config: ServerConfig | dict[str, Any], global_config: dict[str, Any] | None = None):
        if isinstance(config, dict):
            config = LocalVLLMModelConfig.model_validate(config)
        path = f"{config.name or 'local_vllm_model'}.responses_api_models.local_vllm_model.executable"
        self.executable = resolve_executable(config.executable, path)
        port = config.vllm_port or _free_port(config.vllm_host)
        host = f"[{config.vllm_host}]" if ":" in config.vllm_host else config.vllm_host
        config = config.model_copy(update={"vllm_port": port, "base_url": f"http://{host}:{port}/v1",
                                           "model": config.model or config.model_path})
        super().__init__(config, global_config)
        self.root_url = f"http://{host}:{port}"
        self.command = self.executable + config.serve_args()
        self.state = "stopped"
        self.restarts = 0
        self.last_exit: str | None = None
        self.failure: str | None = None
        self.ready_after_s: float | None = None
        self.vllm: VLLMProcess | None = None
        self._stopping = False
        self._watcher: asyncio.Task | None = None

    # ------------------------------------------------------------------------------------------ life cycle

    async def startup(self) -> None:
        self._stopping = False
        self.state = "starting"
        self._watcher = asyncio.create_task(self._watch(), name="vllm-watcher")
        await ModelServer.startup(self)  # not vllm_model's: its upstream probe starts once vLLM is healthy

    async def shutdown(self) -> None:
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        await self._stop_vllm()
        if self.state != "failed":
            self.state = "stopped"
        await super().shutdown()

    async def _start_vllm(self) -> None:
        """Start vLLM and wait until `/health` answers 200 (see the module docstring)."""
        env = {**os.environ, **self.config.vllm_serve_env_vars}
        if self.config.hf_home:
            env["HF_HOME"] = self.config.hf_home
        self.vllm = vllm = await VLLMProcess.start(self.command, env)
        timeout_s = self.config.health_timeout_s
        url = self.root_url + "/health"
        log.info("started vLLM, pid %s: %s; waiting up to %g s (health_timeout_s) for %s to answer 200",
                 vllm.pid, shlex.join(self.command), timeout_s, url)
        logged_at = time.monotonic()
        while True:
            if vllm.process.returncode is not None:
                await vllm.stop(0)
                raise LocalVLLMStartError(
                    f"vLLM exited with {_exit_text(vllm.process.returncode)} before answering {url}; command: "
                    f"{shlex.join(self.command)}" + vllm.tail_text())
            error = await self._health_error(url)
            waited = time.monotonic() - vllm.started
            if error is None:
                self.ready_after_s = round(waited, 1)
                self.state = "ready"
                log.info("vLLM (pid %s) answers %s (after %.1f s)", vllm.pid, url, waited)
                return
            if waited > timeout_s:
                raise LocalVLLMStartError(
                    f"vLLM (pid {vllm.pid}) did not answer {url} with 200 within {timeout_s:g} s (health_timeout_s; "
                    f"last: {error}); command: {shlex.join(self.command)}" + vllm.tail_text())
            if time.monotonic() - logged_at >= HEALTH_LOG_EVERY_S:
                logged_at = time.monotonic()
                log.info("still waiting for vLLM (pid %s) at %s: %s (%.0f s so far, timeout %g s)",
                         vllm.pid, url, error, waited, timeout_s)
            await asyncio.sleep(HEALTH_POLL_S)

    async def _health_error(self, url: str) -> str | None:
        """None when `url` answers 200, else why not."""
        try:
            answer = await http.request("GET", url, timeout_s=HEALTH_PROBE_TIMEOUT_S, retry=http.NO_RETRY)
        except TransportError as exc:
            return str(exc)
        return None if answer.status == 200 else f"HTTP {answer.status}"

    async def _stop_vllm(self) -> None:
        if self.vllm is not None:
            await self.vllm.stop(self.config.stop_grace_s)

    async def _watch(self) -> None:
        """Start vLLM, then restart it when it exits (bounded), else mark this server failed (see "Supervision")."""
        try:
            await self._start_vllm()
        except LocalVLLMStartError as exc:
            await self._stop_vllm()
            self._fail(str(exc))
            return
        if self.upstream.timeout_s > 0:  # vllm_model's /upstream_status; it answers at once now
            self._probe = asyncio.create_task(self.upstream.run(), name="upstream-probe")
        while True:
            code = await self.vllm.process.wait()
            if self._stopping:
                return
            self.last_exit = _exit_text(code)
            log.error("vLLM (pid %s) exited unexpectedly with %s%s", self.vllm.pid, self.last_exit,
                      self.vllm.tail_text())
            await self._stop_vllm()  # what is left of its group (engine workers)
            while True:
                if self.restarts >= self.config.max_restarts:
                    self._fail(f"vLLM exited with {self.last_exit} and was restarted {self.restarts} time(s), the "
                               f"limit (max_restarts={self.config.max_restarts})")
                    return
                self.restarts += 1
                self.state = "restarting"
                log.warning("restarting vLLM on port %s (restart %s/%s)", self.config.vllm_port, self.restarts,
                            self.config.max_restarts)
                try:
                    await self._start_vllm()
                    break
                except LocalVLLMStartError as exc:
                    log.error("restart %s/%s of vLLM failed: %s", self.restarts, self.config.max_restarts, exc)
                    self.last_exit = "a failed restart"
                    await self._stop_vllm()

    def _fail(self, reason: str) -> None:
        self.state, self.failure = "failed", reason
        if auth.fleet_token():
            log.error("vLLM cannot be brought back; stopping this server, so the fleet restarts it or stops: %s",
                      reason)
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            log.error("vLLM cannot be brought back; requests now fail with 502 connection_error: %s", reason)

    # ------------------------------------------------------------------------------------------ serving

    def routes(self, app: FastAPI) -> None:
        super().routes(app)
        app.add_middleware(NotLiveUntilVLLM, server=self)

        async def vllm_status(request: Request) -> StarletteResponse:
            return JSONResponse(self.status())

        add_route(app, "/vllm_status", vllm_status, methods=("GET",))

    def status(self) -> dict[str, Any]:
        """What `GET /vllm_status` answers."""
        return {"state": self.state, "pid": self.vllm.pid if self.vllm else None, "url": self.root_url,
                "command": self.command, "restarts": self.restarts, "max_restarts": self.config.max_restarts,
                "last_exit": self.last_exit, "ready_after_s": self.ready_after_s, "failure": self.failure}

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.state != "ready":
            why = f": {self.failure}" if self.failure else ""
            raise UpstreamError(f"{self.config.name or 'local_vllm_model'}'s vLLM is {self.state}{why}",
                                url=self.config.base_url, failure_class="connection_error")
        return await super().complete(body)
