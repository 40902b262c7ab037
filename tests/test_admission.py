"""Rollout admission (`gymfleet.serving.admission.Admission`, `max_concurrent_rollouts`) on real servers.

A real simple_agent, a real scripted model and a real environment whose `/verify` the test can hold open per row
(`ReleasedVerifies`), so which rollouts are in progress at any moment is decided by the test, not by timing. The
environment records the order rollouts reach it (`/seed_session`) and finish (`/verify`): a rollout that never
reached it did no work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agents.simple_agent.app import SimpleAgent
from gymfleet.serving.admission import ADMISSION_LEVEL_HEADER, HOLD_FROM, SLOW_ROLLOUT_S, WAITING_ROLLOUT_S, Admission
from gymfleet.testing import wait_until
from gymfleet.testing.fleets import ReleasedVerifies, agent_fleet
from responses_api_models.scripted_model.app import ScriptedModel

HANG_BOUND_S = 60.0
"""Bound on every wait below: it only catches a hang, it times nothing."""


RULES = [{"match": "(?i)slow", "text": "a slow answer", "delay_s": 0.2}]


@contextlib.contextmanager
def _fleet(max_concurrent_rollouts, *, gated: bool = True):
    env = ReleasedVerifies({"name": "gated", "domain": "other"}, gated=gated, hang_bound_s=HANG_BOUND_S)
    model = ScriptedModel({"name": "llm", "rules": RULES, "default": {"text": "an answer"}})
    with agent_fleet(SimpleAgent, env, model, env_name="gated", max_concurrent_rollouts=max_concurrent_rollouts) \
            as agent_url, ThreadPoolExecutor(16) as pool:
        yield agent_url, env, pool


def _row(idx: int, text: str = "hello") -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": text}]}, "idx": idx}


def _post(url: str, row: dict) -> httpx.Response:
    return httpx.post(f"{url}/run", json=row, timeout=HANG_BOUND_S)


def _metrics(url: str) -> dict[str, float]:
    """Every sample of the agent's `/metrics` by name (labels ignored: summed)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def _queued(url: str) -> tuple[float, float]:
    values = _metrics(url)
    return values["gymfleet_rollouts_in_progress"], values["gymfleet_rollouts_waiting"]


def _send_in_order(url: str, pool: ThreadPoolExecutor, indices) -> list:
    """Post one row per idx, each only once the agent has counted the one before: the arrival order is `indices`."""
    held = sum(_queued(url))
    futures = []
    for count, idx in enumerate(indices, start=int(held) + 1):
        futures.append(pool.submit(_post, url, _row(idx)))
        wait_until(lambda count=count: sum(_queued(url)) == count, f"the agent holds {count} requests")
    return futures


def test_at_most_the_bound_run_and_the_rest_start_in_arrival_order():
    with _fleet(2) as (url, env, pool):
        futures = _send_in_order(url, pool, range(6))
        # the agent counts a rollout in progress a moment before its /seed_session reaches the environment
        wait_until(lambda: len(env.started) >= 2, "the two admitted rollouts reach the environment")
        assert env.started == [0, 1], "only the first two arrivals reached the environment"
        assert _queued(url) == (2, 4)
        assert _metrics(url)["gymfleet_rollouts_admission_limit"] == 2
        # Finish the later of the two first: the slot goes to the oldest waiter (2), not to whoever asks first.
        for finish, expected_start in ((1, [0, 1, 2]), (0, [0, 1, 2, 3]), (3, [0, 1, 2, 3, 4]),
                                       (2, [0, 1, 2, 3, 4, 5])):
            env.release(finish)
            started = len(expected_start)
            wait_until(lambda n=started: len(env.started) == n, f"{started} rollouts start")
            assert env.started == expected_start
        env.release(4, 5)
        results = [future.result() for future in futures]
        assert [r.status_code for r in results] == [200] * 6
        assert [r.json()["idx"] for r in results] == list(range(6)) and all(r.json()["reward"] == 1.0 for r in results)
        assert {r.headers[ADMISSION_LEVEL_HEADER] for r in results} == {"2"}, "each answer says what the agent admits"
        assert env.peak == 2
        wait_until(lambda: _queued(url) == (0, 0), "the queue drains")
        assert _metrics(url)["gymfleet_rollout_wait_seconds_count"] == 6


def test_with_a_slow_model_no_more_than_the_bound_run_and_the_first_admitted_finish_first():
    with _fleet(2, gated=False) as (url, env, pool):
        results = list(pool.map(lambda idx: _post(url, _row(idx, "slow please")), range(8)))
        assert [r.status_code for r in results] == [200] * 8
        assert all(r.json()["response"]["output"][-1]["content"][0]["text"] == "a slow answer" for r in results)
        assert sorted(env.started) == list(range(8)) and sorted(env.finished) == list(range(8))
        assert env.peak <= 2
        # With at most two in progress, the k-th rollout to finish is one of the first k+2 to have started.
        for k, idx in enumerate(env.finished):
            assert idx in env.started[: k + 2], f"{idx} finished {k}th but started {env.started.index(idx)}th"


