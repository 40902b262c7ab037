"""NeMo-RL's rollout step against a real fleet: N weather rollouts through `run_examples`, all in flight at once.

The fleet is what NeMo-RL starts (`RunHelper.start` with an `initial_global_config_dict`): `policy_model`
(vllm_model_for_training, token capture on), `example_weather` and its simple_agent, plus one scripted upstream
standing in for vLLM, each its own process. This process is the trainer's Gym actor: it sends every row's
`POST /run` at once, with no semaphore, as NeMo-RL does (4096 = 256 prompts x 16 generations, one Super RLVR step).
Every rollout is two model calls and one tool call, so one rollout is 10 HTTP requests inside the fleet.

    python bench/nemo_rl_rollouts.py [--rollouts 4096] [--generations 16] [--max-concurrent-rollouts 0,256]
                                     [--baseline DIR] [--repeat K] [--model-delay-s S] [--client plain|nemo-gym]

`--max-concurrent-rollouts` takes one or more agent bounds (`gymfleet.serving.agent`; 0 = unbounded, NeMo-Gym's way;
`default` = the agent's own default); each gets its own fresh fleet, one after the other, and one row of the
table. Prints one table: rollouts/s, p50/p99 latency from dispatch to result (all rows are dispatched at t=0: with
no bound every rollout progresses in lockstep and p50 is close to the wall time; with a bound results stream back
and p50 falls towards half of it), p50 / wall, time to the first result and to the first complete group (all
`--generations` rows of one prompt: what an asynchronous trainer can start on), errors, and the peak RSS of the
fleet's processes (sum over every child, sampled every 0.2 s) and of this client process. The bound column is
what the agent's `/metrics` says (`gymfleet_rollouts_admission_limit`), so a bound that did not reach the agent
shows. A second table gives the share of all results that came in each tenth of the wall time: even shares give
p50 / wall about 0.5, fewer early ones (the first seconds slowed by sending the whole step) push it up.

`--model-delay-s S` makes the scripted policy answer each of its calls S seconds late: rollouts that wait on a
policy's latency as well as on the fleet's CPU (what the agent's admission ramp must not hold back).

`--client plain` sends the rows with a plain aiohttp session straight to the agent instead, all at once, one
connection per row, as a hand-written client or NeMo-Gym's own does: no client-side line, so the agent takes the
whole burst (`gymfleet.serving.read_pacer`), and the client's own connecting (1.6-2 s for 4,096 on 2 cores) comes
before any result. `--client nemo-gym` does the same with the limits NeMo-Gym's own client sets (at most 1,024
connections to a host, no cookie jar): the client still builds all 4,096 requests before it writes the first (0.45 s
against a bare endpoint on an idle 2-core machine), but connects only a quarter as many sockets. Both start the rows'
requests in row order, as NeMo-Gym's `run_examples` does (given the coroutines themselves, `asyncio.as_completed`
makes its tasks from a set, and the rows went out in hash order: every group scattered over the step, the first
complete group 2.5-3.3 s in, against 1.4 s in row order with `--client nemo-gym`).

`--repeat K` runs every setting K times, in rounds, and adds a table of each setting's mean and range: p50 / wall
moves by several hundredths from run to run on a shared 2-core machine (0.47-0.57 over six runs of one tree), more
than most changes move it, so compare means over rounds.

`--baseline DIR` runs every bound twice, one after the other: against the gymfleet of another checkout (say, of
main: `git archive main | tar -x -C DIR`) and against this one, each in a process (and a fleet) of its own, this
script driving both, so the two rows of a bound are measured side by side on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

CHECKOUT_ENV = "NEMO_RL_BENCH_CHECKOUT"
"""Set by `--baseline` for the process that measures another checkout: its code is imported instead of this one's."""
ROOT = Path(os.environ.get(CHECKOUT_ENV) or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))

from bench._common import Sampler, started_fleet  # noqa: E402
from bench._fleet import head_get, head_host, instance_pids  # noqa: E402
from gymfleet import auth, http  # noqa: E402
from gymfleet.testing import free_port  # noqa: E402
from nemo_gym.cli import RunHelper  # noqa: E402
from nemo_gym.rollout_collection import RolloutCollectionHelper  # noqa: E402
from nemo_gym.server_utils import BaseServerConfig  # noqa: E402
from resources_servers.example_weather.app import FORECASTS  # noqa: E402

EXAMPLE = ROOT / "resources_servers/example_weather/data/example.jsonl"
AGENT = "example_weather_simple_agent"
SCRIPTED = "scripted_llm.responses_api_models.scripted_model"


