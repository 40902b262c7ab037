"""What a body full of wrong-typed items costs a server: event-loop stall, answer size and memory.

The server (mcqa, one uvicorn worker with the launcher's settings) runs in its own process. This process posts a
`/verify` body whose `responses_create_params.input` is N integers (each item a validation error) while a second
thread pings `GET /` every few milliseconds: the slowest ping is how long the event loop was blocked.

    python bench/error_bodies.py [--items 250000 1000000]

Prints one line per size: body bytes, status, answer bytes, the bad request's latency, the worst ping, and the
server's RSS before, at peak and 2 s after.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gymfleet.testing import free_port, spawn_server  # noqa: E402


def serve(port: int) -> None:
    import logging

    import uvicorn

    from gymfleet.fleet.launch import _uvicorn_config
    from resources_servers.mcqa.app import MCQAServer

    logging.basicConfig(level=logging.ERROR)
    app = MCQAServer({"name": "mcqa", "domain": "knowledge"}).create_app()
    config = _uvicorn_config(app, access_log=False)
    config.host, config.port = "127.0.0.1", port
    uvicorn.Server(config).run()


def _ping(url: str, stop: threading.Event, worst: list[float]) -> None:
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            start = time.perf_counter()
            client.get(url + "/")
            worst[0] = max(worst[0], time.perf_counter() - start)
            time.sleep(0.005)


def _sample_rss(proc: psutil.Process, stop: threading.Event, peak: list[float]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss / 2**20)
        time.sleep(0.005)


def measure(url: str, proc: psutil.Process, items: int) -> str:
    body = orjson.dumps({"responses_create_params": {"input": [1] * items}, "response": {"output": []}})
    before = proc.memory_info().rss / 2**20
    stop, worst, peak = threading.Event(), [0.0], [before]
    threads = [
        threading.Thread(target=_ping, args=(url, stop, worst)),
        threading.Thread(target=_sample_rss, args=(proc, stop, peak)),
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    start = time.perf_counter()
    answer = httpx.post(url + "/verify", content=body, headers={"Content-Type": "application/json"}, timeout=600)
    took = time.perf_counter() - start
    time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join()
    time.sleep(2)
    after = proc.memory_info().rss / 2**20
    return (
        f"{items:>9} | {len(body) / 1e6:>6.2f} MB | {answer.status_code} | "
        f"{len(answer.content) / 1e3:>10.1f} kB | {took * 1e3:>8.0f} ms | {worst[0] * 1e3:>8.0f} ms | "
        f"{before:>6.0f} {peak[0]:>6.0f} {after:>6.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, nargs="+", default=[250_000, 1_000_000])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    port = free_port()
    process, url = spawn_server([sys.executable, __file__, "--serve", str(port)], port)
    proc = psutil.Process(process.pid)
    try:
        print(
            f"{'items':>9} | {'body':>9} | st | {'answer':>13} | {'request':>11} | {'worst ping':>11} | "
            f"RSS MB before/peak/after"
        )
        for items in args.items:
            print(measure(url, proc, items), flush=True)
    finally:
        process.terminate()
        process.wait(10)


if __name__ == "__main__":
    main()
