"""Sending many rollouts at once, in order: `SendWindow`.

A trainer posts a whole step's rollouts at once (NeMo-RL: 4,096 `POST /run`, no semaphore), each on its own
connection. Started all together, the client first opens every connection, then writes every request, so the agent
receives its first complete request only once the client has done that work for all of them (seconds on a busy
machine), and in whatever order the connections happened to come up: a group's rows arrive scattered over the whole
batch, its first complete group only near the end. `SendWindow` keeps the sending in row order and in a window: a
rollout's request starts going out only when fewer than `size` earlier ones are still connecting (a slot is freed as
soon as the request has its connection, and its headers go out, `gymfleet.connections.on_connected`, or when its
call ends). Every rollout is still in flight at once for its caller, and the agent still holds and admits them all in
arrival order (`gymfleet.serving.agent`); what changes is that the first rows reach the agent first, and at once.

`AgentLines` keeps what waits in the client, not in the agent: an agent admits at most its `max_concurrent_rollouts`
per worker process at once (`gymfleet.serving.admission.agent_capacity`), and the rest of a step posted at once would
otherwise wait inside it, each on a connection of its own. Sending them all costs the client and the agent about a
millisecond of CPU per request (connecting, writing and reading the request, parsing its body), paid in the first
seconds of a step, by the processes that run the first rollouts, which finish that much later (and the step's median
with them). So at most that capacity, and half as much again waiting its turn in the agent, are sent to an agent
at once; the rest wait in the client, in the order they were started, and go out, on a connection a finished one
freed, as earlier ones are answered. The agent runs the same rollouts in the same order at the same concurrency
(it never runs out of waiting ones), and every rollout is still in flight for the caller from the start. An agent
whose bound is 0 or null (NeMo-Gym's way: everything at once) gets everything at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from typing import Any

from gymfleet import connections
from gymfleet.errors import ServerRefError
from gymfleet.fleet.folders import SERVER_FOLDERS_KEY
from gymfleet.replicas import instance_fields
from gymfleet.serving.admission import agent_capacity

__all__ = ["SEND_WINDOW", "AgentLines", "SendWindow"]

SEND_WINDOW = 64
"""Requests connecting or being written at once."""


class SendWindow:
    """At most `size` requests connecting at once, started in the order their tasks asked (FIFO)."""

    def __init__(self, size: int = SEND_WINDOW) -> None:
        self._slots = asyncio.Semaphore(size)

    @contextlib.asynccontextmanager
    async def sending(self) -> AsyncIterator[None]:
        """Hold a slot until the block's request has its connection (or the block ends, whichever comes first)."""
        await self._slots.acquire()
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._slots.release()

        try:
            with connections.on_connected(release):
                yield
        finally:
            release()


class AgentLines:
    """Per agent of the fleet `config` (the global config dict), at most `ahead(agent)` requests sent and not yet
    answered; the others wait here, first in, first out (see the module docstring). One per fleet and event loop,
    shared by every batch sent to it, so a later batch queues behind an earlier one."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self._lines: dict[str, asyncio.Semaphore | None] = {}

    def ahead(self, agent: str) -> int | None:
        """Most requests kept sent to `agent` at once: what it admits at once, and half as much again (a send window
        at least) waiting there for their turn. None: no bound (its bound is 0 or null, or it is not in the config,
        where its request fails naming the instances there are, or it is served from a NeMo-Gym folder: NeMo-Gym's
        own agents admit everything at once, and gymfleet's default bound is not theirs)."""
        if agent in (self._config.get(SERVER_FOLDERS_KEY) or {}):
            return None
        try:
            capacity = agent_capacity(instance_fields(self._config, agent))
        except (ServerRefError, TypeError, ValueError):  # the agent refused such a value at start-up; its call says
            return None
        return None if capacity is None else capacity + max(SEND_WINDOW, capacity // 2)

    def in_flight(self, agents: Iterable[str]) -> int:
        """Requests at most in flight at once for a batch whose rows go to `agents` (one name per row)."""
        return sum(count if (limit := self.ahead(agent)) is None else min(count, limit)
                   for agent, count in Counter(agents).items())

    @contextlib.asynccontextmanager
    async def turn(self, agent: str) -> AsyncIterator[None]:
        """Wait for `agent`'s line to let one more request go (in the order callers asked) and hold the place for
        the block. asyncio's `Semaphore` hands a freed place to its oldest waiter (Python 3.11+), so none overtakes.
        """
        if agent not in self._lines:
            limit = self.ahead(agent)
            self._lines[agent] = None if limit is None else asyncio.Semaphore(limit)
        line = self._lines[agent]
        if line is None:
            yield
            return
        async with line:
            yield
