"""SWE rollouts under load: N concurrent rollouts of ~20 tool steps each through the shipped SWE recipe.

The fleet is `configs/swe_rl.yaml` as `ng_run` starts it (`running_fleet`: policy model, sandbox, swebench and
swe_agent each their own process), with a scripted upstream standing in for vLLM. Each rollout explores the
repository (git log, listings, file views, greps, test runs), writes the gold patch with `create_file`, applies it
with `git apply`, runs the tests and looks at the diff: 20 tool calls, 21 model calls, then `/verify` grades the
session's diff in a fresh sandbox, and scores 1.0. Rows cycle through the five example tasks. This process is
`ng_collect_rollouts` (`gymfleet.rollouts.collect.collect`, every `/run` at once).

    python bench/swe_rollouts.py [--rollouts 32] [--repeats 1]

Prints a table per collection: rollouts/s, p50/p99 of a whole rollout, of one tool call (round trip seen by the
agent, `agent_tool_call_s`) and of one grading run (`grading_duration_s`), errors (failed rollouts, rewards other
than 1.0, rollouts without 20 tool calls), the sandbox service's RSS (with its children) before, at its peak and
after, the sandbox sessions still open (its `/metrics`), and the sandbox processes left under the service afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import RSSSampler, timed_collect  # noqa: E402
from gymfleet import http  # noqa: E402
from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig  # noqa: E402
from gymfleet.testing import running_fleet, scripted_policy  # noqa: E402

AGENT = "swebench_swe_agent"
EXAMPLE = ROOT / "resources_servers/swebench/data/example.jsonl"
CONFIG_PATHS = ["configs/swe_rl.yaml"]
TOOL_CALLS = 20
SANDBOX_UID = 65534


def calls_for(row: dict) -> list[tuple[str, dict]]:
    """20 tool calls that explore, fix with the gold patch, and check."""
    source = re.search(r"^\+\+\+ b/(.+)$", row["patch"], re.M).group(1)
    package = source.split("/")[0]
    calls = [
        ("bash", {"command": "git log --oneline"}), ("view_file", {"path": "."}), ("view_file", {"path": package}),
        ("view_file", {"path": source}), ("bash", {"command": f"grep -rn def {package}"}),
        ("view_file", {"path": "tests"}), ("bash", {"command": "python3 -m unittest 2>&1 | tail -3"}),
        ("view_file", {"path": "README.md"}), ("bash", {"command": "git status --short"}),
        ("bash", {"command": f"python3 -c 'import {package}; print({package}.__doc__)'"}),
        ("view_file", {"path": source, "start_line": 1, "end_line": 5}), ("bash", {"command": "ls -la"}),
        ("bash", {"command": "wc -l $(git ls-files)"}), ("bash", {"command": "git show --stat HEAD"}),
        ("view_file", {"path": source, "start_line": 5}),
        ("create_file", {"path": "fix.patch", "content": row["patch"]}),
        ("bash", {"command": "git apply fix.patch && rm fix.patch"}),
        ("bash", {"command": "python3 -m unittest 2>&1 | tail -3"}), ("bash", {"command": "git diff"}),
        ("bash", {"command": "git status --short"}),
    ]
    assert len(calls) == TOOL_CALLS
    return calls


def script(rows: list[dict]) -> list[dict]:
    rules = []
    for row in rows:
        match = re.escape(row["responses_create_params"]["input"][-1]["content"][:60])
        calls = calls_for(row)
        rules += [{"match": match, "turn": turn, "tool_calls": [{"name": name, "arguments": arguments}]}
                  for turn, (name, arguments) in enumerate(calls)]
        rules.append({"match": match, "turn": len(calls), "text": "Fixed: the tests pass."})
    return rules


def fleet_extra(rules: list[dict]) -> dict:
    return scripted_policy(rules, default_text=None)


async def instance_info(head_port: int) -> dict[str, dict]:
    try:
        response = await http.request("GET", f"http://127.0.0.1:{head_port}/server_instances")
        response.raise_for_status()
        return {row["process_name"]: row for row in response.json()}
    finally:
        await http.close()


async def sessions_open(url: str) -> float | None:
    try:
        text = (await http.request("GET", url + "/metrics")).text
    finally:
        await http.close()
    match = re.search(r"^gymfleet_sandbox_sessions(?:_open)?(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else None


def sandbox_processes(pid: int) -> int:
    """Processes under the sandbox service (its sandboxes: bwrap and what runs as the sandbox uid in them)."""
    count = 0
    for process in psutil.Process(pid).children(recursive=True):
        try:
            count += process.name() == "bwrap" or SANDBOX_UID in (process.uids().real, process.uids().effective)
        except psutil.Error:
            pass
    return count


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--settle-s", type=float, default=5.0, help="wait before the 'after' samples")
    args = parser.parse_args()
    os.environ.setdefault("GYMFLEET_LOG_LEVEL", "WARNING")
    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines() if line.strip()]
    mib = 1024 * 1024
    table = []
    with tempfile.TemporaryDirectory() as scratch, running_fleet(CONFIG_PATHS, fleet_extra(script(rows))) as fleet:
        head_port = fleet.config.head_port
        info = asyncio.run(instance_info(head_port))
        sandbox = info["sandbox"]
        sandbox_url = f"http://{sandbox.get('host', '127.0.0.1')}:{sandbox['port']}"
        pid = sandbox["pid"]
        before_all = RSSSampler(pid).rss()
        for index, count in enumerate([5] + [args.rollouts] * args.repeats):  # a warm-up of one rollout per task
            data = Path(scratch) / f"rows{index}.jsonl"
            with data.open("w") as out:
                for number in range(count):
                    out.write(json.dumps({**rows[number % len(rows)], "rollout": number}) + "\n")
            config = RolloutCollectionConfig(input_jsonl_fpath=str(data), agent_name=AGENT,
                                             output_jsonl_fpath=f"{scratch}/out{index}.jsonl",
                                             num_samples_in_parallel=None)
            before = RSSSampler(pid).rss()
            summary, client, wall_s, sampler = asyncio.run(timed_collect(config, head_port, pid))
            time.sleep(args.settle_s)
            after = RSSSampler(pid).rss()
            results = [json.loads(line) for line in Path(config.output_jsonl_fpath).read_text().splitlines()]
            tool_s = [t for r in results for t in r.get("agent_tool_call_s") or []]
            grading_s = [r["grading_duration_s"] for r in results if r.get("grading_duration_s") is not None]
            errors = (count - len(results)) + sum(r.get("reward") != 1.0 for r in results) + sum(
                len(r.get("agent_tool_call_s") or []) != TOOL_CALLS for r in results)
            table.append({
                "run": "warm-up" if index == 0 else f"run {index}", "rollouts": count, "wall_s": wall_s,
                "rollouts_per_s": count / wall_s, "run_p50": pct(client.latencies, 0.5),
                "run_p99": pct(client.latencies, 0.99), "tool_p50": pct(tool_s, 0.5), "tool_p99": pct(tool_s, 0.99),
                "tool_calls": len(tool_s), "grade_p50": pct(grading_s, 0.5), "grade_p99": pct(grading_s, 0.99),
                "errors": errors, "rss_before": before / mib, "rss_peak": sampler.peak / mib, "rss_after": after / mib,
                "sessions_open": asyncio.run(sessions_open(sandbox_url)), "uid_procs": sandbox_processes(pid),
            })  # fmt: skip
    print(f"\nSWE rollouts ({TOOL_CALLS} tool calls each) via configs/swe_rl.yaml; sandbox RSS at start "
          f"{before_all / mib:.0f} MiB")
    header = ("run", "rollouts", "wall s", "rollouts/s", "run p50/p99 s", "tool calls", "tool p50/p99 ms",
              "grade p50/p99 s", "errors", "sandbox RSS before/peak/after MiB", "sessions open", "sandbox procs left")
    print(" | ".join(header))
    for row in table:
        print(" | ".join([
            row["run"], str(row["rollouts"]), f"{row['wall_s']:.1f}", f"{row['rollouts_per_s']:.2f}",
            f"{row['run_p50']:.1f}/{row['run_p99']:.1f}", str(row["tool_calls"]),
            f"{row['tool_p50'] * 1000:.0f}/{row['tool_p99'] * 1000:.0f}",
            f"{row['grade_p50']:.2f}/{row['grade_p99']:.2f}", str(row["errors"]),
            f"{row['rss_before']:.0f}/{row['rss_peak']:.0f}/{row['rss_after']:.0f}", str(row["sessions_open"]),
            str(row["uid_procs"]),
        ]))  # fmt: skip


if __name__ == "__main__":
    main()
