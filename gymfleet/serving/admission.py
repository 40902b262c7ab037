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

ADMISSION_LEVEL_HEADER = "x-gymfleet-admission-level"
"""Response header of an agent's `/run`: how many rollouts the answering worker admits at once now (`Admission.level`),
so a client that sends a whole step keeps no more waiting in the agent than a margin (`gymfleet.rollouts.dispatch`).
"""

MIN_WAITING = 32
"""Requests kept waiting in an agent beyond what it admits at once, at the least (half of that, when more,
`waiting_margin`): enough that it never runs out while a busy client refills its line (a quarter ran dry, with a
mixed fleet on 2 cores), few enough that they cost it little. A gymfleet client keeps that many sent
(`gymfleet.rollouts.dispatch.AgentLines`); an agent reads no more of a burst from other clients
(`gymfleet.serving.read_pacer.IntakePacer`)."""


def waiting_margin(level: int) -> int:
    """How many rollouts should wait in an agent that admits `level` at once: `MIN_WAITING`, or half of `level`."""
    return max(MIN_WAITING, level // 2)


HOLD_FROM = 64
"""The ramp holds on a busy CPU only from this many rollouts in progress (`Admission`). A CPU can be busy and still
do more with more in progress (more requests per event-loop pass, per system call): on 2 cores running
`bench/nemo_rl_rollouts.py`, 16 in progress kept the CPU 85% busy at about 130 rollouts/s, 64 as many rollouts/s as
256 (about 160), with the median result earlier (p50 / wall 0.49-0.50 against 0.52 over five rounds)."""

SLOW_ROLLOUT_S = 1.0
"""Rollouts that take this long or longer wait on their policy (an LLM generating), not on this machine's CPU, so a
busy CPU does not hold the ramp (`Admission`). Where the fleet's CPU is the bottleneck, the held bound keeps them
short: 0.3-0.6 s for the weather rollouts of `bench/nemo_rl_rollouts.py` on 2 cores."""

WAITING_ROLLOUT_S = 0.3
"""When even the quickest rollout of a step takes this long, rollouts wait on something besides this machine's CPU
(a policy's latency), and more of them in progress hide more of that wait: a busy CPU does not hold the ramp.
Measured on 2 cores with `bench/nemo_rl_rollouts.py --model-delay-s 0.2` (every rollout waits 0.4 s on the policy):
held at 110 with the CPU 85-90% busy, 127 rollouts/s, against 151 at 256 (single runs). Rollouts that wait on the
CPU alone take about 0.1 s at 16 in progress, up to 0.3 s in a step's first moments, while the agent takes in the
first requests."""


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
    `limit` over `ramp_s` seconds (see `AgentServerConfig.admission_ramp_s`). With `saturated` as well (a callable
    answering whether the CPU was saturated lately, `gymfleet.serving.cpu_busy.CpuBusy.saturated`), the ramp counts
    only the time the CPU had room: asked at most every `ramp_s / 16` seconds while ramping with the bound at
    `hold_from` or more, a True holds the bound where it is for that interval, so a fleet whose own CPU is the
    bottleneck keeps no more in progress than it can run (see `AgentServerConfig.admission_hold_on_busy_cpu`).
    Unless the rollouts wait on something else: when callers hold their slots `SLOW_ROLLOUT_S` or longer on average
    (`leave(held_s)`), or none has left for that long, or even the quickest took `WAITING_ROLLOUT_S`, a policy is
    what they wait on, not this CPU, and the ramp goes on as if the CPU had room; so it does until one has left.
    """

    def __init__(self, limit: int | None, *, ramp_s: float = 0.0, ramp_from: int = 16,
                 clock: Callable[[], float] = time.monotonic, saturated: Callable[[], bool] | None = None,
                 hold_from: int = HOLD_FROM) -> None:
        self.limit = limit or None
        self.hold_from = hold_from
        self._clock = clock
        self.in_progress = 0
        self.ramp_s = ramp_s
        self._ramp_from = max(1, ramp_from)
        self._busy_since: float | None = None
        self._saturated = saturated
        self._ramped = 0.0
        """Seconds of the ramp gone by with the CPU not saturated (with `saturated`)."""
        self._checked = 0.0
        """When `saturated` was last asked."""
        self._held_logged = False
        self._held_s: float | None = None
        """Moving average of how long a slot is held (`leave(held_s)`)."""
        self._quickest_s: float | None = None
        """The shortest hold of this busy period."""
        self._last_leave = 0.0
        self._tick: asyncio.TimerHandle | None = None
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._abandoned = 0
        """Waiters still in `_waiters` that gave up (skipped when a slot is handed on)."""
        self.on_room: Callable[[], None] | None = None
        """Called whenever the line may have become shorter (slots handed on, a waiter gave up): the agent's
        `gymfleet.serving.read_pacer.IntakePacer` then reads more of the requests waiting unread."""

    @property
    def waiting(self) -> int:
        return len(self._waiters) - self._abandoned

    def current_limit(self) -> int | None:
        """The bound now: `limit`, or less while ramping up after idling (asks `saturated` when an interval is up)."""
        if self._saturated is not None and self._busy_since is not None:
            now = self._clock()
            if now - self._checked >= self.ramp_s / 16:
                if (self.level() or 0) >= self.hold_from and not self._slow(now) and self._saturated():
                    self._log_held()
                else:
                    self._ramped += now - self._checked
                self._checked = now
        level = self.level()
        if level == self.limit:
            self._busy_since = None  # the ramp is over
        return level

    def _slow(self, now: float) -> bool:
        """Do rollouts take `SLOW_ROLLOUT_S` or longer (on average, or none has ended for that long), or did even the
        quickest of this busy period take `WAITING_ROLLOUT_S`, or has none ended yet? Then they may wait on a policy,
        and a busy CPU is not known to be what holds them back: the ramp goes on regardless."""
        if self._quickest_s is None or self._held_s is None:  # none has ended yet: nothing says it is the CPU
            return True
        if self._held_s >= SLOW_ROLLOUT_S or self._quickest_s >= WAITING_ROLLOUT_S:
            return True
        since = max(self._last_leave, self._busy_since or 0.0)
        return self.in_progress > 0 and now - since >= SLOW_ROLLOUT_S

    def level(self) -> int | None:
        """The bound now, measuring nothing (what `/metrics` shows)."""
        if self.limit is None or self._busy_since is None:
            return self.limit
        start = min(self._ramp_from, self.limit)
        elapsed = self._clock() - self._busy_since if self._saturated is None else self._ramped
        if elapsed >= self.ramp_s or start >= self.limit:
            return self.limit
        return start + int((self.limit - start) * elapsed / self.ramp_s)

    def _log_held(self) -> None:
        if not self._held_logged:
            self._held_logged = True
            log.info("the CPU is saturated with %d rollouts in progress: more would only queue, so the bound stays "
                     "below max_concurrent_rollouts (%d) while it is (admission_hold_on_busy_cpu)", self.level(),
                     self.limit)

    def try_enter(self) -> bool:
        """Take a slot if one is free and nobody waits for one."""
        if self.limit is None:
            self.in_progress += 1
            return True
        if self.ramp_s > 0 and self.in_progress == 0 and not self.waiting:
            self._busy_since = self._checked = self._clock()  # idle until now: ramp up again
            self._ramped = 0.0
            self._held_logged = False
            self._quickest_s = None
            if self._saturated is not None:
                self._saturated()  # measure from now
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

    def leave(self, held_s: float | None = None) -> None:
        """Give a slot back: to the oldest waiter still waiting, else to the pool. `held_s`: how long the caller held
        it (what tells a slow policy from a busy CPU while ramping, see `_slow`)."""
        self.in_progress -= 1
        if held_s is not None:
            self._held_s = held_s if self._held_s is None else 0.9 * self._held_s + 0.1 * held_s
            self._quickest_s = held_s if self._quickest_s is None else min(self._quickest_s, held_s)
            self._last_leave = self._clock()
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
        if self.on_room is not None:
            self.on_room()

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
            if self.on_room is not None:
                self.on_room()
