"""Test helpers: serve a real app on an ephemeral port, build responses, check a resources server.

`serve(app)` runs the ASGI app under uvicorn in a thread on a port the OS picks, so tests use real HTTP, real
cookies and the real middleware. `make_response` builds a Responses object from text and tool calls (so no test
hand-writes twenty lines of JSON). `check_resources_server` is the conformance checker every environment passes;
`nemo_gym_examples(env)` finds NeMo-Gym's own rows for an environment (in NeMo-Gym's wheel, `nemo_gym_wheel.py`).

The fleet token (`gymfleet.auth`), in tests: a bare app served by `serve(app)` checks none (no fleet token in this
process's environment), so tests talk to it as they like; a fleet (`running_fleet`, `RunHelper`, an `ng_run`
subprocess) requires it on every route but `GET /`, as in production. gymfleet's own clients find it on their own;
a test that talks to a fleet's servers with httpx sends `fleet_headers()` (`fleet_headers(head_port)` for an
`ng_run` subprocess).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from gymfleet.http_types import SERVER_KEEP_ALIVE_S
from gymfleet.testing.waits import processes_gone, wait_until, wait_until_async  # noqa: F401  (re-exported)
from gymfleet.wire import make_response  # noqa: F401  (tests build responses with it from here)

log = logging.getLogger(__name__)


class _ThreadServer(uvicorn.Server):
    """uvicorn's server, stopped from the test's thread without uvicorn's fixed waits: `stop()` ends the main loop
    at once (uvicorn looks at `should_exit` every 0.1 s), and shutdown polls for the connections to close every
    5 ms (uvicorn pauses 0.1 s, then polls every 0.1 s). Every `serve()` of a test suite pays those waits once,
    so they add up to minutes."""

    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)

    def stop(self) -> None:
        self.should_exit = True
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed: nothing to wake
                self._loop.call_soon_threadsafe(self._wake.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown (stop accepting, ask each connection to close, wait for them and for the app's
        tasks up to `timeout_graceful_shutdown`, then the lifespan's shutdown), with short polls."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout_graceful_shutdown
        while (self.server_state.connections or self.server_state.tasks) and loop.time() < deadline:
            await asyncio.sleep(0.005)
        for task in self.server_state.tasks:
            task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()


SERVE_STOP_TIMEOUT_S = 10.0
SERVE_START_TIMEOUT_S = 60.0
"""How long `serve` waits for the app's startup: a bound against a hang (a loaded CI machine is slow to start one)."""


@contextmanager
def serve(app: Any, *, host: str = "127.0.0.1", intake: Any = None) -> Iterator[str]:
    """Serve `app` in a background thread, as a fleet serves it (`gymfleet.serving.accept_gate.GatedServer`: batched
    writes and, with `intake`, a server's `IntakePacer`); yields its base URL (`http://127.0.0.1:<port>`)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1, proxy_headers=False,
                            timeout_keep_alive=SERVER_KEEP_ALIVE_S)
    from gymfleet.serving.accept_gate import GatedServer

    class _ThreadGatedServer(_ThreadServer, GatedServer):
        pass

    server = _ThreadGatedServer(config, intake)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + SERVE_START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("test server failed to start: its thread ended (see the log for the app's error)")
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"test server did not start within {SERVE_START_TIMEOUT_S:g}s (its lifespan startup "
                               "hangs?)")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.stop()
        thread.join(SERVE_STOP_TIMEOUT_S)
        sock.close()
        if thread.is_alive():  # the test waited the whole timeout: say so, it is the test's wall time
            log.warning("the test server's thread did not stop within %gs: its event loop waits on something the "
                        "test left running (e.g. a thread of `asyncio.to_thread` still blocked)", SERVE_STOP_TIMEOUT_S)


NEWER_RESPONSES_PARAMS: dict[str, Any] = {
    "context_management": [{"type": "compaction", "compact_threshold": 20000}],
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"ttl": "30m"},
    "stream_options": {"include_obfuscation": False},
    "moderation": {"model": "omni-moderation-latest"},
    "image": {"context_compression": "auto"},
    "access_programs": {"cyber": "standard"},
    "background_options": {"completion_window": "soonest"},
}
"""Responses API parameters newer `openai` clients send that gymfleet's `ResponseCreateParams` does not declare."""


