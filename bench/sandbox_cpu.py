"""CPU per one-shot sandbox run, by process, beside a bare interpreter: what a run costs the machine's cores.

`bench/sandbox_throughput.py` gives runs/s, which on a shared machine moves with whatever else runs there; the CPU a
run takes moves much less. This starts the sandbox service (`python -m sandbox`, default settings) in a CPU
accounting cgroup of its own (cgroup v1 `cpuacct`, or a cgroup v2 child of this process's cgroup: run it as root,
or where the cgroup is delegated), so everything a run costs is counted: the service, the fork server, each run's
processes, bwrap. It keeps `--concurrency` `/run`s of a trivial program in flight for `--batch` runs, then runs the
same number of bare `python -I -S -c` subprocesses (their CPU from `getrusage`), and alternates the two for
`--rounds`. `--baseline DIR` serves another checkout's sandbox too (say, a clone of main), in alternating batches.

    python bench/sandbox_cpu.py [--concurrency 2] [--batch 40] [--rounds 10] [--code "print(1)"] [--baseline DIR]

Prints one row per service: CPU ms per run (all of it, the service's own process, the rest: fork server, runs and
bwrap) and its ratio to a bare run's CPU; the client's own CPU (HTTP here, spawning there) is in neither.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import bare_python_run, sandbox_run  # noqa: E402
from gymfleet import http  # noqa: E402
from gymfleet.testing import free_port, spawn_server  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def accounting_parent() -> tuple[Path, str]:
    """A directory where a CPU-accounting cgroup can be made, and the file that holds its CPU time.

    Raises:
        SystemExit: there is none (the message says what is needed).
    """
    v1 = Path("/sys/fs/cgroup/cpuacct")
    if (v1 / "cpuacct.usage").exists() and os.access(v1, os.W_OK):
        return v1, "cpuacct.usage"
    own = Path("/proc/self/cgroup").read_text().splitlines()
    unified = [line.split(":", 2)[2] for line in own if line.startswith("0::")]
    for base in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        if unified and (base / "cgroup.controllers").exists():
            parent = base / unified[0].lstrip("/")
            if os.access(parent, os.W_OK):
                return parent, "cpu.stat"
    raise SystemExit("no writable CPU-accounting cgroup here (cgroup v1 cpuacct, or a delegated cgroup v2): run as "
                     "root, or use bench/sandbox_throughput.py")


def cgroup_cpu_s(cgroup: Path, name: str) -> float:
    text = (cgroup / name).read_text()
    if name == "cpuacct.usage":
        return int(text) / 1e9
    return int(text.split("usage_usec", 1)[1].split()[0]) / 1e6


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def in_flight(concurrency: int, count: int, run_once) -> None:
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await run_once()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def measure(args: argparse.Namespace, services: list[dict], stat: str) -> list[str]:
    for service in services:  # warm-up
        await in_flight(2, 10, lambda url=service["url"]: sandbox_run(url, args.code))
    bare_cpu = 0.0
    for round_ in range(args.rounds):
        for service in services if round_ % 2 == 0 else services[::-1]:
            total, own = cgroup_cpu_s(service["cgroup"], stat), process_cpu_s(service["pid"])
            await in_flight(args.concurrency, args.batch, lambda url=service["url"]: sandbox_run(url, args.code))
            await asyncio.sleep(0.2)  # teardowns finish after the answers
            service["cpu"] += cgroup_cpu_s(service["cgroup"], stat) - total
            service["own"] += process_cpu_s(service["pid"]) - own
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        await in_flight(args.concurrency, args.batch, lambda: bare_python_run(args.python, args.code))
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        bare_cpu += after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    await http.close()
    runs = args.rounds * args.batch
    bare_ms = bare_cpu / runs * 1e3
    rows = []
    for service in services:
        cpu_ms, own_ms = service["cpu"] / runs * 1e3, service["own"] / runs * 1e3
        rows.append(f"{service['name']:>10} {cpu_ms:>9.2f} {own_ms:>9.2f} {cpu_ms - own_ms:>9.2f} "
                    f"{cpu_ms / bare_ms:>8.2f}x")
    rows.append(f"{'bare':>10} {bare_ms:>9.2f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--batch", type=int, default=40, help="runs per batch")
    parser.add_argument("--rounds", type=int, default=10, help="alternating batches of each")
    parser.add_argument("--code", default="print(1)")
    parser.add_argument("--python", default="/usr/bin/python3", help="interpreter of the bare runs (the sandbox's)")
    parser.add_argument("--baseline", type=Path, help="another checkout whose sandbox is measured beside this one")
    args = parser.parse_args()
    parent, stat = accounting_parent()
    checkouts = [ROOT, *([args.baseline.resolve()] if args.baseline else [])]
    services: list[dict] = []
    try:
        for index, checkout in enumerate(checkouts):
            cgroup = parent / f"gymfleet-sandbox-cpu-{os.getpid()}-{index}"
            cgroup.mkdir()
            services.append({"name": "this" if index == 0 else "baseline", "cgroup": cgroup, "cpu": 0.0, "own": 0.0})
            port = free_port()
            command = (f"echo $$ > {cgroup}/cgroup.procs && PYTHONPATH={checkout} exec {sys.executable} -m sandbox "
                       f"--port {port}")
            server, url = spawn_server(["sh", "-c", command], port, cwd=checkout, stderr=subprocess.DEVNULL)
            services[-1].update(server=server, url=url, pid=server.pid)
        rows = asyncio.run(measure(args, services, stat))
    finally:
        for service in services:
            if "server" in service:
                service["server"].terminate()
                service["server"].wait(30)
        for service in services:
            for _ in range(50):  # the sandbox's processes may still be exiting
                try:
                    service["cgroup"].rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
    print(f"trivial program {args.code!r}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}; "
          f"{args.rounds} x {args.batch} runs each at concurrency {args.concurrency}")
    print(f"{'checkout':>10} {'ms/run':>9} {'service':>9} {'rest':>9} {'/bare':>9}   (CPU)")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
