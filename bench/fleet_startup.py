"""Fleet start-up: time to ready and memory of the Nano 3 fleet, fresh interpreters vs forked from the zygote.

Starts `configs/nano3_rlvr.yaml` as a user does (`ng_run` as a subprocess) with its policy on an embedded scripted
model (a `scripted_llm` instance in the fleet, as `configs/quickstart.yaml` has: no GPU, no network), once per mode
and repeat, alternating: `server_start: spawn` (every server is `python -m gymfleet.fleet.launch`, importing its stack
anew) and `server_start: zygote` (every server forked from one pre-imported `python -m gymfleet.fleet.zygote_main`).
For each start it takes the time from `ng_run`'s launch to its `All N / N servers ready` line, then (after
`--settle-s`: long enough for the servers that load what their requests need once they are up, `Server.warm_up`,
to have done so; `--trace` says when they had) the memory of every process of the fleet (the supervisor, the
zygote, every server and its workers) with psutil's `memory_full_info`:

- RSS counts every page a process maps, shared ones included, so forked servers sharing the zygote's imports
  (copy-on-write) are counted once per server: the RSS sum double-counts. It is what `top` shows.
- PSS splits each shared page among the processes sharing it: the PSS sum is the fleet's real share of memory.
- USS counts only the pages a process alone holds: what killing it would free.

    python bench/fleet_startup.py [--repeats 1] [--settle-s 2] [--modes spawn,zygote]

It also takes the CPU seconds (user + system) the fleet's processes had used when it was ready: the supervisor,
the zygote and its helper, the servers (with their workers and sandboxes). On a shared machine other processes'
load stretches the time to ready; it stretches CPU seconds much less, so compare those too.

Prints one table: per mode, the median over repeats (and the range) of the time to ready, the totals, the
per-server medians and the CPU seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs/nano3_rlvr.yaml"
READY_TIMEOUT_S = 300
MIB = 1024 * 1024
STARTED = re.compile(r"^started (\S+) .* pid (\d+),")
# "started mcqa (resources_servers/mcqa) on http://127.0.0.1:10523, pid 4242, log: ..." -> mcqa, 4242
ZYGOTE_DONE = re.compile(r"zygote: shared stack imported in ([\d.]+)s, \d+ servers' in ([\d.]+)s")
ZYGOTE_IMPORTED = re.compile(r"zygote \(pid \d+\): imported (.+) in ([\d.]+)s")
FRESH = re.compile(r"served by the folder .*\(in a fresh interpreter")
# "foo: served by the folder /x/resources_servers/foo (in a fresh interpreter: <why>)": the start-up line that says why
WARMED = re.compile(r": warmed up in [\d.]+s")
# a server that loads what its requests need once it is up (`Server.warm_up`: instruction_following, reasoning_gym)
SANDBOX_WARMED = re.compile(r"^\(sandbox\) .*: warmed up in [\d.]+s")
# the sandbox's warm-up, whose self-test the fleet's readiness waits for (negative: done before the rest was ready)


def overlay(mode: str, folder: Path) -> Path:
    """A config file: the Nano 3 recipe, its policy on an embedded scripted model, and `server_start: <mode>`."""
    data = {
        "config_paths": [str(RECIPE)],
        "server_start": mode,
        "scripted_llm": {"responses_api_models": {"scripted_model": {
            "entrypoint": "app.py", "model": "scripted", "default": {"text": "I am not sure."}}}},
        "policy_base_url": "http://${scripted_llm.responses_api_models.scripted_model.host}:"
                           "${scripted_llm.responses_api_models.scripted_model.port}/v1",
        "policy_api_key": "not-needed",
        "policy_model_name": "scripted",
    }
    path = folder / f"nano3_{mode}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


NEMO_GYM_FOLDERS = (
    "string_match", "equivalence_rule", "example_multi_step", "example_session_state_mgmt",
    "example_single_tool_call", "example_tool_call_multireward", "aalcr", "abstention", "aegis_v4_safety", "arc_agi",
    "bbq", "bunsenbench_chemistry_mcq", "circle_click", "circle_count", "citation_if", "format_verification",
    "gpqa_diamond", "hotpotqa_qa", "imo_gradingbench", "ragtruth",
)  # fmt: skip
"""Folders of NeMo-Gym 0.7.0's wheel that start here in the shared environment: pure Python, every line of their
`requirements.txt` (if any) satisfied by gymfleet's own (`bench/nemo_gym_corpus.py`'s table: `start yes`)."""


def nemo_gym_overlay(mode: str, folder: Path, count: int) -> Path:
    """A config file: the first `count` of `NEMO_GYM_FOLDERS` served from the wheel where they lie (their model
    servers stand-ins that answer nothing, as the corpus bench has them), and `server_start: <mode>`."""
    from gymfleet.testing.nemo_gym_corpus import STUB_MODEL_URL, folder_config
    from gymfleet.testing.nemo_gym_wheel import nemo_gym_wheel

    if not 0 < count <= len(NEMO_GYM_FOLDERS):
        raise SystemExit(f"--nemo-gym-folders: 1 to {len(NEMO_GYM_FOLDERS)}, not {count}")
    tree = nemo_gym_wheel() / "resources_servers"
    data: dict = {"server_start": mode, "server_folders": {}, "policy_base_url": STUB_MODEL_URL,
                  "policy_api_key": "stand-in", "policy_model_name": "stand-in",
                  "model_endpoint_readiness_timeout_seconds": 0}
    for name in NEMO_GYM_FOLDERS[:count]:
        blocks, servers = folder_config(tree / name)
        if clash := set(servers) & set(data):
            raise SystemExit(f"{name}: instance names {sorted(clash)} are taken by an earlier folder")
        data.update(blocks)
        data["server_folders"].update({server: str(tree / name) for server in servers})
    path = folder / f"nemo_gym_{count}_{mode}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def memory(pid: int) -> tuple[float, float, float]:
    """RSS, PSS and USS (MiB) of process `pid` and all its descendants (zeros if it is gone)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0.0, 0.0
    rss = pss = uss = 0.0
    for process in processes:
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss, pss, uss = rss + info.rss / MIB, pss + info.pss / MIB, uss + info.uss / MIB
    return rss, pss, uss


