"""`/verify` throughput and latency: mcqa beside a bare FastAPI endpoint, at several concurrencies, in one run.

Each server runs alone in its own process (one uvicorn worker, as `ng_run` starts it); the load generator is this
process, using gymfleet's own HTTP client (aiohttp). The bare endpoint parses the same JSON body and returns a
constant, so the gap between the two columns is what gymfleet's middleware, validation and mcqa's grading cost.

    python bench/verify_throughput.py [--concurrency 1 16 256 4096] [--seconds 8]

Prints one table: requests/s, p50 and p99 latency, and the server's peak RSS, for both servers at each concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import psutil
from fastapi import FastAPI, Request

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import closed_loop  # noqa: E402
from gymfleet.testing import free_port, make_response, spawn_server  # noqa: E402

ROW = json.loads((ROOT / "resources_servers/mcqa/data/example.jsonl").read_text().splitlines()[0])
ANSWER = "Mercury has the shortest year, about 88 days. " * 20 + "\n\n\\boxed{B}"


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


def serve(kind: str, port: int) -> None:
    import logging

    import uvicorn

    logging.basicConfig(level=logging.ERROR)
    app = _bare_app() if kind == "bare" else _mcqa_app()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False, backlog=8192)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 256, 4096])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--serve", choices=["bare", "mcqa"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return

    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65535), hard))
    body = {**ROW, "response": make_response(ANSWER)}
    print(f"body {len(json.dumps(body))} bytes; {args.seconds:g}s per cell; {os.cpu_count()} cores")
    results: dict[tuple[str, int], dict] = {}
    for kind in ("bare", "mcqa"):
        port = free_port()
        process, url = spawn_server([sys.executable, __file__, "--serve", kind, "--port", str(port)], port)
        proc = psutil.Process(process.pid)
        try:
            asyncio.run(closed_loop(url + "/verify", body, 16, 1.0, timeout_s=120))  # warm-up
            for concurrency in args.concurrency:
                result = asyncio.run(closed_loop(url + "/verify", body, concurrency, args.seconds, timeout_s=120))
                result["rss_mb"] = proc.memory_info().rss / 2**20
                results[kind, concurrency] = result
        finally:
            process.terminate()
            process.wait(10)

    header = f"{'conc':>5} | {'bare req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'RSS MB':>7} | " \
             f"{'mcqa req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'RSS MB':>7} | {'mcqa/bare':>9} {'errors':>6}"
    print(header)
    print("-" * len(header))
    for concurrency in args.concurrency:
        bare, mcqa = results["bare", concurrency], results["mcqa", concurrency]
        print(f"{concurrency:>5} | {bare['rps']:>10.0f} {bare['p50_ms']:>8.2f} {bare['p99_ms']:>8.2f} "
              f"{bare['rss_mb']:>7.0f} | {mcqa['rps']:>10.0f} {mcqa['p50_ms']:>8.2f} {mcqa['p99_ms']:>8.2f} "
              f"{mcqa['rss_mb']:>7.0f} | {mcqa['rps'] / bare['rps']:>9.2f} {bare['errors'] + mcqa['errors']:>6}")


if __name__ == "__main__":
    main()
