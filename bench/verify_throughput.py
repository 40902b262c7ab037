"""`/verify` throughput and latency: mcqa beside a bare FastAPI endpoint, at several concurrencies, in one run.

Both servers run at once, each alone in its own process: the bare app as plain uvicorn serves it, mcqa as `ng_run`
serves each server (`gymfleet.fleet.launch.serve_app`: one uvicorn worker with the fleet's settings, accept gate and
batched writes). The load generator is this process, using gymfleet's own HTTP client (aiohttp), or with `--wrk`,
`wrk` pinned to one core with every server pinned to the other: a client that costs far less per request than the
server, so each server's own cost is what shows (on 2 cores a Python client is the bottleneck, and the ratio it
gives is nearer 1). The bare endpoint parses the same JSON body and returns a constant, so the gap between the two
columns is what gymfleet's serving, middleware, validation and mcqa's grading cost. Every request carries mcqa's
session cookie, as an agent's `/verify` does. The CPU column is the server process's own user and system CPU per
request over the round: the steadiest of the numbers.
After each round the bench waits until that server is idle again (`bench._common.settle`): `wrk` stops without
waiting for its answers, and a server still working through a few thousand of them would weigh on the next round.

Rounds alternate between the servers (bare, mcqa, then mcqa, bare, ...) so that other work on the machine weighs on
both alike; each cell is the median round. A first line gives the CPU each app spends per request when called in
process (ASGI, no network, no client): the cleanest number, and the one least moved by a loaded machine.

    python bench/verify_throughput.py [--concurrency 1 16 256 4096] [--seconds 4] [--rounds 3] [--baseline DIR]
                                      [--wrk]

Prints one table: requests/s, p50 and p99 latency, and the server's RSS, for both servers at each concurrency, and
mcqa's share of bare's requests/s. `--baseline DIR` adds a third server, mcqa as another checkout serves it (say a
`git worktree` of the commit to compare with), to the same rounds: a before/after under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import orjson
import psutil
from fastapi import FastAPI, Request

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import (  # noqa: E402
    asgi_us_per_request,
    checkout_script,
    closed_loop,
    median_round,
    pin_to_server_core,
    settle,
    write_plots,
    wrk_loop,
)
from gymfleet import http  # noqa: E402
from gymfleet.testing import free_port, make_response, spawn_server  # noqa: E402

ROW = json.loads((ROOT / "resources_servers/mcqa/data/example.jsonl").read_text().splitlines()[0])
ANSWER = "Mercury has the shortest year, about 88 days. " * 20 + "\n\n\\boxed{B}"
KINDS = ("bare", "mcqa")


def _bare_app():
    app = FastAPI()

    @app.post("/verify")
    async def verify(request: Request):
        await request.json()
        return {"reward": 1.0}

    return app


def _mcqa_app():
    from resources_servers.mcqa.app import MCQAServer

    return MCQAServer({"name": "mcqa", "domain": "knowledge"}).create_app()


def build_app(kind: str):
    return _bare_app() if kind == "bare" else _mcqa_app()


def serve(kind: str, port: int) -> None:
    """The bare app as plain uvicorn serves it; mcqa as a fleet serves each server (`gymfleet.fleet.launch.serve_app`:
    the fleet's uvicorn settings, accept gate and batched writes), on a socket bound here."""
    import logging

    import uvicorn

    logging.basicConfig(level=logging.ERROR)
    if kind == "bare":
        uvicorn.run(build_app(kind), host="127.0.0.1", port=port, log_level="error", access_log=False, backlog=8192)
        return
    from gymfleet.fleet import launch

    sock = socket.create_server(("127.0.0.1", port), backlog=8192)
    launch.serve_app(build_app(kind), sock)


async def _session_cookies(url: str) -> dict[str, str]:
    try:
        return (await http.request("POST", url + "/seed_session", json=ROW)).cookies
    finally:
        await http.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 256, 4096])
    parser.add_argument("--seconds", type=float, default=4.0, help="length of one round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per server and concurrency (alternating)")
    parser.add_argument("--asgi-requests", type=int, default=6000, help="in-process requests per app (0: skip)")
    parser.add_argument("--baseline", type=Path, help="a checkout whose mcqa is served as a third column")
    parser.add_argument("--wrk", action="store_true",
                        help="load from wrk on one core, every server pinned to the other (needs wrk: apt-get install "
                             "wrk): what each server does when it, not a Python client, is the bottleneck")
    parser.add_argument("--json", type=Path, help="also write the numbers there (for bench/report.py)")
    parser.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return

    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65535), hard))
    body = {**ROW, "response": make_response(ANSWER)}
    asgi: dict[str, float] = {}
    if args.asgi_requests:
        apps = {kind: build_app(kind) for kind in KINDS}
        cookies = asyncio.run(asgi_cookie(apps["mcqa"]))
        asgi = asyncio.run(asgi_us_per_request(apps, "/verify", orjson.dumps(body), cookies, args.asgi_requests))
        print(f"in process (ASGI, no network; fastest of alternating blocks): bare {asgi['bare']:.0f} µs/request, "
              f"mcqa {asgi['mcqa']:.0f} µs/request (bare/mcqa {asgi['bare'] / asgi['mcqa']:.2f})")

    kinds = [*KINDS, "baseline"] if args.baseline else list(KINDS)
    servers = {}
    try:
        for kind in kinds:
            port = free_port()
            script, env = checkout_script(Path(__file__), args.baseline if kind == "baseline" else None)
            serve_kind = "mcqa" if kind == "baseline" else kind
            argv = [sys.executable, str(script), "--serve", serve_kind, "--port", str(port)]
            servers[kind] = spawn_server(argv, port, env=env)
            if args.wrk:
                pin_to_server_core(servers[kind][0].pid)
        cookies = asyncio.run(_session_cookies(servers["mcqa"][1]))
        baseline_cookies = asyncio.run(_session_cookies(servers["baseline"][1])) if args.baseline else {}
        for kind, (_, url) in servers.items():  # warm-up
            asyncio.run(closed_loop(url + "/verify", body, 16, 1.0, timeout_s=120,
                                    cookies=baseline_cookies if kind == "baseline" else cookies))
        results: dict[tuple[str, int], list[dict]] = {}
        for concurrency in args.concurrency:
            for round_ in range(args.rounds):
                for kind in (kinds if round_ % 2 == 0 else kinds[::-1]):
                    process, url = servers[kind]
                    server = psutil.Process(process.pid)
                    before = server.cpu_times()
                    jar = baseline_cookies if kind == "baseline" else cookies
                    if args.wrk:
                        result = wrk_loop(url + "/verify", orjson.dumps(body), concurrency, args.seconds, jar)
                    else:
                        result = asyncio.run(closed_loop(url + "/verify", body, concurrency, args.seconds,
                                                         timeout_s=120, cookies=jar))
                    after = server.cpu_times()
                    result["cpu_us"] = ((after.user + after.system) - (before.user + before.system)) * 1e6 / max(
                        1, result["n"])
                    result["rss_mb"] = server.memory_info().rss / 2**20
                    settle(process.pid)  # the answers still owed (wrk does not wait for them) are not the next's load
                    results.setdefault((kind, concurrency), []).append(result)
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(10)

    load = ("wrk on core 1, servers on core 0" if args.wrk
            else "this process's aiohttp client, on the same cores as the servers")
    print(f"body {len(json.dumps(body))} bytes; median of {args.rounds} alternating rounds of {args.seconds:g}s per "
          f"cell; load: {load}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; CPU: the server "
          "process's user + system CPU per request")
    header = f"{'conc':>5} | " + " | ".join(
        f"{kind + ' req/s':>14} {'p50 ms':>8} {'p99 ms':>8} {'CPU µs':>7} {'RSS MB':>7}" for kind in kinds
    ) + " | " + " ".join(f"{kind + '/bare':>13}" for kind in kinds[1:]) + " | errors " + "/".join(kinds)
    print(header)
    print("-" * len(header))
    for concurrency in args.concurrency:
        cells = {kind: median_round(results[kind, concurrency]) for kind in kinds}
        errors = "/".join(str(sum(r["errors"] for r in results[kind, concurrency])) for kind in kinds)
        print(f"{concurrency:>5} | " + " | ".join(
            f"{c['rps']:>14.0f} {c['p50_ms']:>8.2f} {c['p99_ms']:>8.2f} {c['cpu_us']:>7.0f} {c['rss_mb']:>7.0f}"
            for c in cells.values()
        ) + " | " + " ".join(f"{cells[kind]['rps'] / cells['bare']['rps']:>13.2f}" for kind in kinds[1:])
              + f" | {errors}")
    medians = {key: median_round(rounds) for key, rounds in results.items()}
    in_process = [{"title": "CPU per /verify, in process (ASGI, no network)", "x_label": "app", "y_label": "µs",
                   "series": {"µs per request": [[kind, asgi[kind]] for kind in KINDS]}}] if asgi else []
    write_plots(args.json, in_process + [
        {"title": "/verify requests/s, mcqa beside a bare FastAPI endpoint", "x_label": "requests in flight",
         "y_label": "requests/s", "log_x": True,
         "series": {kind: [[c, medians[kind, c]["rps"]] for c in args.concurrency] for kind in kinds}},
        {"title": "/verify p99 latency", "x_label": "requests in flight", "y_label": "p99 ms", "log_x": True,
         "series": {kind: [[c, medians[kind, c]["p99_ms"]] for c in args.concurrency] for kind in kinds}},
    ])


async def asgi_cookie(app) -> list[tuple[bytes, bytes]]:
    """The `cookie` header of a session `app` started (its `/seed_session` called in process)."""
    started = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            started.extend(value.split(b";")[0] for key, value in message["headers"] if key == b"set-cookie")

    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"), (b"content-length", b"2")]
    scope = {"type": "http", "method": "POST", "path": "/seed_session", "raw_path": b"/seed_session",
             "headers": headers, "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1"}
    await app(scope, receive, send)
    if not started:
        raise RuntimeError("/seed_session answered no session cookie")
    return [(b"cookie", started[0])]


if __name__ == "__main__":
    main()
