"""`gymfleet.rollouts.dispatch.SendWindow`: many requests in flight at once, sent in order, a window at a time.

A real server (uvicorn in a thread) holds every answer until all requests have arrived, so the window can only move
on the "headers sent" signal of `gymfleet.http` (were it freed only when answers come back, the test would hang and
time out); and it records the order requests arrive in, which must follow the order they were started in, within
the window.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gymfleet import http
from gymfleet.rollouts.dispatch import SendWindow
from gymfleet.testing import serve

COUNT, WINDOW = 96, 4


@pytest.fixture(scope="module")
def holding_server():
    arrived: list[int] = []
    lock = threading.Lock()
    everyone: dict[str, asyncio.Event] = {}

    async def run(request: Request) -> JSONResponse:
        row = (await request.json())["row"]
        event = everyone.setdefault("all", asyncio.Event())
        with lock:
            arrived.append(row)
            if len(arrived) == COUNT:
                event.set()
        await asyncio.wait_for(event.wait(), timeout=60)  # nobody is answered before everyone has arrived
        return JSONResponse({"row": row})

    app = Starlette(routes=[Route("/run", run, methods=["POST"])])
    with serve(app) as url:
        yield url, arrived


def test_requests_go_out_in_order_a_window_at_a_time(holding_server):
    url, arrived = holding_server

    async def main() -> list[int]:
        window = SendWindow(WINDOW)

        async def one(row: int) -> int:
            async with window.sending():
                response = await http.request("POST", url + "/run", json={"row": row}, timeout_s=60)
            return response.json()["row"]

        try:
            return await asyncio.gather(*(one(row) for row in range(COUNT)))
        finally:
            await http.close()

    assert asyncio.run(asyncio.wait_for(main(), timeout=120)) == list(range(COUNT))
    assert sorted(arrived) == list(range(COUNT))
    # Request i starts only once every request before i - WINDOW has its headers on the wire.
    assert all(abs(row - position) < 2 * WINDOW for position, row in enumerate(arrived)), arrived


def test_a_failed_call_frees_its_slot():
    async def main() -> None:
        window = SendWindow(1)
        for _ in range(3):  # with the slot kept by a call that never connected, the second one would wait forever
            with pytest.raises(Exception):  # noqa: B017, PT011 - any transport failure will do
                async with window.sending():
                    await http.request("POST", "http://127.0.0.1:9/run", json={}, timeout_s=5,
                                       retry=http.RetryPolicy(max_attempts=1))
        await http.close()

    asyncio.run(asyncio.wait_for(main(), timeout=60))
