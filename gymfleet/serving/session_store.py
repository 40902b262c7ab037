"""`SessionStore`: an environment's per-rollout state, keyed by session id, with idle expiry, a cap and eviction.

An environment that keeps each rollout's state in its memory (a sandbox session, a copy of tables) holds it here:
`put` at `/seed_session`, `get` (or `peek` + `touch`) in its tools, `pop` at `/verify`. Entries untouched for
`idle_s`, and past `limit` the least recently used, are evicted by `expire()` (each call that adds or touches runs
it; `start_sweeping` runs it in the background too); an entry `busy(value)` says is in use is never evicted.
`close(value)`, if given, releases what an evicted, replaced or remaining entry holds, in the background;
`close_all()` at shutdown waits for every close.

An evicted session is remembered (its key, up to `MAX_LOST` of them) until it is seeded again or popped: the rollout's
next call is its `session_lost`, the typed failure of a session that a restarted server lost
(`gymfleet.serving.sessions`), never a tool call on an empty session nor a reward scored on one. `lost_answer()` is
the HTTP 410 for a tool route, `lost_fields()` the failure fields of a `/verify` answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

from gymfleet.serving.server import JSONResponse
from gymfleet.serving.sessions import SESSION_LOST, SESSION_LOST_STATUS

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_LOST = 65_536
"""Evicted session ids remembered at once (the oldest are forgotten first; a forgotten one reads as never seeded)."""


class SessionStore(Generic[T]):
    """Session id -> one rollout's state, least recently used first."""

    def __init__(self, idle_s: float, limit: int | None = None, *, name: str = "environment",
                 clock: Callable[[], float] = time.monotonic, close: Callable[[T], Awaitable[None]] | None = None,
                 busy: Callable[[T], bool] | None = None):
        """`name` is the environment's, for messages; `clock` the time source (tests pass a fake one)."""
        self.idle_s = idle_s
        self.limit = limit
        self.name = name
        self.clock = clock
        self._close = close
        self._busy = busy
        self._items: OrderedDict[str, tuple[T, float]] = OrderedDict()
        self._lost: OrderedDict[str, None] = OrderedDict()
        self._closing: set[asyncio.Task] = set()
        self._sweeper: asyncio.Task | None = None

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def values(self) -> Iterator[T]:
        return (value for value, _ in self._items.values())

    def put(self, key: str, value: T) -> T | None:
        """Store `value` as `key`'s state, freshly used; returns the state it replaces (the caller closes it)."""
        old = self._items.pop(key, None)
        self._lost.pop(key, None)
        self._items[key] = (value, self.clock())
        self.expire()
        return None if old is None else old[0]

    def get(self, key: str) -> T | None:
        """`key`'s state, touched, after evicting what has expired (itself included); None if there is none."""
        self.expire()
        if key not in self._items:
            return None
        self.touch(key)
        return self._items[key][0]

    def peek(self, key: str) -> T | None:
        """`key`'s state as it is: neither touched nor expired."""
        entry = self._items.get(key)
        return None if entry is None else entry[0]

    def touch(self, key: str) -> None:
        """Mark `key` used now (the most recently used), if it is held."""
        entry = self._items.get(key)
        if entry is not None:
            self._items[key] = (entry[0], self.clock())
            self._items.move_to_end(key)

    def pop(self, key: str) -> T | None:
        """Remove `key`'s state and return it (the caller closes it); forgets that it was evicted, if it was."""
        self._lost.pop(key, None)
        entry = self._items.pop(key, None)
        return None if entry is None else entry[0]

    def lost(self, key: str) -> bool:
        """Whether `key`'s session was evicted (and not seeded again or popped since)."""
        return key in self._lost

    def expire(self) -> None:
        """Evict the entries idle longer than `idle_s`, and the least recently used past `limit` (not busy ones)."""
        cutoff = self.clock() - self.idle_s
        for key, (value, used) in list(self._items.items()):
            over = self.limit is not None and len(self._items) > self.limit
            if used >= cutoff and not over:
                break  # the rest were used later
            if self._busy is not None and self._busy(value):
                continue
            del self._items[key]
            self._lost[key] = None
            while len(self._lost) > MAX_LOST:
                self._lost.popitem(last=False)
            log.info("%s: closing the %s session %s", self.name, "idle" if used < cutoff else "least recently used",
                     key)
            self.close_later(value)

    def close_later(self, value: T) -> None:
        """Release `value` in the background (`close_all` waits for it)."""
        if self._close is None:
            return
        task = asyncio.ensure_future(self._close(value))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def start_sweeping(self) -> None:
        """Run `expire()` in the background every quarter of `idle_s` (at most 30 s apart), until `close_all`."""
        self._sweeper = asyncio.create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        period = min(max(self.idle_s / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(period)
            self.expire()

    async def close_all(self) -> None:
        """Stop sweeping, drop every entry, and wait until every close (these and earlier ones) is done."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        values = list(self.values())
        self._items.clear()
        for value in values:
            self.close_later(value)
        await asyncio.gather(*self._closing)

    def lost_message(self, what: str) -> str:
        return (f"{self.name}: {what}: this rollout's session was closed by this server (idle longer than "
                f"{self.idle_s:g}s, or past {self.limit} sessions open at once) and its state went with it; the "
                "rollout cannot go on. Run it again from /seed_session.")

    def lost_answer(self, what: str) -> JSONResponse:
        """The HTTP 410 `session_lost` answer (the shape `gymfleet.serving.sessions` gives) for a call on an evicted
        session; agents end the rollout with that typed failure."""
        return JSONResponse({"detail": self.lost_message(what), "error_type": SESSION_LOST},
                            status_code=SESSION_LOST_STATUS)

    def lost_fields(self) -> dict[str, Any]:
        """The failure fields of a `/verify` answer for an evicted session (with `reward` 0.0 only for the schema)."""
        return {"_ng_failure_class": SESSION_LOST, "failure": self.lost_message("POST /verify")}