def check_resources_server(url: str, rows: list[dict[str, Any]], texts: list[str | None] | None = None) -> None:
    """Conformance checks on a running resources server; raises AssertionError naming the failed check.

    For each row: `/seed_session` answers 200 and sets a cookie; `/verify` with a response (`texts[i]`, default an
    empty answer) answers 200, echoes every row field unchanged, returns a finite float `reward`, and gives the same
    reward twice (determinism), and carries a `reward_provenance` whose `version` is not `v0` (the module
    docstring's `## Version history` must have a `- vN:` entry; `gymfleet.serving.provenance`).
    Also `GET /` is live, `/reverify_mode` answers a known mode, `/metrics` is
    Prometheus text, `/aggregate_metrics` accepts the results, and a body that is not a row is a 422.
    """
    import httpx

    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/").json() == {"status": "ok"}, "GET / liveness"
        assert client.get("/reverify_mode").json() in ("stateless", "unsupported", "unknown"), "reverify_mode"
        results = []
        for index, row in enumerate(rows):
            client.cookies.clear()  # each row is its own rollout: a fresh session
            seeded = client.post("/seed_session", json=row)
            assert seeded.status_code == 200, f"row {index}: /seed_session {seeded.status_code}: {seeded.text}"
            assert seeded.cookies, f"row {index}: /seed_session set no session cookie"
            text = texts[index] if texts else ""
            body = {**row, "response": make_response(text)}
            rewards = []
            for _ in range(2):
                verified = client.post("/verify", json=body)  # the jar carries the seeded session cookie
                assert verified.status_code == 200, f"row {index}: /verify {verified.status_code}: {verified.text}"
                result = verified.json()
                for key, value in row.items():
                    assert result.get(key) == value, f"row {index}: /verify did not echo field {key!r}"
                reward = result.get("reward")
                assert isinstance(reward, float | int) and math.isfinite(reward), f"row {index}: reward {reward!r}"
                rewards.append(reward)
            assert rewards[0] == rewards[1], f"row {index}: /verify not deterministic: {rewards}"
            provenance = result.get("reward_provenance")
            assert isinstance(provenance, dict), f"row {index}: /verify answer has no reward_provenance"
            assert provenance.get("version") not in (None, "v0"), (
                f"row {index}: reward_provenance version is {provenance.get('version')!r}: the environment module's "
                "docstring needs a `## Version history` section with a `- v1: ...` entry"
            )
            results.append(result)
        aggregated = client.post("/aggregate_metrics", json={"verify_responses": results})
        assert aggregated.status_code == 200 and "agent_metrics" in aggregated.json(), "aggregate_metrics"
        assert client.post("/verify", json={"not": "a row"}).status_code == 422, "malformed /verify must be 422"
        assert "gymfleet_requests" in client.get("/metrics").text, "/metrics"


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now (for a head server a test starts)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def spawn_server(argv: list[str], port: int, *, timeout_s: float = 60, **popen: Any) -> tuple[Any, str]:
    """Start a server process (`argv`, listening on 127.0.0.1:`port`) and wait until it answers HTTP.

    Any HTTP answer to `GET /` counts, a 404 included. `popen` goes to `subprocess.Popen` (`cwd`, `stderr`, ...).

    Returns:
        The `Popen` (the caller terminates it) and the base URL.

    Raises:
        RuntimeError: the process exited, or did not answer within `timeout_s` (it is killed).
    """
    import subprocess
    import urllib.error
    import urllib.request

    process = subprocess.Popen(argv, **popen)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url + "/", timeout=1):
                return process, url
        except urllib.error.HTTPError:
            return process, url
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"{' '.join(argv)} did not start serving {url}") from None
            time.sleep(0.1)


def scripted_policy(rules: list[dict[str, Any]] | None = None, default_text: str | None = "I am not sure.",
                    instance: str = "scripted_llm") -> dict[str, Any]:
    """Config keys that make a fleet's policy model (`policy_base_url`, ...) the scripted model `instance`,
    answering by `rules` (and `default_text` when none matches): merge them into `running_fleet`'s `extra`."""
    model: dict[str, Any] = {"entrypoint": "app.py", "model": "scripted"}
    if rules is not None:
        model["rules"] = rules
    if default_text is not None:
        model["default"] = {"text": default_text}
    path = f"{instance}.responses_api_models.scripted_model"
    return {
        instance: {"responses_api_models": {"scripted_model": model}},
        "policy_base_url": f"http://${{{path}.host}}:${{{path}.port}}/v1",
        "policy_api_key": "not-needed",
        "policy_model_name": "scripted",
    }


