"""A supervised pool of worker processes with a hard per-item deadline, for CPU-heavy verification.

`ProcessPool(target)` runs `target(*args)` in worker processes it owns, one item per worker at a time, each worker
talking to the pool over its own socket. The event loop only waits: it is woken when a worker's socket turns
readable, and process starts run in a thread. Unlike `concurrent.futures.ProcessPoolExecutor`, a dead or killed
worker only affects its own item (the executor marks the whole pool broken and fails every queued item):

- An item that has used `timeout_s` of CPU time, or `wall_factor * timeout_s` (default 4x) of wall-clock time
  since it was handed to a worker, gets its worker SIGKILLed, and the caller gets `ItemTimeout`. The worker is
  replaced on demand. The budget is CPU time so that an ordinary item starved by a busy machine is not failed for
  the machine's load; the wall-clock backstop bounds the wait all the same. No `signal.alarm` anywhere: the
  deadline is kept by the parent, so the target may block, spin in C code or hold the GIL.
- An item that has burnt `slow_after_s` of CPU time is demoted: its worker is reniced to 19 and stops counting
  against `size`, so a fresh worker takes its place and ordinary items keep flowing while a poison input burns out
  its budget at low priority (at most `max_demoted` workers at once). A demoted worker is retired when its item
  ends, since a process cannot raise its own priority back.
- A worker that dies mid-item (segfault, OOM kill) has the item retried once on a fresh worker; a second death is
  `WorkerCrashed`.
- A worker that cannot be started raises `PoolError` (a `SandboxError`: infrastructure, not the input's fault).

Workers are forked from a small fork server of the pool's own (the "zygote": a fresh interpreter that imports
`preload` and runs `initializer` once, so a new worker is ready in milliseconds with warm caches). Forking the
caller instead could deadlock the child (the caller runs threads and an event loop), and multiprocessing's own
fork server re-runs the caller's `__main__` script in every worker. Workers start lazily, as items need them; they
die with the zygote (parent-death signal) and the zygote exits when the pool's process goes away. A pool may be used
from one event loop at a time (sequential loops, as in tests, are fine). Linux only. The processes themselves (the fork
server, the worker body, the pool's handles on them) are in `gymfleet.grading.procworkers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from gymfleet.errors import SandboxError
from gymfleet.grading.procworkers import Worker, Zygote, cpu_seconds

log = logging.getLogger(__name__)

_TIMED_OUT = object()
"""What an item's wait is settled with when its deadline passes first."""

__all__ = ["ItemTimeout", "PoolError", "ProcessPool", "RemoteError", "WorkerCrashed", "available_cpus"]


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask: `taskset`, container cpusets), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class PoolError(SandboxError):
    """The pool cannot run items: it is closed or a worker could not be started (infrastructure failure)."""


class ItemTimeout(Exception):
    """An item outlived its deadline; its worker was killed."""


class WorkerCrashed(Exception):
    """The worker died while running an item, twice (the item was retried once on a fresh worker)."""


class RemoteError(Exception):
    """`target` raised in the worker; the message names the remote exception type."""


