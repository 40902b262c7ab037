"""An agent reads a burst of rollout requests as its admission line has room for them (`gymfleet.serving.read_pacer`).

A real agent (served as a fleet serves it, `GatedServer`), a scripted model and an environment whose `/verify` answers
only once the test releases it; a plain aiohttp client posts every row at once, each on a connection of its own, as
NeMo-Gym's client or a hand-written one does."""

from __future__ import annotations

import asyncio
import itertools

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.simple_agent.app import SimpleAgent
from gymfleet.serving.admission import MIN_WAITING
from gymfleet.serving.read_pacer import PER_TURN, IntakePacer
from gymfleet.testing import wait_until_async
from gymfleet.testing.fleets import ReleasedVerifies, agent_fleet
from responses_api_models.scripted_model.app import ScriptedModel

BOUND = 2
ROWS = BOUND + MIN_WAITING + 3 * PER_TURN + 40
"""More than the agent reads before its line is full: its bound, the line's margin, and the requests read in the
turns before the first of them reach the line."""


@pytest.mark.parametrize(("first_bytes", "paced"), [
    (b"POST /run HTTP/1.1\r\nHost: a\r\n", True),
    (b"POST /run?x=1 HTTP/1.1\r\n", True),
    (b"POST /v1/responses HTTP/1.1\r\n", True),
    (b"POST /runs HTTP/1.1\r\n", False),  # another route that starts alike
    (b"POST /run/x HTTP/1.1\r\n", False),
    (b"POST /v1/responsesx HTTP/1.1\r\n", False),
    (b"GET /run HTTP/1.1\r\n", False),  # the routes are POST only: anything else is answered at once
    (b"GET /metrics HTTP/1.1\r\n", False),
    (b"POST /aggregate_metrics HTTP/1.1\r\n", False),
    (b"POST /run", False),  # the request line is cut short: read at once rather than guess
    (b"PO", False),
    (b"", False),
])
def test_only_a_new_connections_request_for_an_admitted_route_is_paced(first_bytes, paced):
    assert IntakePacer(("/run", "/v1/responses"), lambda: True).paced(first_bytes) is paced


@pytest.mark.parametrize("path", ["/metrics", "/health", "/aggregate_metrics", "/seed_session", "/verify", "/"])
def test_no_other_route_or_method_spelling_is_paced(path):
    pacer = IntakePacer(("/run", "/v1/responses"), lambda: True)
    for method, tail in itertools.product(["GET", "POST", "PUT", "post", "HEAD"], [" HTTP/1.1", "?a=b HTTP/1.1"]):
        assert not pacer.paced(f"{method} {path}{tail}\r\n".encode())
    for method in ["GET", "PUT", "post", "Post", "HEAD", "DELETE"]:
        assert not pacer.paced(f"{method} /run HTTP/1.1\r\n".encode())


class _Transport:
    def __init__(self, closing: bool = False):
        self.closing = closing

    def is_closing(self) -> bool:
        return self.closing


class _Flow:
    def __init__(self):
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


async def test_waiting_connections_are_read_in_arrival_order_a_turn_at_a_time_and_closed_ones_are_dropped():
    room = {"left": 0}
    pacer = IntakePacer(("/run",), lambda: room["left"] > 0, per_turn=3)
    read: list[int] = []
    flows = []

    def take(index: int):
        def taken(data: bytes) -> None:
            read.append(index)
            room["left"] -= 1
        return taken

    for index in range(10):
        flows.append(_Flow())
        pacer.first_data(_Transport(closing=index == 4), flows[-1], take(index), b"POST /run HTTP/1.1\r\n")
    pacer.first_data(_Transport(), _Flow(), take(99), b"GET /metrics HTTP/1.1\r\n")
    assert read == [99], "the line is full: only the request for another route is read"
    assert all(flow.paused for flow in flows)
    room["left"] = 100
    pacer.wake()
    await asyncio.sleep(0)
    assert read == [99, 0, 1, 2], "a turn reads per_turn of them, oldest first"
    for _ in range(5):
        await asyncio.sleep(0)
    assert read == [99, 0, 1, 2, 3, 5, 6, 7, 8, 9], "the connection that closed while it waited is dropped"
    assert not any(flow.paused for index, flow in enumerate(flows) if index != 4)


def _metrics(text: str) -> dict[str, float]:
    return {sample.name: sample.value for family in text_string_to_metric_families(text) for sample in family.samples}


async def test_an_agent_reads_a_burst_as_its_line_has_room_and_answers_every_request_once():
    env = ReleasedVerifies({"name": "gated", "domain": "other"})
    model = ScriptedModel({"name": "llm", "default": {"text": "an answer"}})
    with agent_fleet(SimpleAgent, env, model, env_name="gated", max_concurrent_rollouts=BOUND,
                     admission_ramp_s=0) as agent_url:
        # One connection per request, as a client that posts a whole step at once opens them.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                         timeout=aiohttp.ClientTimeout(total=120)) as session:
            async def run(idx: int) -> dict:
                row = {"responses_create_params": {"input": [{"role": "user", "content": "hi"}]}, "idx": idx}
                async with session.post(f"{agent_url}/run", json=row) as answer:
                    assert answer.status == 200, await answer.text()
                    return await answer.json()

            async def metrics() -> dict[str, float]:  # a new connection each time: never held behind the burst
                async with session.get(f"{agent_url}/metrics") as answer:
                    return _metrics(await answer.text())

            runs = [asyncio.ensure_future(run(idx)) for idx in range(ROWS)]
            seen: dict[str, float] = {}

            async def settled() -> bool:
                seen.update(await metrics())
                return (seen["gymfleet_rollouts_in_progress"] + seen["gymfleet_rollouts_waiting"]
                        + seen["gymfleet_rollouts_unread"]) == ROWS and seen["gymfleet_rollouts_in_progress"] == BOUND
            await wait_until_async(settled, "every request is in progress, waiting in line or waiting unread")
            await asyncio.sleep(0.3)  # nothing more is read while the line stays full
            seen.update(await metrics())
            assert MIN_WAITING <= seen["gymfleet_rollouts_waiting"] <= MIN_WAITING + 3 * PER_TURN, seen
            assert seen["gymfleet_rollouts_unread"] >= ROWS - BOUND - MIN_WAITING - 3 * PER_TURN, seen
            assert len(env.started) == BOUND
            env.release(*range(ROWS))
            results = await asyncio.gather(*runs)
            final = await metrics()
    assert sorted(result["idx"] for result in results) == list(range(ROWS))
    assert all(result["reward"] == 1.0 for result in results)
    assert sorted(env.started) == list(range(ROWS)), "every rollout ran once"
    assert final["gymfleet_rollouts_unread"] == 0 and final["gymfleet_rollouts_waiting"] == 0
