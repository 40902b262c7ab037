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
with them). So at most its capacity and half as much again (`ahead`) are sent to an agent at once, and once one of
its `/run` answers has said how many it admits at once now (`ADMISSION_LEVEL_HEADER`: its bound ramps up after idling
and may hold where its CPU is saturated, `gymfleet.serving.admission.Admission`), that and a margin waiting its turn
there (`MIN_WAITING`, or half what it admits); the rest wait in the client, in the order they were started, and go
out, on a connection a finished one freed, as earlier ones are answered. With 4,096 weather rows on 2 cores, where
the agent's bound held at 81-93, 384 sent left 290-300 waiting in the agent all along; following its answers, about
45: p50 / wall 0.50 and 0.52 against 0.50 and 0.52, the first complete group at 0.56 and 0.49 s against 0.61 and
0.65 s, in two batches of four rounds (`bench/nemo_rl_rollouts.py --repeat 4`). What may go goes in the order the
rows were started, across agents: a client that can send only so fast (a mixed fleet on 2 cores leaves it little
CPU) then gives every agent its share of the step from the start; sending one agent's rows, then the next one's, put
the median of `bench/rollouts_at_scale.py --sizes 4096` 5 s later. Following the agent's ramp by the clock before its
first answer (16 per agent and a margin at first) put it 3 s later too, for a first complete group 0.3 s sooner on
the weather rows: a step's first rows go out at once. The agent runs the same rollouts in the same order at the same
concurrency (it never runs out of waiting ones), and every rollout is still in flight for the caller from
the start. An agent whose bound is 0 or null (NeMo-Gym's way: everything at once) gets everything at once.

`AgentLines.start` is how a whole step enters the lines: it returns a future per row at once, and starts a row's
coroutine only when its agent's line lets the row go. A row waiting in the client is a future, not a task: 4,096
tasks started together each run a first step, then wake again when their turn comes, 0.1-0.2 s of the client's CPU
in a step's first moments, before its first request goes out (a step's first `POST /run` left `run_examples` 0.19 s
after the call, 0.03 s now).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from gymfleet import connections
from gymfleet.errors import ServerRefError
from gymfleet.fleet.folders import SERVER_FOLDERS_KEY
from gymfleet.replicas import instance_fields
from gymfleet.serving.admission import (
    ADMISSION_LEVEL_HEADER,
    DEFAULT_MAX_CONCURRENT_ROLLOUTS,
    agent_capacity,
    waiting_margin,
)

__all__ = ["SEND_WINDOW", "AgentLines", "SendWindow", "agent_name"]

T = TypeVar("T")
Runner = Callable[[dict[str, Any]], Awaitable[Any]]

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


class _Line:
    """One agent's line: the rows sent to it and not yet answered (`running`), and the rows waiting here in the order
    they were started. How many may be sent at once (`limit`): until an answer of this busy spell has said how many the
    agent admits at once now, `ahead` (its capacity, and half again: a step's first rows go out at once, as the agent
    may ramp up to its bound within the first rollouts, and a policy's first answer can take long); once one has
    (`heard`: the answering worker's level, `ADMISSION_LEVEL_HEADER`, times the agent's processes), that and a margin,
    at most `ahead`. Where the agent holds its bound low (a saturated CPU), the rest of the step then waits here."""

    __slots__ = ("ahead", "processes", "running", "waiting", "heard")

    def __init__(self, ahead: int, processes: int) -> None:
        self.ahead, self.processes = ahead, processes
        self.running = 0
        self.waiting: deque[tuple[int, dict[str, Any], asyncio.Future, Runner]] = deque()
        self.heard: int | None = None

    def limit(self) -> int:
        if self.heard is None:
            return self.ahead
        return min(self.ahead, self.heard + waiting_margin(self.heard))


