"""Fuzz soak: the HTTP fuzz of tests/test_fuzz_http.py with a big budget, each server in its own process.

The same eight server types (scripted_model, vllm_model in front of it, mcqa, workplace_assistant, genrm_compare,
simple_agent, head, sandbox), each started as its own `python bench/fuzz_soak.py --serve ...` process, are fuzzed
round after round until `--minutes` run out: every round draws `--examples` fresh bodies per route from the
server's OpenAPI (a new hypothesis seed per round) and, every `--hostile-every` rounds, sends every hostile body to
every route. Nothing stops at the first failure: 500s, untyped 5xx, hangs (no answer within the client timeout) and
crashes (the process died; it is restarted) are counted, and the first of each kind is printed.

    python bench/fuzz_soak.py [--minutes 3] [--examples 50] [--hostile-every 3] [--scoring-examples 0]

Prints one row per server: requests, 2xx/4xx, 500s, other 5xx (typed), hangs, crashes, and RSS (MiB) after
start-up, at its peak between rounds, and at the end. `--scoring-examples N` also runs tests/test_fuzz_scoring.py
with N examples per property (`GYMFLEET_FUZZ_EXAMPLES`) and prints its pytest summary line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench._common import require_modules  # noqa: E402

require_modules("bench/fuzz_soak.py", "hypothesis", "pytest", install="pip install -e '.[test]'")

import test_fuzz_http as fuzz  # noqa: E402

from gymfleet.testing import free_port, spawn_server  # noqa: E402


def serve_one(name: str, port: int, urls: dict[str, str]) -> None:
    """Child process: serve server `name` on `port`."""
    import uvicorn

    logging.basicConfig(level=logging.ERROR)
    uvicorn.run(fuzz.build_app(name, urls), host="127.0.0.1", port=port, log_level="critical")


class Server:
    """One server process and its tallies."""

    def __init__(self, name: str, urls: dict[str, str]):
        self.name, self.urls = name, dict(urls)
        self.tally = {"requests": 0, "2xx": 0, "4xx": 0, "500": 0, "5xx_typed": 0, "5xx_untyped": 0, "hangs": 0,
                      "crashes": 0}
        self.first: dict[str, str] = {}
        self.rss_start = self.rss_peak = self.rss_end = 0.0
        self.start()

    def start(self) -> None:
        port = free_port()
        argv = [sys.executable, __file__, "--serve", self.name, str(port), json.dumps(self.urls)]
        self.process, self.url = spawn_server(argv, port, timeout_s=120, cwd=str(ROOT),
                                              stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    def rss_mib(self) -> float:
        try:
            return psutil.Process(self.process.pid).memory_info().rss / 2**20
        except psutil.Error:
            return 0.0

    def note(self, kind: str, message: str) -> None:
        self.tally[kind] += 1
        if kind not in self.first:
            self.first[kind] = message[:400]
            print(f"  [{self.name}] first {kind}: {message[:400]}", flush=True)

    def alive(self) -> bool:
        if self.process.poll() is None:
            return True
        self.note("crashes", f"exit status {self.process.returncode}")
        self.start()
        return False


def record_answers(server_of: dict[str, Server]) -> None:
    """Replace the test module's assert-and-stop checks with ones that count and go on."""
    original_send = fuzz.send

    def send(client, url, method, path, body=None, raw=None, headers=None):
        server = server_of[url]
        server.tally["requests"] += 1
        try:
            return original_send(client, url, method, path, body, raw, headers)
        except fuzz.pytest.fail.Exception as exc:
            server.note("hangs", f"{method.upper()} {path}: {exc}")
        except httpx.TransportError as exc:
            server.alive()
            server.note("hangs" if server.process.poll() is None else "crashes", f"{method.upper()} {path}: {exc!r}")
        return httpx.Response(499, json={"error_type": "soak_no_answer"})

    def check_answer(answer: httpx.Response, what: str) -> None:
        if answer.status_code == 499:  # no answer: `send` counted it
            return
        target = answer.request.url
        server = server_of[f"{target.scheme}://{target.host}:{target.port}"]
        code = answer.status_code
        if code < 300:
            server.tally["2xx"] += 1
        elif code < 500:
            server.tally["4xx"] += 1
        elif code == 500:
            server.note("500", f"{what}: {answer.text[:300]}")
        elif code in fuzz.TYPED_UPSTREAM and "error_type" in answer.text:
            server.tally["5xx_typed"] += 1
        else:
            server.note("5xx_untyped", f"{what}: {code} {answer.text[:300]}")

    fuzz.send = send
    fuzz.check_answer = check_answer


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run_scoring(examples: int) -> None:
    env = {**os.environ, "GYMFLEET_FUZZ_EXAMPLES": str(examples)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_fuzz_scoring.py"], cwd=ROOT, env=env, capture_output=True, text=True)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    print(f"scoring properties, {examples} examples each: {summary} ({time.monotonic() - started:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--examples", type=int, default=50, help="bodies per route per round")
    parser.add_argument("--hostile-every", type=int, default=3, help="send the hostile bodies every N rounds")
    parser.add_argument("--scoring-examples", type=int, default=0, help="also run the scoring properties")
    parser.add_argument("--serve", nargs=3, metavar=("NAME", "PORT", "URLS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve_one(args.serve[0], int(args.serve[1]), json.loads(args.serve[2]))
        return 0
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)

    servers: dict[str, Server] = {}
    urls: dict[str, str] = {}
    for name in fuzz.SERVER_NAMES:
        servers[name] = Server(name, urls)
        urls[name] = servers[name].url
    server_of = {server.url: server for server in servers.values()}
    record_answers(server_of)
    time.sleep(1)
    for server in servers.values():
        server.rss_start = server.rss_peak = server.rss_mib()

    deadline = time.monotonic() + args.minutes * 60
    rounds = 0
    signal.signal(signal.SIGTERM, _interrupt)  # a `timeout` wrapper still gets the table
    with httpx.Client(timeout=fuzz.CLIENT_TIMEOUT_S) as client, contextlib.suppress(KeyboardInterrupt):
        while time.monotonic() < deadline:
            rounds += 1
            for name, server in servers.items():
                if time.monotonic() >= deadline:
                    break
                server.alive()
                server_of[server.url] = server
                try:
                    examples = args.examples if name != "sandbox" else max(5, args.examples // 3)
                    fuzz.fuzz_server(client, name, server.url, examples, seed=rounds)
                    if rounds % args.hostile_every == 1 or args.hostile_every == 1:
                        fuzz.hostile_server(client, name, server.url)
                except AssertionError as exc:  # "stopped answering"
                    server.note("crashes", str(exc))
                server.rss_peak = max(server.rss_peak, server.rss_mib())
            print(f"round {rounds} done, {sum(s.tally['requests'] for s in servers.values())} requests",
                  flush=True)
    for server in servers.values():
        server.rss_end = server.rss_mib()
        server.process.terminate()
    for server in servers.values():
        server.process.wait(10)

    minutes = (time.monotonic() - deadline) / 60 + args.minutes
    print(f"\n{rounds} rounds in {minutes:.1f} min, {args.examples} bodies per route per round\n")
    columns = ["requests", "2xx", "4xx", "500", "5xx_typed", "5xx_untyped", "hangs", "crashes"]
    print(f"{'server':<20}" + "".join(f"{c:>12}" for c in columns) + f"{'RSS start':>11}{'peak':>8}{'end':>8}")
    for name, server in servers.items():
        print(f"{name:<20}" + "".join(f"{server.tally[c]:>12}" for c in columns)
              + f"{server.rss_start:>11.0f}{server.rss_peak:>8.0f}{server.rss_end:>8.0f}")
    if args.scoring_examples:
        run_scoring(args.scoring_examples)
    bad = sum(server.tally[kind] for server in servers.values() for kind in ("500", "5xx_untyped", "hangs", "crashes"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
