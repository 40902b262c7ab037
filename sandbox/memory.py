"""The memory watch: all of a run's processes together may hold at most its memory limit.

RLIMIT_AS bounds each process, but nothing in rlimits bounds their sum: a program that forks 64 children of 1 GiB
each would hold 64 GiB of the host's memory. Nor does it see memory that is held without being mapped: files in the
run's tmpfs mounts (`/workspace` = `/tmp`, `/dev/shm`) and memfd files (`memfd_create` + `write`) live in the
kernel's shared memory, owned by no address space. So while a sandbox runs a request, the service samples its
process tree from outside (through the host's /proc, where the program cannot interfere) every `POLL_S`, and counts:

- what its processes map, as proportional set size (PSS: a page shared by n of them counts 1/n in each, so shared
  anonymous memory and pages shared after a fork count once in all);
- the used size of the run's tmpfs mounts (seen through its init's root: deleted files still open included);
- the allocated size of every memfd (or other internal shared-memory file) its processes hold open, once per file.

Mappings of tmpfs files and of memfds held open are left out of the PSS, so a page held both ways counts once. When
the total passes the limit, every process of the program is killed and the run is reported `oom`. A cheap upper
bound comes first (resident sizes from `statm` plus the files), so PSS (`smaps_rollup`) is only read for runs near
their limit, and the per-mapping list (`smaps`) only for their processes that map shared memory. The sandbox's
init and its launcher (the batch supervisor or session kernel) are spared, so a batch goes on with its next case and
a session survives; in direct mode the launcher is the program, and goes too.
What it kills does not free the files the program left in its tmpfs: a batch's next case that starts over the limit
is killed at once.

Not counted by this sampling: SysV shared memory that no process has attached, memfds whose only reference is in
flight in a unix socket, pipe and socket buffers, kernel memory. Memory allocated faster than the sampling sees it
is caught at the next sample.

Where the service could make memory cgroups (`sandbox.cgroups`), a sandbox in one is not sampled: the kernel counts
all of the above and holds the cgroup to the limit itself, killing a process (the program's, by their
`oom_score_adj`) when it cannot. The watch then only polls the cgroup's OOM-kill counter and ends the rest of the
program's processes as above, so an OOM ends a case whole; it leaves a kill to the result being reported when the
launcher has already written one (that case is over, and the next one may be running).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

from sandbox.isolation import TMPFS_MOUNTS
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
        if process.cgroup is not None and not process.cgroup.ran_out(peek=True):
            return False
        pids = _tree(process.popen.pid)  # before the pending check: a case started after it is not in the list
        if process.cgroup is not None:
            if process.result_pending() or not process.cgroup.ran_out():
                return False
            held = process.cgroup.peak_bytes()
        else:
            held = held_bytes(pids, pidns=process.pidns, over=limit_bytes)
            if held <= limit_bytes:
                return False
        process.memory_exceeded_bytes = held
        spared = _infrastructure(process, pids, spare_launcher=not direct)
        for pid in pids:
            if pid not in spared:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return True

    @staticmethod
    def take(process: SandboxProcess) -> int:
        """What the program's processes held when they ran out of memory since the last result (0 if they did not),
        for the result reported now; counted once."""
        if process.cgroup is not None and not process.memory_exceeded_bytes and process.cgroup.ran_out():
            process.memory_exceeded_bytes = process.cgroup.peak_bytes()
        held, process.memory_exceeded_bytes = process.memory_exceeded_bytes, 0
        return held


def held_bytes(pids: list[int], *, pidns: bool, over: int = 0) -> int:
    """The memory the processes `pids` (a sandbox's tree, its outer process first) hold together, see the module's
    docstring. Below `over`, a cheap upper bound is returned instead of the exact count."""
    files = _tmpfs_usage(pids[1]) if pidns and len(pids) > 1 else {}
    shmem = _shmem_files(pids)
    unmapped = sum(files.values()) + sum(shmem.values())
    bound = unmapped + sum(map(_resident, pids))
    if bound <= over:
        return bound
    return unmapped + sum(_mapped(pid, set(files), set(shmem)) for pid in pids)


def _shmem_device() -> int:
    """The device of the kernel's internal shared-memory mount (memfd files, shared anonymous and SysV memory)."""
    fd = os.memfd_create("gymfleet-probe", os.MFD_CLOEXEC)
    try:
        return os.fstat(fd).st_dev
    finally:
        os.close(fd)


SHMEM_DEVICE = _shmem_device()


def _tmpfs_usage(init: int) -> dict[int, int]:
    """{device: bytes in use} of the sandbox's tmpfs mounts, seen through the root of its init (`init`)."""
    usage = {}
    for mount in TMPFS_MOUNTS:
        path = f"/proc/{init}/root{mount}"
        try:
            device, stats = os.stat(path).st_dev, os.statvfs(path)
        except OSError:
            continue
        usage[device] = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
    return usage


def _shmem_files(pids: list[int]) -> dict[int, int]:
    """{inode: bytes allocated} of the internal shared-memory files (memfds) the processes hold open, each once."""
    files = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                info = os.stat(f"/proc/{pid}/fd/{fd}")  # follows the link: the open file itself
            except OSError:
                continue
            if info.st_dev == SHMEM_DEVICE:
                files[info.st_ino] = info.st_blocks * 512
    return files


def _mapped(pid: int, counted_devices: set[int], counted_shmem: set[int]) -> int:
    """The PSS of the process's mappings, except those of files on `counted_devices` (the run's tmpfs mounts) and
    of the shared-memory files `counted_shmem` (held open): those are counted by their size. The per-mapping list
    (`smaps`, slow) is read only when the process maps shared memory at all (`smaps_rollup`'s Pss_Shmem)."""
    rollup = _rollup(pid)
    if rollup is None:
        return _resident(pid)
    pss, pss_shmem = rollup
    if not pss_shmem:
        return pss
    total, skip = 0, False
    try:
        with open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                parts = line.split(None, 5)
                if parts[0].endswith(":"):
                    if parts[0] == "Pss:" and not skip:
                        total += int(parts[1]) << 10
                    continue
                major, minor = (int(number, 16) for number in parts[3].split(":"))  # a mapping's header line
                device, inode = os.makedev(major, minor), int(parts[4])
                skip = device in counted_devices or (device == SHMEM_DEVICE and inode in counted_shmem)
    except (OSError, IndexError, ValueError):
        # Gone while being read (a child exiting): it holds nothing now. Its whole PSS would count its mappings of
        # the memfds and tmpfs files already counted by size a second time (a well-behaved run reported `oom`).
        return min(pss, _resident(pid))
    return total


def _rollup(pid: int) -> tuple[int, int] | None:
    """(Pss, Pss_Shmem) in bytes from /proc/<pid>/smaps_rollup; None if unreadable."""
    fields = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                name, _, rest = line.partition(":")
                if name in ("Pss", "Pss_Shmem"):
                    fields[name] = int(rest.split()[0]) << 10
    except (OSError, IndexError, ValueError):
        return None
    if "Pss" not in fields:
        return None
    return fields["Pss"], fields.get("Pss_Shmem", fields["Pss"])  # kernels before 5.7 do not say: read smaps


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


def _resident(pid: int) -> int:
    """Resident memory (statm): anonymous, file-backed and shared pages alike; cheap, and at least its PSS."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


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
