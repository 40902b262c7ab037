"""How many connections a process's HTTP pool (`gymfleet.http`) holds, and how fast a burst opens them.

- Every request in flight holds a socket, so the pool is sized to the open-files limit: `budget()` lifts the soft
  `RLIMIT_NOFILE` as far as the hard one allows and keeps `OPEN_FILES_RESERVE` descriptors for everything else;
  `plan_in_flight` says once, when more requests are meant to be in flight than the pool holds, how many wait, why,
  and what to raise (`ulimit -Hn ...` or `global_aiohttp_connector_limit`). The rest wait, in order, for a slot.
- A burst is built and connected `CONNECTS_AT_ONCE` requests at a time (`first_turn`, `pool_slot`, `PacedConnector`):
  a request takes a connect turn before anything is built and gives it back once the connector has its connection.
- Deadlines count work, not queues (`off_the_clock`): a request's deadline starts once it holds a connection slot,
  and a task's enclosing deadlines (a resources server's `verify_timeout_s`, `gymfleet.serving.deadline`) stop while
  it waits for admission (a slot of a full pool, a judge's concurrency cap) or waits on a call bounded by a deadline
  of its own. Measured: 65,536 rollouts at once on 2 cores ended with 127 `verify_timeout` rows, in batches of
  exactly 64 (math_with_judge's judge cap): their verify deadline had run out while they queued for a judge slot.

Measured with `bench/rollouts_at_scale.py` (16,384 rollouts at once on a loaded 2-core machine): without turns every
request was built in one event-loop pass, which outlasted the 20 s connect deadline, and a quarter of the first
connects failed as `connection_error` although the kernel had accepted them (1,360 retried connects; 0 with turns).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import logging
import resource
import select
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

OPEN_FILES_TARGET = 1 << 20
"""How far `raise_open_files_limit` lifts the soft open-files limit (the kernel's default `nr_open`), hard limit
permitting."""
OPEN_FILES_RESERVE = 512
"""Descriptors a process keeps out of its connection pool: its listening socket, log files, pipes, its imports."""

CLIENT_KEEP_ALIVE_S = 4.0
"""How long `gymfleet.http`'s pool keeps an idle connection. Under uvicorn's default server keep-alive (5 s, what
vLLM's server and most Python servers run with): a server closes an idle connection on its own clock, and a client
that picks it from the pool at that moment has sent a request the server never read, which fails as a reset that a
POST cannot safely retry. aiohttp checks a pooled connection's idle time when it hands it out, and the client's idle
time starts after the server's (on reading the last response), so the client always drops it first."""


Pause = Callable[[], AbstractContextManager[None]]
_pause: contextvars.ContextVar[Pause | None] = contextvars.ContextVar("gymfleet_deadline_pause", default=None)
"""How to stop the current task's enclosing deadlines for a while (set by `gymfleet.serving.deadline`)."""


def pause_deadlines_with(pause: Pause) -> contextvars.Token:
    """Make `pause()` (a context manager that stops a deadline while it is entered) part of what `off_the_clock`
    enters in this context, besides the enclosing deadlines' own; returns the token to `resume_deadlines_with`."""
    outer = _pause.get()
    if outer is not None:
        inner = pause

        @contextlib.contextmanager
        def pause() -> Iterator[None]:
            with outer(), inner():
                yield

    return _pause.set(pause)


def resume_deadlines_with(token: contextvars.Token) -> None:
    """Undo `pause_deadlines_with`."""
    _pause.reset(token)


@contextlib.contextmanager
def off_the_clock() -> Iterator[None]:
    """Time spent in the block does not count against this task's enclosing deadlines (`gymfleet.serving.deadline`;
    nothing when there are none): wrap waits for admission (a free slot of a bounded queue, in arrival order) and
    calls bounded by a deadline of their own. A deadline counts from when its work is admitted, not from when it
    queued behind thousands of others, and no wait counts against two deadlines at once."""
    pause = _pause.get()
    if pause is None:
        yield
        return
    with pause():
        yield


def raise_open_files_limit() -> tuple[int, int]:
    """Lift this process's soft open-files limit (`RLIMIT_NOFILE`) as far as its hard limit allows (at most
    `OPEN_FILES_TARGET`): each request in flight holds a socket. Returns the (soft, hard) limits now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = OPEN_FILES_TARGET if hard == resource.RLIM_INFINITY else min(OPEN_FILES_TARGET, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, exc)
    return soft, hard


def budget() -> int:
    """Connections this process's pool may hold at once: its open-files limit (raised as far as allowed) less
    `OPEN_FILES_RESERVE`."""
    soft, _ = raise_open_files_limit()
    if soft == resource.RLIM_INFINITY:
        return OPEN_FILES_TARGET
    return max(16, soft - OPEN_FILES_RESERVE)


_warned_in_flight = 0


def plan_in_flight(count: int, what: str, pool_limit: int) -> int:
    """Get ready for `count` requests in flight at once from this process, each on its own connection: raise the
    open-files limit as far as allowed and, when they still do not fit (or the pool's own `pool_limit` is lower), say
    once what happens (the rest wait in the pool for a free connection: later, not failed) and what to change.
    Returns how many connections the pool holds at once."""
    global _warned_in_flight
    room = budget()
    pool = min(pool_limit or room, room)
    if count > pool and count > _warned_in_flight:
        _warned_in_flight = count
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if pool < (pool_limit or room):
            why = (f"this process may open {soft:,} files (RLIMIT_NOFILE soft {soft:,}, hard {hard:,}), so its pool "
                   f"holds at most {pool:,} connections. To send all {count:,} at once, raise the hard limit to at "
                   f"least {count + OPEN_FILES_RESERVE:,} (`ulimit -Hn {count + OPEN_FILES_RESERVE}` as root, "
                   f"systemd `LimitNOFILE=`, `docker run --ulimit nofile=...`, Slurm/K8s limits)")
        else:
            why = (f"the connection pool holds at most {pool:,} (`global_aiohttp_connector_limit`); raise it to send "
                   "them all at once")
        log.warning("%s %s in flight at once need %s sockets, but %s. The other %s wait in the pool for a free "
                    "connection (they start later; none fails for it).", f"{count:,}", what, f"{count:,}", why,
                    f"{count - pool:,}")
    return pool


CONNECTS_AT_ONCE = 256
"""Requests of one process (event loop) between being built and having their connection: the rest of a burst waits
its turn before anything is built or timed. Sending 16,384 rollouts at once used to build every request and start
every connect in one event-loop pass; on a loaded 2-core machine that pass outlasted `CONNECT_TIMEOUT_S`, so the
first connects' deadlines passed before the loop could see them done, and they failed as `connection_error` (the
kernel had accepted every one)."""

_turn: contextvars.ContextVar[list[asyncio.Semaphore] | None] = contextvars.ContextVar("gymfleet_http_turn",
                                                                                      default=None)
"""The connect turn the current request holds (a one-item list, emptied when it is given back)."""


def end_turn() -> None:
    """Give back the current request's connect turn, if it still holds one."""
    held = _turn.get()
    if held:
        held.pop().release()


_on_connected: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("gymfleet_on_connected",
                                                                                           default=None)


@contextlib.contextmanager
def on_connected(callback: Callable[[], None]) -> Iterator[None]:
    """Call `callback()` each time a request made inside the block (this task) has its connection, pooled or new, or
    has failed to get one: the request's headers go out next, with no wait in between (`gymfleet.rollouts.dispatch`
    paces new connections with it). The connector calls it (`PacedConnector.connect`), so requests pay nothing for
    it: aiohttp's request tracing, which could tell the same, costs every request of every process its signals."""
    token = _on_connected.set(callback)
    try:
        yield
    finally:
        _on_connected.reset(token)


def peer_spoke(transport: Any) -> bool:
    """Whether an idle connection's socket has something to read: its server's FIN or RST (it closed the connection;
    a loop that lags has not read it yet), or bytes no request asked for. Either way it must not carry a request."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


stale_dropped = 0
"""Pooled connections this process found closed by their server and dropped before use (benches print it)."""


class PacedConnector(aiohttp.TCPConnector):
    """A `TCPConnector` that gives back the request's connect turn (see `CONNECTS_AT_ONCE`) once it has its
    connection, pooled or new, or failed to get one, and that holds its pool to two rules at scale:

    - a pooled connection its server has closed is never handed out: aiohttp checks only that its transport is
      open, and a loop that lags (65,536 rollouts from one process lagged it tens of seconds) has not read the
      server's FIN yet, so the request went out on a dead connection and failed unread ("Server disconnected",
      "Can not write request body"), which a POST must not retry. The next idle connection's socket is polled
      first (`peer_spoke`, as urllib3 does), and one with anything to read is closed;
    - idle connections count against `limit` (aiohttp counts only those in use): before a new connection is made
      past it, the oldest idle ones, to any host, are closed. Otherwise a pool at its limit of requests in flight
      kept idle sockets to other hosts on top, past the open-files budget (`budget`): EMFILE on connect.
    """

    async def connect(self, req: Any, traces: Any, timeout: aiohttp.ClientTimeout) -> Any:
        try:
            return await super().connect(req, traces, timeout)
        finally:
            end_turn()
            callback = _on_connected.get()
            if callback is not None:
                callback()

    async def _get(self, key: Any, traces: Any) -> Any:
        self._drop_dead(key)
        return await super()._get(key, traces)

    async def _create_connection(self, req: Any, traces: Any, timeout: aiohttp.ClientTimeout) -> Any:
        self._make_room()
        return await super()._create_connection(req, traces, timeout)

    def _drop_dead(self, key: Any) -> None:
        """Close the idle connections to `key` the pool would hand out next while they are unusable: closed,
        idle past the keep-alive, or spoken to by their server."""
        global stale_dropped
        idle = self._conns.get(key)
        now = time.monotonic()
        while idle:
            proto, since = idle[0]
            if not proto.is_connected() or (self._keepalive_timeout is not None
                                            and now - since > self._keepalive_timeout):
                pass
            elif peer_spoke(proto.transport):
                stale_dropped += 1
                log.debug("dropped a pooled connection to %s:%s its server had closed", key.host, key.port)
            else:
                return
            idle.popleft()
            proto.close()

    def _make_room(self) -> None:
        """Close the oldest idle connections while those in use (this new one included) and idle exceed `limit`."""
        if not self._limit:
            return
        excess = len(self._acquired) + sum(map(len, self._conns.values())) - self._limit
        while excess > 0:
            pools = [idle for idle in self._conns.values() if idle]
            if not pools:
                return
            oldest = min(pools, key=lambda idle: idle[0][1])
            proto, _ = oldest.popleft()
            proto.close()
            excess -= 1


_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()
"""Per event loop: one slot per connection its pool may hold. A request takes one before aiohttp builds it, so a
burst bigger than the pool waits here, at no cost, rather than as built requests queued in the pool: sending 65,536
rollouts at once built them all in one event-loop pass (tens of seconds on a loaded machine), long enough for the
first connects' deadlines to pass before the loop could see them done."""


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()
"""Per event loop: `CONNECTS_AT_ONCE` connect turns."""


def make_room(loop: asyncio.AbstractEventLoop, limit: int) -> None:
    """`loop`'s connection slots (`limit`) and connect turns, for a new session of its pool."""
    _slots[loop] = asyncio.Semaphore(limit)
    _turns[loop] = asyncio.Semaphore(CONNECTS_AT_ONCE)


class NoTurn(Exception):
    """No connect turn came free within the request's deadline."""


@contextlib.asynccontextmanager
async def first_turn(timeout_s: float) -> AsyncIterator[None]:
    """Hold a connect turn of this loop until the connector has the request's connection (or the block ends); waits
    at most `timeout_s` (`NoTurn` then). Taken before the request is built: a burst builds `CONNECTS_AT_ONCE` at a
    time."""
    turns = _turns[asyncio.get_running_loop()]
    try:
        if turns.locked():
            async with asyncio.timeout(timeout_s):
                await turns.acquire()
        else:
            await turns.acquire()  # free: no wait, no timer
    except TimeoutError:
        raise NoTurn from None
    held = _turn.set([turns])
    try:
        yield
    finally:
        end_turn()
        _turn.reset(held)


@contextlib.asynccontextmanager
async def pool_slot() -> AsyncIterator[None]:
    """Hold one of this loop's connection slots for a request, all its attempts included. A request finding the pool
    full waits here, in arrival order and with no deadline: it has not started (nothing is built or sent), and each
    slot is held by a request with a deadline of its own, so one frees. Its deadline starts once it holds one, and
    the task's enclosing deadlines stop meanwhile (`off_the_clock`)."""
    slots = _slots[asyncio.get_running_loop()]
    if slots.locked():
        with off_the_clock():
            await slots.acquire()
    else:
        await slots.acquire()  # free: no wait
    try:
        yield
    finally:
        slots.release()


@contextlib.asynccontextmanager
async def attempt_turn(timeout_s: float, began: float) -> AsyncIterator[float]:
    """Hold a connect turn until the connector has this attempt's connection (`first_turn` took the first attempt's;
    a later attempt takes another). Waiting counts against `timeout_s` from `began` (a `TimeoutError` past it);
    yields the seconds left."""
    held = _turn.get()
    if not held:
        turns = _turns[asyncio.get_running_loop()]
        if turns.locked():
            async with asyncio.timeout(max(0.0, timeout_s - (time.monotonic() - began))):
                await turns.acquire()
        else:
            await turns.acquire()  # free: no wait, no timer
        held.append(turns)
    try:
        yield max(0.001, timeout_s - (time.monotonic() - began))
    finally:
        end_turn()  # an attempt that failed before its connector was asked


def out_of_files_hint(exc: BaseException) -> str:
    """A sentence for a connect that failed with EMFILE (this process ran out of file descriptors), else nothing."""
    if errno.EMFILE not in (getattr(exc, "errno", None), getattr(getattr(exc, "os_error", None), "errno", None)):
        return ""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (f" (this process has run out of file descriptors: RLIMIT_NOFILE soft {soft:,}, hard {hard:,}; raise the "
            "hard limit, e.g. `ulimit -Hn`, or send fewer requests at once)")
