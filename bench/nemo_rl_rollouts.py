"""NeMo-RL's rollout step against a real fleet: N weather rollouts through `run_examples`, all in flight at once.

The fleet is what NeMo-RL starts (`RunHelper.start` with an `initial_global_config_dict`): `policy_model`
(vllm_model_for_training, token capture on), `example_weather` and its simple_agent, plus one scripted upstream
standing in for vLLM, each its own process. This process is the trainer's Gym actor: it sends every row's
`POST /run` at once, with no semaphore, as NeMo-RL does (4096 = 256 prompts x 16 generations, one Super RLVR step).
Every rollout is two model calls and one tool call, so one rollout is 10 HTTP requests inside the fleet.

    python bench/nemo_rl_rollouts.py [--rollouts 4096] [--generations 16]

Prints one table: rollouts/s, p50/p99 latency from dispatch to result (all rows are dispatched at t=0, so p50 is
roughly half the wall time), errors, and the peak RSS of the fleet's processes (sum over every child, sampled
every 0.2 s) and of this client process.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gymfleet import http  # noqa: E402
from gymfleet.testing import free_port  # noqa: E402
from nemo_gym.cli import GlobalConfigDictParserConfig, RunHelper  # noqa: E402
from nemo_gym.rollout_collection import RolloutCollectionHelper  # noqa: E402
from nemo_gym.server_utils import BaseServerConfig  # noqa: E402
from resources_servers.example_weather.app import FORECASTS  # noqa: E402

EXAMPLE = ROOT / "resources_servers/example_weather/data/example.jsonl"
AGENT = "example_weather_simple_agent"
SCRIPTED = "scripted_llm.responses_api_models.scripted_model"


def fleet_config(head_port: int) -> dict:
    conditions = sorted({condition for condition, _ in FORECASTS.values()})
    rules = [{"match": rf'"condition":\s*"{c}"', "match_in": "last_message", "text": f"The forecast says {c}."}
             for c in conditions]
    rules += [{"match": rf"(?i)\b{city}\b", "match_in": "transcript", "text": "Let me look that up.",
               "tool_calls": [{"name": "get_weather", "arguments": {"city": city.title()}}]} for city in FORECASTS]
    return {
        "config_paths": ["responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
                         "resources_servers/example_weather/configs/example_weather.yaml"],
        "scripted_llm": {"responses_api_models": {"scripted_model": {"entrypoint": "app.py", "rules": rules}}},
        "policy_base_url": f"http://${{{SCRIPTED}.host}}:${{{SCRIPTED}.port}}/v1",
        "policy_api_key": "dummy_key", "policy_model_name": "scripted", "default_host": "127.0.0.1",
        "head_server": {"host": "0.0.0.0", "port": head_port}, "port_range_low": 5000, "port_range_high": 5999,
        "global_aiohttp_connector_limit_per_host": 16384, "global_aiohttp_connector_limit": 65536,
        "num_gpu_nodes": 0,
    }


def nemo_rl_rows(count: int, generations: int) -> list[dict]:
    """Groups of `generations` identical rows, stamped as NeMo-RL's `_prepare_nemo_gym_rows` stamps them."""
    tasks = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    rows = []
    for index in range(count):
        row = copy.deepcopy(tasks[index // generations % len(tasks)])
        row["responses_create_params"].update(temperature=1.0, top_p=1.0, max_output_tokens=1024)
        row.update(_rowidx=index, _ng_task_index=index // generations,
                   agent_ref={"type": "responses_api_agents", "name": AGENT})
        rows.append(row)
    return rows


class PeakRSS:
    """Samples the RSS of this process and of all its descendants (the fleet) in a background thread, and each
    server's CPU time (for where the time goes)."""

    def __init__(self, interval_s: float = 0.2):
        self.interval_s, self.client, self.fleet = interval_s, 0, 0
        self.per_server: Counter = Counter()
        self.cpu_s: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        me = psutil.Process()
        while not self._stop.is_set():
            self.client = max(self.client, me.memory_info().rss)
            total = 0
            for child in me.children(recursive=True):
                try:
                    rss, cmdline, cpu = child.memory_info().rss, child.cmdline(), child.cpu_times()
                except psutil.Error:
                    continue
                total += rss
                if "--instance" in cmdline:
                    name = cmdline[cmdline.index("--instance") + 1]
                    self.per_server[name] = max(self.per_server[name], rss)
                    self.cpu_s[name] = cpu.user + cpu.system
            self.fleet = max(self.fleet, total)
            self._stop.wait(self.interval_s)


async def run(rows: list[dict], head: BaseServerConfig) -> tuple[list[float], Counter, float]:
    latencies, errors = [], Counter()
    start = time.perf_counter()
    try:
        for future in RolloutCollectionHelper().run_examples(examples=rows, head_server_config=head):
            try:
                _, result = await future
            except Exception as exc:  # a bench counts failures by kind
                errors[f"{type(exc).__name__} {getattr(exc, 'status', '')}".strip()] += 1
                continue
            latencies.append(time.perf_counter() - start)
            if result.get("reward") != 1.0:
                errors["reward != 1.0"] += 1
        return latencies, errors, time.perf_counter() - start
    finally:
        await http.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=4096)
    parser.add_argument("--generations", type=int, default=16, help="rows per prompt group")
    args = parser.parse_args()

    os.environ.setdefault("GYMFLEET_LOG_LEVEL", "WARNING")  # the fleet's processes inherit it: no per-request INFO
    rh = RunHelper()
    started = time.perf_counter()
    rh.start(GlobalConfigDictParserConfig(initial_global_config_dict=fleet_config(free_port()),
                                          skip_load_from_cli=True))
    try:
        spin_up_s = time.perf_counter() - started
        rows = nemo_rl_rows(args.rollouts, args.generations)
        with PeakRSS() as rss:
            latencies, errors, wall_s = asyncio.run(run(rows, rh.head_server_config))
        rh.poll()
    finally:
        rh.shutdown()
    mib = 1024 * 1024
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    print(f"\nfleet up in {spin_up_s:.1f}s; {args.rollouts} rollouts in flight at once; wall {wall_s:.1f}s\n")
    print("| rollouts | rollouts/s | p50 latency | p99 latency | errors | peak RSS fleet | peak RSS client |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.rollouts} | {len(latencies) / wall_s:.0f} | {quantiles[49]:.1f} s | {quantiles[98]:.1f} s | "
          f"{sum(errors.values())} | {rss.fleet / mib:.0f} MiB | {rss.client / mib:.0f} MiB |")
    servers = sorted(rss.per_server.items())
    print("\nper server, peak RSS / CPU time: "
          + ", ".join(f"{name} {value / mib:.0f} MiB / {rss.cpu_s.get(name, 0):.0f} s" for name, value in servers))
    if errors:
        print("errors: " + ", ".join(f"{kind} x{count}" for kind, count in errors.most_common()))


if __name__ == "__main__":
    main()
