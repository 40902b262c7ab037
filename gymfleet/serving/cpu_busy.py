"""Is the CPU this process runs on already saturated? `CpuBusy`, the signal the agent's admission ramp holds on.

Where the fleet's own CPU is the bottleneck (a scripted or CPU-served policy, environments that grade on the same
cores), more rollouts in progress add no throughput: they only queue, and every result comes later (a step's median
lands at about 0.5 + in progress / (2 x rollouts) of its wall time, `docs/scaling-out.md`). Where a GPU server is the
bottleneck, the CPUs idle and the policy wants every rollout it can batch. So the agent's ramp
(`gymfleet.serving.admission.Admission`) rises only while the CPUs have room (or while rollouts wait on a policy's
latency besides the CPU), and `CpuBusy.saturated()` says when they have none, over the last half second:

- the CPUs this process may run on were busy at least `busy_at` (0.85) of the time: a cgroup v2 CPU quota (`cpu.max`, a
  container's `--cpus`) when one is set, else the CPUs of its affinity mask (`taskset`, a container's cpuset), else
  every CPU of the machine; or
- this process itself used at least that share of one core: its event loop is the bottleneck, however many cores idle.

Reading it costs a few tens of µs (`/proc/stat`, or the cgroup's `cpu.stat`; psutil where there is no `/proc`); the
ramp calls it every eighth of a second at most. Where the CPUs' times cannot be read, only this process's own CPU time
counts.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

BUSY_AT = 0.85
"""Share of the CPU time available that counts as saturated. Measured on 2 cores running `bench/nemo_rl_rollouts.py`
(every process of the fleet and the client CPU-bound): 0.84-1.0 over each eighth of a second, 0.91 on average (the
kernel counts in 10 ms ticks, and a rollout pipeline has gaps); an agent whose policy is a GPU server elsewhere
leaves most of its CPUs idle."""
WINDOW_S = 0.5
"""Seconds the busy share is measured over: four of the ramp's eighth-of-a-second steps, so one short dip does not
count as room."""

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_quota_cpus(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs' worth of time a cgroup v2 quota (`cpu.max`: "<quota> <period>", or "max <period>") grants this
    process's cgroup; None without one (no cgroup v2 at `root`, or no quota)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        cpus = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None
    return cpus if cpus > 0 else None


def cgroup_usage_s(root: Path = CGROUP_ROOT) -> float | None:
    """CPU seconds the cgroup at `root` has used (`cpu.stat`'s `usage_usec`); None if it cannot be read."""
    try:
        for line in (root / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        return None
    return None


PROC_STAT = Path("/proc/stat")


def proc_stat_times(cpus: list[int] | None = None, path: Path = PROC_STAT) -> tuple[float, float] | None:
    """(busy, total) CPU time in clock ticks since boot from Linux's `/proc/stat`: the `cpu` line, or the sum of the
    `cpuN` lines of `cpus`; idle and iowait count as idle, guest time (already inside user time) not twice. None if
    it cannot be read."""
    wanted = {"cpu"} if cpus is None else {f"cpu{cpu}" for cpu in cpus}
    busy = total = 0
    try:
        with open(path, "rb") as stat:
            for line in stat:
                if not line.startswith(b"cpu"):
                    break  # the cpu lines come first
                name, *fields = line.split()
                if name.decode() not in wanted:
                    continue
                ticks = [int(field) for field in fields[:8]]  # user nice system idle iowait irq softirq steal
                idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
                total += sum(ticks)
                busy += sum(ticks) - idle
    except (OSError, ValueError, IndexError):
        return None
    return (float(busy), float(total)) if total else None


def _affinity() -> list[int] | None:
    """The CPUs this process may run on, when that is fewer than the machine has; else None."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    return cpus if 0 < len(cpus) < (os.cpu_count() or 0) else None


def _psutil_times(cpus: list[int] | None) -> tuple[float, float] | None:
    """`proc_stat_times` through psutil, where there is no `/proc/stat` (psutil is imported only then)."""
    import psutil

    try:
        every = [psutil.cpu_times()] if cpus is None else psutil.cpu_times(percpu=True)
    except (OSError, psutil.Error, NotImplementedError):
        return None
    times = every if cpus is None else [every[cpu] for cpu in cpus if cpu < len(every)]
    total = sum(one.user + one.system + one.idle + getattr(one, "nice", 0.0) + getattr(one, "iowait", 0.0)
                + getattr(one, "irq", 0.0) + getattr(one, "softirq", 0.0) + getattr(one, "steal", 0.0)
                for one in times)
    idle = sum(one.idle + getattr(one, "iowait", 0.0) for one in times)
    return (total - idle, total) if total else None


def machine_meter(root: Path = CGROUP_ROOT, proc_stat: Path = PROC_STAT) -> Callable[[], tuple[float, float]] | None:
    """A function giving (busy, available) CPU time so far (in any unit, from any fixed origin: only their changes'
    ratio counts) for the CPUs this process may use: its cgroup's quota, else its affinity mask, else the machine;
    None if none can be read."""
    quota = cgroup_quota_cpus(root)
    if quota is not None and cgroup_usage_s(root) is not None:
        def from_cgroup() -> tuple[float, float]:
            return cgroup_usage_s(root) or 0.0, time.monotonic() * quota
        return from_cgroup

    cpus = _affinity()
    if proc_stat_times(cpus, proc_stat) is not None:
        return lambda: proc_stat_times(cpus, proc_stat) or (0.0, 0.0)
    if _psutil_times(cpus) is not None:
        return lambda: _psutil_times(cpus) or (0.0, 0.0)
    return None


class CpuBusy:
    """`saturated()`: were the CPUs `machine` measures (None: none), or this process itself, busy at least
    `busy_at` of the last `window_s` seconds? (See the module docstring.) Measured over what is known of that window:
    the calls since the oldest one still inside it; a call after a longer pause than the window starts afresh and
    answers False. `CpuBusy.here()` measures the CPUs this process may use."""

    def __init__(self, busy_at: float = BUSY_AT, *, machine: Callable[[], tuple[float, float]] | None,
                 window_s: float = WINDOW_S, process: Callable[[], float] = time.process_time,
                 clock: Callable[[], float] = time.monotonic):
        self.busy_at = busy_at
        self.window_s = window_s
        self._machine = machine
        self._process, self._clock = process, clock
        self._samples: deque[tuple[float, float, float, float]] = deque([self._sample()])

    @classmethod
    def here(cls, busy_at: float = BUSY_AT) -> CpuBusy:
        """Measuring this process and the CPUs it may use (`machine_meter`)."""
        machine = machine_meter()
        if machine is None:
            log.info("cannot read this machine's CPU times: the admission ramp holds only when this process itself "
                     "is saturated")
        return cls(busy_at, machine=machine)

    def _sample(self) -> tuple[float, float, float, float]:
        busy, available = self._machine() if self._machine is not None else (0.0, 0.0)
        return self._clock(), self._process(), busy, available

    def saturated(self) -> bool:
        now = self._sample()
        samples = self._samples
        if now[0] - samples[-1][0] > self.window_s:  # a pause: what came before says nothing about now
            samples.clear()
            samples.append(now)
            return False
        samples.append(now)
        while len(samples) > 2 and now[0] - samples[1][0] >= self.window_s:
            samples.popleft()  # the oldest left is the newest one at least a window old
        at, process, busy, available = samples[0]
        wall = now[0] - at
        if wall <= 0:
            return False
        if (now[1] - process) / wall >= self.busy_at:
            return True
        available_delta = now[3] - available
        return available_delta > 0 and (now[2] - busy) / available_delta >= self.busy_at
