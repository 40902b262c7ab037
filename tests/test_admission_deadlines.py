"""Deadlines count work, not queues (`gymfleet.connections.off_the_clock`), against real servers: a request queued
behind a full connection pool, and a `/verify` queued behind a judge's concurrency cap, start their clocks when their
turn comes, not when they joined the queue. Found with 65,536 rollouts at once on 2 cores: `verify_timeout` rows in
batches of exactly 64 (math_with_judge's judge cap), verifies whose deadline ran out while they queued for a judge."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from gymfleet import http
from gymfleet.errors import TransportError
from gymfleet.serving.judged import JudgedServer
from gymfleet.serving.resources import VerifyRequest, VerifyResponse
from gymfleet.testing import serve
from gymfleet.testing.fleets import judge_fleet
from gymfleet.wire import make_response

JUDGE_S = 0.3
"""How long the judge takes to answer each call."""


def _judge_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/responses")
    async def responses():
        await asyncio.sleep(JUDGE_S)
        return make_response("Same number. [[A=B]]")

    @app.get("/slow")
    async def slow():
        await asyncio.sleep(5)
        return {}

    @app.get("/fast")
    async def fast():
        return {"fast": True}

    return app


@pytest.fixture(scope="module")
def judge_url():
    with serve(_judge_app()) as url:
        yield url


async def test_a_request_queued_behind_a_full_pool_starts_its_deadline_when_it_gets_a_connection(judge_url,
                                                                                                  monkeypatch):
    """The only connection is held for 1 s; the request queued behind it has a 0.5 s deadline and needs a moment:
    it waited twice its deadline, and still answers."""
    monkeypatch.setattr(http, "_limits", http.ClientLimits(limit=1, limit_per_host=1))
    holder = asyncio.ensure_future(http.request("GET", f"{judge_url}/slow", timeout_s=1.0, retry=http.NO_RETRY))
    await asyncio.sleep(0.05)  # the holder has the pool's one slot
    queued = await http.request("GET", f"{judge_url}/fast", timeout_s=0.5, retry=http.NO_RETRY)
    assert queued.json() == {"fast": True}
    with pytest.raises(TransportError, match="within 1s"):
        await holder
    await http.close()  # this test's one-connection pool goes with it


class _Judged(JudgedServer):
    """Asks the judge once per verify; 1.0 when it says equal."""

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        ruling = await self.gate.ask("Same answer?", labels=("[[A=B]]", "[[A!=B]]"))
        return VerifyResponse.echo(body, reward=1.0 if ruling.label == "[[A=B]]" else 0.0)


@pytest.fixture(scope="module")
def judged_url(judge_url):
    config = {"name": "judged", "domain": "other", "judge_model_server": "judge_model", "judge_max_concurrency": 1,
              "verify_timeout_s": 4 * JUDGE_S, "judge_timeout_s": 30}
    with serve(_Judged(config, judge_fleet(judge_url)).create_app()) as url:
        yield url


async def test_verifies_queued_for_a_judge_slot_do_not_time_out_while_they_wait(judged_url):
    """Eight verifies at once, one judge call at a time, each call `JUDGE_S`: the last waits seven calls in the
    queue, well past its `verify_timeout_s` (four calls' time), and none times out: the wait for the judge's slot
    and the judge's call (bounded by `judge_timeout_s`) are off the verify's clock."""
    row = {"responses_create_params": {"input": "q"}, "response": make_response("a")}
    async with httpx.AsyncClient(base_url=judged_url, timeout=60) as client:
        answers = await asyncio.gather(*(client.post("/verify", json=row) for _ in range(8)))
    rows = [answer.json() for answer in answers]
    assert [row.get("_ng_failure_class") for row in rows] == [None] * 8, [row.get("failure") for row in rows]
    assert [row["reward"] for row in rows] == [1.0] * 8


async def test_local_work_of_a_verify_stays_on_its_clock(judge_url):
    """Off the clock is only the judge's part: a verify whose own work outlasts `verify_timeout_s` still ends as a
    `verify_timeout` row (the judged server's verify sleeps past it here, then asks the judge)."""

    class _Slow(_Judged):
        async def verify(self, body: VerifyRequest) -> VerifyResponse:
            await asyncio.sleep(8 * JUDGE_S)
            return await super().verify(body)

    server = _Slow({"name": "slow", "domain": "other", "judge_model_server": "judge_model",
                    "verify_timeout_s": 4 * JUDGE_S}, judge_fleet(judge_url))
    row = {"responses_create_params": {"input": "q"}, "response": make_response("a")}
    with serve(server.create_app()) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            answer = (await client.post("/verify", json=row)).json()
    assert answer["_ng_failure_class"] == "verify_timeout"
