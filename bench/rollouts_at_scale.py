"""Rollouts at scale: 1,024 / 4,096 / 16,384 in flight at once through NeMo-RL's `run_examples`, on a mixed fleet.

The fleet is what NeMo-RL starts (`RunHelper.start` with an `initial_global_config_dict`): `policy_model`
(vllm_model_for_training, token capture on) in front of one scripted upstream standing in for vLLM, and five
environments behind their simple_agents: mcqa, math_with_judge (its judge is the policy model, so the scripted
model too), instruction_following, example_weather (a tool call, then the answer) and code_gen (its programs run
in the sandbox service; 1 group in 16, so the run stays a few minutes on 2 cores). Every scripted answer is right,
so every rollout must score 1.0: anything else is counted as an error. math_with_judge answers in words
(`\\boxed{\\text{four hundred}}`), which math-verify cannot confirm, so every math rollout asks the judge twice.

Generation latency is injected: each row draws (seeded) one of `DELAYS_S` (1-3 s), the scripted upstream sleeps
that long on every model call of its rollout, judge calls included (the row carries a `(ref L<k>)` tag its rules
match). Rows come in groups of `--generations` identical prompts, stamped as NeMo-RL's `_prepare_nemo_gym_rows`
does, and this process sends every row's `POST /run` at once, as NeMo-RL does.

    python bench/rollouts_at_scale.py [--sizes 1024,4096,16384] [--generations 16] [--seed 0]
        [--max-concurrent-rollouts N] [--placement ray --replicas 2]

Each size gets a fresh fleet. One table, a column per size: rollouts/s, p50/p99 end to end, time to the first
result and the first complete group, per-hop p50/p99 computed from the fleet's own `/metrics` histograms
(`gymfleet_upstream_seconds` of the agents, the judge's and the model server's calls; `gymfleet_request_seconds`
of `/verify` inside the environments; the agents' admission wait), peak RSS of the fleet and of this client, and
errors by class. A second table gives each server's peak RSS (summed over its processes) and peak open file
descriptors (its busiest process), sampled every 0.2 s with psutil.

Stall detector: no result for `--stall-s` (60 s) is a stall, printed when it happens and counted in the table; no
result for `--abort-s` (600 s) gives the run up, counting what is left as `stalled`.

`--placement ray --replicas 2` sets the top-level `placement: ray` and `num_replicas: 2` on every resources server,
agent and the policy's model server. Ray placement needs a cluster: `$RAY_ADDRESS` (or this process already
connected), or `--ray-nodes N`, which starts a local one of N nodes with Ray's own multi-node test fixture
(`ray.cluster_utils.Cluster`, each node `--ray-node-cpus` CPUs, on `127.0.0.1`; the head server then listens on
127.0.0.1 too) for the length of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import math
import os
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from bench._common import require_modules, started_fleet  # noqa: E402
from bench._fleet import Buckets, instance_pids, scrape, server_urls  # noqa: E402
from bench.nemo_rl_rollouts import PeakRSS  # noqa: E402
from gymfleet import connections, http  # noqa: E402
from gymfleet.errors import TransportError  # noqa: E402
from gymfleet.fleet.launch import raise_nofile_limit  # noqa: E402
from gymfleet.testing import free_port  # noqa: E402
from nemo_gym.cli import RunHelper  # noqa: E402
from nemo_gym.rollout_collection import RolloutCollectionHelper  # noqa: E402
from resources_servers.example_weather.app import FORECASTS  # noqa: E402

SCRIPTED = "scripted_llm.responses_api_models.scripted_model"
DELAYS_S = (1.0, 1.5, 2.0, 2.5, 3.0)
"""Generation latencies a row can draw; its every model call (judge calls included) sleeps that long."""
ENVS = ("mcqa", "math_with_judge", "instruction_following", "example_weather", "code_gen")
SCHEDULE = ("code_gen",) + ("mcqa", "math_with_judge", "instruction_following", "example_weather") * 4
"""Which environment each group goes to, cycling: code_gen 1 group in 17, the others 4 each."""
WEATHER_CITY = "paris"

# The right answer to the first row of each environment's data/example.jsonl (matched on the last user message).
ANSWERS = {
    "mcqa": ("shortest orbital period",
             {"text": "Mercury is closest to the Sun, so its year is shortest.\n\n\\boxed{B}"}),
    "math_with_judge": ("sum of the first 20 positive odd integers",
                        {"reasoning": "The first n odd numbers add up to n squared.",
                         "text": "1 + 3 + ... + 39 = 20^2, so the sum is $\\boxed{\\text{four hundred}}$."}),
    "instruction_following": ("new neighbour inviting them to a weekend barbecue",
                              {"text": "<<Welcome to the Street>>\nHi [neighbour name], come over for a barbecue on "
                                       "Saturday at [time]. We will handle the grill; just bring your appetite."}),
    "code_gen": ("largest value of a_j - a_i",
                 {"text": "Track the smallest value so far.\n\n```python\nn = int(input())\nbest, low = 0, None\n"
                          "for x in map(int, input().split()):\n    if low is not None:\n"
                          "        best = max(best, x - low)\n    low = x if low is None else min(low, x)\n"
                          "print(best)\n```"}),
}


def tag(level: int) -> str:
    return f"(ref L{level})"


def script() -> list[dict]:
    """The scripted upstream's rules: per latency level, the judge's verdict first (its prompt quotes the math
    question), then each environment's answer, then the weather tool call and the forecast."""
    rules = []
    condition = FORECASTS[WEATHER_CITY][0]
    for level, delay_s in enumerate(DELAYS_S):
        marker = tag(level).replace("(", r"\(").replace(")", r"\)")
        rules.append({"match": rf"Two final answers to the same math problem[\s\S]*{marker}",
                      "text": "Both are the number 400.\n[[A=B]]", "delay_s": delay_s})
        for match, reply in ANSWERS.values():
            rules.append({"match": rf"{match}[\s\S]*{marker}", **reply, "delay_s": delay_s})
        rules.append({"match": rf"(?i)\b{WEATHER_CITY}\b[\s\S]*{marker}", "turn": 0, "text": "Let me look that up.",
                      "tool_calls": [{"name": "get_weather", "arguments": {"city": WEATHER_CITY.title()}}],
                      "delay_s": delay_s})
        rules.append({"match": rf"{marker}[\s\S]*\"condition\":\s*\"{condition}\"", "match_in": "transcript",
                      "turn": 1, "text": f"The forecast says {condition}.", "delay_s": delay_s})
    return rules


