"""What several bench scripts share: background samplers, a `/run`-timing client, a closed-loop load driver.

Imported after the script has put the repository root on `sys.path` (each script does so first).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from gymfleet import http
from gymfleet.http import ServerClient
from gymfleet.rollouts.collect import CollectionSummary, collect
from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig
from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper


@contextlib.contextmanager
def started_fleet(config: dict[str, Any]) -> Iterator[tuple[RunHelper, float]]:
    """The fleet `config` describes, started by `RunHelper` as NeMo-RL starts one, and the seconds it took to come
    up. On leaving the block normally the fleet is polled (a server that died fails the run), then shut down."""
    rh = RunHelper()
    started = time.perf_counter()
    rh.start(GlobalConfigDictParserConfig(initial_global_config_dict=config, skip_load_from_cli=True))
    try:
        yield rh, time.perf_counter() - started
        rh.poll()
    finally:
        rh.shutdown()


class Sampler:
    """Calls `sample()` in a background thread every `interval_s` while in its `with` block."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)


class RSSSampler(Sampler):
    """The peak RSS of one process with its children (processes that exit between two looks are skipped)."""

    def __init__(self, pid: int, interval_s: float = 0.1):
        super().__init__(interval_s)
        self.process, self.peak = psutil.Process(pid), 0

    def rss(self) -> int:
        total = 0
        for process in [self.process, *self.process.children(recursive=True)]:
            try:
                total += process.memory_info().rss
            except psutil.Error:
                pass
        return total

    def sample(self) -> None:
        self.peak = max(self.peak, self.rss())


class TimedClient(ServerClient):
    """A `ServerClient` that records how long each `/run` took (dispatch to answer)."""

    def __init__(self, config: dict):
        super().__init__(config)
        self.latencies: list[float] = []

    async def post(self, server: str, path: str, **kwargs):
        started = time.perf_counter()
        try:
            return await super().post(server, path, **kwargs)
        finally:
            if path == "/run":
                self.latencies.append(time.perf_counter() - started)


async def timed_collect(config: RolloutCollectionConfig, head_port: int, pid: int
                        ) -> tuple[CollectionSummary, TimedClient, float, RSSSampler]:
    """`collect` through the fleet at `head_port` while sampling `pid`'s RSS: (summary, client, wall s, sampler)."""
    try:
        client = TimedClient((await ServerClient.from_head("127.0.0.1", head_port)).config)
        with RSSSampler(pid) as sampler:
            started = time.perf_counter()
            summary = await collect(config, client, progress=False)
            wall_s = time.perf_counter() - started
        return summary, client, wall_s, sampler
    finally:
        await http.close()


async def closed_loop(url: str, body: Any, concurrency: int, seconds: float, timeout_s: float,
                      cookies: dict[str, str] | None = None) -> dict[str, float]:
    """POST `body` to `url` from `concurrency` workers, each sending its next request when the last is answered,
    for `seconds`: requests per second, p50/p99 latency (ms), errors (non-200 answers and failed calls), count."""
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker():
        nonlocal errors
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            try:
                response = await http.request("POST", url, json=body, cookies=cookies, timeout_s=timeout_s,
                                              retry=http.NO_RETRY)
                errors += response.status != 200
            except Exception:  # noqa: BLE001 - a benchmark counts every failure
                errors += 1
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    await http.close()
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "errors": errors,
        "n": len(latencies),
    }


def _not_installed(name: str) -> bool:
    """No module `name`, or only a namespace package of that name (a folder of the repository root without an
    `__init__.py`, such as `docker/`, imports as one where the package is not installed)."""
    spec = importlib.util.find_spec(name)
    return spec is None or spec.origin is None


def require_modules(bench: str, *modules: str, install: str) -> None:
    """Stop `bench` with one line naming the `modules` it needs that are not importable and how to install them:
    after `pip install -e .` alone, a bench that needs an optional extra (Ray, the test tools) says so up front,
    before it starts a fleet or prints a traceback.

    Raises:
        SystemExit: some of `modules` cannot be imported (exit status 1, the line on stderr).
    """
    missing = [name for name in modules if _not_installed(name)]
    if missing:
        raise SystemExit(f"{bench} needs {' and '.join(missing)}, which `pip install -e .` does not install: "
                         f"{install}")


WRK_CORE, SERVER_CORE = 1, 0
"""With `--wrk`, the load generator runs on this core and the servers on that one (`pin_to_server_core`)."""


def pin_to_server_core(pid: int) -> None:
    """Keep process `pid` on `SERVER_CORE` (with `--wrk`: wrk gets the other core, so each measures alone)."""
    os.sched_setaffinity(pid, {SERVER_CORE})


def settle(pid: int, timeout_s: float = 30.0, quiet_share: float = 0.02, interval_s: float = 0.2) -> float:
    """Wait until process `pid` has used under `quiet_share` of a core for `interval_s` (at most `timeout_s`);
    returns the seconds waited. `wrk` stops at its deadline without waiting for its answers: with thousands in
    flight the server works through them for a second or more after, on the core the next round's server runs on."""
    process = psutil.Process(pid)
    began = time.monotonic()
    before = sum(process.cpu_times()[:2])
    while time.monotonic() - began < timeout_s:
        time.sleep(interval_s)
        now = sum(process.cpu_times()[:2])
        if now - before < quiet_share * interval_s:
            break
        before = now
    return time.monotonic() - began


