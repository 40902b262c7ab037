"""Fault soak: a long `ng_collect_rollouts` while servers are killed (SIGKILL) or stalled (SIGSTOP) at random.

The fleet is real (`ng_run`'s supervisor, every server its own process, a restart budget large enough for the
soak): a scripted LLM behind `vllm_model`, mcqa, example_weather (two model calls and a tool call per rollout) and
code_gen on the sandbox service, each with its simple_agent. The collector is `gymfleet.rollouts.collect.collect` in
this process. For `--fault-s` seconds a seeded injector hits one server every `--kill-every` seconds on average: most
often a kill -9 (the supervisor restarts it), sometimes a stall of `--stall-s` seconds (the process is stopped; its
socket still accepts, nothing answers; then it goes on). Meanwhile the collection runs, and whenever a pass ends
(every rollout tried, or stopped because the fleet looked down), the next pass resumes it (`resume_from_cache`).
After the fault period, passes go on until every rollout has a result.

    python bench/fault_soak.py [--repeats 200] [--delay-s 0.2] [--parallel 16] [--kill-every 3] [--stall-s 5]
                               [--fault-s 60] [--seed 0]

Prints one table: rollouts expected, `/run` requests sent (over all passes), faults injected by kind, failure rows
by class, passes and stopped passes, rollouts lost (no result at the end: must be 0), rollouts with more than one
result (must be 0), rollouts completed exactly once, failure rows left open (not superseded: must be 0), wall time,
and the fleet's peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gymfleet import http  # noqa: E402
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config  # noqa: E402
from gymfleet.fleet.supervisor import Fleet  # noqa: E402
from gymfleet.http import ServerClient  # noqa: E402
from gymfleet.rollouts.collect import collect  # noqa: E402
from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig  # noqa: E402
from gymfleet.testing import free_port  # noqa: E402
from resources_servers.example_weather.app import FORECASTS  # noqa: E402
from tests.fault_tools import Outputs, key  # noqa: E402

ENVS = {  # agent -> its example rows
    "mcqa_simple_agent": ROOT / "resources_servers/mcqa/data/example.jsonl",
    "example_weather_simple_agent": ROOT / "resources_servers/example_weather/data/example.jsonl",
    "code_gen_simple_agent": ROOT / "resources_servers/code_gen/data/example.jsonl",
}
CONFIG_PATHS = ["configs/quickstart.yaml", "resources_servers/example_weather/configs/example_weather.yaml",
                "resources_servers/code_gen/configs/code_gen.yaml"]
STALLABLE = ("sandbox", "mcqa", "policy_model")
"""Servers the injector may stall as well as kill."""


def policy_rules(delay_s: float) -> list[dict]:
    """The quickstart's mcqa answers, a program for every code_gen row, and the weather script (look the city up,
    then report the forecast's condition); every answer takes `delay_s` (a model generating)."""
    quickstart = yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())
    rules = list(quickstart["scripted_llm"]["responses_api_models"]["scripted_model"]["rules"])
    rules.append({"match": "Solve the programming problem",
                  "text": "Easy.\n\n```python\nimport sys\nprint(sys.stdin.read()[:1])\n```"})
    conditions = sorted({condition for condition, _ in FORECASTS.values()})
    rules += [{"match": rf'"condition":\s*"{c}"', "match_in": "last_message", "text": f"The forecast says {c}."}
              for c in conditions]
    rules += [{"match": rf"(?i)\b{city}\b", "match_in": "transcript", "text": "Let me look that up.",
               "tool_calls": [{"name": "get_weather", "arguments": {"city": city.title()}}]} for city in FORECASTS]
    return [{**rule, "delay_s": delay_s} for rule in rules]


def start_fleet(workdir: Path, log, delay_s: float) -> Fleet:
    initial = {
        "config_paths": [str(ROOT / path) for path in CONFIG_PATHS],
        "head_server": {"host": "127.0.0.1", "port": free_port()},
        "restart_crashed_servers": 100_000,
        "nemo_gym_log_dir": str(workdir / "logs"),
        "scripted_llm": {"responses_api_models": {"scripted_model": {"rules": policy_rules(delay_s)}}},
        "code_gen": {"resources_servers": {"code_gen": {"verify_timeout_s": 10, "unit_test_timeout_secs": 2}}},
    }
    config = parse_global_config(
        GlobalConfigDictParserConfig(initial_global_config_dict=initial, skip_load_from_cli=True))
    fleet = Fleet(config, output=log)
    fleet.start(timeout_s=300)
    return fleet


