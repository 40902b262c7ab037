"""Admission control: by count and by memory, with a bounded waiting line.

A request asks for a run slot (at most `max_running` held at once) and/or memory (its `memory_mb`; the sum held at
once stays within `memory_budget_mb`). What does not fit waits in one line, at most `max_queued` requests; past that
a request is refused at once with `Overloaded` (answered 429 with `Retry-After`) instead of piling up until clients
time out. A request asking more memory than the whole budget could never be admitted, so it is refused at once
with a `BadRequestError` (400) naming `memory_mb` and the budget.

Fairness: the line is first come, first served. A waiter that cannot be admitted holds back, for itself, whatever
free memory it needs, so a big run is never starved by a stream of small ones. It holds back a free slot only when
it waits for a slot: one waiting for memory lets a later request that needs a slot and no memory (a session exec,
whose session already holds its memory) run meanwhile. That keeps sessions deadlock-free: a run waiting for the
memory an idle session holds cannot block that session's next exec, and so its end. The `Retry-After` estimate is
the time the current line needs to drain at the recent average run time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gymfleet.errors import BadRequestError

log = logging.getLogger(__name__)

AUTO_BUDGET_SHARE = 0.75
"""With no `memory_budget_mb` configured, the budget is this share of the memory available when the server starts."""
CGROUP = Path("/sys/fs/cgroup")


class Overloaded(Exception):
    """No slot and no room in the queue; retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int, reason: str = "queue_full"):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason


def machine_memory_budget_mb(share: float = AUTO_BUDGET_SHARE) -> int:
    """`share` of the memory available now: the host's (psutil), or the container's cgroup (v2) if that is less."""
    available = psutil.virtual_memory().available
    with contextlib.suppress(OSError, ValueError):
        limit = (CGROUP / "memory.max").read_text().strip()
        if limit != "max":
            available = min(available, int(limit) - int((CGROUP / "memory.current").read_text()))
    return max(1, int(share * available) >> 20)


@dataclass(eq=False)
class _Waiter:
    slots: int
    memory_mb: int
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    logged: bool = False


@dataclass(eq=False)
class Admission:
    """A FIFO line for run slots and memory, with a bounded length."""

    max_running: int
    max_queued: int
    memory_budget_mb: int
    max_wait_s: float | None = None
    """How long a request may wait in line; past it, `Overloaded` (`admission_timeout`). None: no bound."""
    running: int = field(default=0, init=False)
    admitted_mb: int = field(default=0, init=False)
    waiting_for_memory: int = field(default=0, init=False)
    """Waiters held back by the memory budget (at the last admission pass)."""
    _line: deque[_Waiter] = field(default_factory=deque, init=False)
    _average_s: float = field(default=0.05, init=False)

    @property
    def waiting(self) -> int:
        """Requests in the line."""
        return len(self._line)

    def check_memory(self, memory_mb: int) -> None:
        """Refuse a request that asks more memory than the whole budget (it could never be admitted).

        Raises:
            BadRequestError: `memory_mb` is above `memory_budget_mb`.
        """
        if memory_mb > self.memory_budget_mb:
            raise BadRequestError(
                f"memory_mb={memory_mb} is above this sandbox's memory budget of {self.memory_budget_mb} MiB "
                f"(memory_budget_mb: the memory all runs and sessions admitted at once may ask for); ask for at "
                f"most {self.memory_budget_mb}"
            )

    @asynccontextmanager
    async def slot(self, memory_mb: int = 0) -> AsyncIterator[None]:
        """Hold one run slot (and `memory_mb`) for the body of the `async with`.

        Raises:
            Overloaded: it does not fit now and the queue is full.
            BadRequestError: `memory_mb` is above the whole budget.
        """
        release = await self.acquire(memory_mb)
        try:
            yield
        finally:
            release()

    async def acquire(self, memory_mb: int = 0, *, slot: bool = True) -> Callable[[], None]:
        """Take a run slot (unless `slot` is false) and `memory_mb` of the budget, waiting in line for them;
        returns the function that gives them back (calling it again does nothing).

        Raises:
            Overloaded: it does not fit now and the queue is full.
            BadRequestError: `memory_mb` is above the whole budget.
        """
        self.check_memory(memory_mb)
        waiter = _Waiter(int(slot), memory_mb)
        self._line.append(waiter)
        self._admit()
        if not waiter.future.done() and len(self._line) > self.max_queued:
            self._line.remove(waiter)  # the last in line: nobody behind it was held back for it
            self._admit()
            raise Overloaded(
                f"sandbox overloaded: {self.running} running, {self.admitted_mb} of {self.memory_budget_mb} MiB "
                f"admitted, {self.waiting} queued (queue_length {self.max_queued}); retry later",
                self.retry_after_s(),
            )
        try:
            async with asyncio.timeout(self.max_wait_s):
                await waiter.future
        except (asyncio.CancelledError, TimeoutError) as exc:
            if waiter.future.done() and not waiter.future.cancelled():
                self._give_back(waiter)  # admitted just as the caller went away (or the deadline passed)
            else:
                with contextlib.suppress(ValueError):
                    self._line.remove(waiter)
                self._admit()
            if isinstance(exc, TimeoutError):
                raise Overloaded(
                    f"sandbox overloaded: not admitted within {self.max_wait_s:g}s (admission_timeout_s; "
                    f"{self.running} running, {self.admitted_mb} of {self.memory_budget_mb} MiB admitted, "
                    f"{self.waiting} queued); retry later", self.retry_after_s(), reason="admission_timeout",
                ) from None
            raise
        return self._releaser(waiter)

    def _releaser(self, waiter: _Waiter) -> Callable[[], None]:
        start = time.monotonic()
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            if waiter.slots:
                self._average_s = 0.9 * self._average_s + 0.1 * (time.monotonic() - start)
            self._give_back(waiter)

        return release

    def _give_back(self, waiter: _Waiter) -> None:
        self.running -= waiter.slots
        self.admitted_mb -= waiter.memory_mb
        self._admit()

    def _admit(self) -> None:
        """Admit waiters in order while they fit; one that does not holds back what it needs (see the module)."""
        free_slots = self.max_running - self.running
        free_mb = self.memory_budget_mb - self.admitted_mb
        for_memory = 0
        for waiter in list(self._line):
            if waiter.future.done():  # its caller went away
                self._line.remove(waiter)
                continue
            if waiter.slots <= free_slots and waiter.memory_mb <= free_mb:
                self._line.remove(waiter)
                free_slots -= waiter.slots
                free_mb -= waiter.memory_mb
                self.running += waiter.slots
                self.admitted_mb += waiter.memory_mb
                waiter.future.set_result(None)
                continue
            if waiter.memory_mb > free_mb:
                for_memory += 1
                self._log_wait(waiter, free_mb)
            free_mb -= min(waiter.memory_mb, free_mb)
        self.waiting_for_memory = for_memory

    def _log_wait(self, waiter: _Waiter, free_mb: int) -> None:
        if not waiter.logged:
            waiter.logged = True
            log.debug("a request asking %d MiB waits for memory: %d of %d MiB admitted, %d MiB free for it, "
                      "%d in line", waiter.memory_mb, self.admitted_mb, self.memory_budget_mb, free_mb, self.waiting)

    def retry_after_s(self) -> int:
        """Seconds until the queue has likely drained (at least 1)."""
        return max(1, math.ceil(self.waiting * self._average_s / self.max_running))