def cpu_seconds(root: int, servers: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system, with the children each has reaped) used so far by the fleet's processes, split into
    the supervisor (`ng_run`), the zygote and its helper (and the validation children they reaped), and the servers
    (each with its workers and sandboxes). Load stretches wall-clock times; it distorts these much less."""
    totals = {"supervisor": 0.0, "zygote": 0.0, "servers": 0.0}
    try:
        processes = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return totals
    server_trees: set[int] = set()
    for pid in servers.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            server_trees |= {pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        used = times.user + times.system + times.children_user + times.children_system
        kind = "supervisor" if process.pid == root else "servers" if process.pid in server_trees else "zygote"
        totals[kind] += used
    return totals


def breakdown(timed: list[tuple[float, str]], ready_s: float) -> dict[str, float]:
    """What the time to ready is made of, from `ng_run`'s timestamped output (its zygote logging at DEBUG): the
    zygote's shared-stack import and its (two-process) server imports, the gap to the first fork (validating every
    server in a zygote child, binding ports), the forks, and the servers building their apps until every one
    answers. Empty for a start without a zygote."""
    done = next(((t, m) for t, line in timed if (m := ZYGOTE_DONE.search(line))), None)
    started = [t for t, line in timed if STARTED.match(line)]
    if done is None or not started:
        return {}
    done_s, match = done
    shared_s, servers_s = float(match.group(1)), float(match.group(2))
    slowest = max(((float(m.group(2)), m.group(1)) for _, line in timed if (m := ZYGOTE_IMPORTED.search(line))),
                  default=(0.0, "-"))
    warmed = [t for t, line in timed if WARMED.search(line)]
    verdict = next((t for t, line in timed if SANDBOX_WARMED.search(line)), None)
    return {
        "ng_run start, zygote interpreter start": done_s - shared_s - servers_s,
        "zygote: shared stack import": shared_s,
        f"zygote + helper: server imports (slowest: {slowest[1][:40]} {slowest[0]:.2f} s)": servers_s,
        "validation in a zygote child, ports, to first fork": started[0] - done_s,
        f"forking {len(started)} servers": started[-1] - started[0],
        "last fork to every server answering": ready_s - started[-1],
        **({f"ready to the last of {len(warmed)} warm-ups done (within --settle-s)": max(warmed) - ready_s}
           if warmed else {}),
        **({"ready to the sandbox's warm-up done (fork server, warm sandboxes, self-test; the fleet waits for it)":
            verdict - ready_s} if verdict is not None else {}),
    }


def start_once(mode: str, folder: Path, settle_s: float, trace: bool = False, nemo_gym_folders: int = 0) -> dict:
    """Start the fleet once in `mode`; measure; stop it. Returns the measurements (with `trace`: `breakdown`).
    With `nemo_gym_folders`, the fleet is that many NeMo-Gym folders (`nemo_gym_overlay`) instead of Nano 3."""
    config = nemo_gym_overlay(mode, folder, nemo_gym_folders) if nemo_gym_folders else overlay(mode, folder)
    command = [sys.executable, "-m", "gymfleet.cli.run", f"+config_paths=[{config}]",
               f"+head_server.port={free_port()}"]
    began = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True,
                               env={**os.environ, "GYMFLEET_LOG_LEVEL": "DEBUG" if trace else "WARNING"})
    servers: dict[str, int] = {}
    lines: list[str] = []
    timed: list[tuple[float, str]] = []
    output: queue.Queue[tuple[float, str] | None] = queue.Queue()
    threading.Thread(target=_pump, args=(process, began, output), daemon=True).start()
    try:
        ready_s = None
        deadline = began + READY_TIMEOUT_S
        while (item := output.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
            at, line = item
            lines.append(line.rstrip())
            timed.append(item)
            if match := STARTED.match(line):
                servers[match.group(1)] = int(match.group(2))
            if "servers ready!" in line:
                ready_s = at
                cpu_at_ready = cpu_seconds(process.pid, servers)
                break
            if time.monotonic() > deadline:
                break
        if ready_s is None:
            raise RuntimeError(f"{mode}: the fleet did not become ready:\n" + "\n".join(lines[-40:]))
        time.sleep(settle_s)
        while not output.empty() and (item := output.get()) is not None:  # what the servers said meanwhile
            timed.append(item)
        total = memory(process.pid)
        per_server = [memory(pid) for pid in servers.values()]
        count = len(psutil.Process(process.pid).children(recursive=True)) + 1
        fresh = sorted(name for name, pid in servers.items() if _parent(pid) == process.pid)
        return {"mode": mode, "forked": len(servers) - len(fresh), "fresh": fresh,
                "why_fresh": [line for line in lines if FRESH.search(line)],
                "ready_s": ready_s, "servers": len(servers), "processes": count, "total": total,
                "cpu_at_ready": cpu_at_ready, "cpu_settled": cpu_seconds(process.pid, servers),
                "breakdown": breakdown(timed, ready_s) if trace else {},
                "per_server": [statistics.median(values) for values in zip(*per_server, strict=True)]}
    finally:
        with_signal(process, signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            with_signal(process, signal.SIGKILL, group=True)
            process.wait()
        if process.stdout:
            process.stdout.close()


def _parent(pid: int) -> int | None:
    """The parent of `pid`: the supervisor (`ng_run`) for a fresh interpreter, the zygote (or its helper) for a
    fork."""
    try:
        return psutil.Process(pid).ppid()
    except psutil.NoSuchProcess:
        return None


def _pump(process: subprocess.Popen, began: float, output: queue.Queue) -> None:
    with contextlib.suppress(ValueError, OSError):  # start_once closed the pipe
        for line in process.stdout:
            output.put((time.monotonic() - began, line))
    output.put(None)


def with_signal(process: subprocess.Popen, sig: int, group: bool = False) -> None:
    try:
        os.killpg(process.pid, sig) if group else process.send_signal(sig)
    except ProcessLookupError:
        pass


def table(results: list[dict]) -> str:
    header = ("mode", "servers", "forked", "procs", "ready s", "range", "RSS MiB*", "PSS MiB", "range", "USS MiB",
              "server RSS*", "server PSS", "server USS", "CPU s sup/zyg/srv")
    rows = [header]
    for mode in dict.fromkeys(r["mode"] for r in results):
        runs = [r for r in results if r["mode"] == mode]
        med = statistics.median
        rows.append((
            f"{mode} (x{len(runs)})",
            str(runs[0]["servers"]),
            str(runs[0]["forked"]),
            str(runs[0]["processes"]),
            f"{med(r['ready_s'] for r in runs):.2f}",
            f"{min(r['ready_s'] for r in runs):.2f}-{max(r['ready_s'] for r in runs):.2f}",
            f"{med(r['total'][0] for r in runs):.0f}",
            f"{med(r['total'][1] for r in runs):.0f}",
            f"{min(r['total'][1] for r in runs):.0f}-{max(r['total'][1] for r in runs):.0f}",
            f"{med(r['total'][2] for r in runs):.0f}",
            *(f"{med(r['per_server'][i] for r in runs):.1f}" for i in range(3)),
            "/".join(f"{med(r['cpu_at_ready'][k] for r in runs):.2f}" for k in ("supervisor", "zygote", "servers")),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.append("forked: servers forked from the zygote (or its helper); the others are fresh interpreters.")
    lines.append("ready s: from launching ng_run to its 'All N / N servers ready' line (median, and range). Totals: "
                 "every process of the fleet (supervisor, zygote, servers, workers); server*: per-server medians.")
    lines.append("CPU s: user + system seconds used by the time the fleet was ready (median): the supervisor, the "
                 "zygote and its helper, all the servers (load stretches ready s much more than these).")
    lines.append("* RSS counts shared pages once per process: forked servers share the zygote's imports "
                 "(copy-on-write), so the RSS sum double-counts; PSS splits shared pages, USS is private only.")
    return "\n".join(lines)


def main() -> None:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--settle-s", type=float, default=2.0, help="wait after ready before measuring memory")
    parser.add_argument("--modes", default="spawn,zygote")
    parser.add_argument("--trace", action="store_true",
                        help="log the zygote at DEBUG and print what each start's time to ready is made of")
    parser.add_argument("--json", type=Path, help="also write the numbers there (for bench/report.py)")
    parser.add_argument("--nemo-gym-folders", type=int, default=0, metavar="N",
                        help="start N NeMo-Gym folders of the 0.7.0 wheel where they lie (NEMO_GYM_FOLDERS), in the "
                             "shared environment, instead of the Nano 3 fleet")
    args = parser.parse_args()
    modes = args.modes.split(",")
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            for mode in modes:
                result = start_once(mode, Path(folder), args.settle_s, args.trace, args.nemo_gym_folders)
                cpu, settled = result["cpu_at_ready"], result["cpu_settled"]
                print(f"run {repeat + 1}/{args.repeats} {mode}: ready in {result['ready_s']:.2f} s, "
                      f"RSS {result['total'][0]:.0f} MiB, PSS {result['total'][1]:.0f} MiB; CPU s at ready: "
                      f"supervisor {cpu['supervisor']:.2f}, zygote {cpu['zygote']:.2f}, servers {cpu['servers']:.2f} "
                      f"(after --settle-s: servers {settled['servers']:.2f})", flush=True)
                if result["fresh"]:
                    print(f"    fresh interpreters: {', '.join(result['fresh'])}", flush=True)
                for line in result["why_fresh"][:3]:
                    print(f"    {line}", flush=True)
                for part, seconds in result["breakdown"].items():
                    print(f"    {seconds:6.2f} s  {part}", flush=True)
                results.append(result)
    print(table(results))
    from bench._common import write_plots

    medians = {mode: [r for r in results if r["mode"] == mode] for mode in modes}
    fleet = f"{args.nemo_gym_folders} NeMo-Gym folders" if args.nemo_gym_folders else "Nano 3 fleet"
    write_plots(args.json, [
        {"title": f"{fleet}: time to ready (median)", "x_label": "server start", "y_label": "seconds",
         "series": {"ready": [[mode, statistics.median(r["ready_s"] for r in runs)]
                              for mode, runs in medians.items()]}},
        {"title": f"{fleet}: memory of all its processes (median)", "x_label": "server start", "y_label": "MiB",
         "series": {kind: [[mode, statistics.median(r["total"][i] for r in runs)] for mode, runs in medians.items()]
                    for i, kind in enumerate(("RSS (double-counts shared)", "PSS", "USS"))}},
    ])


if __name__ == "__main__":
    main()
