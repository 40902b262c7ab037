"""workplace_assistant under load: N rollouts of 6 tool calls each, all in flight at once, through `collect`.

The fleet is started from the shipped config files (`vllm_model.yaml` + `workplace_assistant.yaml`) with a scripted
upstream standing in for vLLM, each server its own process (`running_fleet`, as `ng_run` starts it). Rows are the
environment's `data/example.jsonl` tasks with read-only calls put in front of their reference solution so each
ground truth has exactly 6 calls; the scripted model replays it one call per turn (`turn: N` rules), then answers
"Done.", so a rollout is 7 model calls, 6 tool calls, `/seed_session` and `/verify`, and scores 1.0. This process
is `ng_collect_rollouts`: `gymfleet.rollouts.collect.collect` with `num_samples_in_parallel` unset (every `/run` at
once).

    python bench/workplace_assistant_rollouts.py [--rollouts 2000]

Prints one table, a line per collection: rollouts/s, p50/p99 latency of one `/run` (all are dispatched at t=0, so
p50 is roughly half the wall time), errors (failed rollouts, rewards other than 1.0, trajectories without 6 tool
calls), the workplace_assistant server's RSS before the collection, at its peak (sampled every 0.1 s) and after
it, and the sessions still open after it (its `gymfleet_sessions_open` gauge). First a warm-up of 20 rollouts (the
first requests import and cache what a server keeps for its lifetime), then `--repeats` collections of `--rollouts`
each on the same fleet: sessions are dropped at `/verify` and the server hands freed memory back when it falls idle
after a burst, so "after" should come back near "before", and stay level from one collection to the next.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import timed_collect  # noqa: E402
from gymfleet import http  # noqa: E402
from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig  # noqa: E402
from gymfleet.testing import running_fleet, scripted_policy  # noqa: E402

ENV = "workplace_assistant"
AGENT = "workplace_assistant_simple_agent"
EXAMPLE = ROOT / "resources_servers/workplace_assistant/data/example.jsonl"
CONFIG_PATHS = ["responses_api_models/vllm_model/configs/vllm_model.yaml",
                "resources_servers/workplace_assistant/configs/workplace_assistant.yaml"]
CALLS_PER_ROLLOUT = 6
READS = [  # read-only calls on the synthetic tables: replaying them changes nothing, so the reward stays 1.0
    ("company_directory_find_email_address", {"name": "priya"}),
    ("email_search_emails", {"query": "Roadmap"}),
    ("calendar_search_events", {"query": "sync"}),
    ("project_management_search_tasks", {"board": "Front end"}),
    ("customer_relationship_manager_search_customers", {"status": "Won"}),
    ("analytics_total_visits_count", {"time_min": "2023-11-01", "time_max": "2023-11-15"}),
]


def tasks() -> list[dict]:
    """The example tasks, each ground truth padded in front with read-only calls to `CALLS_PER_ROLLOUT` calls."""
    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines() if line.strip()]
    for row in rows:
        pad = CALLS_PER_ROLLOUT - len(row["ground_truth"])
        reads = [{"name": name, "arguments": json.dumps(args)} for name, args in READS[:pad]]
        row["ground_truth"] = reads + row["ground_truth"]
    return rows


def script(rows: list[dict]) -> list[dict]:
    """Scripted-model rules: each task's ground-truth calls one per turn, then a closing message."""
    rules = []
    for row in rows:
        match = re.escape(row["responses_create_params"]["input"][-1]["content"])
        calls = row["ground_truth"]
        rules += [{"match": match, "turn": turn, "tool_calls": [call]} for turn, call in enumerate(calls)]
        rules.append({"match": match, "turn": len(calls), "text": "Done."})
    return rules


def fleet_extra(rules: list[dict]) -> dict:
    """Merged over the config files: the scripted upstream, and max_steps above the 7 model calls a rollout takes."""
    return {**scripted_policy(rules, default_text=None),
            AGENT: {"responses_api_agents": {"simple_agent": {"max_steps": CALLS_PER_ROLLOUT + 4}}}}


def write_rows(path: Path, rows: list[dict], count: int) -> None:
    """`count` rows cycling through `rows`, each with its own `id` (so each is its own task)."""
    with path.open("w") as handle:
        for index in range(count):
            handle.write(json.dumps({**rows[index % len(rows)], "id": index}) + "\n")


async def server_pid(head_port: int, name: str) -> int:
    """The pid the head server's `/server_instances` reports for instance `name`."""
    try:
        response = await http.request("GET", f"http://127.0.0.1:{head_port}/server_instances")
        response.raise_for_status()
        return next(row["pid"] for row in response.json() if row["process_name"] == name)
    finally:
        await http.close()