class AgentLines:
    """Per agent of the fleet `config` (the global config dict), at most what it admits at once now and a margin
    (`MIN_WAITING`, or half what it admits) sent and not yet answered, and never more than `ahead(agent)`; the
    others wait here, first in, first out (see the module docstring). One per fleet and event loop, shared by every
    batch sent to it, so a later batch queues behind an earlier one."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self._lines: dict[str, _Line | None] = {}
        self._order = itertools.count()

    def ahead(self, agent: str) -> int | None:
        """Most requests ever kept sent to `agent` at once (its line's cap; what it admits at once now and a margin is
        usually less): its full capacity, and half as much again (a send window at least) waiting there for their
        turn. None: no bound (its bound is 0 or null, or it is not in the config, where its request fails naming the
        instances there are, or it is served from a NeMo-Gym folder: NeMo-Gym's own agents admit everything at once,
        and gymfleet's default bound is not theirs)."""
        bounds = self._bounds(agent)
        return None if bounds is None else bounds[0]

    def _bounds(self, agent: str) -> tuple[int, int] | None:
        """`(ahead, worker processes and replicas)` for `agent`, reading its config block once; None: no bound."""
        if agent in (self._config.get(SERVER_FOLDERS_KEY) or {}):
            return None
        try:
            fields = instance_fields(self._config, agent)
            capacity = agent_capacity(fields)
            if capacity is None:
                return None
            processes = capacity // int(fields.get("max_concurrent_rollouts", DEFAULT_MAX_CONCURRENT_ROLLOUTS))
        except (ServerRefError, TypeError, ValueError):  # the agent refused such a value at start-up; its call says
            return None
        return capacity + max(SEND_WINDOW, capacity // 2), processes

    def in_flight(self, agents: Iterable[str]) -> int:
        """Requests at most in flight at once for a batch whose rows go to `agents` (one name per row)."""
        return sum(count if (limit := self.ahead(agent)) is None else min(count, limit)
                   for agent, count in Counter(agents).items())

    def start(self, rows: Sequence[dict[str, Any]], run: Callable[[dict[str, Any]], Awaitable[T]],
              agent_of: Callable[[dict[str, Any]], str],
              futures: Sequence[asyncio.Future[T]] | None = None) -> Sequence[asyncio.Future[T]]:
        """One future per row (`futures`, or new ones), in row order, resolving to what `run(row)` returns (or raises).

        `run(row)` is called once the line of the row's agent (`agent_of(row)`) lets one more go: in row order per
        agent, behind every row earlier calls queued, holding its place until it ends. Cancelling a future cancels its
        row, or drops it from the line unstarted. Must be called with the event loop running.
        """
        if futures is None:
            loop = asyncio.get_running_loop()
            futures = [loop.create_future() for _ in rows]
        for row, future in zip(rows, futures, strict=True):
            line = self._line(agent_of(row))
            if line is None:
                self._run(None, row, future, run)
                continue
            line.waiting.append((next(self._order), row, future, run))
        self._pump()
        return futures

    def heard(self, agent: str, headers: Mapping[str, str]) -> None:
        """Note what an answer of `agent` said it admits at once now (`ADMISSION_LEVEL_HEADER`), and send more rows if
        that leaves room. Called by a row still running, so its line is busy."""
        line = self._lines.get(agent)
        value = headers.get(ADMISSION_LEVEL_HEADER)
        if line is None or value is None:
            return
        try:
            line.heard = max(1, int(value)) * line.processes
        except ValueError:
            return
        self._pump()

    def _line(self, agent: str) -> _Line | None:
        if agent not in self._lines:
            bounds = self._bounds(agent)
            self._lines[agent] = None if bounds is None else _Line(*bounds)
        return self._lines[agent]

    def _pump(self) -> None:
        """Send waiting rows while their lines have room, the oldest first across agents (as they were started: a
        client that can send only so fast then serves every agent its share of the step from the start); a row
        cancelled while it waited is dropped. A line with nothing left is idle: what its agent said is forgotten."""
        lines = [line for line in self._lines.values() if line is not None]
        limits = [line.limit() if line.waiting else 0 for line in lines]
        while True:
            oldest = None
            for index, line in enumerate(lines):
                while line.waiting and line.waiting[0][2].done():
                    line.waiting.popleft()
                if line.waiting and line.running < limits[index] and (
                        oldest is None or line.waiting[0][0] < lines[oldest].waiting[0][0]):
                    oldest = index
            if oldest is None:
                break
            line = lines[oldest]
            _, row, future, run = line.waiting.popleft()
            line.running += 1
            self._run(line, row, future, run)
        for line in lines:
            if line.running == 0 and not line.waiting:  # idle: the agent ramps up from the start again
                line.heard = None

    def _run(self, line: _Line | None, row: dict[str, Any], future: asyncio.Future[T],
             run: Callable[[dict[str, Any]], Awaitable[T]]) -> None:
        task = asyncio.ensure_future(run(row))
        future.add_done_callback(lambda done: task.cancel() if done.cancelled() else None)
        task.add_done_callback(lambda ended: self._ended(line, future, ended))

    def _ended(self, line: _Line | None, future: asyncio.Future[T], ended: asyncio.Future[T]) -> None:
        """Pass a row's outcome to its future, and its place in the line to the next row."""
        if line is not None:
            line.running -= 1
            self._pump()
        if future.done():
            return
        if ended.cancelled():
            future.cancel()
        elif (exc := ended.exception()) is not None:
            future.set_exception(exc)
        else:
            future.set_result(ended.result())


def agent_name(row: dict[str, Any]) -> str:
    """The agent a row goes to, as far as it says (a row without one fails on its own when its request is built)."""
    agent_ref = row.get("agent_ref") if isinstance(row, dict) else None
    return str(agent_ref.get("name") if isinstance(agent_ref, dict) else None)
