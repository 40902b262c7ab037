"""The supervision loop both fleets share (`gymfleet.fleet.supervisor.Fleet`, `gymfleet.fleet.ray_fleet.RayFleet`).

A fleet runs one round of supervision (`_supervise()`: notice crashes, restart, mark restarted servers that answer)
in a watcher thread every interval until it is told to stop, whether anyone polls or not; `run_forever()` blocks the
caller, polling (`poll()` raises when a server cannot be brought back).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

log = logging.getLogger(__name__)


class Watched:
    """The watcher thread's loop and `run_forever`, for a fleet with `poll()`, `_supervise()` and `_stopping`."""

    _stopping: bool
    _started: bool
    _watcher: threading.Thread | None

    def poll(self) -> None:
        raise NotImplementedError

    def _supervise(self) -> None:
        raise NotImplementedError

    def _watch(self) -> None:
        raise NotImplementedError

    def _begin_watching(self, name: str) -> None:
        """The fleet is up: mark it started and run `_watch` in a daemon thread called `name`."""
        self._started = True
        self._watcher = threading.Thread(target=self._watch, name=name, daemon=True)
        self._watcher.start()

    def run_forever(self, interval_s: float = 1.0) -> None:
        """Block, polling, until a server cannot be brought back (raises) or the process is told to stop."""
        while not self._stopping:
            self.poll()
            time.sleep(interval_s)

    @staticmethod
    def _to_check(members: Iterable[Any], now: float, restart: Callable[[Any, float], None]) -> Iterator[Any]:
        """The servers (children, replicas) a round checks: neither failed nor waiting out a restart backoff. One
        whose backoff is over is restarted (`restart(member, now)`) instead, and checked in a later round."""
        for member in members:
            if member.state == "failed":
                continue
            if member.restart_at is not None:
                if now >= member.restart_at:
                    restart(member, now)
                continue
            yield member

    def _watch_rounds(self, wake: threading.Event, lock: Any, interval_s: float, what: str) -> None:
        """Supervise under `lock` every `interval_s` until `wake` is set or the fleet stops; `what` names the fleet
        in the log line of a round that raised (a bug there must not end supervision silently, and `poll()` would
        raise a server's failure again)."""
        while not wake.wait(interval_s):
            with lock:
                if self._stopping:
                    return
                try:
                    self._supervise()
                except Exception:
                    log.exception("%s watcher: supervising the servers failed", what)
