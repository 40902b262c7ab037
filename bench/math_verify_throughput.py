r"""math_with_judge `/verify` under load, with poison inputs mixed in.

The real math_with_judge server runs alone in its own process (one uvicorn worker, as `ng_run` starts it; judge
off), with its default verification pool (one worker process per CPU). This process fires bursts of concurrent
`/verify` requests through gymfleet's own HTTP client. Each burst holds `--concurrency` requests: a few poison
answers (a power tower `9^{9^{9^{9}}}`, a fraction nested 30 deep, 50 nested parentheses, a 1 MB output) and
ordinary answers, all distinct, so the result cache never helps: realistic outputs (a paragraph of reasoning, then
a boxed answer as an integer, fraction, decimal, radical or set, about a fifth of them wrong).

    python bench/math_verify_throughput.py [--concurrency 256] [--rounds 3] [--timeout-s 5] [--baseline DIR]

First, the ratio to math-verify's own limit: this process measures the CPU seconds math-verify itself spends per
verification, in process, on the same bodies (`parse` of the boxed gold, `parse` of the output text as NeMo-Gym
hands it over, `verify`; and, second, of the last box alone, which is all the server hands it), so its limit on the
server's cores is cores / that. Then `--ratio-answers` fresh answers (never seen, so no cache helps) go to
`/verify` at `--ratio-concurrency` (64) in flight, and the table sets the verifications/s reached beside that limit,
and the server's CPU (server process and its verification workers) per verification beside math-verify's. With
more than one core, the server and its workers are pinned to all cores but the last (`--server-cpus`) and this
process, the load, to the rest, so "the server's cores" are what the limit is computed for. `--baseline DIR` serves
another checkout's math_with_judge (say, of main) the same way, alternating with this one, for before/after in one
run.

Then, per burst and overall: ordinary verifications per second (ordinary answers / time until the last ordinary
answer came back), their p50/p99/max latency, and how each poison input ended (reason, reward and latency). A first
burst without poison also measures the CPU time the server and its verification workers spend per verification,
which, unlike the rates, does not depend on what else the machine is running: cores / that = the capacity of an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import Sampler, checkout_script  # noqa: E402
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


class TreeCpu(Sampler):
    """CPU seconds process `pid` and its descendants used while in the `with` block, counting processes that ended
    meanwhile (a verification worker killed or retired) up to their last sample (every 50 ms)."""

    def __init__(self, pid: int):
        super().__init__(0.05)
        self.root = psutil.Process(pid)
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.sample()
        self.first = dict(self.last)

    def sample(self) -> None:
        for process in [self.root, *self.root.children(recursive=True)]:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            self.last[process.pid] = times.user + times.system

    @property
    def seconds(self) -> float:
        self.sample()
        return sum(cpu - self.first.get(pid, 0.0) for pid, cpu in self.last.items())


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


def math_verify_cpu_ms(items: list[tuple[str, str]]) -> dict[str, float]:
    """CPU ms math-verify itself spends per verification of `items` (gold, output text), in this process: on the
    whole output text (NeMo-Gym's way) and on its last box alone (what gymfleet hands it)."""
    import math_verify

    from gymfleet.grading.latex import last_boxed
    from gymfleet.grading.mathcheck import _WARM_UP_CASES

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    gold_config = (math_verify.LatexExtractionConfig(),)
    pred_config = (math_verify.ExprExtractionConfig(), math_verify.LatexExtractionConfig())

    def one(gold: str, text: str) -> bool:
        parsed = math_verify.parse("\\boxed{" + gold + "}", gold_config, parsing_timeout=None)
        return math_verify.verify(parsed, math_verify.parse(text, pred_config, parsing_timeout=None),
                                  timeout_seconds=None)

    for gold, text in _WARM_UP_CASES:  # what the server's fork server warms up, so neither side pays first uses
        one(gold, text)
    ways = {"text": items, "box": [(gold, "\\boxed{" + (last_boxed(text) or "") + "}") for gold, text in items]}
    cpu_ms = {}
    for way, pairs in ways.items():
        began = time.process_time()
        for gold, text in pairs:
            one(gold, text)
        cpu_ms[way] = (time.process_time() - began) / len(pairs) * 1000
    return cpu_ms


async def _ratio_round(url: str, server_pid: int, concurrency: int, items: list[tuple[str, str]]) -> dict:
    """`items` (fresh answers) through `/verify` at `concurrency` in flight: verifications/s, CPU per verification."""
    gate = asyncio.Semaphore(concurrency)

    async def one(gold: str, text: str) -> tuple[float, dict]:
        async with gate:
            return await _verify(url, gold, text)

    await asyncio.gather(*(_verify(url, str(k), rf"\boxed{{{k}}}") for k in range(8)))  # workers up, connections open
    load = os.getloadavg()[0]
    with TreeCpu(server_pid) as cpu:
        began = time.perf_counter()
        results = await asyncio.gather(*(one(gold, text) for gold, text in items))
        wall_s = time.perf_counter() - began
    await http.close()
    return {"rps": len(items) / wall_s, "cpu_ms": cpu.seconds / len(items) * 1000,
            "load": max(load, os.getloadavg()[0]),
            "rewards": [(result.get("reward"), result.get("library_reason")) for _, result in results]}


def _pin(cpus: set[int]):
    return lambda: os.sched_setaffinity(0, cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=256, help="requests per burst (poison included)")
    parser.add_argument("--rounds", type=int, default=3, help="bursts with poison (after one without)")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="the server's per-verification deadline")
    parser.add_argument("--ratio-answers", type=int, default=512, help="fresh answers per round (ratio)")
    parser.add_argument("--ratio-concurrency", type=int, default=64, help="in flight for the ratio")
    parser.add_argument("--ratio-rounds", type=int, default=2, help="alternating rounds per server for the ratio")
    parser.add_argument("--server-cpus", help="CPUs for the servers, e.g. 0 or 0-2 (default: all but the last)")
    parser.add_argument("--baseline", type=Path, help="another checkout (e.g. of main) served beside this one")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.port, args.timeout_s)
        return

    cpus = sorted(os.sched_getaffinity(0))
    if args.server_cpus:
        low, _, high = args.server_cpus.partition("-")
        server_cpus = set(range(int(low), int(high or low) + 1))
    else:
        server_cpus = set(cpus[:-1] or cpus)
    load_cpus = set(cpus) - server_cpus or set(cpus)
    os.sched_setaffinity(0, load_cpus)
    kinds = ["this", "baseline"] if args.baseline else ["this"]
    servers = {}
    try:
        for kind in kinds:
            port = free_port()
            script, env = checkout_script(Path(__file__), args.baseline if kind == "baseline" else None)
            servers[kind] = spawn_server([sys.executable, str(script), "--serve", "--port", str(port), "--timeout-s",
                                          str(args.timeout_s)], port, env=env, preexec_fn=_pin(server_cpus))
        rng = random.Random(27)
        ratio: dict[str, list[dict]] = {kind: [] for kind in kinds}
        serial, measured = 10**6, []
        for round_ in range(args.ratio_rounds):
            items = [_ordinary(rng, serial + i) for i in range(args.ratio_answers)]  # new to every server
            serial += args.ratio_answers
            measured += items[:200]
            for kind in (kinds if round_ % 2 == 0 else kinds[::-1]):
                process, url = servers[kind]
                ratio[kind].append(asyncio.run(_ratio_round(url, process.pid, args.ratio_concurrency, items)))
        library = math_verify_cpu_ms(measured)
        bursts = {kind: asyncio.run(_run(url, process.pid, args.concurrency, args.rounds))
                  for kind, (process, url) in servers.items()}
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(30)

    cores = len(server_cpus)
    print(f"{os.cpu_count()} cores: servers and their verification workers on CPUs {sorted(server_cpus)}, load on "
          f"{sorted(load_cpus)}; load = the 1-minute load average (other users of the machine)")
    print(f"math-verify alone, in process, CPU per verification: {library['text']:.2f} ms on the output text "
          f"(NeMo-Gym's way), {library['box']:.2f} ms on the last box alone; its limit on {cores} core(s): "
          f"{cores * 1000 / library['text']:.0f} / {cores * 1000 / library['box']:.0f} verifications/s")
    header = (f"{'server':>8} | {'round':>5} {'load':>4} {'verif/s':>8} {'CPU ms':>7} | {'of limit (text)':>15} "
              f"{'of limit (box)':>14} | {'CPU ratio (text)':>16} {'CPU ratio (box)':>15}")
    print(f"\n{args.ratio_answers} fresh answers at {args.ratio_concurrency} in flight; of limit = verif/s / (cores /"
          f" math-verify CPU); CPU ratio = math-verify CPU / server CPU per verification (independent of load)")
    print(header)
    print("-" * len(header))
    for kind in kinds:
        for index, r in enumerate(ratio[kind]):
            of_limit = {way: r["rps"] * cpu_ms / 1000 / cores for way, cpu_ms in library.items()}
            print(f"{kind:>8} | {index + 1:>5} {r['load']:>4.1f} {r['rps']:>8.0f} {r['cpu_ms']:>7.2f} | "
                  f"{of_limit['text']:>15.2f} {of_limit['box']:>14.2f} | "
                  f"{library['text'] / r['cpu_ms']:>16.2f} {library['box'] / r['cpu_ms']:>15.2f}")
    if args.baseline:
        pairs = [(a, b) for this, base in zip(ratio["this"], ratio["baseline"], strict=True)
                 for a, b in zip(this["rewards"], base["rewards"], strict=True)]
        differ = [(a, b) for a, b in pairs if a != b]
        print(f"rewards of the same {len(pairs)} answers from both servers: {len(differ)} differ (reward, reason: this"
              f" / baseline){': ' + ', '.join(f'{a} / {b}' for a, b in differ[:5]) if differ else ''}")
    for kind in kinds:
        print(f"\n{kind}: bursts of {args.concurrency} concurrent /verify")
        _print_bursts(bursts[kind], args)


def _print_bursts(results: list[dict], args: argparse.Namespace) -> None:
    clean = results[0]
    print(f"server + workers CPU per ordinary verification (first burst, no poison): {clean['cpu_ms']:.1f} ms; "
          f"deadline {args.timeout_s:g}s CPU per verification")
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
    if not poisoned:
        return
    total = sum(r["n"] for r in poisoned)
    print(f"{'poison':>6} | {'':>4} {total:>8} {total / sum(r['wall_s'] for r in poisoned):>8.0f} "
          f"{statistics.median(r['p50_ms'] for r in poisoned):>8.0f} {max(r['p99_ms'] for r in poisoned):>8.0f} "
          f"{max(r['max_ms'] for r in poisoned):>8.0f}")


if __name__ == "__main__":
    main()
