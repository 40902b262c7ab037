"""`IntakePacer`: an agent reads a new connection's rollout request when its admission line has room for it.

A client that posts a whole step at once (4,096 `POST /run` over as many fresh connections, as a plain aiohttp or
NeMo-Gym client does) connects over a second or two, then writes every request within half a second. Taking one in
costs the agent 0.2-0.4 ms of CPU (parse, a task, the middleware, the body), so its event loop then spent 1.6 s on
little else: each turn took in every request that had arrived, and the first admitted rollouts, whose model and tool
answers were queued behind that work, got one step further per turn. All of it only to have 4,000 requests wait
for their turn inside the agent instead of in their sockets. Measured on 2 cores (`bench/nemo_rl_rollouts.py`'s
weather fleet, a plain aiohttp client): the first result came 1.6 s after the first request was sent. Read as the
line has room, it comes 0.6 s after, and the first complete group 3.1 s (2.7-3.7) after the call instead of 4.5 s
(4.3-5.0), most of it the client's own connecting (`bench/nemo_rl_rollouts.py --client plain`, three rounds each).

So a new connection whose first bytes are a request for one of the agent's admitted routes (`POST /run`,
`POST /v1/responses`) is read only while the agent's admission line is short (`hungry`: fewer waiting than half what it
admits at once now, or `MIN_WAITING`: `gymfleet.serving.admission.waiting_margin`), at most `per_turn` in one turn
of the event loop. The others wait in arrival order with their reading paused (the bytes read so far are kept) until
rollouts end and the line shortens (`wake`). The agent's `/metrics` shows how many wait so
(`gymfleet_rollouts_unread`). Any other request (`/metrics`, `/aggregate_metrics`, a health check) is read at once,
and so are later requests on a kept-alive connection; a connection that closed while it waited is dropped when its
turn comes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

PER_TURN = 32
"""Waiting connections read in one turn of the event loop: at 0.2-0.4 ms each, a turn's intake stays under about
13 ms, so the rollouts in progress keep moving between turns."""


class IntakePacer:
    """Reads the first request of a new connection to one of `paths` (`POST` only) only while `hungry()`, at most
    `per_turn` per event-loop turn; the rest wait, reading paused, in arrival order, until `wake()`. A protocol
    hands its first `data_received` to `first_data`."""

    def __init__(self, paths: Iterable[str], hungry: Callable[[], bool], per_turn: int = PER_TURN):
        if per_turn < 1:
            raise ValueError(f"per_turn must be at least 1, got {per_turn}")
        self._prefixes = tuple(f"POST {path}".encode() for path in paths)
        self.hungry = hungry
        self.per_turn = per_turn
        self.taken = 0
        """Waiting or new connections read since the last turn began."""
        self.waiting: deque[tuple[asyncio.BaseTransport, Any, Callable[[bytes], None], bytes]] = deque()
        self._turn_pending = False

    def paced(self, data: bytes) -> bool:
        """Do these first bytes of a connection start a request for one of the paced routes?"""
        for prefix in self._prefixes:
            if data.startswith(prefix) and data[len(prefix):len(prefix) + 1] in (b" ", b"?"):
                return True
        return False

    def first_data(self, transport: asyncio.BaseTransport, flow: Any, take: Callable[[bytes], None],
                   data: bytes) -> None:
        """A new connection's first bytes: `take(data)` now, or later with its reading paused until then (`flow`:
        uvicorn's `FlowControl` of the connection, through which uvicorn itself pauses and resumes reading)."""
        if not self.paced(data):
            take(data)
            return
        if not self.waiting and self.taken < self.per_turn and self.hungry():
            self.taken += 1
            take(data)
        else:
            flow.pause_reading()
            self.waiting.append((transport, flow, take, data))
        self._next_turn()  # to read waiting ones, or to start counting `taken` afresh

    def wake(self) -> None:
        """The line may have room now (a rollout ended or was given up): read waiting connections in the next turn."""
        if self.waiting:
            self._next_turn()

    def _next_turn(self) -> None:
        if not self._turn_pending:
            self._turn_pending = True
            asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        """Runs in the loop's next turn (`call_soon`): read up to `per_turn` waiting connections while hungry."""
        self._turn_pending = False
        self.taken = 0
        while self.waiting and self.taken < self.per_turn and self.hungry():
            transport, flow, take, data = self.waiting.popleft()
            if transport.is_closing():  # closed while it waited: nobody to answer
                continue
            self.taken += 1
            flow.resume_reading()
            take(data)
        if self.taken:  # again next turn: to read more if still hungry, and to start counting afresh
            self._next_turn()