def fleet_config(head_port: int, args: argparse.Namespace) -> dict:
    config = {
        "config_paths": ["responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"]
        + [f"resources_servers/{env}/configs/{env}.yaml" for env in ENVS],
        "scripted_llm": {"responses_api_models": {"scripted_model": {"entrypoint": "app.py", "rules": script()}}},
        "math_with_judge": {"resources_servers": {"math_with_judge": {"should_use_judge": True}}},
        "policy_base_url": f"http://${{{SCRIPTED}.host}}:${{{SCRIPTED}.port}}/v1",
        "policy_api_key": "dummy_key", "policy_model_name": "scripted", "default_host": "127.0.0.1",
        "head_server": {"host": "127.0.0.1" if args.ray_nodes else "0.0.0.0", "port": head_port},
        "port_range_low": 5000, "port_range_high": 5999,
        "global_aiohttp_connector_limit_per_host": 32768, "global_aiohttp_connector_limit": 65536,
        "num_gpu_nodes": 0,
    }
    agent_fields = {}
    if args.max_concurrent_rollouts is not None:
        agent_fields["max_concurrent_rollouts"] = args.max_concurrent_rollouts
    if args.placement:
        config["placement"] = args.placement
    if args.replicas:
        agent_fields["num_replicas"] = args.replicas
        for env in ENVS:
            config.setdefault(env, {}).setdefault("resources_servers", {}).setdefault(env, {})[
                "num_replicas"] = args.replicas
        # the policy's model server too (a vLLM with data parallelism has one per replica): a single one queues the
        # doubled agents' calls and math_with_judge's judge calls behind each other past the judge's timeout
        config["policy_model"] = {"responses_api_models": {"vllm_model": {"num_replicas": args.replicas}}}
    if agent_fields:
        for env in ENVS:
            config[f"{env}_simple_agent"] = {"responses_api_agents": {"simple_agent": dict(agent_fields)}}
    return config


def first_row(env: str) -> dict:
    path = ROOT / f"resources_servers/{env}/data/example.jsonl"
    return json.loads(path.read_text().splitlines()[0])


