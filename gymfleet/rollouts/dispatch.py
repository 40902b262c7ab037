"""Sending many rollouts at once, in order: `SendWindow`.

A trainer posts a whole step's rollouts at once (NeMo-RL: 4,096 `POST /run`, no semaphore), each on its own
connection. Started all together, the client first opens every connection, then writes every request, so the agent
receives its first complete request only once the client has done that work for all of them (seconds on a busy
machine), and in whatever order the connections happened to come up: a group's rows arrive scattered over the whole
batch, its first complete group only near the end. `SendWindow` keeps the sending in row order and in a window: a
rollout's request starts going out only when fewer than `size` earlier ones are still connecting (a slot is freed as
soon as the request's headers are on the wire, `gymfleet.http.on_request_sent`, or when its call ends). Every
rollout is still in flight at once for its caller, and the agent still holds and admits them all in arrival order
(`gymfleet.serving.agent`); what changes is that the first rows reach the agent first, and at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from gymfleet import http

__all__ = ["SEND_WINDOW", "SendWindow"]

SEND_WINDOW = 64
"""Requests connecting or being written at once."""


class SendWindow:
    """At most `size` requests connecting at once, started in the order their tasks asked (FIFO)."""

    def __init__(self, size: int = SEND_WINDOW) -> None:
        self._slots = asyncio.Semaphore(size)

    @contextlib.asynccontextmanager
    async def sending(self) -> AsyncIterator[None]:
        """Hold a slot until the block's request has its headers sent (or the block ends, whichever comes first)."""
        await self._slots.acquire()
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._slots.release()

        try:
            with http.on_request_sent(release):
                yield
        finally:
            release()