def wrk_loop(url: str, body: bytes, concurrency: int, seconds: float, cookies: dict[str, str] | None = None,
             headers: dict[str, str] | None = None) -> dict[str, float]:
    """`closed_loop`'s numbers from `wrk` (C, one thread on `WRK_CORE`): a load generator that costs far less per
    request than any Python client, so the server, not the client, is what saturates. Needs `wrk` on PATH (Debian:
    `apt-get install wrk`)."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("--wrk needs the wrk load generator on PATH: apt-get install wrk (Debian/Ubuntu)")
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    if cookies:
        all_headers["Cookie"] = "; ".join(f"{name}={value}" for name, value in cookies.items())
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write('wrk.method = "POST"\n' + f"wrk.body = {json.dumps(body.decode())}\n"
                     + "".join(f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}\n" for k, v in all_headers.items()))
    try:
        out = subprocess.run(
            [wrk, "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout", "120s", "--latency",
             "-s", script.name, url],
            capture_output=True, text=True, timeout=seconds + 60,
            preexec_fn=lambda: os.sched_setaffinity(0, {WRK_CORE}),
        ).stdout
    finally:
        os.unlink(script.name)
    count = re.search(r"(\d+) requests in ([\d.]+)(\w+)", out)
    percentiles = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)\s*$", out, re.MULTILINE))
    if count is None or len(percentiles) != 2:
        raise RuntimeError(f"wrk printed no request count or percentiles:\n{out}")
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50_ms": _wrk_ms(percentiles["50"]),
        "p99_ms": _wrk_ms(percentiles["99"]),
        "errors": (int(non_2xx.group(1)) if non_2xx else 0)
                  + (sum(map(int, socket_errors.groups())) if socket_errors else 0),
        "n": int(count.group(1)),
    }


def _wrk_ms(value: str) -> float:
    """A wrk duration ("812.00us", "1.23ms", "2.01s", "1.5m") in milliseconds."""
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value).groups()
    return float(number) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}[unit]


def median_round(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each key's median over rounds (of `closed_loop` results)."""
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


async def asgi_us_per_request(apps: dict[str, Any], path: str, body: bytes, headers: list[tuple[bytes, bytes]] = (),
                              n: int = 10_000, blocks: int = 10) -> dict[str, float]:
    """µs of CPU per `POST path` for each ASGI app called directly (no network), in alternating blocks of `n /
    blocks` requests: the fastest block of each (other work on the machine only ever makes a block slower)."""
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), *headers]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
        "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5000),
    }  # fmt: skip

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"POST {path} answered {message['status']}")

    per_block = max(1, n // blocks)
    timings: dict[str, list[float]] = {kind: [] for kind in apps}
    for app in apps.values():  # warm-up (builds the middleware stacks)
        for _ in range(200):
            await app(dict(scope), receive, send)
    for block in range(blocks):
        for kind in (list(apps) if block % 2 == 0 else list(reversed(apps))):
            app = apps[kind]
            start = time.process_time()
            for _ in range(per_block):
                await app(dict(scope), receive, send)
            timings[kind].append((time.process_time() - start) / per_block * 1e6)
    return {kind: min(values) for kind, values in timings.items()}


def write_plots(path: Path | None, plots: list[dict[str, Any]]) -> None:
    """Write a bench's numbers for `bench/report.py` (`--json PATH`; nothing without a path). Each plot is
    `{"title", "x_label", "y_label", "series": {name: [[x, y], ...]}}`; string x values make a bar chart."""
    if path is not None:
        path.write_text(json.dumps({"plots": plots}, indent=1))


def checkout_script(script: Path, checkout: Path | None) -> tuple[Path, dict[str, str] | None]:
    """Bench `script` as another `checkout` has it (say, of main), with that checkout's code first on the path for
    the process that runs it; `checkout` None: this one. Returns the script and the environment to run it with."""
    if checkout is None:
        return script, None
    checkout = checkout.resolve()
    return checkout / "bench" / script.name, {**os.environ, "PYTHONPATH": str(checkout)}


async def sandbox_run(url: str, code: str) -> None:
    """One `/run` of `code` through the sandbox service at `url`; anything but `ok` is an error."""
    answer = (await http.request("POST", f"{url}/run", json={"code": code}, timeout_s=60)).json()
    if answer.get("status") != "ok":
        raise RuntimeError(f"sandbox run failed: {answer}")


async def bare_python_run(python: str, code: str) -> None:
    """`code` run by a bare `python` with the flags the sandbox uses (`-I -S -c`), as an asyncio subprocess."""
    process = await asyncio.create_subprocess_exec(
        python, "-I", "-S", "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={}
    )
    await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"bare run failed with status {process.returncode}")
