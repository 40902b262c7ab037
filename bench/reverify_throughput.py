"""`ng_reverify` throughput: a rollouts file collected by `ng_collect_rollouts`, re-scored cold, then from the cache.

Starts the quickstart fleet (scripted model, vllm_model, mcqa, simple_agent), collects `--rows` rollouts (the five
example rows repeated), then re-scores the file four ways: against the fleet (cold: every row POSTed; warm: every
row from the cache) and in this process from the config (cold and warm). Every run must find every row unchanged.

    python bench/reverify_throughput.py [--rows 1000] [--concurrency 32]

Prints one table: rows, rows re-scored, rows from the cache, seconds, rows/s, and the peak RSS of this process.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gymfleet import http  # noqa: E402
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config  # noqa: E402
from gymfleet.rollouts.collect import collect  # noqa: E402
from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig  # noqa: E402
from gymfleet.rollouts.reverify import FleetBackend, InProcessBackend, ReverifyConfig, reverify  # noqa: E402
from gymfleet.testing import running_fleet  # noqa: E402

EXAMPLE = ROOT / "resources_servers/mcqa/data/example.jsonl"


async def _collect(fleet, out: Path, rows: int) -> None:
    config = RolloutCollectionConfig(agent_name="mcqa_simple_agent", input_jsonl_fpath=str(EXAMPLE),
                                     output_jsonl_fpath=str(out), num_repeats=math.ceil(rows / 5),
                                     num_samples_in_parallel=64)
    try:
        client = await http.ServerClient.from_head("127.0.0.1", fleet.config.head_port)
        await collect(config, client, progress=False)
    finally:
        await http.close()


async def _fleet_run(fleet, settings: ReverifyConfig):
    try:
        client = await http.ServerClient.from_head("127.0.0.1", fleet.config.head_port)
        async with FleetBackend(client) as backend:
            return await reverify(settings, backend, progress=False)
    finally:
        await http.close()


async def _in_process_run(settings: ReverifyConfig):
    config = parse_global_config(GlobalConfigDictParserConfig(
        initial_global_config_dict={"config_paths": [str(ROOT / "configs/quickstart.yaml")]},
        skip_load_from_cli=True), assign_ports=False)
    async with InProcessBackend(config) as backend:
        return await reverify(settings, backend, progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    process = psutil.Process()
    peak = 0
    table = []
    with tempfile.TemporaryDirectory() as folder, running_fleet([str(ROOT / "configs/quickstart.yaml")]) as fleet:
        out = Path(folder) / "rollouts.jsonl"
        asyncio.run(_collect(fleet, out, args.rows))
        rows = len(out.read_text().splitlines())
        for label, runner, cache in (("fleet, cold", "fleet", "fleet"), ("fleet, warm (cached)", "fleet", "fleet"),
                                     ("in process, cold", "local", "local"),
                                     ("in process, warm (cached)", "local", "local")):
            settings = ReverifyConfig(input_jsonl_fpath=str(out), concurrency=args.concurrency,
                                      cache_jsonl_fpath=str(Path(folder) / f"{cache}_cache.jsonl"))
            start = time.perf_counter()
            if runner == "fleet":
                summary = asyncio.run(_fleet_run(fleet, settings))
            else:
                summary = asyncio.run(_in_process_run(settings))
            seconds = time.perf_counter() - start
            peak = max(peak, process.memory_info().rss)
            if summary.total("unchanged") != rows:
                raise SystemExit(f"{label}: expected {rows} unchanged rows:\n{summary.table()}")
            table.append((label, rows, summary.total("rescored"), summary.total("cached"), seconds, rows / seconds))
    print(f"ng_reverify over {rows} mcqa rollouts, concurrency {args.concurrency} (peak RSS of this process: "
          f"{peak / 2**20:.0f} MB)")
    print(f"{'run':<26} {'rows':>6} {'re-scored':>10} {'from cache':>11} {'seconds':>8} {'rows/s':>9}")
    for label, total, rescored, cached, seconds, rate in table:
        print(f"{label:<26} {total:>6} {rescored:>10} {cached:>11} {seconds:>8.2f} {rate:>9.0f}")


if __name__ == "__main__":
    main()
