r"""math_with_judge `/verify` under load, with poison inputs mixed in.

The real math_with_judge server runs alone in its own process (one uvicorn worker, as `ng_run` starts it; judge
off), with its default verification pool (one worker process per CPU). This process fires bursts of concurrent
`/verify` requests through gymfleet's own HTTP client. Each burst holds `--concurrency` requests: a few poison
answers (a power tower `9^{9^{9^{9}}}`, a fraction nested 30 deep, 50 nested parentheses, a 1 MB output) and
ordinary answers, all distinct, so the result cache never helps: realistic outputs (a paragraph of reasoning, then
a boxed answer as an integer, fraction, decimal, radical or set, about a fifth of them wrong).

    python bench/math_verify_throughput.py [--concurrency 256] [--rounds 3] [--timeout-s 5]

Prints, per burst and overall: ordinary verifications per second (ordinary answers / time until the last ordinary
answer came back), their p50/p99/max latency, and how each poison input ended (reason, reward and latency). A first
burst without poison also measures the CPU time the server and its verification workers spend per verification,
which, unlike the rates, does not depend on what else the machine is running: cores / that = the capacity of an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gymfleet import http  # noqa: E402
from gymfleet.testing import free_port, make_response, spawn_server  # noqa: E402

ROW = json.loads((ROOT / "resources_servers/math_with_judge/data/example.jsonl").read_text().splitlines()[0])
REASONING = ("We set up the problem carefully. Let $a_n$ denote the $n$-th term, so $a_n = a_{n-1} + d$ and "
             "the sum of the first $n$ terms is $\\frac{n}{2}(a_1 + a_n)$. Checking small cases confirms it. ") * 6
POISON = {
    "power-tower": r"so the answer is \boxed{9^{9^{9^{9}}}}",
    "nested-fraction": r"\boxed{" + r"\frac{1}{" * 30 + "2" + "}" * 31,
    "nested-parens": r"\boxed{" + "(" * 50 + "1" + ")" * 50 + "}",
    "1MB-output": "let me think " * 80_000 + r"\boxed{7}",
}


def _ordinary(rng: random.Random, serial: int) -> tuple[str, str]:
    """A (gold, output) pair; `serial` makes every output distinct."""
    k = rng.randint(2, 999)
    wrong = rng.random() < 0.2
    kind = serial % 5
    if kind == 0:
        gold, answer = str(k), str(k + wrong)
    elif kind == 1:
        gold, answer = rf"\frac{{{k}}}{{{k + 1}}}", rf"\dfrac{{{2 * k + wrong}}}{{{2 * k + 2}}}"
    elif kind == 2:
        gold, answer = rf"\frac{{1}}{{{k}}}", f"{1 / (k + wrong):.6f}"
    elif kind == 3:
        gold, answer = rf"{k}\sqrt{{2}}", rf"\sqrt{{{2 * k * k + wrong}}}"
    else:
        gold, answer = f"{k}, {k + 1}", f"{k + 1 + wrong}, {k}"
    return gold, f"{REASONING}(case {serial})\n\nTherefore the final answer is $\\boxed{{{answer}}}$."


def serve(port: int, timeout_s: float) -> None:
    import logging

    import uvicorn

    from resources_servers.math_with_judge.app import MathWithJudgeServer

    logging.basicConfig(level=logging.ERROR)
    server = MathWithJudgeServer({"name": "math_with_judge", "domain": "math",
                                  "library_verifier_timeout_seconds": timeout_s})
    uvicorn.run(server.create_app(), host="127.0.0.1", port=port, log_level="error", access_log=False,
                backlog=8192)


async def _verify(url: str, gold: str, text: str) -> tuple[float, dict]:
    body = {**ROW, "expected_answer": gold, "response": make_response(text)}
    began = time.perf_counter()
    # The default policy retries connection errors: a keep-alive connection the server has just closed is one.
    response = await http.request("POST", url + "/verify", json=body, timeout_s=300)
    result = response.json() if response.status == 200 else {"library_reason": f"HTTP {response.status}"}
    return time.perf_counter() - began, result


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds used so far by process `pid` and its descendants that are alive (the server, its workers)."""
    total = 0.0
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