def short_rollouts(path: Path) -> int:
    """Results in `path` whose trajectory does not hold exactly `CALLS_PER_ROLLOUT` tool calls."""
    short = 0
    for line in path.read_text().splitlines():
        items = json.loads(line)["response"]["output"]
        short += sum(item["type"] == "function_call" for item in items) != CALLS_PER_ROLLOUT
    return short


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=2, help="collections of --rollouts on the same fleet")
    parser.add_argument("--settle-s", type=float, default=35.0,
                        help="wait before the 'after' RSS sample (past the 30 s keep-alive of idle connections)")
    args = parser.parse_args()

    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65535), hard))
    os.environ.setdefault("GYMFLEET_LOG_LEVEL", "WARNING")  # the fleet's processes inherit it
    rows = tasks()
    mib = 1024 * 1024
    lines = []
    with tempfile.TemporaryDirectory() as scratch, running_fleet(CONFIG_PATHS, fleet_extra(script(rows))) as fleet:
        head_port = fleet.config.head_port
        pid = asyncio.run(server_pid(head_port, ENV))
        at_start = psutil.Process(pid).memory_info().rss
        for run_index, count in enumerate([20] + [args.rollouts] * args.repeats):
            data = Path(scratch) / f"rows{run_index}.jsonl"
            write_rows(data, rows, count)
            config = RolloutCollectionConfig(input_jsonl_fpath=str(data),
                                             output_jsonl_fpath=f"{scratch}/out{run_index}.jsonl",
                                             agent_name=AGENT, num_samples_in_parallel=None)
            before = psutil.Process(pid).memory_info().rss
            summary, client, wall_s, sampler = asyncio.run(timed_collect(config, head_port, pid))
            time.sleep(args.settle_s)
            after = sampler.rss()
            short = short_rollouts(Path(config.output_jsonl_fpath))
            rewards = Counter(reward for _, _, reward in summary.rewards)
            errors = summary.failed + sum(n for reward, n in rewards.items() if reward != 1.0) + short
            latencies = client.latencies
            quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
            label = "warm-up" if run_index == 0 else f"run {run_index}"
            lines.append(f"| {label} | {count} | {summary.ok / wall_s:.0f} | {quantiles[49]:.1f} s | "
                         f"{quantiles[98]:.1f} s | {errors} | {before / mib:.0f} MiB | {sampler.peak / mib:.0f} MiB | "
                         f"{after / mib:.0f} MiB | {open_sessions(head_port)} |")
            if summary.failure_classes or set(rewards) - {1.0} or short:
                lines.append(f"failures: {dict(summary.failure_classes)}; rewards: {dict(rewards)}; "
                             f"results without {CALLS_PER_ROLLOUT} tool calls: {short}; first failure: "
                             f"{first_failure(Path(config.output_jsonl_fpath))}")
        crashed = fleet_statuses(head_port)
    print(f"\n{args.rollouts} rollouts x {CALLS_PER_ROLLOUT} tool calls, all in flight at once, {args.repeats} times "
          f"on one fleet; {os.cpu_count()} cores; workplace_assistant RSS at fleet start {at_start / mib:.0f} MiB\n")
    print("| collection | rollouts | rollouts/s | p50 latency | p99 latency | errors | RSS before | RSS peak "
          "| RSS after | sessions open after |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(lines))
    if crashed:
        print(f"servers not running or restarted: {crashed}")


def first_failure(output: Path) -> str:
    """The reason of the first row in the collection's failures file, if any."""
    for path in output.parent.glob(output.stem + "*failures*"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            return (f"{row.get('_ng_failure_class')} {row.get('_ng_failure_status')}: "
                    f"{str(row.get('_ng_failure_detail') or row.get('failure'))[:400]}")
    return "-"


def open_sessions(head_port: int) -> str:
    """The environment's `gymfleet_sessions_open` gauge, read from its `/metrics`."""
    async def fetch():
        try:
            response = await http.request("GET", f"http://127.0.0.1:{head_port}/server_instances")
            url = next(row["url"] for row in response.json() if row["process_name"] == ENV)
            return (await http.request("GET", url + "/metrics")).text
        finally:
            await http.close()

    found = re.search(r"^gymfleet_sessions_open (\S+)$", asyncio.run(fetch()), re.MULTILINE)
    return str(int(float(found.group(1)))) if found else "?"


def fleet_statuses(head_port: int) -> list[str]:
    """Instances that are not running, or restarted during the run (from the head's `/server_instances`)."""
    async def fetch():
        try:
            response = await http.request("GET", f"http://127.0.0.1:{head_port}/server_instances")
            return response.json()
        finally:
            await http.close()

    return [f"{row['process_name']} {row['status']} restarts={row['restarts']}" for row in asyncio.run(fetch())
            if row["status"] != "running" or row["restarts"]]


if __name__ == "__main__":
    main()
