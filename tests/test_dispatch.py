"""`gymfleet.rollouts.dispatch.SendWindow`: many requests in flight at once, sent in order, a window at a time.

A real server (uvicorn in a thread) holds every answer until all requests have arrived, so the window can only move
on the "headers sent" signal of `gymfleet.http` (were it freed only when answers come back, the test would hang and
time out); and it records the order requests arrive in, which must follow the order they were started in, within
the window.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agents.simple_agent.app import SimpleAgent
from gymfleet import http
from gymfleet.fleet.config import GlobalConfig
from gymfleet.fleet.head import create_head_app
from gymfleet.rollouts.dispatch import SEND_WINDOW, AgentLines, SendWindow
from gymfleet.serving.admission import ADMISSION_LEVEL_HEADER, DEFAULT_MAX_CONCURRENT_ROLLOUTS, MIN_WAITING
from gymfleet.testing import free_port, serve
from gymfleet.testing import wait_until as _wait_until
from gymfleet.testing.fleets import ReleasedVerifies, agent_fleet, server_block
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.server_utils import BaseServerConfig
from responses_api_models.scripted_model.app import ScriptedModel

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


# ------------------------------------------------------------ run_examples: an agent's line waits in the client


BOUND = 2
AHEAD = BOUND + SEND_WINDOW
"""What `AgentLines` sends an agent admitting BOUND at once before it has answered: BOUND and a send window."""
FOLLOWING = BOUND + MIN_WAITING
"""What it keeps sent once the agent's answers say it admits BOUND at once: BOUND and `MIN_WAITING` waiting there."""
ROWS = AHEAD + 6


