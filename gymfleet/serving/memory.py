"""Handing a server's freed memory back to the OS: after a huge invalid body, and when it falls idle after a burst.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the OS, after pydantic freed the errors of a huge invalid body, and when
    a server falls idle after a burst of concurrent requests (`MetricsMiddleware`'s `on_idle`).

    Validating 250,000 wrong-typed items builds ~170 MB of errors (1M items: ~700 MB); glibc keeps the freed pages
    mapped, so without this the server's RSS would stay that much higher. Costs ~50 ms after such a body, ~0.2 ms
    when there is nothing to give back; a no-op where the C library has no `malloc_trim`.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


IDLE_TRIM_DELAYS_S = (0.0, 31.0)
"""When a server falls idle after a burst: trim at once (request memory), and again once the burst's idle
keep-alive connections have closed (their clients close them: gymfleet's pool after 4 s idle, aiohttp's default
after 15 s; `gymfleet.http_types.SERVER_KEEP_ALIVE_S`), which frees their buffers."""


def release_memory_when_idle() -> None:
    """Collect cyclic garbage and `release_freed_memory`, now and after each of `IDLE_TRIM_DELAYS_S` (called by
    `MetricsMiddleware`). The collection matters: a burst's requests leave reference cycles (frames of finished
    tasks, exceptions) that only the cyclic collector frees, and until then their pages cannot be handed back.
    A full collection costs tens of milliseconds, once per burst."""
    loop = asyncio.get_running_loop()
    for delay_s in IDLE_TRIM_DELAYS_S:
        if delay_s:
            loop.call_later(delay_s, _collect_and_trim)
        else:
            _collect_and_trim()


def _collect_and_trim() -> None:
    gc.collect()
    release_freed_memory()
