"""Admission control: at most `max_running` sandboxes at once, at most `max_queued` requests waiting for one.

Past both, a request is refused at once with `Overloaded` (answered 429 with `Retry-After`) instead of piling up
until clients time out. Waiters are served first come, first served. The `Retry-After` estimate is the time the
current queue needs to drain at the recent average run time.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class Overloaded(Exception):
    """No slot and no room in the queue; retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int, reason: str = "queue_full"):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason


class Admission:
    """A FIFO semaphore with a bounded waiting line."""

    def __init__(self, max_running: int, max_queued: int):
        self.max_running = max_running
        self.max_queued = max_queued
        self.running = 0
        self.waiting = 0
        self._average_s = 0.05
        self._slots: asyncio.Semaphore | None = None

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one run slot for the body of the `async with`.

        Raises:
            Overloaded: every slot is taken and the queue is full.
        """
        release = await self.acquire()
        try:
            yield
        finally:
            release()

    async def acquire(self) -> Callable[[], None]:
        """Take a run slot (waiting in line for one); returns the function that gives it back (call it once).

        Raises:
            Overloaded: every slot is taken and the queue is full.
        """
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_running)
        if self._slots.locked() and self.waiting >= self.max_queued:
            raise Overloaded(
                f"sandbox overloaded: {self.running} running, {self.waiting} queued (queue_length "
                f"{self.max_queued}); retry later",
                self.retry_after_s(),
            )
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        start = time.monotonic()

        def release() -> None:
            self.running -= 1
            self._slots.release()
            self._average_s = 0.9 * self._average_s + 0.1 * (time.monotonic() - start)

        return release

    def retry_after_s(self) -> int:
        """Seconds until the queue has likely drained (at least 1)."""
        return max(1, math.ceil(self.waiting * self._average_s / self.max_running))