@contextmanager
def running_fleet(config_paths: list[str], extra: dict[str, Any] | None = None) -> Iterator[Any]:
    """Start a real fleet (`ng_run`'s supervisor, real subprocesses) from config files; yields the `Fleet`.

    `extra` is merged over the files, as NeMo-RL's `initial_global_config_dict` is. The head server gets a free
    port; `fleet.config` has every instance's URL.
    """
    from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
    from gymfleet.fleet.supervisor import Fleet

    initial = {
        "config_paths": list(config_paths),
        "head_server": {"host": "127.0.0.1", "port": free_port()},
        **(extra or {}),
    }
    config = parse_global_config(
        GlobalConfigDictParserConfig(initial_global_config_dict=initial, skip_load_from_cli=True)
    )
    fleet = Fleet(config)
    fleet.start(timeout_s=120)
    try:
        yield fleet
    finally:
        fleet.shutdown()


def ng_status_all_live(head_port: int, *args: str, timeout_s: float = 120.0) -> Any:
    """`ng_status +head_server.port=<head_port> <args>` (a subprocess), asked again until it says every instance is
    live (exit 0); returns that `CompletedProcess`. Once is not enough on a loaded machine: a server may miss
    ng_status's 2 s probe, and a model server's own probe of its upstream (every second) may not have answered yet
    when the fleet said ready (or the head, that a restarted server runs).

    Raises:
        AssertionError: not all live within `timeout_s`; the message has ng_status's last output.
    """
    import subprocess
    import sys

    from gymfleet.fleet.config_instances import repository_root

    said: list[subprocess.CompletedProcess] = []

    def all_live() -> subprocess.CompletedProcess | None:
        said[:] = [subprocess.run([sys.executable, "-m", "gymfleet.cli.status", f"+head_server.port={head_port}",
                                   *args], cwd=repository_root(), capture_output=True, text=True, timeout=120)]
        return said[0] if said[0].returncode == 0 else None

    return wait_until(all_live, f"ng_status says every instance of the fleet on head port {head_port} is live",
                      timeout_s=timeout_s, interval_s=1, explain=lambda: said[0].stdout + said[0].stderr)


def fleet_headers(head: Any = None) -> dict[str, str]:
    """Headers carrying a fleet's token: of `head` (a `Fleet` / `RayFleet` this process started), of the fleet whose
    head server listens on this machine at `head` (its port, or its URL), or (none given) of the one fleet this
    process started (`running_fleet`, `RunHelper`); no headers if it started none (a bare app needs none)."""
    from urllib.parse import urlsplit

    from gymfleet import auth

    if getattr(head, "token", None):
        return {auth.TOKEN_HEADER: head.token}
    if head is not None:
        head_port = head if isinstance(head, int) else urlsplit(head).port
        token = auth.token_for("127.0.0.1", head_port)
        if not token:
            raise RuntimeError(f"no fleet token for the head server on port {head_port}: "
                               f"{auth.token_path('', head_port)} does not exist")
        return {auth.TOKEN_HEADER: token}
    tokens = auth.started_here()
    if not tokens:
        return {}
    if len(tokens) > 1:
        raise RuntimeError(f"fleet_headers(): this process runs {len(tokens)} fleets; pass the head server's port")
    return {auth.TOKEN_HEADER: tokens[0]}


def nemo_gym_examples(env: str) -> Path:
    """The folder of NeMo-Gym's own example rows for `env`: `resources_servers/<env>/data` in NeMo-Gym's wheel
    (`gymfleet.testing.nemo_gym_wheel`: downloaded from the package index once, version-checked, cached).

    Raises:
        FileNotFoundError: the release has no such environment or it ships no `data/` folder.
        gymfleet.testing.nemo_gym_wheel.WheelUnavailableError: the wheel could not be downloaded.
    """
    from gymfleet.testing.nemo_gym_wheel import nemo_gym_folder

    folder = nemo_gym_folder(env) / "data"
    if not folder.is_dir():
        raise FileNotFoundError(f"NeMo-Gym's {env} ships no data/ folder ({folder})")
    return folder


def jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of the JSONL file at `path`, one a line (no blank lines expected)."""
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def environment_block(env: str, root: Path | None = None) -> tuple[str, dict[str, Any]]:
    """The resources server instance that environment `env`'s own config (`resources_servers/<env>/configs/<env>.yaml`
    under `root`, gymfleet's checkout unless given) declares: its instance name and its fields.

    Raises:
        AssertionError: the config declares no `resources_servers.<env>` instance.
    """
    import yaml

    from gymfleet.fleet.config_instances import repository_root

    path = (root or repository_root()) / "resources_servers" / env / "configs" / f"{env}.yaml"
    for name, block in yaml.safe_load(path.read_text()).items():
        if isinstance(block, dict) and env in (block.get("resources_servers") or {}):
            return name, block["resources_servers"][env]
    raise AssertionError(f"configs/{env}.yaml declares no resources_servers.{env} instance")