def test_a_caller_that_leaves_while_waiting_gives_up_its_place_and_nothing_runs_for_it():
    with _fleet(2) as (url, env, pool):
        futures = _send_in_order(url, pool, [0, 1, 2])
        body = json.dumps(_row(3)).encode()
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as leaver:
            leaver.sendall(b"POST /run HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            wait_until(lambda: _queued(url) == (2, 2), "the leaver waits behind 2")
        wait_until(lambda: _metrics(url).get("gymfleet_rollouts_abandoned_total") == 1, "the leaver is given up")
        assert _queued(url) == (2, 1), "the leaver held no slot, so none was freed"
        futures += _send_in_order(url, pool, [4])
        env.release(0)
        wait_until(lambda: len(env.started) == 3, "a third rollout starts")
        env.release(1)
        wait_until(lambda: len(env.started) == 4, "a fourth rollout starts")
        assert env.started == [0, 1, 2, 4], "the leaver (3) was skipped and never reached the environment"
        env.release(2, 4)
        assert [future.result().status_code for future in futures] == [200] * 4
        assert 3 not in env.finished and env.peak == 2
        assert _metrics(url)["gymfleet_rollout_wait_seconds_count"] == 4


def test_unbounded_admits_everything_at_once():
    with _fleet(0) as (url, env, pool):
        futures = [pool.submit(_post, url, _row(idx)) for idx in range(5)]
        wait_until(lambda: len(env.started) == 5, "all five start before any finishes")
        assert _queued(url) == (5, 0)
        assert _metrics(url)["gymfleet_rollouts_admission_limit"] == 0
        env.release(*range(5))
        results = [future.result() for future in futures]
        assert [r.status_code for r in results] == [200] * 5
        assert not any(ADMISSION_LEVEL_HEADER in r.headers for r in results), "no bound, nothing to say"
        assert env.peak == 5


def test_v1_responses_queues_with_run():
    with _fleet(1) as (url, env, pool):
        held = _send_in_order(url, pool, [0])
        params = {"input": [{"role": "user", "content": "hi"}]}
        episode = pool.submit(httpx.post, f"{url}/v1/responses", json=params, timeout=HANG_BOUND_S)
        wait_until(lambda: _queued(url) == (1, 1), "the episode waits behind the rollout")
        assert not episode.done()
        env.release(0)
        assert episode.result().status_code == 200 and held[0].result().status_code == 200
        assert episode.result().json()["output"][-1]["content"][0]["text"] == "an answer"


# ------------------------------------------------------------------------------- the queue itself, on one loop


def _one_slot_taken() -> Admission:
    """An admission queue of one slot, held (by the test)."""
    admission = Admission(1)
    assert admission.try_enter()
    return admission


def test_a_freed_slot_goes_to_the_oldest_waiter_and_no_newcomer_overtakes_it():
    async def scenario():
        admission = _one_slot_taken()
        order: list[str] = []

        async def waiter(name):
            assert await admission.enter()
            order.append(name)
            admission.leave()

        tasks = [asyncio.create_task(waiter(name)) for name in ("first", "second")]
        await asyncio.sleep(0)
        assert admission.waiting == 2
        admission.leave()  # handed to "first", which has not run yet
        assert not admission.try_enter(), "a newcomer must not take the slot handed to a waiter"
        await asyncio.gather(*tasks)
        assert order == ["first", "second"]
        assert (admission.in_progress, admission.waiting) == (0, 0)

    asyncio.run(scenario())


def test_a_waiter_cancelled_as_it_is_handed_a_slot_passes_it_on():
    async def scenario():
        admission = _one_slot_taken()
        first = asyncio.create_task(admission.enter())
        second = asyncio.create_task(admission.enter())
        await asyncio.sleep(0)
        admission.leave()  # the slot is handed to `first`...
        first.cancel()  # ...which is cancelled before it runs
        assert await second is True
        with pytest.raises(asyncio.CancelledError):
            await first
        assert (admission.in_progress, admission.waiting) == (1, 0)
        admission.leave()
        assert (admission.in_progress, admission.waiting) == (0, 0)

    asyncio.run(scenario())


def test_a_waiter_that_gives_up_holds_nothing():
    async def scenario():
        admission = _one_slot_taken()
        gone = asyncio.Event()
        waiter = asyncio.create_task(admission.enter(gone.wait))
        behind = asyncio.create_task(admission.enter())
        await asyncio.sleep(0)
        assert admission.waiting == 2
        gone.set()
        assert await waiter is False
        assert (admission.in_progress, admission.waiting) == (1, 1)
        admission.leave()
        assert await behind is True
        admission.leave()
        assert (admission.in_progress, admission.waiting) == (0, 0)

    asyncio.run(scenario())


async def _entering(admission: Admission, count: int) -> tuple[list[int], list[asyncio.Task]]:
    """`count` callers entering `admission` in order, each noting its index once in; returns the indices in so far
    (the list goes on filling) and the callers' tasks, once the first ones had their turn."""
    entered: list[int] = []

    async def one(index):
        assert await admission.enter()
        entered.append(index)

    tasks = [asyncio.create_task(one(index)) for index in range(count)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return entered, tasks


def test_after_idling_the_bound_ramps_up_in_arrival_order():
    now = [0.0]

    async def scenario():
        admission = Admission(64, ramp_s=1.0, ramp_from=4, clock=lambda: now[0])
        entered, tasks = await _entering(admission, 100)
        assert entered == [0, 1, 2, 3] and admission.waiting == 96
        now[0] = 0.5  # halfway: 4 + (64 - 4) / 2 = 34
        admission.leave()
        await asyncio.sleep(0)
        assert entered == list(range(35)) and admission.in_progress == 34
        now[0] = 1.0  # the ramp is over
        admission.leave()
        await asyncio.sleep(0)
        assert entered == list(range(66)) and admission.in_progress == 64
        while admission.in_progress:
            admission.leave()
            await asyncio.sleep(0)
        assert entered == list(range(100)) and admission.waiting == 0
        await asyncio.gather(*tasks)
        now[0] = 10.0  # idle, then a new step: the ramp starts again
        assert all(admission.try_enter() for _ in range(4))
        assert not admission.try_enter()

    asyncio.run(scenario())


def test_the_ramp_admits_waiters_on_its_own_clock_without_any_rollout_ending():
    async def scenario():
        admission = Admission(32, ramp_s=0.2, ramp_from=2)
        entered: list[int] = []

        async def one(index):
            assert await admission.enter()
            entered.append(index)

        await asyncio.wait_for(asyncio.gather(*(one(index) for index in range(32))), HANG_BOUND_S)
        assert entered == list(range(32)) and admission.in_progress == 32

    asyncio.run(scenario())


def test_while_the_cpu_is_saturated_the_ramp_holds_and_goes_on_once_there_is_room(caplog):
    """`saturated` (the agent's `CpuBusy`) is asked every ramp_s / 16 s while ramping: a True holds the bound for
    that interval; only the time with room counts towards the ramp."""
    now, busy, asked = [0.0], [True], []

    def saturated() -> bool:
        asked.append(now[0])
        return busy[0]

    async def scenario():
        # ramp_s 2: asked every 1/8 s; each 1/8 s with room raises the bound by (68 - 4) / 16 = 4
        admission = Admission(68, ramp_s=2.0, ramp_from=4, clock=lambda: now[0], saturated=saturated, hold_from=4)
        entered, tasks = await _entering(admission, 200)
        assert entered == [0, 1, 2, 3] and admission.level() == 4
        for step in range(1, 11):  # over a second saturated: one out, one in, the bound stays at 4
            now[0] = step / 8
            admission.leave(0.05)
            await asyncio.sleep(0)
            assert admission.in_progress == 4 and admission.level() == 4
        assert len(entered) == 14
        busy[0] = False
        for step, level in ((11, 8), (12, 12)):  # room: the bound rises again, in arrival order
            now[0] = step / 8
            admission.leave(0.05)
            await asyncio.sleep(0)
            assert admission.in_progress == level and admission.level() == level
        assert entered == list(range(14 + 1 + 4 + 1 + 4))
        busy[0] = True
        now[0] = 13 / 8
        admission.leave(0.05)
        await asyncio.sleep(0)
        assert admission.level() == 12 and admission.in_progress == 12
        busy[0] = False
        now[0] = 13 / 8 + 1.75  # 1.75 s more with room: with the 0.25 s before, the whole ramp
        admission.leave(0.05)
        await asyncio.sleep(0)
        assert admission.level() == 68 and admission.in_progress == 68
        asked_before = len(asked)
        for step in range(28, 40):  # the ramp is over: the CPU is not asked again
            now[0] = step / 8
            admission.leave(0.05)
            await asyncio.sleep(0)
        assert len(asked) == asked_before and admission.in_progress == 68
        while admission.in_progress:
            admission.leave(0.05)
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        now[0] = 50.0  # idle, then a new step: from 4 again, held again while saturated
        busy[0] = True
        assert all(admission.try_enter() for _ in range(4)) and not admission.try_enter()

    with caplog.at_level(logging.INFO, logger="gymfleet.serving.admission"):
        asyncio.run(scenario())
    held = [record.getMessage() for record in caplog.records if "saturated" in record.getMessage()]
    assert len(held) == 1, "one message per step, not one per interval"
    assert "4 rollouts in progress" in held[0] and "admission_hold_on_busy_cpu" in held[0]


@given(st.lists(st.tuples(st.floats(0.126, 0.5), st.booleans()), max_size=40), st.integers(2, 64),
       st.integers(2, 1024), st.integers(0, 1100))
def test_the_bound_only_rises_and_only_with_time_the_cpu_had_room(intervals, ramp_from, limit, hold_from):
    """Whatever the CPU answers: the bound never falls while ramping, never passes `limit`, and is `ramp_from` plus
    the share of the ramp that the time with room, or with the bound under `hold_from`, covers."""
    now = [0.0]
    busy = [False]
    admission = Admission(limit, ramp_s=2.0, ramp_from=ramp_from, clock=lambda: now[0], saturated=lambda: busy[0],
                          hold_from=hold_from)
    assert admission.try_enter() and admission.try_enter()  # two in progress: one ending never leaves it idle
    start = min(ramp_from, limit)
    room, last = 0.0, start
    for wall, saturated in intervals:
        before = now[0]
        now[0] += wall
        busy[0] = saturated
        admission.leave(0.05)  # a fast rollout ended (slow ones do not hold the ramp): its slot is taken again
        assert admission.try_enter()
        level = admission.current_limit()
        if not saturated or last < hold_from:
            room += now[0] - before
        expected = limit if room >= 2.0 else start + int((limit - start) * room / 2.0)
        assert level == expected and last <= level <= limit
        last = level


def test_the_bound_rises_to_the_hold_mark_however_busy_the_cpu():
    """Below `HOLD_FROM` the CPU is not asked: a few rollouts in progress can keep a CPU busy without making the most
    of it (more per event-loop pass, per system call)."""
    now = [0.0]
    asked = []
    admission = Admission(256, ramp_s=2.0, ramp_from=16, clock=lambda: now[0],
                          saturated=lambda: asked.append(now[0]) or True)
    assert admission.hold_from == HOLD_FROM == 64
    assert all(admission.try_enter() for _ in range(2))
    levels = []
    for step in range(1, 40):
        now[0] = step / 8
        admission.leave(0.05)
        assert admission.try_enter()
        levels.append(admission.current_limit())
    assert levels[0] == 31 and levels[-1] == levels[5] and 64 <= levels[-1] < 64 + 15, levels
    assert len(asked) >= 30, "asked every eighth of a second once at the mark"


@pytest.mark.parametrize(("ending", "learnt"), [
    ("slowly", 0),  # the first rollout to end took 3 s: a slow policy
    ("never", 8),  # one quick rollout ended (at 1/8 s), then none within SLOW_ROLLOUT_S (1 s)
    ("waiting", 0),  # every rollout takes 0.4 s, even the quickest: they wait on a policy's latency
    ("unknown", 0),  # none has ended yet: nothing says the CPU is what they wait on
])
def test_rollouts_that_wait_on_a_policy_ramp_up_on_a_busy_cpu_all_the_same(ending, learnt):
    """A policy that takes seconds per rollout, or a good part of one, is what its rollouts wait on, however busy
    this machine's CPU is (something else keeps it busy, or more in progress would hide more of the wait): the ramp
    goes on, and the bound reaches its limit within `ramp_s`. Until a rollout ends, nothing says otherwise."""
    assert (SLOW_ROLLOUT_S, WAITING_ROLLOUT_S) == (1.0, 0.3)  # the timings below
    now = [0.0]
    admission = Admission(68, ramp_s=2.0, ramp_from=4, clock=lambda: now[0], saturated=lambda: True, hold_from=4)
    assert all(admission.try_enter() for _ in range(4)) and not admission.try_enter()
    held = {"slowly": {1: 3.0}, "never": {1: 0.05}, "waiting": {step: 0.4 for step in range(1, 60)}}.get(ending, {})
    levels = []
    for step in range(1, 60):
        now[0] = step / 8
        if step in held:
            admission.leave(held[step])
            assert admission.try_enter()
        levels.append(admission.current_limit())
    # `learnt`: the index of the first level after the agent can tell
    assert levels[:learnt] == [4] * learnt, "held while the CPU is busy and a rollout ended quickly"
    assert levels == sorted(levels) and levels[learnt] > 4
    assert levels.index(68) == learnt + 15, "then the whole ramp within ramp_s (16 steps of an eighth of a second)"