async def _burst(url: str, server_pid: int, concurrency: int, rng: random.Random, first_serial: int,
                 poison: bool) -> dict:
    bad = POISON if poison else {}
    items = [("ordinary", *_ordinary(rng, first_serial + i)) for i in range(concurrency - len(bad))]
    for index, (name, text) in enumerate(bad.items()):
        items.insert(len(items) * (index + 1) // (len(bad) + 1), (name, "7", text))
    cpu_before, load = _tree_cpu_s(server_pid), os.getloadavg()[0]
    results = await asyncio.gather(*(_verify(url, gold, text) for _, gold, text in items))
    ordinary = [(latency, result) for (kind, _, _), (latency, result) in zip(items, results, strict=True)
                if kind == "ordinary"]
    latencies = sorted(latency for latency, _ in ordinary)
    return {
        "wall_s": max(latencies),
        "rps": len(latencies) / max(latencies),
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "max_ms": latencies[-1] * 1000,
        "right": sum(result.get("reward") == 1.0 for _, result in ordinary),
        "errors": sum(result.get("library_reason") not in (None, "not_equal") for _, result in ordinary),
        "n": len(latencies),
        "cpu_ms": (_tree_cpu_s(server_pid) - cpu_before) / len(items) * 1000,
        "load": max(load, os.getloadavg()[0]),
        "poison": {kind: (result.get("library_reason"), result.get("reward"), latency)
                   for (kind, _, _), (latency, result) in zip(items, results, strict=True) if kind != "ordinary"},
    }


async def _run(url: str, server_pid: int, concurrency: int, rounds: int) -> list[dict]:
    rng = random.Random(0)
    await asyncio.gather(*(_verify(url, str(k), rf"\boxed{{{k}}}") for k in range(8)))  # start the workers
    results = []
    for r in range(rounds + 1):
        results.append(await _burst(url, server_pid, concurrency, rng, r * concurrency, poison=r > 0))
        await http.close()  # fresh connections for the next burst
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=256, help="requests per burst (poison included)")
    parser.add_argument("--rounds", type=int, default=3, help="bursts with poison (after one without)")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="the server's per-verification deadline")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.port, args.timeout_s)
        return

    port = free_port()
    process, url = spawn_server([sys.executable, __file__, "--serve", "--port", str(port), "--timeout-s",
                                 str(args.timeout_s)], port)
    try:
        results = asyncio.run(_run(url, process.pid, args.concurrency, args.rounds))
    finally:
        process.terminate()
        process.wait(30)

    clean = results[0]
    print(f"{os.cpu_count()} cores; {args.concurrency} concurrent /verify per burst; deadline {args.timeout_s:g}s CPU "
          f"per verification; load = the 1-minute load average during the burst (other users of the machine)")
    capacity = os.cpu_count() * 1000 / clean["cpu_ms"]
    print(f"server + workers CPU per ordinary verification: {clean['cpu_ms']:.1f} ms "
          f"(so an idle {os.cpu_count()}-core machine: ~{capacity:.0f} verifications/s)")
    header = f"{'burst':>6} | {'load':>4} {'ordinary':>8} {'verif/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} " \
             f"{'right':>5} {'errors':>6} | poison: reason, reward (latency s)"
    print(header)
    print("-" * len(header))
    for index, r in enumerate(results):
        poison = ", ".join(f"{kind}: {reason}, {reward} ({latency:.1f})"
                           for kind, (reason, reward, latency) in r["poison"].items()) or "none"
        print(f"{'clean' if index == 0 else index:>6} | {r['load']:>4.1f} {r['n']:>8} {r['rps']:>8.0f} "
              f"{r['p50_ms']:>8.0f} {r['p99_ms']:>8.0f} {r['max_ms']:>8.0f} {r['right']:>5} {r['errors']:>6} "
              f"| {poison}")
    poisoned = results[1:]
    total = sum(r["n"] for r in poisoned)
    print(f"{'poison':>6} | {'':>4} {total:>8} {total / sum(r['wall_s'] for r in poisoned):>8.0f} "
          f"{statistics.median(r['p50_ms'] for r in poisoned):>8.0f} {max(r['p99_ms'] for r in poisoned):>8.0f} "
          f"{max(r['max_ms'] for r in poisoned):>8.0f}")


if __name__ == "__main__":
    main()
