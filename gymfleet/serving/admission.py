"""Rollout admission: `Admission`, the agent's first-in-first-out line, and how many rollouts an agent admits at once.

An agent (`gymfleet.serving.agent`) admits `/run` and `/v1/responses` through one `Admission` per worker process, at
most `max_concurrent_rollouts` at a time (`DEFAULT_MAX_CONCURRENT_ROLLOUTS` when its config leaves the key out).
`agent_capacity` reads that bound from an agent's config fields, times its worker processes and replicas: what a
client sending a whole step at once needs to know to keep only that many, and a margin, waiting in the agent
(`gymfleet.rollouts.dispatch`). Nothing here imports the web framework, so a trainer's client can use it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_MAX_CONCURRENT_ROLLOUTS = 256
"""Rollouts one agent worker runs at a time by default; see `AgentServerConfig.max_concurrent_rollouts`."""


def agent_capacity(fields: dict[str, Any]) -> int | None:
    """Rollouts an agent runs at once over all its worker processes and replicas, from its config `fields` (the
    instance's block in the global config); None: it admits everything at once (`max_concurrent_rollouts` 0 or null).
    """
    bound = fields.get("max_concurrent_rollouts", DEFAULT_MAX_CONCURRENT_ROLLOUTS)
    if not bound:
        return None
    replicas = len(fields.get("replicas") or ()) or int(fields.get("num_replicas") or 1)
    return int(bound) * int(fields.get("num_workers") or 1) * replicas


class Admission:
    """A strictly first-in-first-out admission queue with at most `limit` holders (`limit` None: no bound).

    A freed slot is handed to the oldest waiter directly (the holder count does not drop and rise again), and a
    newcomer enters at once only when nobody waits, so no caller can overtake one that is waiting (which
    `asyncio.Semaphore` does not promise across Python versions). Waiters that give up are skipped, never handed a
    slot; one that is handed a slot as it gives up passes the slot on.

    With `ramp_s`, a queue that goes from idle to busy starts at `ramp_from` holders and raises the bound evenly to
    `limit` over `ramp_s` seconds (see `AgentServerConfig.admission_ramp_s`).
    """

    def __init__(self, limit: int | None, *, ramp_s: float = 0.0, ramp_from: int = 16,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit or None
        self._clock = clock
        self.in_progress = 0
        self.ramp_s = ramp_s
        self._ramp_from = max(1, ramp_from)
        self._busy_since: float | None = None
        self._tick: asyncio.TimerHandle | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._abandoned = 0
        """Waiters still in `_waiters` that gave up (skipped when a slot is handed on)."""

    @property
    def waiting(self) -> int:
        return len(self._waiters) - self._abandoned

    def current_limit(self) -> int | None:
        """The bound now: `limit`, or less while ramping up after idling."""
        if self.limit is None or self._busy_since is None:
            return self.limit
        elapsed = self._clock() - self._busy_since
        start = min(self._ramp_from, self.limit)
        if elapsed >= self.ramp_s or start >= self.limit:
            self._busy_since = None  # the ramp is over
            return self.limit
        return start + int((self.limit - start) * elapsed / self.ramp_s)

    def try_enter(self) -> bool:
        """Take a slot if one is free and nobody waits for one."""
        if self.limit is None:
            self.in_progress += 1
            return True
        if self.ramp_s > 0 and self.in_progress == 0 and not self.waiting:
            self._busy_since = self._clock()  # idle until now: ramp up again
        if self.in_progress < self.current_limit() and not self._waiters:
            self.in_progress += 1
            return True
        return False

    async def enter(self, give_up: Callable[[], Awaitable[Any]] | None = None) -> bool:
        """Wait for a slot in arrival order. True: the caller holds a slot (and must `leave`). False: the awaitable
        `give_up()` (called only if the caller has to wait) finished first, and the caller holds nothing.
        Cancelling the caller gives up its place as well."""
        if self.try_enter():
            return True
        slot = asyncio.get_running_loop().create_future()
        self._waiters.append(slot)
        self._schedule_tick()
        watcher = asyncio.ensure_future(give_up()) if give_up is not None else None
        try:
            if watcher is None:
                await slot
            else:
                await asyncio.wait((slot, watcher), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: give the place up (or pass on a slot handed over meanwhile)
            self._abandon(slot)
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        if watcher is not None and watcher.done() and not watcher.cancelled():
            if watcher.exception() is not None:  # the caller's connection broke some other way: it is gone too
                log.warning("watching a waiting caller failed: %r", watcher.exception())
            self._abandon(slot)
            return False
        return True

    def leave(self) -> None:
        """Give a slot back: to the oldest waiter still waiting, else to the pool."""
        self.in_progress -= 1
        self._admit()

    def _admit(self) -> None:
        """Hand free slots to the oldest waiters still waiting."""
        while self._waiters and (self.limit is None or self.in_progress < self.current_limit()):
            slot = self._waiters.popleft()
            if slot.done():  # a waiter that gave up
                self._abandoned -= 1
                continue
            slot.set_result(None)
            self.in_progress += 1

    def _schedule_tick(self) -> None:
        """While ramping with callers waiting, raise the bound on a timer too (not only when a rollout ends)."""
        if self._tick is None and self._busy_since is not None and self.waiting:
            self._tick = asyncio.get_running_loop().call_later(self.ramp_s / 16, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        self._admit()
        self._schedule_tick()

    def _abandon(self, slot: asyncio.Future[None]) -> None:
        if slot.done() and not slot.cancelled():  # handed a slot just as it gave up: pass it on
            self.leave()
        else:
            slot.cancel()
            self._abandoned += 1