class ProcessPool:
    """Worker processes that run `target(*args)` one item each, with a hard deadline per item.

    Args:
        target: Function run in the workers, pickled by reference, so defined at the top level of an importable
            module (not `__main__`). It should catch what its inputs can make it raise and return a small,
            picklable result.
        size: Workers running items at full priority (default: `available_cpus()`).
        initializer: Module-level function the fork server runs once before forking workers (warm caches there
            and every worker inherits them).
        preload: Modules the fork server imports before unpickling `target`.
        memory_mb: Address-space limit per worker (`RLIMIT_AS`); None for no limit.
        slow_after_s: Demote an item's worker once the item has used this much CPU time; None never demotes.
        max_demoted: Most demoted workers alive at once (default `4 * size`); past it, slow items keep their slot.
        wall_factor: An item is killed after `wall_factor * timeout_s` wall-clock seconds even if it has not used
            its CPU budget (starved by a busy machine, or blocked).
        start_timeout_s: How long the fork server, or a new worker, may take to report ready.
    """

    def __init__(
        self,
        target: Callable[..., Any],
        *,
        size: int | None = None,
        initializer: Callable[[], None] | None = None,
        preload: Sequence[str] = (),
        memory_mb: int | None = None,
        slow_after_s: float | None = 0.25,
        max_demoted: int | None = None,
        wall_factor: float = 4.0,
        start_timeout_s: float = 60.0,
    ):
        self.size = max(1, size or available_cpus())
        self._max_demoted = 4 * self.size if max_demoted is None else max_demoted
        self._wall_factor = max(1.0, wall_factor)
        self._payload = pickle.dumps((target, initializer, memory_mb))
        self._preload = tuple(preload)
        self._slow_after_s = slow_after_s
        self._start_timeout_s = start_timeout_s
        self._zygote: Zygote | None = None
        self._zygote_lock = threading.Lock()
        self._workers: set[Worker] = set()
        self._idle: list[Worker] = []
        self._free_slots = self.size
        self._demoted = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False
        self.stats = {"items": 0, "timeouts": 0, "crashes": 0, "started": 0, "demoted": 0}
        """Counters since the pool was created: items run, deadlines hit, worker deaths, workers started, demotions."""

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    async def start(self, workers: int | None = None) -> None:
        """Start the fork server and `workers` (default `size`) workers now instead of on first use."""
        wanted = min(self.size, workers or self.size)
        started = []
        try:
            while len(self._idle) + len(started) < wanted and self._free_slots > 0:
                started.append(await self._acquire())
        finally:
            for worker in started:
                self._release(worker)

    async def run(self, *args: Any, timeout_s: float) -> Any:
        """Run `target(*args)` in a worker and return its result.

        Args:
            *args: Picklable arguments for `target`.
            timeout_s: CPU-time budget for the item once a worker has it (time queued for a worker is not counted);
                the wall-clock backstop is `wall_factor` times this.

        Returns:
            What `target` returned.

        Raises:
            ItemTimeout: The item outlived its budget (its worker was killed).
            WorkerCrashed: The worker died running the item, on two workers in a row.
            RemoteError: `target` raised.
            PoolError: The pool is closed or cannot start a worker.
        """
        for attempt in range(2):
            worker = await self._acquire()
            reply = await self._run_on(worker, args, timeout_s)
            if reply is not None:
                kind, value = reply
                if kind == "raise":
                    raise RemoteError(value)
                return value
            if self._closed:
                raise PoolError("the process pool was closed while the item ran")
            self.stats["crashes"] += 1
            log.warning("a worker died running an item (attempt %d of 2)", attempt + 1)
        raise WorkerCrashed("the worker process died while running this item, twice")

    def close(self) -> None:
        """Kill every worker and the fork server, and refuse new items. Items in flight fail with `PoolError`."""
        self._closed = True
        for worker in list(self._workers):
            if worker.busy:
                worker.kill()  # its item notices the closed socket and cleans up
            else:
                worker.close()
                self._workers.discard(worker)
        self._idle.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done() and not waiter.get_loop().is_closed():
                waiter.set_result(None)
        if self._zygote_lock.acquire(blocking=False):  # else a start is under way; it stops the zygote itself
            try:
                if self._zygote is not None:
                    self._zygote.close()
                    self._zygote = None
            finally:
                self._zygote_lock.release()

    # ------------------------------------------------------------------------------------------ one item

    async def _run_on(self, worker: Worker, args: tuple[Any, ...], timeout_s: float) -> tuple[str, Any] | None:
        """Run one item on `worker`; returns the worker's reply `(kind, value)`, or None when the worker died.

        The wait is one future, settled by the worker's reply (a reader on its socket) or by the deadline's timer;
        the budget starts from the CPU time the worker reported with its last reply, so no `/proc` read is needed
        unless the item runs long enough for a deadline or demotion check."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        fd = worker.conn.fileno()

        def on_readable() -> None:
            loop.remove_reader(fd)
            try:
                reply = worker.conn.recv()
            except (EOFError, OSError):
                reply = None
            if not done.done():
                done.set_result(reply)

        worker.busy = True
        self.stats["items"] += 1
        began, cpu_before = loop.time(), worker.cpu
        wall_limit = began + self._wall_factor * timeout_s

        def check_deadline() -> None:
            # Called once the item may have used its CPU budget (never before: CPU time cannot outrun the clock),
            # then at the earliest moment it could have used what is left; a starved item gets more wall time, up
            # to the backstop.
            nonlocal deadline_timer
            if done.done():
                return
            cpu_now = cpu_seconds(worker.pid)
            now = loop.time()
            used = now - began if cpu_now is None or cpu_before is None else cpu_now - cpu_before
            wait_s = min(timeout_s - used, wall_limit - now)
            if wait_s <= 0:
                done.set_result(_TIMED_OUT)
            else:
                deadline_timer = loop.call_at(now + wait_s, check_deadline)

        loop.add_reader(fd, on_readable)
        deadline_timer = loop.call_at(began + min(timeout_s, wall_limit - began), check_deadline)
        if self._slow_after_s and cpu_before is not None:
            worker.demote_timer = loop.call_later(self._slow_after_s, self._maybe_demote, worker, cpu_before)
        healthy = False
        try:
            try:
                worker.conn.send(args)
            except OSError:
                done.set_result(None)
            reply = await done
            if reply is _TIMED_OUT:
                self.stats["timeouts"] += 1
                raise ItemTimeout(f"no result within {timeout_s:g}s of CPU time; the worker was killed")
            if reply is None:
                return None
            kind, value, worker.cpu = reply
            healthy = True
            return kind, value
        finally:
            # Also reached when the caller is cancelled: the worker is then busy with an item nobody waits for, so
            # it is killed rather than left to finish.
            deadline_timer.cancel()
            if worker.demote_timer is not None:
                worker.demote_timer.cancel()
                worker.demote_timer = None
            loop.remove_reader(fd)
            worker.busy = False
            if healthy and not worker.demoted and not self._closed:
                self._release(worker)
            else:
                self._retire(worker)

    def _maybe_demote(self, worker: Worker, cpu_before: float) -> None:
        """Demote a worker whose item has burnt CPU for `slow_after_s`; one merely waiting for a CPU is left be."""
        worker.demote_timer = None
        cpu_now = cpu_seconds(worker.pid)
        if not worker.busy or worker.demoted or cpu_now is None:
            return
        used = cpu_now - cpu_before
        if used < 0.8 * self._slow_after_s:
            worker.demote_timer = asyncio.get_running_loop().call_later(
                self._slow_after_s - used, self._maybe_demote, worker, cpu_before
            )
            return
        if self._demoted >= self._max_demoted:
            return
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, worker.pid, 19)
        worker.demoted = True
        self._demoted += 1
        self.stats["demoted"] += 1
        self._free_slot()

    # ------------------------------------------------------------------------------------------ slots

    async def _acquire(self) -> Worker:
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise PoolError("the process pool is closed")
            if self._idle:
                return self._idle.pop()
            if self._free_slots > 0:
                self._free_slots -= 1
                try:
                    worker = await self._spawn()
                except BaseException:
                    self._free_slot()
                    raise
                if self._closed:
                    worker.close()
                    raise PoolError("the process pool is closed")
                self._workers.add(worker)
                return worker
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # we were woken but will not take the turn: pass it on
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise

    def _release(self, worker: Worker) -> None:
        self._idle.append(worker)
        self._wake()

    def _retire(self, worker: Worker) -> None:
        worker.close()
        self._workers.discard(worker)
        if worker.demoted:
            self._demoted -= 1
        else:
            self._free_slot()

    def _free_slot(self) -> None:
        self._free_slots += 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done() and not waiter.get_loop().is_closed():
                waiter.set_result(None)
                return

    # ------------------------------------------------------------------------------------------ processes

    async def _spawn(self) -> Worker:
        errors = []
        for _ in range(3):
            try:
                worker = await asyncio.to_thread(self._spawn_sync)
            except (OSError, EOFError, TimeoutError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                log.warning("cannot start a worker: %s", errors[-1])
                continue
            self.stats["started"] += 1
            return worker
        raise PoolError(f"cannot start a worker process: {'; '.join(errors)}")

    def _spawn_sync(self) -> Worker:
        with self._zygote_lock:
            if self._zygote is not None and not self._zygote.alive:
                self._zygote.close()
                self._zygote = None
            if self._zygote is None and not self._closed:
                self._zygote = Zygote(self._payload, self._preload, self._start_timeout_s)
            try:
                if self._closed:
                    raise PoolError("the process pool is closed")
                return self._zygote.fork()
            except (OSError, EOFError):
                self._zygote.close()  # a broken fork server is replaced on the next attempt
                self._zygote = None
                raise
            finally:
                if self._closed and self._zygote is not None:  # closed while we were starting it
                    self._zygote.close()
                    self._zygote = None