def nemo_rl_rows(count: int, generations: int, seed: int) -> list[dict]:
    """Groups of `generations` rows of one prompt, environments cycling through `SCHEDULE`; each row draws its
    latency level, tagged onto its last user message (and the math question the judge is shown)."""
    templates = {env: first_row(env) for env in ENVS}
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        group = index // generations
        env = SCHEDULE[group % len(SCHEDULE)]
        row = copy.deepcopy(templates[env])
        level = rng.randrange(len(DELAYS_S))
        params = row["responses_create_params"]
        params["input"][-1]["content"] += f"\n\n{tag(level)}"
        if "question" in row:
            row["question"] += f" {tag(level)}"
        params.update(temperature=1.0, top_p=1.0, max_output_tokens=1024)
        row.update(_rowidx=index, _ng_task_index=group,
                   agent_ref={"type": "responses_api_agents", "name": f"{env}_simple_agent"})
        rows.append(row)
    return rows


class Run:
    """One size's collection: completion times (s since dispatch), groups, errors by class, stalls."""

    def __init__(self, rows: list[dict]):
        self.rows = rows
        self.latencies: list[float] = []
        self.errors: Counter = Counter()
        self.group_left = Counter(row["_ng_task_index"] for row in rows)
        self.first_group_s: float | None = None
        self.stalls: list[str] = []
        self.wall_s = 0.0
        self.stale_dropped = 0
        """Pooled connections this client found closed by their server and dropped before sending on them."""

    def quantile(self, q: int) -> float:
        if not self.latencies:
            return math.nan
        return statistics.quantiles(self.latencies, n=100)[q - 1] if len(self.latencies) > 1 else self.latencies[0]

    def record(self, now: float, row: dict, result: dict) -> None:
        self.latencies.append(now)
        group = row["_ng_task_index"]
        self.group_left[group] -= 1
        if self.first_group_s is None and self.group_left[group] == 0:
            self.first_group_s = now
        failure = result.get("_ng_failure_class")
        if failure:
            self.errors[f"failure row: {failure}"] += 1
        elif result.get("reward") != 1.0:
            self.errors[f"reward {result.get('reward')} ({row['agent_ref']['name']})"] += 1


def error_class(exc: BaseException) -> str:
    if isinstance(exc, TransportError):
        return f"{exc.failure_class} {exc.status or ''}".strip()
    return type(exc).__name__


async def collect(rows: list[dict], head, stall_s: float, abort_s: float) -> Run:
    run = Run(rows)
    start = time.perf_counter()
    last = [start]
    stale_before = connections.stale_dropped

    async def consume():
        for future in RolloutCollectionHelper().run_examples(examples=rows, head_server_config=head):
            try:
                row, result = await future
            except Exception as exc:  # a bench counts failures by class
                run.errors[error_class(exc)] += 1
                last[0] = time.perf_counter()
                continue
            last[0] = now = time.perf_counter()
            run.record(now - start, row, result)

    async def watchdog(task: asyncio.Task):
        stalled_since = None
        while not task.done():
            await asyncio.sleep(1.0)
            quiet = time.perf_counter() - last[0]
            done = len(run.latencies) + sum(run.errors.values())
            if quiet >= stall_s and stalled_since is None:
                stalled_since = last[0]
                note = (f"STALL at {last[0] - start + stall_s:.0f}s: no result for {stall_s:g}s, "
                        f"{done}/{len(rows)} done")
                run.stalls.append(note)
                print(note, flush=True)
            elif quiet < stall_s:
                stalled_since = None
            if quiet >= abort_s:
                print(f"giving up after {abort_s:g}s without a result; {len(rows) - done} rollouts left", flush=True)
                run.errors["stalled (no result before --abort-s)"] += len(rows) - done
                task.cancel()

    try:
        task = asyncio.ensure_future(consume())
        guard = asyncio.ensure_future(watchdog(task))
        try:
            await task
        except asyncio.CancelledError:
            pass
        guard.cancel()
        run.wall_s = time.perf_counter() - start
        run.stale_dropped = connections.stale_dropped - stale_before
        return run
    finally:
        await http.close()


# ---------------------------------------------------------------------------------------------- /metrics hops


class FleetMemory(PeakRSS):
    """`PeakRSS`, plus the peak PSS of this client and of the fleet (all its processes), sampled every
    `pss_every_s`: PSS splits the pages forked servers share with the zygote among them, so the fleet's sum counts
    each page once (the RSS sum counts a shared page once per process)."""

    def __init__(self, pids: dict[int, str], pss_every_s: float = 5.0):
        super().__init__(pids)
        self.client_pss = self.fleet_pss = 0
        self.pss_every_s, self._pss_at = pss_every_s, 0.0

    def sample(self) -> None:
        super().sample()
        if not hasattr(self, "cpu_start"):
            self.cpu_start = dict(self.cpu_s)  # CPU time the servers had used before the run (start-up)
        now = time.monotonic()
        if now - self._pss_at < self.pss_every_s:
            return
        self._pss_at = now
        self.client_pss = max(self.client_pss, self._me.memory_full_info().pss)
        total = 0
        for child in self._me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_full_info().pss
        self.fleet_pss = max(self.fleet_pss, total)

    def __exit__(self, *exc):
        self._pss_at = 0.0
        self.sample()  # one last PSS sample: the end of a short run is its fullest
        return super().__exit__(*exc)