def fleet_config(head_port: int, max_concurrent_rollouts: int | None = None, model_delay_s: float = 0.0) -> dict:
    conditions = sorted({condition for condition, _ in FORECASTS.values()})
    rules = [{"match": rf'"condition":\s*"{c}"', "match_in": "last_message", "text": f"The forecast says {c}."}
             for c in conditions]
    rules += [{"match": rf"(?i)\b{city}\b", "match_in": "transcript", "text": "Let me look that up.",
               "tool_calls": [{"name": "get_weather", "arguments": {"city": city.title()}}]} for city in FORECASTS]
    if model_delay_s:
        rules = [{**rule, "delay_s": model_delay_s} for rule in rules]
    return {
        "config_paths": ["responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
                         "resources_servers/example_weather/configs/example_weather.yaml"],
        "scripted_llm": {"responses_api_models": {"scripted_model": {"entrypoint": "app.py", "rules": rules}}},
        "policy_base_url": f"http://${{{SCRIPTED}.host}}:${{{SCRIPTED}.port}}/v1",
        "policy_api_key": "dummy_key", "policy_model_name": "scripted", "default_host": "127.0.0.1",
        "head_server": {"host": "0.0.0.0", "port": head_port}, "port_range_low": 5000, "port_range_high": 5999,
        "global_aiohttp_connector_limit_per_host": 16384, "global_aiohttp_connector_limit": 65536,
        "num_gpu_nodes": 0,
        **({} if max_concurrent_rollouts is None else {
            AGENT: {"responses_api_agents": {"simple_agent": {"max_concurrent_rollouts": max_concurrent_rollouts}}}
        }),
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


class PeakRSS(Sampler):
    """Samples, in a background thread, the RSS of this process and of all its descendants (the fleet), and per
    server instance (`pids`: a server's pid -> its instance name, from the head server's `/server_instances`; a
    server's worker processes count as its own) the peak RSS (summed over its processes), the peak open file
    descriptors of one of its processes, and its CPU time; and at each sample the CPU time of this process and the
    fleet together (`cpu_series`: (time.perf_counter(), CPU seconds) pairs)."""

    def __init__(self, pids: dict[int, str] | None = None, interval_s: float = 0.2):
        super().__init__(interval_s)
        self.client, self.fleet, self._me = 0, 0, psutil.Process()
        self.pids = dict(pids or {})
        self.per_server: Counter = Counter()
        self.fds: Counter = Counter()
        self.cpu_s: dict[str, float] = {}
        self.cpu_series: list[tuple[float, float]] = []

    def _instance(self, process: psutil.Process) -> str | None:
        for candidate in [process, *process.parents()]:
            if candidate.pid in self.pids:
                return self.pids[candidate.pid]
        return None

    def sample(self) -> None:
        self.client = max(self.client, self._me.memory_info().rss)
        total, rss_now, cpu_now = 0, Counter(), Counter()
        mine = self._me.cpu_times()
        cpu_all = mine.user + mine.system
        for child in self._me.children(recursive=True):
            try:
                rss, fds, cpu = child.memory_info().rss, child.num_fds(), child.cpu_times()
                name = self._instance(child)
            except psutil.Error:
                continue
            total += rss
            cpu_all += cpu.user + cpu.system
            if name is not None:
                rss_now[name] += rss
                cpu_now[name] += cpu.user + cpu.system
                self.fds[name] = max(self.fds[name], fds)
        for name, rss in rss_now.items():
            self.per_server[name] = max(self.per_server[name], rss)
            self.cpu_s[name] = max(self.cpu_s.get(name, 0.0), cpu_now[name])
        self.fleet = max(self.fleet, total)
        self.cpu_series.append((time.perf_counter(), cpu_all))


class Stats:
    """One run's numbers: completion times (s since dispatch), first complete group, errors."""

    def __init__(self, rows: list[dict]):
        self.latencies: list[float] = []
        self.errors: Counter = Counter()
        self.group_left = Counter(row["_ng_task_index"] for row in rows)
        self.first_group_s: float | None = None
        self.wall_s = 0.0
        self.started_at = 0.0
        """`time.perf_counter()` when the rows were dispatched."""


PLAIN_CONNECTORS = {
    "plain": {"limit": 0},
    "nemo-gym": {"limit": 100 * 1024, "limit_per_host": 1024, "keepalive_timeout": 15.0},
}
"""aiohttp connector settings of the clients `--client` names besides run_examples: one connection per row, or the
limits NeMo-Gym's own global client sets (`nemo_gym.server_utils`, its defaults with one worker: at most 1,024
connections to one host, the other rows queued inside aiohttp; no cookie jar)."""


async def run(rows: list[dict], head: BaseServerConfig, plain_url: str | None = None,
              client: str = "plain") -> Stats:
    """Every row's `POST /run` at once through `run_examples`, or with `plain_url` (the agent's URL) through a plain
    aiohttp session with `client`'s connector settings (`PLAIN_CONNECTORS`), as a hand-written or NeMo-Gym client
    sends them."""
    stats = Stats(rows)
    start = stats.started_at = time.perf_counter()
    session = None
    if plain_url is None:
        futures = RolloutCollectionHelper().run_examples(examples=rows, head_server_config=head)
    else:
        import aiohttp

        headers = auth.head_headers(head_host(head), head.port)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(**PLAIN_CONNECTORS[client]),
                                        timeout=aiohttp.ClientTimeout(total=3600),
                                        cookie_jar=aiohttp.DummyCookieJar() if client == "nemo-gym" else None)

        async def post(row: dict) -> tuple[dict, dict]:
            async with session.post(f"{plain_url}/run", json=row, headers=headers) as answer:
                answer.raise_for_status()
                return row, await answer.json()

        # started in row order, as NeMo-Gym's own `run_examples` starts them (`asyncio.as_completed` given coroutines
        # makes its tasks from a set: the rows would go out in hash order, every group scattered over the whole step)
        futures = asyncio.as_completed([asyncio.ensure_future(post(row)) for row in rows])
    try:
        for future in futures:
            try:
                row, result = await future
            except Exception as exc:  # a bench counts failures by kind
                stats.errors[f"{type(exc).__name__} {getattr(exc, 'status', '')}".strip()] += 1
                continue
            now = time.perf_counter() - start
            stats.latencies.append(now)
            stats.group_left[row["_ng_task_index"]] -= 1
            if stats.first_group_s is None and stats.group_left[row["_ng_task_index"]] == 0:
                stats.first_group_s = now
            if result.get("reward") != 1.0:
                stats.errors["reward != 1.0"] += 1
        stats.wall_s = time.perf_counter() - start
        return stats
    finally:
        await http.close()
        if session is not None:
            await session.close()