class Injector:
    """Hits a random server every `every_s` seconds on average (seeded) until `stop()`; counts what it did, and
    samples the fleet's RSS."""

    def __init__(self, fleet: Fleet, seed: int, every_s: float, stall_s: float, for_s: float):
        self.fleet, self.every_s, self.stall_s = fleet, every_s, stall_s
        self.until = time.monotonic() + for_s
        self.rng = random.Random(seed)
        self.faults: Counter[str] = Counter()
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-injector", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s * self.rng.uniform(0.5, 1.5)) and time.monotonic() < self.until:
            self._sample_rss()
            name = self.rng.choice(sorted(self.fleet.children))
            child = self.fleet.children[name]
            if child.state != "running" or child.process.poll() is not None:
                continue  # still coming back from an earlier fault
            if name in STALLABLE and self.rng.random() < 0.25:
                self._stall(name, child.process.pid)
            else:
                os.kill(child.process.pid, signal.SIGKILL)
                self.faults[f"kill -9 {name}"] += 1

    def _stall(self, name: str, pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        self.faults[f"stall {name} {self.stall_s:g}s"] += 1
        self._stop.wait(self.stall_s)
        os.kill(pid, signal.SIGCONT)

    def _sample_rss(self) -> None:
        total = 0
        for child in psutil.Process().children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:
                continue
        self.peak_rss = max(self.peak_rss, total)


def write_rows(path: Path) -> int:
    """Every environment's example rows, each with its agent; returns how many."""
    rows = [{**json.loads(line), "agent_ref": {"type": "responses_api_agents", "name": agent}}
            for agent, rows_file in ENVS.items() for line in rows_file.read_text().splitlines()]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return len(rows)


async def wait_all_running(fleet: Fleet, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while any(row["status"] != "running" for row in fleet.process_table().values()):
        fleet.poll()  # raises if a server cannot be brought back
        if time.monotonic() > deadline:
            raise RuntimeError(f"servers not back: {fleet.process_table()}")
        await asyncio.sleep(0.2)


async def soak(args: argparse.Namespace, fleet: Fleet, workdir: Path) -> dict:
    tasks = write_rows(workdir / "in.jsonl")
    expected = {(task, rollout) for task in range(tasks) for rollout in range(args.repeats)}
    config = RolloutCollectionConfig(
        input_jsonl_fpath=str(workdir / "in.jsonl"), output_jsonl_fpath=str(workdir / "out.jsonl"),
        num_repeats=args.repeats, num_samples_in_parallel=args.parallel, max_attempts=1_000_000,
        disable_aggregation=True)
    client = ServerClient(fleet.config.data)
    injector = Injector(fleet, args.seed, args.kill_every, args.stall_s, args.fault_s)
    numbers = {"passes": 0, "stopped passes": 0, "dispatched": 0, "failures": Counter()}
    started = time.perf_counter()
    injector.start()
    try:
        while numbers["passes"] < args.max_passes:
            summary = await collect(config.model_copy(update={"resume_from_cache": numbers["passes"] > 0}),
                                    client, progress=False)
            numbers["passes"] += 1
            numbers["dispatched"] += summary.dispatched
            numbers["failures"].update(summary.failure_classes)
            numbers["stopped passes"] += summary.stopped is not None
            print(f"pass {numbers['passes']}: {summary.ok}/{len(expected)} done, {summary.dispatched} sent, "
                  f"failures {dict(summary.failure_classes)}, {summary.not_finished} not sent "
                  f"({summary.stopped or 'not stopped'}), {time.perf_counter() - started:.0f} s",
                  file=sys.stderr, flush=True)
            if summary.exit_code == 0:
                break
            if injector.running:
                await asyncio.sleep(1.0)  # servers come back by themselves; resume meanwhile
            else:
                await wait_all_running(fleet)
    finally:
        injector.stop()
        await http.close()
    numbers["wall_s"] = time.perf_counter() - started
    outputs = Outputs.of(workdir / "out.jsonl")
    done = Counter(key(row) for row in outputs.results)
    numbers.update(
        expected=len(expected), faults=injector.faults, peak_rss=injector.peak_rss,
        lost=len(expected - set(done)), duplicates=sum(1 for count in done.values() if count > 1),
        once=sum(1 for k, count in done.items() if count == 1 and k in expected),
        open_failures=len(outputs.open_failures()), failure_rows=len(outputs.failures),
        untyped=sum(1 for row in outputs.failures if not row.get("_ng_failure_class")),
    )
    return numbers


def print_table(numbers: dict) -> None:
    rows = [
        ("rollouts expected", numbers["expected"]),
        ("rollouts dispatched (all passes)", numbers["dispatched"]),
        ("passes (stopped: fleet looked down)", f"{numbers['passes']} ({numbers['stopped passes']})"),
        ("faults injected", sum(numbers["faults"].values())),
        *((f"  {kind}", count) for kind, count in sorted(numbers["faults"].items())),
        ("failure rows (all passes)", numbers["failure_rows"]),
        *((f"  {cls}", count) for cls, count in sorted(numbers["failures"].items())),
        ("failure rows without a class", numbers["untyped"]),
        ("rollouts lost (no result at the end)", numbers["lost"]),
        ("rollouts with more than one result", numbers["duplicates"]),
        ("rollouts completed exactly once", numbers["once"]),
        ("failure rows left open (not superseded)", numbers["open_failures"]),
        ("wall time (s)", f"{numbers['wall_s']:.1f}"),
        ("rollouts/s (incl. fault period)", f"{numbers['expected'] / numbers['wall_s']:.1f}"),
        ("fleet peak RSS (MiB)", f"{numbers['peak_rss'] / 2**20:.0f}"),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"{'fault soak':<{width}}  value")
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="rollouts per example row (15 rows)")
    parser.add_argument("--delay-s", type=float, default=0.2, help="seconds the scripted LLM takes per answer")
    parser.add_argument("--kill-every", type=float, default=3.0, help="mean seconds between faults")
    parser.add_argument("--stall-s", type=float, default=5.0, help="how long a stalled server stays stopped")
    parser.add_argument("--fault-s", type=float, default=60.0, help="seconds of fault injection")
    parser.add_argument("--parallel", type=int, default=16, help="num_samples_in_parallel")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-passes", type=int, default=200)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="fault_soak-") as folder:
        workdir = Path(folder)
        with (workdir / "fleet.log").open("w") as log:
            fleet = start_fleet(workdir, log, args.delay_s)
            try:
                numbers = asyncio.run(soak(args, fleet, workdir))
            finally:
                fleet.shutdown()
    print_table(numbers)
    if numbers["lost"] or numbers["duplicates"] or numbers["open_failures"] or numbers["untyped"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