def hops(rh: RunHelper) -> dict[str, Buckets]:
    """Per-hop latency histograms from every server's (every replica's) `/metrics`, per call attempt."""
    found: dict[str, Buckets] = defaultdict(Buckets)
    agents = {f"{env}_simple_agent" for env in ENVS}
    for name, url in server_urls(rh.head_server_config):
        for sample in scrape(rh.head_server_config, url):
            if sample.name == "gymfleet_upstream_seconds_bucket":
                target = sample.labels["target"]
                if name in agents:
                    hop = "agent → model" if target == "policy_model" else "agent → resources (all calls)"
                elif name == "math_with_judge" and target == "policy_model":
                    hop = "math_with_judge → judge"
                elif name == "code_gen":
                    hop = "code_gen → sandbox"
                elif name == "policy_model":
                    hop = "model server → upstream (scripted vLLM)"
                else:
                    continue
                found[hop].add(sample)
            elif sample.name == "gymfleet_request_seconds_bucket" and sample.labels.get("route") == "/verify":
                found["/verify inside the environment"].add(sample)
            elif sample.name == "gymfleet_rollout_wait_seconds_bucket":
                found["agent admission wait"].add(sample)
    return found


# --------------------------------------------------------------------------------------------------- driver


def one_size(size: int, args: argparse.Namespace) -> dict:
    with started_fleet(fleet_config(free_port(), args)) as (rh, spin_up_s):
        rows = nemo_rl_rows(size, args.generations, args.seed)
        print(f"\n{size} rollouts: fleet up in {spin_up_s:.1f}s; sending them all at once", flush=True)
        with FleetMemory(instance_pids(rh.head_server_config)) as rss:
            run = asyncio.run(collect(rows, rh.head_server_config, args.stall_s, args.abort_s))
        latency = hops(rh)
    return {"size": size, "spin_up_s": spin_up_s, "run": run, "rss": rss, "hops": latency}


HOP_ORDER = ("agent admission wait", "agent → model", "model server → upstream (scripted vLLM)",
             "agent → resources (all calls)", "/verify inside the environment", "math_with_judge → judge",
             "code_gen → sandbox")


