"""The memory watch: all of a run's processes together may hold at most its memory limit.

RLIMIT_AS bounds each process, but nothing in rlimits bounds their sum: a program that forks 64 children of 1 GiB
each would hold 64 GiB of the host's memory. So while a sandbox runs a request, the service samples its process
tree from outside (through the host's /proc, where the program cannot interfere) every `POLL_S`. When the resident
memory of its processes, confirmed by their proportional set size (pages shared after a fork counted once), passes
the limit, every process of the program is killed and the run is reported `oom`. The sandbox's init and its
launcher (the batch supervisor or session kernel) are spared, so a batch goes on with its next case and a session
survives; in direct mode the launcher is the program, and goes too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

from sandbox.process import SandboxProcess

log = logging.getLogger(__name__)

POLL_S = 0.05
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


class MemoryWatch:
    """The sandboxes running a request now, and the memory limit of each."""

    def __init__(self) -> None:
        self._watched: dict[SandboxProcess, tuple[int, bool]] = {}

    def watch(self, process: SandboxProcess, limit_bytes: int, *, direct: bool) -> None:
        """Watch `process` until `unwatch`; `direct`: its launcher runs the program itself (kill it too)."""
        self._watched[process] = (limit_bytes, direct)

    def unwatch(self, process: SandboxProcess) -> None:
        self._watched.pop(process, None)

    async def run_forever(self) -> None:
        """Check every watched sandbox every `POLL_S` (a background task of the server)."""
        while True:
            await asyncio.sleep(POLL_S)
            for process, (limit_bytes, direct) in list(self._watched.items()):
                try:
                    self.check(process, limit_bytes, direct)
                except Exception:
                    log.exception("memory watch of sandbox %d failed", process.popen.pid)

    def check(self, process: SandboxProcess, limit_bytes: int, direct: bool) -> bool:
        """Kill the program's processes if together they hold more than `limit_bytes`; returns whether it did."""
        if process.popen.returncode is not None or process.memory_exceeded_bytes:
            return False
        pids = _tree(process.popen.pid)
        if sum(map(_anonymous_rss, pids)) <= limit_bytes:
            return False
        held = sum(map(_pss, pids))
        if held <= limit_bytes:
            return False
        process.memory_exceeded_bytes = held
        spared = _infrastructure(process, pids, spare_launcher=not direct)
        for pid in pids:
            if pid not in spared:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return True


def _tree(root: int) -> list[int]:
    """`root` and all its descendants (children of every thread), parents first."""
    pids, index = [root], 0
    while index < len(pids):
        pid = pids[index]
        index += 1
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as listing:
                    pids += map(int, listing.read().split())
            except OSError:
                pass
    return pids


def _anonymous_rss(pid: int) -> int:
    """Resident memory that is not file-backed (statm: resident - shared); cheap, and at least the process's share."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            fields = statm.read().split()
        return (int(fields[1]) - int(fields[2])) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def _pss(pid: int) -> int:
    """Proportional set size: each page divided among the processes sharing it (resident size if unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError):
        pass
    return _anonymous_rss(pid)


def _infrastructure(process: SandboxProcess, pids: list[int], *, spare_launcher: bool) -> set[int]:
    """The processes that are not the program's: bwrap (outside), the namespace's init (pid 1) and, unless the
    program runs in it, the launcher (pid 2); without a PID namespace, the launcher is the root itself."""
    root = process.popen.pid
    if not process.pidns:
        return {root} if spare_launcher else set()
    spared = {root}
    for pid in pids[1:]:
        namespace_pid = _namespace_pid(pid)
        if namespace_pid == 1 or (namespace_pid == 2 and spare_launcher):
            spared.add(pid)
    return spared


def _namespace_pid(pid: int) -> int | None:
    """The pid as the process's own PID namespace sees it (last NSpid entry)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None
