"""A server's warm-up (`Server.warm_up`): what requests need but serving need not wait for, loaded once it is up.

`WarmUp` is the part of `gymfleet.serving.server.Server` that runs it: in a niced thread of its own for a plain
`warm_up` (tokenizer models, a large scoring library), or as a task on the server's loop for an `async` one (child
processes started and checked: the sandbox service). Routes that need it await `warmed()`, which raises the
warm-up's error on every call once it failed.

What the fleet's readiness probe is told (`readiness()`, in the `X-Gymfleet-Ready` header of `GET /` to a request
carrying the fleet's token): `ok`, unless the server's class sets `ready_after_warm_up` (its warm-up is a start-up
check the fleet must not start without: the sandbox's isolation self-test); then `warming` while it runs and
`failed` when it failed, with its error in the body's `detail`, so `ng_run` stops with that error as it would for
a server that could not start at all (`gymfleet.fleet.readiness`), while the other servers start beside it. The
probe may ask `GET /` to wait for the verdict a moment (`X-Gymfleet-Ready-Wait`), so it learns it without polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import threading
import time
from typing import Any, ClassVar

log = logging.getLogger(__name__)

WARM_UP_NICE = 10
"""Niceness of the thread that runs `Server.warm_up` (about a tenth of a core's share against busy processes)."""
READY_HEADER = "X-Gymfleet-Ready"
"""`GET /`'s header, to a request carrying the fleet's token: `ok`, `warming` or `failed` (`WarmUp.readiness`)."""
READY, WARMING, FAILED = "ok", "warming", "failed"
READY_WAIT_HEADER = "X-Gymfleet-Ready-Wait"
"""Seconds (at most `MAX_READY_WAIT_S`) that the fleet's probe lets `GET /` wait for a warm-up it waits for: the
answer comes the moment the verdict does, rather than at the probe's next round."""
MAX_READY_WAIT_S = 5.0


class WarmUp:
    """`Server.warm_up` and the state of its run (a mixin of `Server`)."""

    config: Any  # the server's `ServerConfig` (`Server` says which class: `typing.get_type_hints` reads this too)
    ready_after_warm_up: ClassVar[bool] = False
    """The fleet counts the server as started only once its warm-up has succeeded (`readiness`): for a warm-up that
    checks the server can serve at all, so a failed check stops `ng_run` instead of a fleet whose server refuses
    every request. Default: ready while it warms up."""
    _warming: asyncio.Future[None] | None = None
    """`warm_up` running in its thread or task (from start-up on; None when the server has none)."""
    _warm_up_task: asyncio.Task[None] | None = None
    """An `async` `warm_up`'s task while it runs (cancelled when the server stops first)."""

    def warm_up(self) -> None:
        """Load what requests need but serving need not wait for (tokenizer models, a large scoring library): run in a
        thread once the app has started, so the fleet is ready without it. Every route that needs it awaits
        `warmed()` first (`ResourcesServer` does before `/verify` and each tool), so no request is ever answered
        with it half loaded. What every process of the server shares read-only belongs in `preload` instead.
        A subclass whose warm-up is mostly waiting on its own event loop (starting and checking child processes: the
        sandbox service) defines it `async def`: it then runs as a task on the server's loop, not in a thread, and
        is cancelled if the server stops first. Default: nothing (no thread).
        """

    def readiness(self) -> tuple[str, str | None]:
        """`(READY, None)`, or with `ready_after_warm_up`, `(WARMING, None)` while the warm-up runs and `(FAILED,
        its error)` once it failed: what `GET /` tells the fleet's readiness probe."""
        warming = self._warming
        if not self.ready_after_warm_up or warming is None:
            return READY, None
        if not warming.done():
            return WARMING, None
        if warming.cancelled():
            return FAILED, f"{self.config.name} stopped while warming up"
        error = warming.exception()
        return (FAILED, str(error) or type(error).__name__) if error is not None else (READY, None)

    async def readiness_within(self, wait: str | None) -> tuple[str, str | None]:
        """`readiness()`, once a warm-up the fleet waits for is done, or after `wait` seconds (`READY_WAIT_HEADER`'s
        value: a number; anything else waits not at all)."""
        warming = self._warming
        try:
            wait_s = min(float(wait or 0), MAX_READY_WAIT_S)
        except ValueError:
            wait_s = 0.0
        if self.ready_after_warm_up and warming is not None and not warming.done() and wait_s > 0:
            with contextlib.suppress(Exception):  # a timeout, or the warm-up's error: `readiness` tells either
                await asyncio.wait_for(asyncio.shield(warming), wait_s)
        return self.readiness()

    async def warmed(self) -> None:
        """Return once `warm_up` has finished (at once after that, or when there is none).

        Raises:
            Exception: what `warm_up` raised (on every call: the server cannot serve those requests).
        """
        warming = self._warming
        if warming is None:
            return
        if warming.done():  # every request after the warm-up: no shield future per request
            warming.result()  # a failed warm-up raises here, on every call
            return
        await asyncio.shield(warming)  # a waiting request that is cancelled must not cancel the warm-up

    def _start_warm_up(self) -> None:
        loop = asyncio.get_running_loop()
        self._warming = future = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if not future.done():
                future.set_exception(error) if error else future.set_result(None)

        def outcome(started: float, error: Exception | None) -> Exception | None:
            if error is not None:
                log.error("%s: warming up failed; requests that need it fail", self.config.name, exc_info=error)
            else:
                log.info("%s: warmed up in %.2fs", self.config.name, time.monotonic() - started)
            return error

        if inspect.iscoroutinefunction(self.warm_up):
            async def run_on_loop() -> None:
                started, error = time.monotonic(), None
                try:
                    await self.warm_up()
                except asyncio.CancelledError:  # the server stops: nothing waiting for it may hang
                    settle(RuntimeError(f"{self.config.name} stopped while warming up"))
                    raise
                except Exception as exc:  # noqa: BLE001 - handed to every request that awaits `warmed()`
                    error = exc
                settle(outcome(started, error))

            self._warm_up_task = loop.create_task(run_on_loop(), name=f"warm-up-{self.config.name}")
            return

        def run() -> None:
            # Its own thread, niced (Linux: this thread only), so that while a fleet starts the servers still
            # starting get the CPU first; a daemon, so a server stopped while warming exits at once.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WARM_UP_NICE)
            started, error = time.monotonic(), None
            try:
                self.warm_up()
            except Exception as exc:  # noqa: BLE001 - handed to every request that awaits `warmed()`
                error = exc
            error = outcome(started, error)
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped meanwhile
                loop.call_soon_threadsafe(settle, error)

        threading.Thread(target=run, name=f"warm-up-{self.config.name}", daemon=True).start()

    async def _stop_warm_up(self) -> None:
        """Cancel an `async` warm-up still running (the server stops): what it started is its own to clean up."""
        task, self._warm_up_task = self._warm_up_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
