"""Sandbox cost per run: a trivial Python program through the sandbox service beside the same program as a bare
subprocess, at several concurrencies, in one run.

The sandbox server runs in its own process (`python -m sandbox`, default settings: bubblewrap isolation, CPU cores
x 2 concurrent runs); the load generator is this process, using gymfleet's HTTP client. The bare column starts the
same interpreter with the same flags the sandbox uses (`/usr/bin/python3 -I -S -c ...`) as an asyncio subprocess,
so the ratio is what isolation, the service and HTTP cost on top of starting the program.

    python bench/sandbox_throughput.py [--concurrency 1 2 32] [--seconds 9] [--slices 6] [--code "print(1)"]
        [--sandbox-config sandbox.yaml]

`--sandbox-config` passes a YAML file of the service's fields (e.g. `fork_server: false` and `warm_sandboxes: 0`:
a sandbox started per run, as before the fork server), to see what each step saves.

Prints one table: runs/s, p50 and p99 latency for both, and the per-run cost ratio (bare runs/s / sandbox runs/s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import bare_python_run, sandbox_run, write_plots  # noqa: E402
from gymfleet import http  # noqa: E402
from gymfleet.testing import free_port, spawn_server  # noqa: E402


class Cell:
    """Runs and latencies of one mode at one concurrency, gathered over several slices."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.elapsed = 0.0

    def row(self) -> tuple[float, float, float]:
        ordered = sorted(self.latencies)
        return len(ordered) / self.elapsed, statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))]


async def measure(run_once, concurrency: int, seconds: float, cell: Cell) -> None:
    """Keep `run_once` `concurrency` deep for `seconds`; add what happened to `cell`."""
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            await run_once()
            cell.latencies.append(time.perf_counter() - start)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cell.elapsed += time.perf_counter() - started


async def main_async(args: argparse.Namespace, url: str, python: str) -> list[str]:
    """Alternate short slices of the two modes, so load from elsewhere on the machine hits both alike."""
    sandbox_once = lambda: sandbox_run(url, args.code)  # noqa: E731
    bare_once = lambda: bare_python_run(python, args.code)  # noqa: E731
    for _ in range(3):  # warm-up
        await sandbox_once()
        await bare_once()
    rows, plots = [], {"sandbox": [], "bare": []}
    for concurrency in args.concurrency:
        sandbox, bare = Cell(), Cell()
        for _ in range(args.slices):
            await measure(sandbox_once, concurrency, args.seconds / args.slices, sandbox)
            await measure(bare_once, concurrency, args.seconds / args.slices, bare)
        ratio = bare.row()[0] / sandbox.row()[0]
        for name, cell in (("sandbox", sandbox), ("bare", bare)):
            rate, p50, p99 = cell.row()
            plots[name].append([concurrency, rate])
            extra = f"{ratio:9.2f}x" if name == "sandbox" else ""
            rows.append(f"{concurrency:>11} {name:>8} {rate:>8.1f} {p50 * 1e3:>9.1f} {p99 * 1e3:>9.1f} {extra}")
    await http.close()
    write_plots(args.json, [{"title": f"One-shot runs of {args.code!r}: sandbox beside a bare interpreter",
                             "x_label": "runs in flight", "y_label": "runs/s", "log_x": True, "series": plots}])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 32])
    parser.add_argument("--seconds", type=float, default=9.0, help="per mode and concurrency")
    parser.add_argument("--slices", type=int, default=6, help="alternating slices the seconds are split into")
    parser.add_argument("--code", default="print(1)")
    parser.add_argument("--json", type=Path, help="also write the numbers there (for bench/report.py)")
    parser.add_argument("--python", default="/usr/bin/python3", help="interpreter of the bare runs (the sandbox's)")
    parser.add_argument("--sandbox-config", type=Path, help="YAML file of the sandbox service's fields")
    args = parser.parse_args()
    port = free_port()
    config = ["--config", str(args.sandbox_config.resolve())] if args.sandbox_config else []
    server, url = spawn_server([sys.executable, "-m", "sandbox", "--port", str(port), *config], port, cwd=ROOT,
                               stderr=subprocess.DEVNULL)
    try:
        rows = asyncio.run(main_async(args, url, args.python))
    finally:
        server.terminate()
        server.wait(30)
    print(f"trivial program {args.code!r}; {os.cpu_count()} CPUs; {args.seconds:g}s per cell in {args.slices} slices"
          + (f"; sandbox config {args.sandbox_config}" if args.sandbox_config else ""))
    print(f"{'concurrency':>11} {'mode':>8} {'runs/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'cost/run':>10}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
