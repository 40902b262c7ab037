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
with them). So what is sent to an agent at once is what it admits at once now, and a margin waiting its turn there
(`MIN_WAITING`, or a quarter of what it admits), never more than its capacity and half as much again (`ahead`); the
rest wait in the client, in the order they were started, and go out, on a connection a finished one freed, as earlier
ones are answered. "Now": an agent's bound ramps up after idling and may hold where its CPU is saturated
(`gymfleet.serving.admission.Admission`), and each of its `/run` answers says where it stands
(`ADMISSION_LEVEL_HEADER`); until one has, the client follows the agent's ramp by the clock. With 4,096 weather rows
on 2 cores, where the agent's bound held at 81-93, sending its full capacity and half again (384) left 290-300 of them
waiting in the agent: p50 / wall 0.51 (0.48-0.53) against 0.49 (0.46-0.52) following it, the first complete group at
0.47 against 0.24 s (`bench/nemo_rl_rollouts.py --repeat 4`). The agent runs the same rollouts in the same order at
the same concurrency (it never runs out of waiting ones), and every rollout is still in flight for the caller from
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
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from gymfleet import connections
from gymfleet.errors import ServerRefError
from gymfleet.fleet.folders import SERVER_FOLDERS_KEY
from gymfleet.replicas import instance_fields
from gymfleet.serving.admission import (
    ADMISSION_LEVEL_HEADER,
    DEFAULT_ADMISSION_RAMP_S,
    DEFAULT_MAX_CONCURRENT_ROLLOUTS,
    RAMP_FROM,
    agent_capacity,
)

__all__ = ["SEND_WINDOW", "AgentLines", "SendWindow", "agent_name"]

T = TypeVar("T")
Runner = Callable[[dict[str, Any]], Awaitable[Any]]

SEND_WINDOW = 64
"""Requests connecting or being written at once."""