def admission_limit(rh: RunHelper) -> str:
    """The bound the agent reports on its `/metrics` (0: unbounded)."""
    text = head_get(rh.head_server_config, "/metrics", rh.config.instance(AGENT).url).text
    line = next((line for line in text.splitlines() if line.startswith("gymfleet_rollouts_admission_limit ")), None)
    return "?" if line is None else str(int(float(line.split()[1])) or "none")


def one_setting(args: argparse.Namespace, bound: int | None) -> dict:
    """A fresh fleet with the agent bounded at `bound` (None: its default), one batch of rollouts, its numbers (plain
    data: a `--baseline` run sends them back as JSON)."""
    with started_fleet(fleet_config(free_port(), bound, args.model_delay_s)) as (rh, spin_up_s):
        limit = admission_limit(rh)
        rows = nemo_rl_rows(args.rollouts, args.generations)
        with PeakRSS(instance_pids(rh.head_server_config)) as rss:
            plain_url = rh.config.instance(AGENT).url if args.client in PLAIN_CONNECTORS else None
            stats = asyncio.run(run(rows, rh.head_server_config, plain_url, args.client))
    return {"limit": limit, "spin_up_s": spin_up_s, "latencies": stats.latencies, "wall_s": stats.wall_s,
            "first_group_s": stats.first_group_s, "errors": dict(stats.errors), "rss_fleet": rss.fleet,
            "rss_client": rss.client, "per_server": dict(rss.per_server), "cpu_s": rss.cpu_s,
            "cpu_series": [(at - stats.started_at, cpu) for at, cpu in rss.cpu_series]}


def measured(args: argparse.Namespace, bound: int | None, checkout: Path | None) -> dict:
    """`one_setting` in a process of its own, importing `checkout`'s gymfleet and serving its folders (None: this
    checkout's)."""
    env = {**os.environ, "PYTHONPATH": str(checkout or ROOT)}
    env.pop(CHECKOUT_ENV, None)
    if checkout is not None:
        env[CHECKOUT_ENV] = str(checkout)
    command = [sys.executable, str(Path(__file__).resolve()), "--rollouts", str(args.rollouts),
               "--generations", str(args.generations), "--max-concurrent-rollouts",
               "default" if bound is None else str(bound), "--model-delay-s", str(args.model_delay_s),
               "--client", args.client]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "numbers.json"
        subprocess.run([*command, "--json", str(out)], env=env, cwd=checkout or ROOT, check=True)
        return json.loads(out.read_text())