def _received(agent_url: str) -> int:
    """Requests the agent has received: admitted so far (finished or not), waiting for their turn, and waiting unread
    for room in its line (`gymfleet.serving.read_pacer`)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{agent_url}/metrics", timeout=10).text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return int(values["gymfleet_rollout_wait_seconds_count"] + values["gymfleet_rollouts_waiting"]
               + values["gymfleet_rollouts_unread"])


def test_run_examples_sends_an_agent_its_bound_and_a_margin_the_rest_in_order_as_earlier_ones_are_answered():
    env = ReleasedVerifies({"name": "gated", "domain": "other"})
    model = ScriptedModel({"name": "llm", "default": {"text": "an answer"}})
    with agent_fleet(SimpleAgent, env, model, env_name="gated", max_concurrent_rollouts=BOUND) as agent_url:
        agent = server_block("responses_api_agents", "simple_agent", agent_url)
        agent["responses_api_agents"]["simple_agent"].update(entrypoint="app.py", max_concurrent_rollouts=BOUND)
        config = GlobalConfig.from_data({"agent": agent, "head_server": {"host": "127.0.0.1", "port": free_port()}})
        rows = [{"responses_create_params": {"input": [{"role": "user", "content": "hi"}]}, "idx": idx,
                 "agent_ref": {"type": "responses_api_agents", "name": "agent"}} for idx in range(ROWS)]
        with serve(create_head_app(config)) as head_url:
            answered: list[int] = []

            async def collect() -> None:
                try:
                    for future in RolloutCollectionHelper().run_examples(
                            rows, BaseServerConfig(host="127.0.0.1", port=urlsplit(head_url).port)):
                        row, result = await future
                        assert result["idx"] == row["idx"] and result["reward"] == 1.0
                        assert row is rows[row["idx"]], "the very row passed in comes back"
                        answered.append(row["idx"])
                finally:
                    await http.close()

            with ThreadPoolExecutor(1) as pool:
                collecting = pool.submit(asyncio.run, collect())
                # Nothing is answered yet: the agent holds exactly its bound and a window; the rest wait in the client.
                _wait_until(lambda: _received(agent_url) == AHEAD, f"the agent holds {AHEAD} requests")
                # The agent admits its bound; each admitted rollout reaches the environment a moment later.
                _wait_until(lambda: len(env.started) >= BOUND, f"{BOUND} rollouts reach the environment")
                assert sorted(env.started) == [0, 1]  # admitted at once: they race to the environment
                for done in range(ROWS):  # answer one at a time: one more request goes out for each answered
                    env.release(done)
                    _wait_until(lambda done=done: len(answered) == done + 1, f"row {done} is answered")
                    expected = min(ROWS, max(AHEAD, FOLLOWING + done + 1))  # no more sent until fewer than
                    _wait_until(lambda expected=expected: _received(agent_url) == expected,  # FOLLOWING are out
                                f"the agent has received {expected} requests after {done + 1} answers")
                collecting.result(timeout=60)
    assert answered == list(range(ROWS))
    assert sorted(env.started[:BOUND]) == list(range(BOUND))
    assert env.started[BOUND:] == list(range(BOUND, ROWS)), "the rows reached the agent, and started, in the order " \
        "they were passed (each after the one before it was answered)"
    assert env.peak == BOUND


@pytest.mark.parametrize(("fields", "ahead"), [
    ({}, DEFAULT_MAX_CONCURRENT_ROLLOUTS * 3 // 2),  # the agent's default bound
    ({"max_concurrent_rollouts": 0}, None),  # no bound: everything at once, NeMo-Gym's way
    ({"max_concurrent_rollouts": None}, None),
    ({"max_concurrent_rollouts": 10}, 10 + SEND_WINDOW),  # at least a send window waits in the agent
    ({"max_concurrent_rollouts": 512, "num_workers": 2}, 1024 + 512),  # the bound is per worker process
    ({"max_concurrent_rollouts": 100, "replicas": [{"host": "a", "port": 1}, {"host": "b", "port": 2}]}, 300),
    ({"max_concurrent_rollouts": 100, "num_replicas": 4}, 600),
])
def test_what_is_sent_to_an_agent_at_once_follows_its_config(fields, ahead):
    config = {"agent": {"responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": 1, **fields}}}}
    lines = AgentLines(config)
    assert lines.ahead("agent") == ahead
    assert lines.ahead("not_an_agent") is None, "an unknown agent's call fails on its own, naming the known ones"
    rows = 4 * (ahead or 1)
    assert lines.in_flight(["agent"] * rows + ["not_an_agent"] * 3) == (ahead or rows) + 3


@pytest.mark.parametrize("fields", [{}, {"max_concurrent_rollouts": 10}])
def test_an_agent_served_from_a_nemo_gym_folder_is_sent_everything_at_once(fields, tmp_path):
    """NeMo-Gym's own agents (`server_folders`) admit every rollout at once: gymfleet's default bound is not theirs."""
    config = {"agent": {"responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": 1, **fields}}},
              "server_folders": {"agent": str(tmp_path / "responses_api_agents" / "simple_agent")}}
    lines = AgentLines(config)
    assert lines.ahead("agent") is None
    assert lines.in_flight(["agent"] * 1000) == 1000


# ------------------------------------------------- AgentLines.start: a row waiting in the client is not a task yet


def _lines(bound: int | None) -> AgentLines:
    return AgentLines({"agent": {"responses_api_agents": {"simple_agent": {
        "host": "127.0.0.1", "port": 1, "max_concurrent_rollouts": bound}}}})


class _Runs:
    """`run(row)` for `AgentLines.start`: records starts, the most running at once and the most tasks alive, and
    ends a row only when the test releases it (or with the error the row asks for)."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.running = self.peak = self.peak_tasks = 0
        self.released: dict[int, asyncio.Event] = {}

    def release(self, idx: int) -> None:
        self.released.setdefault(idx, asyncio.Event()).set()

    async def __call__(self, row: dict) -> int:
        self.started.append(row["idx"])
        self.running += 1
        self.peak, self.peak_tasks = max(self.peak, self.running), max(self.peak_tasks, len(asyncio.all_tasks()))
        try:
            await self.released.setdefault(row["idx"], asyncio.Event()).wait()
            if row.get("fail"):
                raise ValueError(f"row {row['idx']} failed")
            return row["idx"] * 10
        finally:
            self.running -= 1


async def _settled(futures, runs: _Runs, order) -> list:
    for idx in order:
        runs.release(idx)
        await asyncio.sleep(0)
    return await asyncio.gather(*futures, return_exceptions=True)