MIN_WAITING = 32
"""Requests kept waiting in an agent beyond what it admits at once, at the least (a quarter of that, when more): enough
that it never runs out while the client refills its line, few enough that they cost it little (`AgentLines`)."""


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
    they were started. How many may be sent at once (`limit`): what the agent admits at once now and a margin waiting
    there, at most `ahead`. What the agent admits now is what its latest answer said (`heard`: the answering worker's
    level, `ADMISSION_LEVEL_HEADER`, times the agent's processes); until an answer of this busy spell says, the
    agent's ramp is followed by the clock: `RAMP_FROM` per process when the line went busy, rising evenly to the bound
    over `ramp_s`, as the agent's own ramp does when its CPU has room."""

    __slots__ = ("ahead", "bound", "processes", "ramp_s", "running", "waiting", "busy_since", "heard", "timer")

    def __init__(self, ahead: int, bound: int, processes: int, ramp_s: float) -> None:
        self.ahead, self.bound, self.processes, self.ramp_s = ahead, bound, processes, ramp_s
        self.running = 0
        self.waiting: deque[tuple[dict[str, Any], asyncio.Future, Runner]] = deque()
        self.busy_since: float | None = None
        self.heard: int | None = None
        self.timer: asyncio.TimerHandle | None = None

    def admits(self, now: float) -> int:
        """Rollouts the agent admits at once now, over all its processes, as far as this client can tell."""
        if self.heard is not None:
            return self.heard
        start = min(RAMP_FROM, self.bound)
        if self.busy_since is None:
            return start * self.processes
        elapsed = now - self.busy_since
        if self.ramp_s <= 0 or elapsed >= self.ramp_s:
            return self.bound * self.processes
        return (start + int((self.bound - start) * elapsed / self.ramp_s)) * self.processes

    def limit(self, now: float) -> int:
        admits = self.admits(now)
        return min(self.ahead, admits + max(MIN_WAITING, admits // 4))

    def ramping(self, now: float) -> bool:
        """Whether `limit` may rise with time alone (no answer has said where the agent stands yet)."""
        return self.heard is None and self.ramp_s > 0 and self.busy_since is not None \
            and now - self.busy_since < self.ramp_s


class AgentLines:
    """Per agent of the fleet `config` (the global config dict), at most what it admits at once now and a margin
    (`MIN_WAITING`, or a quarter of what it admits) sent and not yet answered, and never more than `ahead(agent)`; the
    others wait here, first in, first out (see the module docstring). One per fleet and event loop, shared by every
    batch sent to it, so a later batch queues behind an earlier one."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self._lines: dict[str, _Line | None] = {}

    def ahead(self, agent: str) -> int | None:
        """Most requests ever kept sent to `agent` at once (its line's cap; what it admits at once now and a margin is
        usually less): its full capacity, and half as much again (a send window at least) waiting there for their
        turn. None: no bound (its bound is 0 or null, or it is not in the config, where its request fails naming the
        instances there are, or it is served from a NeMo-Gym folder: NeMo-Gym's own agents admit everything at once,
        and gymfleet's default bound is not theirs)."""
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
        touched: dict[int, _Line] = {}
        for row, future in zip(rows, futures, strict=True):
            line = self._line(agent_of(row))
            if line is None:
                self._run(None, row, future, run)
            else:
                line.waiting.append((row, future, run))
                touched[id(line)] = line
        for line in touched.values():
            self._next(line)
        return futures

    def heard(self, agent: str, headers: Mapping[str, str]) -> None:
        """Note what an answer of `agent` said it admits at once now (`ADMISSION_LEVEL_HEADER`), and send more rows if
        that leaves room."""
        line = self._lines.get(agent)
        value = headers.get(ADMISSION_LEVEL_HEADER)
        if line is None or value is None or line.busy_since is None:
            return
        try:
            line.heard = max(1, int(value)) * line.processes
        except ValueError:
            return
        self._next(line)

    def _line(self, agent: str) -> _Line | None:
        if agent not in self._lines:
            ahead = self.ahead(agent)
            if ahead is None:
                self._lines[agent] = None
            else:
                fields = instance_fields(self._config, agent)  # ahead() has checked these
                bound = int(fields.get("max_concurrent_rollouts", DEFAULT_MAX_CONCURRENT_ROLLOUTS))
                try:
                    ramp_s = float(fields.get("admission_ramp_s", DEFAULT_ADMISSION_RAMP_S) or 0.0)
                except (TypeError, ValueError):  # the agent refused it at start-up
                    ramp_s = DEFAULT_ADMISSION_RAMP_S
                self._lines[agent] = _Line(ahead, bound, agent_capacity(fields) // bound, ramp_s)
        return self._lines[agent]

    def _next(self, line: _Line) -> None:
        """Send waiting rows while the line has room (a row cancelled while it waited is dropped); while the room
        grows with the agent's ramp alone, look again a sixteenth of the ramp later."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if line.busy_since is None and line.waiting:
            line.busy_since = now
        limit = line.limit(now)
        while line.running < limit and line.waiting:
            row, future, run = line.waiting.popleft()
            if not future.done():
                line.running += 1
                self._run(line, row, future, run)
        if line.waiting and line.timer is None and line.ramping(now):
            line.timer = loop.call_later(line.ramp_s / 16, self._on_timer, line)
        elif line.running == 0 and not line.waiting:  # idle: the agent will ramp up from the start again
            line.busy_since = line.heard = None
            if line.timer is not None:
                line.timer.cancel()
                line.timer = None

    def _on_timer(self, line: _Line) -> None:
        line.timer = None
        self._next(line)

    def _run(self, line: _Line | None, row: dict[str, Any], future: asyncio.Future[T],
             run: Callable[[dict[str, Any]], Awaitable[T]]) -> None:
        task = asyncio.ensure_future(run(row))
        future.add_done_callback(lambda done: task.cancel() if done.cancelled() else None)
        task.add_done_callback(lambda ended: self._ended(line, future, ended))

    def _ended(self, line: _Line | None, future: asyncio.Future[T], ended: asyncio.Future[T]) -> None:
        """Pass a row's outcome to its future, and its place in the line to the next row."""
        if line is not None:
            line.running -= 1
            self._next(line)
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
