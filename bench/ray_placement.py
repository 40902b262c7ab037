"""Ray placement: start-up time and rollouts through `run_examples` on a local multi-node Ray cluster.

Starts a 3-node `ray.cluster_utils.Cluster` on this machine (Ray's own multi-node fixture, every node on `127.0.0.1`:
the bench sends traffic only to loopback, and stops if any socket of its processes is outside it), then the same fleet
(scripted model behind vllm_model, example_weather and its agent; each model turn sleeps `--delay-s`) three ways:
`placement: local`, `placement: ray` with one replica of each server, and `placement: ray` with `--replicas` of the
environment and the agent. For each: time until the fleet is ready, rollouts/s, p50/p99 end to end, errors, the
fleet's RSS after the run (every server process, replicas included) and how many `/verify` calls each environment
replica answered.

    python bench/ray_placement.py [--rollouts 512] [--replicas 2] [--delay-s 0.3]

On one machine the replicas share its cores, so this measures the cost of Ray placement (start-up, the extra hop
of nothing: clients call replicas directly) and the spread, not a speed-up; on a real cluster each node brings its
own cores.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import require_modules  # noqa: E402
from gymfleet import auth, http  # noqa: E402
from gymfleet.errors import TransportError  # noqa: E402
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config  # noqa: E402
from gymfleet.fleet.ray_placement import make_fleet  # noqa: E402
from gymfleet.rollouts.rollout_helper import RolloutCollectionHelper  # noqa: E402
from gymfleet.testing import free_port  # noqa: E402
from gymfleet.testing.loopback import loopback_cluster, off_loopback, tree_pids  # noqa: E402
from resources_servers.example_weather.app import FORECASTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV, AGENT = "example_weather", "example_weather_simple_agent"


def fleet_config(placement: str, replicas: int, delay_s: float, address: str | None) -> dict:
    answers = [{"match": rf'"condition":\s*"{c}"', "match_in": "last_message", "delay_s": delay_s,
                "text": f"The forecast says {c}."} for c in {c for c, _ in FORECASTS.values()}]
    calls = [{"match": rf"(?i)\b{city}\b", "match_in": "transcript", "delay_s": delay_s, "text": "Looking it up.",
              "tool_calls": [{"name": "get_weather", "arguments": {"city": city.title()}}]} for city in FORECASTS]
    placed = {"num_replicas": replicas} if placement == "ray" else {}
    config = {
        "config_paths": ["responses_api_models/vllm_model/configs/vllm_model.yaml",
                         "resources_servers/example_weather/configs/example_weather.yaml"],
        "policy_base_url": "http://${scripted_llm.responses_api_models.scripted_model.host}:"
                           "${scripted_llm.responses_api_models.scripted_model.port}/v1",
        "policy_api_key": "not-needed", "policy_model_name": "scripted",
        "scripted_llm": {"responses_api_models": {"scripted_model": {
            "entrypoint": "app.py", "model": "scripted", "rules": [*answers, *calls]}}},
        ENV: {"resources_servers": {ENV: placed}},
        AGENT: {"responses_api_agents": {"simple_agent": placed}},
        "head_server": {"host": "127.0.0.1", "port": free_port()},
        "placement": placement,
    }
    if address:
        config["ray_head_node_address"] = address
    return config


def rows(n: int) -> list[dict]:
    import json

    tasks = [json.loads(line) for line in (ROOT / "resources_servers/example_weather/data/example.jsonl")
             .read_text().splitlines()]
    return [{**tasks[i % len(tasks)], "agent_ref": {"type": "responses_api_agents", "name": AGENT}}
            for i in range(n)]


async def collect(head_port: int, examples: list[dict]) -> tuple[list[float], int, float]:
    helper = RolloutCollectionHelper(request_timeout_s=600)
    start = time.perf_counter()
    latencies, errors = [], 0

    async def timed(future):
        nonlocal errors
        try:
            _, result = await future
            if result.get("reward") != 1.0:
                errors += 1
        except TransportError:
            errors += 1
        latencies.append(time.perf_counter() - start)

    futures = list(helper.run_examples(examples, {"host": "127.0.0.1", "port": head_port}))
    await asyncio.gather(*(timed(f) for f in futures))
    wall = time.perf_counter() - start
    await http.close()
    return latencies, errors, wall


def fleet_rss_mb(head_port: int) -> float:
    instances = httpx.get(f"http://127.0.0.1:{head_port}/server_instances", timeout=10,
                          headers=auth.head_headers("127.0.0.1", head_port)).json()
    pids = [r["pid"] for row in instances for r in (row.get("replicas") or [row]) if r.get("pid")]
    total = 0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            total += sum(p.memory_info().rss for p in [process, *process.children(recursive=True)])
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def verify_counts(head_port: int) -> list[int]:
    headers = auth.head_headers("127.0.0.1", head_port)  # the fleet's token: every server of the fleet checks it
    row = {r["process_name"]: r for r in httpx.get(f"http://127.0.0.1:{head_port}/server_instances",
                                                     timeout=10, headers=headers).json()}[ENV]
    counts = []
    for replica in row.get("replicas") or [row]:
        text = httpx.get(f"http://{replica['host']}:{replica['port']}/metrics", timeout=10, headers=headers).text
        found = re.findall(r'gymfleet_requests_total\{[^}]*route="/verify"[^}]*status="200"[^}]*\} ([0-9.e+]+)', text)
        counts.append(int(sum(float(v) for v in found)))
    return counts


def run(label: str, config: dict, n: int) -> dict:
    started = time.perf_counter()
    fleet = make_fleet(parse_global_config(GlobalConfigDictParserConfig(initial_global_config_dict=config,
                                                                        skip_load_from_cli=True)))
    fleet.start(timeout_s=300)
    ready_s = time.perf_counter() - started
    try:
        latencies, errors, wall = asyncio.run(collect(fleet.config.head_port, rows(n)))
        rss = fleet_rss_mb(fleet.config.head_port)
        spread = verify_counts(fleet.config.head_port)
        outside = off_loopback(tree_pids())
        if outside:
            raise SystemExit(f"{label}: sockets outside loopback (the bench sends traffic only to 127.0.0.0/8):\n"
                             + "\n".join(outside))
    finally:
        fleet.shutdown()
    quantiles = statistics.quantiles(latencies, n=100)
    return {"fleet": label, "ready s": f"{ready_s:.1f}", "rollouts/s": f"{n / wall:.1f}",
            "p50 s": f"{quantiles[49]:.2f}", "p99 s": f"{quantiles[98]:.2f}", "errors": str(errors),
            "fleet RSS MiB": f"{rss:.0f}", "/verify per env replica": "/".join(map(str, spread))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=512)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--delay-s", type=float, default=0.3)
    args = parser.parse_args()
    require_modules("bench/ray_placement.py", "ray", install="pip install -e '.[ray]'")
    results = [run("local", fleet_config("local", 1, args.delay_s, None), args.rollouts)]
    with loopback_cluster({"num_cpus": 8}, {"num_cpus": 8}, {"num_cpus": 8}) as cluster:
        results.append(run("ray, 1 replica", fleet_config("ray", 1, args.delay_s, cluster.address), args.rollouts))
        results.append(run(f"ray, {args.replicas} replicas", fleet_config("ray", args.replicas, args.delay_s,
                                                                          cluster.address), args.rollouts))
    columns = list(results[0])
    widths = [max(len(c), *(len(r[c]) for r in results)) for c in columns]
    print(f"{args.rollouts} rollouts at once, 2 model turns of {args.delay_s:g} s each, 3-node Ray cluster on one "
          "machine")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in results:
        print("  ".join(r[c].ljust(w) for c, w in zip(columns, widths, strict=True)))


if __name__ == "__main__":
    main()