@pytest.mark.parametrize("bound", [1, 5, 40, 400])
def test_start_runs_rows_in_order_never_more_than_the_line_and_rows_waiting_are_not_tasks(bound):
    ahead = bound + max(SEND_WINDOW, bound // 2)  # nothing heard: its capacity, and half again (a window at least)
    count = 3 * ahead + 7

    async def main():
        lines, runs = _lines(bound), _Runs()
        rows = [{"idx": idx, "agent_ref": {"name": "agent"}, "fail": idx % 7 == 3} for idx in range(count)]
        futures = lines.start(rows, runs, lambda row: row["agent_ref"]["name"])
        assert len(futures) == count
        await asyncio.sleep(0.01)
        assert runs.started == list(range(ahead)), "the first rows start at once, up to the line"
        # answered out of order within what is running: each answer lets exactly the next row in line start
        outcomes = await _settled(futures, runs, [*reversed(range(count))] + list(range(count)))
        return runs, outcomes

    runs, outcomes = asyncio.run(main())
    assert runs.started == list(range(count)), "rows start in the order they were passed"
    assert runs.peak == ahead
    assert runs.peak_tasks == ahead + 1, "a row waiting its turn costs no task (only the rows running, and main)"
    for idx, outcome in enumerate(outcomes):
        if idx % 7 == 3:
            assert isinstance(outcome, ValueError) and str(outcome) == f"row {idx} failed"
        else:
            assert outcome == idx * 10


def test_start_shares_the_line_a_later_call_queues_behind_an_earlier_one_and_an_unbound_agent_gets_all_at_once():
    async def main():
        lines, runs = _lines(3), _Runs()
        ahead = 3 + SEND_WINDOW  # its bound, and a send window waiting there
        first = lines.start([{"idx": idx} for idx in range(ahead + 2)], runs, lambda row: "agent")
        later = lines.start([{"idx": 100 + idx} for idx in range(3)], runs, lambda row: "agent")
        free = lines.start([{"idx": 200 + idx} for idx in range(150)], runs, lambda row: "elsewhere")
        await asyncio.sleep(0.01)
        assert runs.started == list(range(ahead)) + [200 + idx for idx in range(150)]
        await _settled(first + later + free, runs, [*range(ahead + 2), 100, 101, 102, *range(200, 350)])
        return runs, ahead

    runs, ahead = asyncio.run(main())
    assert runs.started[ahead + 150:] == [ahead, ahead + 1, 100, 101, 102]


def test_cancelling_a_row_skips_it_before_its_turn_and_stops_it_once_running():
    async def main():
        lines, runs = _lines(1), _Runs()
        ahead = 1 + SEND_WINDOW
        rows = [{"idx": idx} for idx in range(ahead + 4)]
        futures = lines.start(rows, runs, lambda row: "agent")
        await asyncio.sleep(0.01)
        futures[0].cancel()  # running: its run is cancelled, its place goes to the next row in line
        futures[ahead + 1].cancel()  # still waiting in the client: never started
        await asyncio.sleep(0.01)
        assert runs.running == ahead
        outcomes = await _settled(futures, runs, range(ahead + 4))
        return runs, outcomes, ahead

    runs, outcomes, ahead = asyncio.run(main())
    assert ahead + 1 not in runs.started and runs.started == [idx for idx in range(ahead + 4) if idx != ahead + 1]
    assert isinstance(outcomes[0], asyncio.CancelledError) and isinstance(outcomes[ahead + 1], asyncio.CancelledError)
    assert [outcome for idx, outcome in enumerate(outcomes) if idx not in (0, ahead + 1)] == [
        idx * 10 for idx in range(1, ahead + 4) if idx != ahead + 1]


def test_run_examples_with_no_fleet_at_the_head_address_fails_every_row_loudly():
    """No head server there: every row's awaitable raises the same clear error, none hangs."""
    rows = [{"idx": idx, "agent_ref": {"type": "responses_api_agents", "name": "agent"}} for idx in range(50)]

    async def main():
        outcomes = []
        for future in RolloutCollectionHelper().run_examples(rows, BaseServerConfig(host="127.0.0.1",
                                                                                  port=free_port())):
            try:
                outcomes.append(await asyncio.wait_for(future, timeout=60))
            except Exception as exc:  # noqa: BLE001 - the test looks at what each row raised
                outcomes.append(exc)
        return outcomes

    outcomes = asyncio.run(main())
    assert len(outcomes) == 50
    assert all("cannot reach the head server" in str(exc) and "is the fleet running?" in str(exc)
               for exc in outcomes), outcomes[:2]


async def _until(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"gave up waiting until {what}"
        await asyncio.sleep(0.01)


def test_the_line_sends_ahead_until_an_answer_says_what_the_agent_admits_then_that_and_forgets_it_when_idle():
    bound, ahead = 100, 100 + SEND_WINDOW

    async def main():
        lines, runs = _lines(bound), _Runs()
        futures = lines.start([{"idx": idx} for idx in range(400)], runs, lambda row: "agent")
        await asyncio.sleep(0)
        assert runs.running == ahead, "nothing heard yet: the agent's capacity and a send window go at once"
        # an answer says the agent holds its bound at 40 (a busy CPU): no more is sent until fewer than 40 + 32 run
        lines.heard("agent", {ADMISSION_LEVEL_HEADER: "40"})
        for idx in range(94):  # 70 left running: 2 more go
            runs.release(idx)
        await _until(lambda: len(runs.started) == ahead + 2, "the line refills to 40 and a margin")
        await asyncio.sleep(0.05)
        assert runs.running == 40 + MIN_WAITING and len(runs.started) == ahead + 2
        lines.heard("agent", {ADMISSION_LEVEL_HEADER: "not a number"})  # ignored
        assert runs.running == 40 + MIN_WAITING
        lines.heard("agent", {ADMISSION_LEVEL_HEADER: "5000"})  # more than `ahead`: `ahead` it is
        await _until(lambda: runs.running == ahead, "the line opens to `ahead`")
        await _settled(futures, runs, range(400))
        assert runs.running == 0
        # idle: the agent ramps up from the start again, and what it said of the last step no longer holds
        again = lines.start([{"idx": 1000 + idx} for idx in range(200)], runs, lambda row: "agent")
        await asyncio.sleep(0)
        assert runs.running == ahead
        await _settled(again, runs, range(1000, 1200))
        return runs

    runs = asyncio.run(main())
    assert runs.started == list(range(400)) + list(range(1000, 1200))


def test_rows_go_out_in_the_order_they_were_started_across_agents():
    """A client that can send only so fast serves every agent its share from the start, not one agent after another."""
    async def main():
        lines = AgentLines({name: {"responses_api_agents": {"simple_agent": {
            "host": "127.0.0.1", "port": 1, "max_concurrent_rollouts": 2}}} for name in ("a", "b", "c")})
        runs = _Runs()
        rows = [{"idx": idx, "agent": "abc"[idx // 3 % 3]} for idx in range(300)]
        futures = lines.start(rows, runs, lambda row: row["agent"])
        await asyncio.sleep(0)
        return runs, futures

    async def whole():
        runs, futures = await main()
        first = list(runs.started)
        await _settled(futures, runs, range(300))
        return first, runs

    first, runs = asyncio.run(whole())
    assert first == list(range(3 * (2 + SEND_WINDOW))), "each agent's first rows go out interleaved, in row order"
    assert sorted(runs.started) == list(range(300))


def test_what_an_answer_says_counts_for_every_worker_process_of_the_agent():
    async def main():
        lines = AgentLines({"agent": {"responses_api_agents": {"simple_agent": {
            "host": "127.0.0.1", "port": 1, "max_concurrent_rollouts": 100, "num_workers": 2}}}})
        runs = _Runs()
        futures = lines.start([{"idx": idx} for idx in range(600)], runs, lambda row: "agent")
        await asyncio.sleep(0)
        assert runs.running == 200 + 100, "two workers admit 100 each: 200, and half of it waiting"
        lines.heard("agent", {ADMISSION_LEVEL_HEADER: "40"})  # one worker's level
        for idx in range(300):
            runs.release(idx)
        await _until(lambda: len(runs.started) >= 300 + 120, "the line refills")
        await asyncio.sleep(0.05)
        assert runs.running == 2 * 40 + 40
        await _settled(futures, runs, range(600))

    asyncio.run(main())
