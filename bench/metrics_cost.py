"""What `/metrics` costs per request: a trivial route with gymfleet's metrics on and off, side by side, in one run.

Both servers are the same `gymfleet.serving.server.Server` app with one plain route (`POST /ping`, answering
`{"ok": true}`); the "off" app has `MetricsMiddleware` taken out of its middleware, so the gap between the columns is
the per-request cost of recording the route, status, latency and in-flight gauge. Three measurements:

1. In process, no network: the ASGI app called directly, µs of CPU per request (the cleanest number).
2. Over HTTP: each server alone in its own process (one uvicorn worker, as `ng_run` starts it), driven by this
   process with gymfleet's own client at each concurrency; rounds alternate on/off so drift hits both alike, and
   each cell is the median round.
3. The client side: what `gymfleet.http` adds per call attempt to record `gymfleet_upstream_*`.

    python bench/metrics_cost.py [--concurrency 1 64] [--seconds 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import asgi_us_per_request, closed_loop, median_round, write_plots  # noqa: E402
from gymfleet import metrics  # noqa: E402
from gymfleet.metrics import MetricsMiddleware  # noqa: E402
from gymfleet.serving.server import JSONResponse, Server, add_route  # noqa: E402
from gymfleet.testing import free_port, spawn_server  # noqa: E402


class PingServer(Server):
    def routes(self, app) -> None:
        async def ping(request):
            await request.body()
            return JSONResponse({"ok": True})

        add_route(app, "/ping", ping)


def build_app(with_metrics: bool):
    app = PingServer({"name": "ping"}).create_app()
    if not with_metrics:
        app.user_middleware = [m for m in app.user_middleware if m.cls is not MetricsMiddleware]
    return app


def serve(kind: str, port: int) -> None:
    import logging

    import uvicorn

    logging.basicConfig(level=logging.ERROR)
    uvicorn.run(build_app(kind == "on"), host="127.0.0.1", port=port, log_level="error", access_log=False,
                backlog=8192)


def _client_us_per_call(n: int) -> float:
    url = "http://127.0.0.1:8000/v1/chat/completions"
    start = time.process_time()
    for _ in range(n):
        metrics.observe_upstream(metrics.target_of(url), 0.003, "2xx")
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--asgi-requests", type=int, default=20_000)
    parser.add_argument("--json", type=Path, help="also write the numbers there (for bench/report.py)")
    parser.add_argument("--serve", choices=["on", "off"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return

    asgi = asyncio.run(asgi_us_per_request({"off": build_app(False), "on": build_app(True)}, "/ping", b"{}",
                                           n=args.asgi_requests))
    client_us = _client_us_per_call(args.asgi_requests)

    servers = {}
    try:
        for kind in ("on", "off"):
            port = free_port()
            servers[kind] = spawn_server([sys.executable, __file__, "--serve", kind, "--port", str(port)], port)
        for _, url in servers.values():
            asyncio.run(closed_loop(url + "/ping", {}, 16, 1.0, timeout_s=60))  # warm-up
        results: dict[tuple[str, int], list[dict]] = {}
        for concurrency in args.concurrency:
            for round_ in range(args.rounds):
                for kind in (("on", "off") if round_ % 2 == 0 else ("off", "on")):
                    results.setdefault((kind, concurrency), []).append(
                        asyncio.run(closed_loop(servers[kind][1] + "/ping", {}, concurrency, args.seconds,
                                                timeout_s=60))
                    )
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(10)

    print(f"in process (ASGI, no network; fastest of alternating blocks): metrics off {asgi['off']:.1f} µs/request,"
          f" on {asgi['on']:.1f} µs/request -> metrics cost {asgi['on'] - asgi['off']:.1f} µs/request")
    print(f"client side (gymfleet.http, per call attempt): recording gymfleet_upstream_* costs {client_us:.1f} µs")
    print(f"over HTTP: median of {args.rounds} alternating rounds of {args.seconds:g}s per cell; "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
          "(other work on the machine shows as noise in these cells)")
    header = (f"{'conc':>5} | {'off req/s':>9} {'p50 ms':>7} {'p99 ms':>7} | {'on req/s':>9} {'p50 ms':>7} "
              f"{'p99 ms':>7} | {'on/off':>6} {'µs/req':>7} {'errors':>6}")
    print(header)
    print("-" * len(header))
    for concurrency in args.concurrency:
        off, on = median_round(results["off", concurrency]), median_round(results["on", concurrency])
        extra_us = (1 / on["rps"] - 1 / off["rps"]) * 1e6  # per-request server time added, at saturation
        print(f"{concurrency:>5} | {off['rps']:>9.0f} {off['p50_ms']:>7.2f} {off['p99_ms']:>7.2f} | {on['rps']:>9.0f} "
              f"{on['p50_ms']:>7.2f} {on['p99_ms']:>7.2f} | {on['rps'] / off['rps']:>6.3f} {extra_us:>7.1f} "
              f"{off['errors'] + on['errors']:>6.0f}")
    medians = {key: median_round(rounds) for key, rounds in results.items()}
    write_plots(args.json, [{
        "title": "A trivial route with gymfleet's metrics on and off", "x_label": "requests in flight",
        "y_label": "requests/s", "log_x": True,
        "series": {f"metrics {kind}": [[c, medians[kind, c]["rps"]] for c in args.concurrency]
                   for kind in ("off", "on")},
    }])


if __name__ == "__main__":
    main()