def quantile(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def cpu_marks(one: dict) -> list[float] | None:
    """The share of the run's CPU time (client and fleet, from dispatch to the last result) spent by the time each
    tenth of the results was in, in percent. Where the fleet's CPU is the bottleneck, as on a machine of its own,
    wall time follows CPU time and the 50% mark is p50 / wall; unlike wall time, it holds on a machine that other
    work keeps busy. None: too few samples."""
    series, latencies = one["cpu_series"], sorted(one["latencies"])
    if len(series) < 2 or not latencies:
        return None

    times = [at for at, _ in series]

    def cpu_at(t: float) -> float:  # interpolated between the samples around `t`
        index = bisect.bisect_left(times, t)
        if index == 0 or index == len(series):
            return series[min(index, len(series) - 1)][1]
        (t0, c0), (t1, c1) = series[index - 1], series[index]
        return c0 + (c1 - c0) * (t - t0) / (t1 - t0)

    start, spent = cpu_at(0.0), cpu_at(one["wall_s"]) - cpu_at(0.0)
    if spent <= 0:
        return None
    marks = [latencies[max(0, len(latencies) * tenth // 10 - 1)] for tenth in range(1, 11)]
    return [100 * (cpu_at(t) - start) / spent for t in marks]


def cpu_tenths(one: dict) -> str:
    marks = cpu_marks(one)
    return " | ".join("-" for _ in range(10)) if marks is None else " | ".join(f"{mark:.0f}" for mark in marks)


def spread(values: list[float], fmt: str) -> str:
    """`mean (min-max)` of `values`, each written with `fmt`."""
    if not values:
        return "-"
    return f"{format(statistics.fmean(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def print_summary(runs: list[dict]) -> None:
    """With `--repeat`: each (tree, bound)'s runs in one row, mean and range."""
    print("\nOver the repeated runs, mean (min-max): p50 / wall swings from run to run with what else the machine "
          "does; the CPU-time mark of the median (the 50% column above) swings less:\n")
    print("| tree | max_concurrent_rollouts | runs | rollouts/s | p50 / wall | CPU-time mark of the median "
          "| first group |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    keys = list(dict.fromkeys((one["tree"], one["limit"]) for one in runs))
    for tree, limit in keys:
        mine = [one for one in runs if (one["tree"], one["limit"]) == (tree, limit)]
        rates = [len(one["latencies"]) / one["wall_s"] for one in mine]
        ratios = [quantile(one["latencies"], 50) / one["wall_s"] for one in mine]
        cpu = [marks[4] / 100 for marks in map(cpu_marks, mine) if marks is not None]
        groups = [one["first_group_s"] for one in mine if one["first_group_s"] is not None]
        print(f"| {tree} | {limit} | {len(mine)} | {spread(rates, '.0f')} | {spread(ratios, '.2f')} "
              f"| {spread(cpu, '.2f')} | {spread(groups, '.2f')} s |")


def tenths(one: dict) -> str:
    """The share of all results that came in each tenth of the wall time, in percent."""
    counts = Counter(min(9, int(10 * t / one["wall_s"])) for t in one["latencies"])
    total = max(1, len(one["latencies"]))
    return " | ".join(f"{100 * counts[tenth] / total:.0f}" for tenth in range(10))


def parse_bounds(text: str) -> list[int | None]:
    bounds = []
    for item in text.split(","):
        item = item.strip()
        if item == "default":
            bounds.append(None)
        elif item.isdigit():
            bounds.append(int(item))
        else:
            raise SystemExit(f"--max-concurrent-rollouts: {item!r} is not a number or 'default' (e.g. 0,256)")
    return bounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=4096)
    parser.add_argument("--generations", type=int, default=16, help="rows per prompt group")
    parser.add_argument("--model-delay-s", type=float, default=0.0,
                        help="the scripted policy answers each call this much later (a policy's latency; 0: at once)")
    parser.add_argument("--max-concurrent-rollouts", default="0,default",
                        help="comma-separated agent bounds to compare, one fleet each (0: unbounded; 'default')")
    parser.add_argument("--client", choices=("gymfleet", *PLAIN_CONNECTORS), default="gymfleet",
                        help="send through run_examples (NeMo-RL's way), or a plain aiohttp session straight to the "
                             "agent: one connection per row (plain), or at most 1,024 (nemo-gym, as NeMo-Gym's "
                             "client)")
    parser.add_argument("--baseline", type=Path, help="another checkout (e.g. of main), measured beside this one")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every setting this many times, in rounds, and add a table of mean and range")
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)  # `measured`: one bound's numbers, as JSON
    args = parser.parse_args()
    bounds = parse_bounds(args.max_concurrent_rollouts)

    os.environ.setdefault("GYMFLEET_LOG_LEVEL", "WARNING")  # the fleet's processes inherit it: no per-request INFO
    if args.json:
        args.json.write_text(json.dumps(one_setting(args, bounds[0])))
        return
    load = os.getloadavg()
    if args.repeat < 1:
        raise SystemExit(f"--repeat: {args.repeat} runs; give 1 or more")
    runs = []
    for _ in range(args.repeat):  # in rounds, so the trees and bounds share whatever the machine does meanwhile
        if args.baseline:
            runs += [{**measured(args, bound, checkout), "tree": label} for bound in bounds
                     for label, checkout in (("baseline", args.baseline.resolve()), ("this", None))]
        else:
            runs += [{**one_setting(args, bound), "tree": "this"} for bound in bounds]
    mib = 1024 * 1024
    delay = f"; the policy answers each call {args.model_delay_s:g} s late" if args.model_delay_s else ""
    client = {"gymfleet": "run_examples",
              "plain": "a plain aiohttp session straight to the agent, one connection per row",
              "nemo-gym": "an aiohttp session straight to the agent with NeMo-Gym's client's limits (1,024 "
                          "connections to a host)"}[args.client]
    print(f"\n{args.rollouts} rollouts in flight at once, groups of {args.generations}{delay}, sent through {client}; "
          "one fresh fleet per bound" + (f"; baseline: {args.baseline}" if args.baseline else ""))
    print(f"load average (1, 5, 15 min) on {os.cpu_count()} cores: before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          "after {:.2f} {:.2f} {:.2f}\n".format(*os.getloadavg()))
    print("| tree | max_concurrent_rollouts | rollouts/s | wall | p50 | p99 | p50 / wall | first result | first group "
          "| errors | peak RSS fleet | peak RSS client | fleet up |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for one in runs:
        latencies, wall = one["latencies"], one["wall_s"]
        first = f"{latencies[0]:.2f} s" if latencies else "-"
        group = f"{one['first_group_s']:.2f} s" if one["first_group_s"] is not None else "-"
        print(f"| {one['tree']} | {one['limit']} | {len(latencies) / wall:.0f} | {wall:.1f} s "
              f"| {quantile(latencies, 50):.1f} s | {quantile(latencies, 99):.1f} s "
              f"| {quantile(latencies, 50) / wall:.2f} | {first} | {group} | {sum(one['errors'].values())} "
              f"| {one['rss_fleet'] / mib:.0f} MiB | {one['rss_client'] / mib:.0f} MiB | {one['spin_up_s']:.1f} s |")
    print("\nShare of all results (%) in each tenth of the wall time:\n")
    print("| tree | max_concurrent_rollouts | " + " | ".join(f"{10 * t}-{10 * t + 10}%" for t in range(10)) + " |")
    print("|---|---:|" + "---:|" * 10)
    for one in runs:
        print(f"| {one['tree']} | {one['limit']} | {tenths(one)} |")
    print("\nShare of the run's CPU time (client and fleet, %) spent by the time 10%, 20%, ... of the results were "
          "in (50%: p50 / wall where the fleet's CPU is the bottleneck, on a machine other work leaves alone):\n")
    print("| tree | max_concurrent_rollouts | " + " | ".join(f"{10 * t}%" for t in range(1, 11)) + " |")
    print("|---|---:|" + "---:|" * 10)
    for one in runs:
        print(f"| {one['tree']} | {one['limit']} | {cpu_tenths(one)} |")
    if args.repeat > 1:
        print_summary(runs)
    for one in runs:
        servers = sorted(one["per_server"].items())
        print(f"\n{one['tree']}, bound {one['limit']}: per server, peak RSS / CPU time: "
              + ", ".join(f"{name} {value / mib:.0f} MiB / {one['cpu_s'].get(name, 0):.0f} s"
                          for name, value in servers))
        if one["errors"]:
            print("errors: " + ", ".join(f"{kind} x{count}" for kind, count
                                         in Counter(one["errors"]).most_common()))


if __name__ == "__main__":
    main()
