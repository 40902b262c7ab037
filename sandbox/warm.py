"""Warm sandboxes: one-shot Python runs take a sandbox that was started before they came.

Starting a sandbox is mostly waiting: bubblewrap makes its namespaces (a network namespace alone is milliseconds of
kernel latency) and the interpreter starts. A run that starts its sandbox when it arrives pays all of that on its
own clock. The pool keeps
`warm_sandboxes` of them started ahead, each exactly what a cold start makes (`SandboxProcess.spawn`: its own
bubblewrap namespaces, its own tmpfs workspace, the launcher up and waiting on stdin for its request), and hands
each to one run only; the run moves it into a memory cgroup of its own, limited to its `memory_mb`, before it sends
its request (`Runner.take_warm`; what the idle launcher had charged before the move stays with the service's
cgroup: on v1 charges do not move). Nothing is shared between runs and nothing is reused: a warm sandbox
has run no code but the launcher before its run, and is torn down after it like any other. Each `take` starts one
replacement, so the pool's size is constant; a run that finds it empty waits for the replacement started first.

The idle sandboxes hold no request, no slot and no memory of the admission budget (an idle launcher holds a few
MiB); their outer processes' pids are `idle_pids()` (the tests' leftover check tells them from a run's leftovers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from sandbox.process import SandboxProcess, SandboxStartError

log = logging.getLogger(__name__)

_IDLE: set[int] = set()


def idle_pids() -> set[int]:
    """The outer (bwrap) pids of every warm sandbox in this process that waits for a run now."""
    return set(_IDLE)


class WarmPool:
    """`size` sandboxes started ahead by `spawn`, each taken by one run."""

    def __init__(self, size: int, spawn: Callable[[], Awaitable[SandboxProcess]]):
        self.size = size
        self._spawn = spawn
        self._ready: asyncio.Queue[SandboxProcess | BaseException] = asyncio.Queue()
        self._starting: set[asyncio.Task] = set()
        self._closed = False

    def fill(self) -> None:
        """Start the pool's sandboxes (at server start)."""
        for _ in range(self.size):
            self._start_one()

    async def take(self) -> SandboxProcess:
        """A started sandbox for one run, and a replacement started.

        Raises:
            SandboxStartError: the sandbox started for this run could not be started.
        """
        while True:
            item = await self._ready.get()
            self._start_one()
            if isinstance(item, BaseException):
                raise SandboxStartError(f"{item}") from item
            _IDLE.discard(item.popen.pid)
            if item.alive():
                return item
            log.warning("warm sandbox %d died while idle (%s): starting the run in the next one", item.popen.pid,
                        item.popen.returncode)
            await item.close()

    def _start_one(self) -> None:
        if self._closed:
            return
        task = asyncio.create_task(self._start())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def _start(self) -> None:
        try:
            process = await self._spawn()
        except Exception as exc:  # handed to the run that takes it: every take must get a sandbox or an error
            log.error("a warm sandbox could not be started: %s", exc)
            self._ready.put_nowait(exc)
            return
        if self._closed:
            await process.close()
            return
        _IDLE.add(process.popen.pid)
        self._ready.put_nowait(process)

    async def close(self) -> None:
        """Stop every idle sandbox and those still starting (at server shutdown)."""
        self._closed = True
        for task in list(self._starting):
            task.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        while not self._ready.empty():
            item = self._ready.get_nowait()
            if isinstance(item, SandboxProcess):
                _IDLE.discard(item.popen.pid)
                with contextlib.suppress(Exception):
                    await item.close()
