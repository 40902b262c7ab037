"""Memory cgroups: each run and each session in a memory cgroup of its own, where the kernel lets the service make one.

Where the memory controller is writable (cgroup v2, or v1's memory hierarchy), every sandbox gets a child of the
service's own cgroup, with a random name, for its whole life:

- Its limit is the run's (or the session's) `memory_mb`: v1 `memory.limit_in_bytes` and
  `memory.memsw.limit_in_bytes` (memory plus swap: swapping cannot dodge it), v2 `memory.max` with
  `memory.swap.max` 0. The kernel counts, and holds to that limit, everything the sandbox's processes charge:
  anonymous memory, page cache, files in its tmpfs mounts, memfds (also while their only reference is in flight in a
  unix socket), SysV shared memory (attached or not), pipe and socket buffers, page tables and other kernel memory
  (v1 counts kernel memory in `memory.usage_in_bytes` when kmem accounting is on, the default since Linux 4.6; v2
  always). That closes the gaps of the sampling watch (`sandbox.memory`), which stays the fallback.
- The sandbox is in it before any model code runs: right after starting bwrap the service moves it, then every
  process below it, parents before children (`adopt`). The kernel orders forks and moves, so a child forked before
  its parent moved is listed under it by then, and one forked after inherits the new cgroup; the launcher meanwhile
  waits for its code on stdin. On v1 the first move of a run waits for an RCU grace period (about 10 ms), so it runs
  in a thread.
- When the kernel's OOM killer kills one of its processes for the limit (`oom_kill` in `memory.oom_control` /
  `memory.events`, with the limit reached), the run is reported `oom`: the memory watch ends the rest of the
  program's processes (sparing the sandbox's init and the batch supervisor or session kernel), and programs run with
  `oom_score_adj` 1000 (`launcher.set_limits`), so the kernel picks them and not their supervisor.
- When the sandbox is closed, whatever is left in it is killed (v2 `cgroup.kill`; v1: SIGKILL to every task until
  none is left; the PID namespace's death has already taken them, so this is a backstop) and it is removed. Cgroups
  of a service that died are swept when the next one starts: their names carry the owner's pid and start time.

`detect` picks the hierarchy at start (`memory_accounting: auto`): v2 if `memory` is among the service cgroup's
controllers (enabling it for its children, after moving the service into a leaf of its own if it must), else the
v1 memory hierarchy, each checked by making, limiting and removing a probe cgroup. Where neither works it says why,
in one log line, and the service falls back to the sampling watch (`memory_accounting: rss` asks for that;
`cgroup` makes a missing cgroup a start-up error).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import os
import re
import secrets
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "gymfleet-sandbox-"
OWNER = re.compile(re.escape(PREFIX) + r"(\d+)-(\d+)-")
KILL_ROUNDS = 100
REMOVE_TRIES = 50
REMOVE_PAUSE_S = 0.02
SWEEP_WAIT_S = 5.0
PID_MAX = 1 << 22
LIMIT_SLACK_BYTES = 1 << 20
"""A v1 peak this close to the limit means the limit was reached (a charge that did not fit is never counted)."""


class CgroupUnavailable(Exception):
    """No writable memory cgroup here; the message says why."""


class Hierarchy:
    """Where this service makes its sandboxes' cgroups: under its own cgroup in the memory hierarchy found at start."""

    def __init__(self, version: int, parent: Path, controller: str = "memory"):
        self.version = version
        self.parent = parent
        self.controller = controller
        """`memory`, or `pids` (v1: the per-run process limits of forked runs, `detect_pids`)."""
        pid = os.getpid()
        self.owner = f"{PREFIX}{pid}-{_start_time(pid)}-"
        self.instance = f"{self.owner}{secrets.token_hex(3)}-"
        """The name prefix of this object's cgroups (a process may run several services)."""
        self.live: set[RunCgroup] = set()
        self._stale: set[Path] = set()
        self._serial = itertools.count()
        """Numbers the instance's cgroups (its name prefix is already unique to it)."""
        self.swap_limits: bool | None = None
        """Whether its memory cgroups have a swap limit file (swap accounting on); None: not looked yet."""

    def __str__(self) -> str:
        return f"cgroup v{self.version} ({self.parent})"

    def create(self, limit_bytes: int | None) -> RunCgroup:
        """A new, empty cgroup limited to `limit_bytes` (None: not yet, `RunCgroup.set_limit` before any run).

        Raises:
            OSError: it could not be made or limited.
        """
        self._remove_stale()
        cgroup = RunCgroup(self.parent / f"{self.instance}{next(self._serial):012x}", self)
        cgroup.path.mkdir()
        try:
            if limit_bytes is not None:
                cgroup.set_limit(limit_bytes)
        except BaseException:
            with contextlib.suppress(OSError):
                cgroup.path.rmdir()
            raise
        self.live.add(cgroup)
        return cgroup

    def ours(self) -> list[Path]:
        """The cgroups of this object that exist now (none once every sandbox is closed)."""
        return sorted(self.parent.glob(f"{self.instance}*"))

    def used_bytes(self) -> int:
        """The memory that the live sandboxes' cgroups hold now."""
        return sum(cgroup.current_bytes() for cgroup in list(self.live))

    def sweep(self) -> int:
        """Kill and remove the cgroups left by services that are gone (crashed); returns how many."""
        removed = 0
        for path in self.parent.glob(f"{PREFIX}*"):
            match = OWNER.match(path.name)
            if match is None or not path.is_dir() or _start_time(int(match[1])) == match[2]:
                continue
            try:
                _kill_and_remove(path, self.version)
                removed += 1
            except OSError as exc:
                log.warning("could not remove the leftover sandbox cgroup %s: %s", path, exc)
        if removed:
            log.info("removed %d sandbox cgroups left by services that are gone, under %s", removed, self.parent)
        return removed

    def _remove_stale(self) -> None:
        for path in list(self._stale):
            with contextlib.suppress(OSError):
                kill_all(path, self.version)
                path.rmdir()
                self._stale.discard(path)


