"""Waiting in tests for the state a test asserts on, never for a fixed time.

A test that sleeps, or waits on one signal and then reads another state that a server, thread, process or task
fills a moment later, passes on a quiet machine and fails by chance on CI (four xdist workers on two cores: each
step 3-5x slower). `wait_until` polls the very state the test goes on to assert, with a deadline that only bounds
a test that would otherwise hang, and fails naming what never happened.

    wait_until(lambda: len(env.started) == 4, "the four admitted rollouts reached the environment")
    row = wait_until(lambda: find_row(head), "the head lists the server", ignore=(httpx.HTTPError,))
    await wait_until_async(lambda: pool.stats["demoted"], "the slow item was demoted")
    wait_until(lambda: processes_gone(servers), "the fleet's processes exited")
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import psutil

WAIT_S = 120.0
"""How long a wait may last before the test fails: a bound against a hang, far above what a loaded CI machine takes
(a wait ends the moment its state is there, so a generous bound costs a passing test nothing)."""

T = TypeVar("T")


def _give_up(what: str, timeout_s: float, last: Any, error: BaseException | None,
             explain: Callable[[], str] | None) -> AssertionError:
    seen = f"; the last error: {error!r}" if error is not None else f"; the last value: {last!r}"
    more = f"\n{explain()}" if explain is not None else ""
    return AssertionError(f"gave up after {timeout_s:g}s waiting until {what}{seen}{more}")


def wait_until(predicate: Callable[[], T], what: str, *, timeout_s: float = WAIT_S, interval_s: float = 0.01,
               ignore: tuple[type[BaseException], ...] = (), explain: Callable[[], str] | None = None) -> T:
    """Call `predicate` every `interval_s` until it returns a true value, and return that value.

    `ignore`: exceptions that mean "not yet" (a server not listening yet: `httpx.HTTPError`). `explain`: what to add
    to the failure's message (a log's tail, the last command's output).

    Raises:
        AssertionError: `timeout_s` passed first; the message names `what` and the predicate's last value or error.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        error = None
        try:
            if value := predicate():
                return value
        except ignore as exc:
            value, error = None, exc
        if time.monotonic() > deadline:
            raise _give_up(what, timeout_s, value, error, explain)
        time.sleep(interval_s)


async def wait_until_async(predicate: Callable[[], T | Awaitable[T]], what: str, *, timeout_s: float = WAIT_S,
                           interval_s: float = 0.01, ignore: tuple[type[BaseException], ...] = (),
                           explain: Callable[[], str] | None = None) -> T:
    """`wait_until` for a test on an event loop: the loop runs between polls. `predicate` may be a coroutine
    function (its result is awaited)."""
    deadline = time.monotonic() + timeout_s
    while True:
        error = None
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
        except ignore as exc:
            value, error = None, exc
        if time.monotonic() > deadline:
            raise _give_up(what, timeout_s, value, error, explain)
        await asyncio.sleep(interval_s)


def processes_gone(processes: Iterable[int | psutil.Process]) -> bool:
    """Whether every process (a pid or a `psutil.Process`) has exited (a zombie counts as exited). Pass the
    `psutil.Process` taken while it ran: a bare pid may be handed to a new process once the old one is reaped."""
    return not live_processes(processes)


def live_processes(processes: Iterable[int | psutil.Process]) -> list[psutil.Process]:
    """The processes (pids or `psutil.Process`es) still running; a zombie (exited, not yet reaped) is not."""
    live = []
    for process in processes:
        try:
            process = process if isinstance(process, psutil.Process) else psutil.Process(process)
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                live.append(process)
        except psutil.NoSuchProcess:
            continue
    return live
