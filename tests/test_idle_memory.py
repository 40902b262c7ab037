"""Servers hand memory back to the OS once a burst of requests is over (`MetricsMiddleware`'s `on_idle`)."""

from __future__ import annotations

import asyncio
import time

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gymfleet.metrics import MetricsMiddleware, ServerMetrics
from gymfleet.testing import serve, wait_until


def app_with_hook(calls: list[float], burst: int, quiet_s: float, handled: list[float]) -> Starlette:
    """`calls`: when `on_idle` ran; `handled`: when each request was handled (the server's clock, which a client's
    clock, read after its loop closed, is not: on a loaded machine that may be past the server's quiet time)."""
    async def hello(request):
        await asyncio.sleep(0.001)
        handled.append(time.monotonic())
        return PlainTextResponse("hi")

    app = Starlette(routes=[Route("/", hello)])
    app.add_middleware(MetricsMiddleware, metrics=ServerMetrics(), on_idle=lambda: calls.append(time.monotonic()),
                       burst=burst, quiet_s=quiet_s)
    return app


async def _hit(url: str, count: int, concurrency: int) -> None:
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(limits=limits) as client:
        for start in range(0, count, concurrency):
            await asyncio.gather(*(client.get(url + "/") for _ in range(min(concurrency, count - start))))


def _unheard(calls: list[float], handled: list[float], quiet_s: float) -> bool:
    """Whether no request was handled in the `quiet_s` before each `on_idle` call (the server's clock throughout:
    a client stalled on a loaded machine may rightly let the server fall quiet mid-way, never make it run early)."""
    return not [(call, when) for call in calls for when in handled if call - quiet_s < when <= call]


def test_on_idle_runs_once_after_a_burst_of_sequential_requests():
    """A burst counts requests served, not the in-flight peak: 60 requests, never more than 3 at once, trigger it."""
    calls: list[float] = []
    handled: list[float] = []
    with serve(app_with_hook(calls, burst=50, quiet_s=0.2, handled=handled)) as url:
        asyncio.run(_hit(url, 60, concurrency=3))
        wait_until(lambda: len(calls) == 1, "on_idle ran after the burst of 60")
        assert len(handled) == 60 and _unheard(calls, handled, 0.2)  # only once the server fell quiet
        time.sleep(0.6)
        assert len(calls) == 1  # once per burst
        asyncio.run(_hit(url, 10, concurrency=3))  # a small trickle is not a burst
        time.sleep(0.6)
        assert len(calls) == 1
        asyncio.run(_hit(url, 50, concurrency=10))
        wait_until(lambda: len(calls) == 2, "on_idle ran after the second burst")
        assert _unheard(calls, handled, 0.2)


def test_on_idle_waits_while_requests_keep_coming():
    calls: list[float] = []
    handled: list[float] = []
    with serve(app_with_hook(calls, burst=20, quiet_s=1.0, handled=handled)) as url:
        async def steady():
            async with httpx.AsyncClient() as client:
                for _ in range(40):  # ~0.05 s apart: never quiet for 1 s
                    await client.get(url + "/")
                    await asyncio.sleep(0.05)

        asyncio.run(steady())
        wait_until(lambda: len(calls) == 1, "on_idle ran once the requests stopped")
        assert len(handled) == 40 and _unheard(calls, handled, 1.0)