def print_tables(results: list[dict], args: argparse.Namespace) -> None:
    mib = 1024 * 1024
    header = "| | " + " | ".join(f"{one['size']:,} in flight" for one in results) + " |"
    rule = "|---|" + "---:|" * len(results)
    lines = []

    def row(label, cell):
        lines.append(f"| {label} | " + " | ".join(cell(one) for one in results) + " |")

    row("rollouts/s", lambda o: f"{len(o['run'].latencies) / o['run'].wall_s:.0f}")
    row("wall", lambda o: f"{o['run'].wall_s:.1f} s")
    row("p50 / p99 end to end", lambda o: f"{o['run'].quantile(50):.1f} s / {o['run'].quantile(99):.1f} s")
    row("time to first result", lambda o: f"{o['run'].latencies[0]:.2f} s" if o["run"].latencies else "-")
    row("time to first complete group",
        lambda o: f"{o['run'].first_group_s:.2f} s" if o["run"].first_group_s is not None else "-")
    for hop in HOP_ORDER:
        row(f"{hop} p50 / p99", lambda o, hop=hop: (
            f"{o['hops'][hop].quantile(0.5)} / {o['hops'][hop].quantile(0.99)} ({o['hops'][hop].count:,})"
            if hop in o["hops"] else "-"))
    row("peak RSS fleet / client",
        lambda o: f"{o['rss'].fleet / mib:.0f} MiB / {o['rss'].client / mib:.0f} MiB")
    row("peak PSS fleet / client (every 5 s)",
        lambda o: f"{o['rss'].fleet_pss / mib:.0f} MiB / {o['rss'].client_pss / mib:.0f} MiB")
    row("errors", lambda o: str(sum(o["run"].errors.values())))
    row("stalls (no result for 60 s)", lambda o: str(len(o["run"].stalls)))
    row("pooled connections closed by their server, dropped unused", lambda o: f"{o['run'].stale_dropped:,}")
    row("fleet up", lambda o: f"{o['spin_up_s']:.1f} s")
    placement = f"placement {args.placement}, {args.replicas} replicas" if args.placement else "one machine"
    bound = "agents' default" if args.max_concurrent_rollouts is None else str(args.max_concurrent_rollouts)
    print(f"\nMixed fleet ({', '.join(ENVS)}; code_gen 1 group in {len(SCHEDULE)}), groups of {args.generations}, "
          f"injected latency {DELAYS_S[0]:g}-{DELAYS_S[-1]:g} s per model call, {placement}, "
          f"max_concurrent_rollouts: {bound}. Hops: per call attempt, from the fleet's /metrics (calls counted).\n")
    print("\n".join([header, rule, *lines]))

    servers = sorted({name for one in results for name in one["rss"].per_server})
    print("\nPer server: peak RSS (all its processes) / peak open file descriptors (its busiest process) / CPU "
          "seconds used during the run (all its processes)\n")
    print("| server | " + " | ".join(f"{one['size']:,}" for one in results) + " |")
    print("|---|" + "---:|" * len(results))
    for name in servers:
        print(f"| {name} | " + " | ".join(
            f"{one['rss'].per_server.get(name, 0) / mib:.0f} MiB / {one['rss'].fds.get(name, 0)} / "
            f"{one['rss'].cpu_s.get(name, 0.0) - one['rss'].cpu_start.get(name, 0.0):.0f} s" for one in results
        ) + " |")
    for one in results:
        for note in one["run"].stalls:
            print(f"{one['size']:,}: {note}")
        if one["run"].errors:
            print(f"{one['size']:,}: errors: "
                  + ", ".join(f"{kind} x{count}" for kind, count in one["run"].errors.most_common()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,4096,16384", help="comma-separated rollouts in flight, one run each")
    parser.add_argument("--generations", type=int, default=16, help="rows per prompt group")
    parser.add_argument("--seed", type=int, default=0, help="seed of the latency each row draws")
    parser.add_argument("--max-concurrent-rollouts", type=int, default=None,
                        help="every agent's bound (0: unbounded); default: the agents' own default")
    parser.add_argument("--placement", choices=("local", "ray"), default=None, help="top-level `placement`")
    parser.add_argument("--replicas", type=int, default=None,
                        help="`num_replicas` of every resources server, agent and the policy's model server "
                             "(needs --placement ray)")
    parser.add_argument("--ray-nodes", type=int, default=0,
                        help="start a local Ray cluster of this many nodes for the run (implies --placement ray)")
    parser.add_argument("--ray-node-cpus", type=int, default=16,
                        help="logical CPUs each local Ray node declares (Ray's CPU is a reservation, not a core: "
                             "2 replicas of this fleet reserve 28)")
    parser.add_argument("--stall-s", type=float, default=60.0, help="no result this long is a stall")
    parser.add_argument("--abort-s", type=float, default=600.0, help="no result this long gives the run up")
    args = parser.parse_args()
    if args.ray_nodes:
        args.placement = "ray"
    if args.placement == "ray":
        require_modules("bench/rollouts_at_scale.py --placement ray", "ray", install="pip install -e '.[ray]'")
    try:
        sizes = [int(size) for size in args.sizes.split(",")]
    except ValueError:
        raise SystemExit(f"--sizes: {args.sizes!r} is not a list of numbers (e.g. 1024,4096)") from None
    if args.replicas and args.replicas > 1 and args.placement != "ray":
        raise SystemExit("--replicas above 1 needs --placement ray")

    os.environ.setdefault("GYMFLEET_LOG_LEVEL", "WARNING")  # the fleet's processes inherit it: no per-request INFO
    raise_nofile_limit()  # this process holds one socket per rollout in flight
    with local_ray_cluster(args.ray_nodes, args.ray_node_cpus):
        results = []
        for size in sizes:
            results.append(one_size(size, args))
            print_tables(results, args)  # after each size: a long run's first numbers are not lost to a later one


@contextlib.contextmanager
def local_ray_cluster(nodes: int, cpus: int) -> Iterator[None]:
    """A local Ray cluster of `nodes` nodes, each on `127.0.0.1`, this process is connected to (nothing when `nodes`
    is 0)."""
    if not nodes:
        yield
        return
    from gymfleet.testing.loopback import loopback_cluster

    with loopback_cluster(*[{"num_cpus": cpus}] * nodes) as cluster:
        print(f"local Ray cluster: {nodes} nodes x {cpus} CPUs at {cluster.address}", flush=True)
        yield


if __name__ == "__main__":
    main()