class RunCgroup:
    """The cgroup of one sandbox (a run, a batch or a session)."""

    def __init__(self, path: Path, hierarchy: Hierarchy):
        self.path = path
        self.hierarchy = hierarchy
        self.v1 = hierarchy.version == 1
        self.limit_bytes = 0
        self._oom_kills_seen = 0

    def set_limit(self, limit_bytes: int) -> None:
        """Its memory limit (a `pids` cgroup: its process limit)."""
        self.limit_bytes = limit_bytes
        path, hierarchy = self.path, self.hierarchy
        if hierarchy.controller == "pids":
            _write(f"{path}/pids.max", min(limit_bytes, PID_MAX))
            return
        _write(f"{path}/{'memory.limit_in_bytes' if self.v1 else 'memory.max'}", limit_bytes)
        swap = f"{path}/{'memory.memsw.limit_in_bytes' if self.v1 else 'memory.swap.max'}"
        if hierarchy.swap_limits is None:  # absent where swap accounting is off: the same for every cgroup here
            hierarchy.swap_limits = os.path.exists(swap)
        if hierarchy.swap_limits:
            _write(swap, limit_bytes if self.v1 else 0)

    def set_process_limit(self, count: int) -> None:
        """Its process limit (v2, where the pids controller is enabled beside memory: `detect_pids`)."""
        _write(self.path / "pids.max", count)

    def adopt(self, root: int) -> None:
        """Move process `root` and every process below it into this cgroup, parents first (the module's docstring).

        Raises:
            OSError: a process could not be moved (one that exited meanwhile is skipped).
        """
        adopt([self], root)

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer killed in this cgroup so far."""
        name = "memory.oom_control" if self.v1 else "memory.events"
        return _keyed(self.path / name).get("oom_kill", 0)

    def limit_reached(self) -> bool:
        """Whether the cgroup's memory ever reached its limit (so an OOM kill in it was its own, not the host's)."""
        if self.v1:
            return self.peak_bytes() >= self.limit_bytes - LIMIT_SLACK_BYTES
        events = _keyed(self.path / "memory.events")
        return events.get("max", 0) > 0 or events.get("oom", 0) > 0

    def ran_out(self, *, peek: bool = False) -> bool:
        """Whether the kernel killed a process of this sandbox for its limit since the last call that said so
        (`peek`: without counting this call as one)."""
        kills = self.oom_kills()
        if kills <= self._oom_kills_seen or not self.limit_reached():
            return False
        if not peek:
            self._oom_kills_seen = kills
        return True

    def current_bytes(self) -> int:
        return _read_int(self.path / ("memory.usage_in_bytes" if self.v1 else "memory.current"))

    def peak_bytes(self) -> int:
        """The most this cgroup held at once (v2 kernels before 5.19 do not say: what it holds now)."""
        peak = _read_int(self.path / ("memory.max_usage_in_bytes" if self.v1 else "memory.peak"))
        return peak or self.current_bytes()

    async def remove(self) -> None:
        """Kill whatever is left in it and remove it; one that stays busy is retried at the next `create`."""
        self.hierarchy.live.discard(self)
        for _ in range(REMOVE_TRIES):
            try:
                kill_all(self.path, self.hierarchy.version)
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    log.warning("could not remove the sandbox cgroup %s: %s", self.path, exc)
                    break
            await asyncio.sleep(REMOVE_PAUSE_S)
        log.warning("the sandbox cgroup %s is still busy: removing it later", self.path)
        self.hierarchy._stale.add(self.path)


def adopt(cgroups: list[RunCgroup], root: int) -> None:
    """Move process `root` and every process below it into each of `cgroups` (a memory and a pids cgroup: one walk
    of the tree for all), parents first: each process is in all of them before its children are listed.

    Raises:
        OSError: a process could not be moved (one that exited meanwhile is skipped).
    """
    fds: list[int] = []
    try:
        for cgroup in cgroups:
            fds.append(os.open(f"{cgroup.path}/cgroup.procs", os.O_WRONLY))
        pending = [root]
        while pending:
            pid = pending.pop()
            try:
                for fd in fds:
                    os.write(fd, b"%d" % pid)
            except ProcessLookupError:
                continue
            pending += _children(pid)
    finally:
        for fd in fds:
            os.close(fd)


def _kill_and_remove(path: Path, version: int, wait_s: float = SWEEP_WAIT_S) -> None:
    """Kill the cgroup's processes and remove it once they have exited (waiting up to `wait_s`, in this thread).

    Raises:
        OSError: it could not be removed.
    """
    deadline = time.monotonic() + wait_s
    while True:
        kill_all(path, version)
        try:
            path.rmdir()
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
        time.sleep(REMOVE_PAUSE_S)


def kill_all(path: Path, version: int) -> None:
    """SIGKILL every process in the cgroup at `path` (v2: `cgroup.kill` where the kernel has it, 5.14+).

    Raises:
        OSError: its process list could not be read.
    """
    if version == 2 and (path / "cgroup.kill").exists():
        _write(path / "cgroup.kill", 1)
        return
    for _ in range(KILL_ROUNDS):  # a process forked between reading the list and the kill is in the next read
        pids = [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def detect(mode: str, *, proc: Path = Path("/proc/self")) -> Hierarchy | None:
    """The hierarchy to make sandboxes' cgroups in (`mode` auto or cgroup), or None (`mode` rss, or auto where none
    works); logs which accounting is in use and why.

    Raises:
        CgroupUnavailable: `mode` is cgroup and no memory cgroup can be made here.
    """
    if mode == "rss":
        log.info("sandbox memory accounting: the sampling watch (memory_accounting: rss)")
        return None
    try:
        hierarchy = _find(proc)
        _probe(hierarchy)
    except CgroupUnavailable as exc:
        if mode == "cgroup":
            raise
        log.warning("sandbox memory accounting: the sampling watch, since no memory cgroup can be made here (%s); "
                    "kernel buffers, SysV shared memory and memfds in flight in sockets are not counted", exc)
        return None
    hierarchy.sweep()
    log.info("sandbox memory accounting: %s, each run and session in a memory cgroup of its own", hierarchy)
    return hierarchy


def detect_pids(memory: Hierarchy | None, *, proc: Path = Path("/proc/self")) -> Hierarchy | str | None:
    """Where forked runs (`sandbox.forkserver`, which share one user namespace, so RLIMIT_NPROC would count them
    together) get a process limit of their own: the v1 pids hierarchy (a `Hierarchy` of `pids` cgroups), "memory"
    (v2: the run's memory cgroup also limits its processes), or None (neither: no fork server)."""
    if memory is not None and memory.version == 2:
        return "memory" if "pids" in _read_words(memory.parent / "cgroup.subtree_control") else None
    memberships, mounts = _memberships(proc / "cgroup"), _mounts(proc / "mountinfo")
    own = _under(mounts["pids"], memberships["pids"]) if "pids" in memberships and "pids" in mounts else None
    if own is None:
        return None
    hierarchy = Hierarchy(1, own, "pids")
    try:
        _probe(hierarchy)
    except CgroupUnavailable as exc:
        log.info("no per-run pids cgroups (%s)", exc)
        return None
    hierarchy.sweep()
    return hierarchy


def _find(proc: Path) -> Hierarchy:
    """The service's own cgroup in the hierarchy that has the memory controller (v2 preferred)."""
    memberships = _memberships(proc / "cgroup")
    mounts = _mounts(proc / "mountinfo")
    reasons = []
    if "" in memberships and "cgroup2" in mounts:
        own = _under(mounts["cgroup2"], memberships[""])
        if own is not None and "memory" in _read_words(own / "cgroup.controllers"):
            return Hierarchy(2, _delegate(own))
        reasons.append("cgroup v2 is mounted without the memory controller" if own else "cgroup v2 is not visible")
    if "memory" in memberships and "memory" in mounts:
        own = _under(mounts["memory"], memberships["memory"])
        if own is not None:
            return Hierarchy(1, own)
        reasons.append("the v1 memory hierarchy does not show this process's cgroup")
    else:
        reasons.append("no cgroup v1 memory hierarchy is mounted")
    raise CgroupUnavailable("; ".join(reasons))


def _delegate(own: Path) -> Path:
    """Enable the memory controller for `own`'s children (v2): a cgroup with processes of its own cannot, so the
    service first moves itself into a leaf `own/<PREFIX><pid>-<start>-service`.

    Raises:
        CgroupUnavailable: other processes share the service's cgroup, or it is not writable.
    """
    control = own / "cgroup.subtree_control"
    if "memory" in _read_words(control):
        _enable_pids(control)
        return own
    try:
        _write(control, "+memory")
        _enable_pids(control)
        return own
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise CgroupUnavailable(f"cannot enable the memory controller in {control}: {exc}") from exc
    pid = os.getpid()
    leaf = own / f"{PREFIX}{pid}-{_start_time(pid)}-service"
    try:
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", pid)
        _write(control, "+memory")
    except OSError as exc:
        raise CgroupUnavailable(f"cannot enable the memory controller in {control} ({exc}): give the service a "
                                "cgroup of its own (a container, or systemd's Delegate=yes)") from exc
    log.info("moved the service into %s to enable the memory controller for its sandboxes' cgroups", leaf)
    _enable_pids(control)
    return own


def _enable_pids(control: Path) -> None:
    """Enable the pids controller beside memory where it can be (v2): forked runs' process limits (`detect_pids`)."""
    with contextlib.suppress(OSError):
        if "pids" not in _read_words(control):
            _write(control, "+pids")


def _probe(hierarchy: Hierarchy) -> None:
    try:
        probe = hierarchy.create(64 << 20)
    except OSError as exc:
        raise CgroupUnavailable(f"cannot make a limited cgroup under {hierarchy.parent}: {exc}") from exc
    hierarchy.live.discard(probe)
    try:
        probe.path.rmdir()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot remove a cgroup under {hierarchy.parent}: {exc}") from exc


def _memberships(path: Path) -> dict[str, str]:
    """{controller (v2: ""): the cgroup path} from /proc/<pid>/cgroup."""
    found = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            _, controllers, cgroup = line.split(":", 2)
            for controller in controllers.split(","):
                found[controller] = cgroup
    return found


def _mounts(path: Path) -> dict[str, tuple[str, Path]]:
    """{"cgroup2" or a v1 controller: (the mount's root in the hierarchy, its mount point)} from mountinfo."""
    found: dict[str, tuple[str, Path]] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            fields, _, tail = line.partition(" - ")
            parts, tail_parts = fields.split(), tail.split()
            if len(parts) < 5 or len(tail_parts) < 3:
                continue
            root, point = parts[3], Path(parts[4].replace("\\040", " "))
            if tail_parts[0] == "cgroup2":
                found.setdefault("cgroup2", (root, point))
            elif tail_parts[0] == "cgroup":
                for option in tail_parts[2].split(","):
                    found.setdefault(option, (root, point))
    return found


def _under(mount: tuple[str, Path], cgroup: str) -> Path | None:
    """The directory of `cgroup` under a mount of its hierarchy whose root is `mount[0]`, if it shows it."""
    root, point = mount
    if cgroup == root or root == "/":
        relative = "" if cgroup == root else cgroup.lstrip("/")
    elif cgroup.startswith(root.rstrip("/") + "/"):
        relative = cgroup[len(root.rstrip("/")) + 1 :]
    else:
        return None
    path = point / relative
    return path if path.is_dir() else None


def _children(pid: int) -> list[int]:
    """The children of every thread of `pid`."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as listing:
            found += map(int, listing.read().split())
    return found


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (with its pid, a name no later process reuses)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def _keyed(path: Path) -> dict[str, int]:
    try:
        pairs = (line.split() for line in path.read_text().splitlines())
        return {pair[0]: int(pair[1]) for pair in pairs if len(pair) == 2}
    except (OSError, ValueError):
        return {}


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _write(path: Path | str, value: int | str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)
