"""`SessionStore`: idle expiry, the least-recently-used cap, busy entries, closing, and evicted sessions as lost."""

from __future__ import annotations

import asyncio
import random

from gymfleet.serving.session_store import SessionStore


def test_sessions_expire_when_idle_and_stay_bounded():
    now = [0.0]
    sessions: SessionStore[object] = SessionStore(idle_s=10, limit=3, clock=lambda: now[0])
    state = object()
    for key in "abc":
        sessions.put(key, state)
    now[0] = 5
    assert sessions.get("a") is state  # touched: a is fresh again
    sessions.put("d", state)
    assert len(sessions) == 3 and sessions.get("b") is None, "past the limit, the least recently used goes"
    now[0] = 14
    assert sessions.get("c") is None and sessions.get("a") is state, "c idle 14 s > 10 s; a used at 5"
    now[0] = 30
    assert sessions.get("a") is None and len(sessions) == 0
    assert all(sessions.lost(key) for key in "abcd")


def test_every_evicted_session_reads_as_lost_until_seeded_again_or_popped():
    """Random seeds, tool calls, verifies and clock steps: a session that leaves the store other than by `pop` is
    lost; a popped or reseeded one is not; no key is both held and lost; the cap holds."""
    rng = random.Random(7)
    now = [0.0]
    keys = "abcdefgh"
    sessions: SessionStore[int] = SessionStore(idle_s=5, limit=4, clock=lambda: now[0])
    for _ in range(3000):
        key, action = rng.choice(keys), rng.random()
        held_before = {name for name in keys if name in sessions}
        lost_before = {name for name in keys if sessions.lost(name)}
        if action < 0.3:
            sessions.put(key, 1)
        elif action < 0.6:
            sessions.get(key)
        elif action < 0.8:
            sessions.pop(key)
        else:
            now[0] += rng.uniform(0, 4)
            sessions.expire()
        assert len(sessions) <= 4
        for name in keys:
            assert not (name in sessions and sessions.lost(name))
            ended_by_call = name == key and action >= 0.6 and action < 0.8
            if name in held_before and name not in sessions and not ended_by_call:
                assert sessions.lost(name), f"{name} was evicted but does not read as lost"
            if ended_by_call or (name == key and action < 0.3):
                assert not sessions.lost(name)
            elif name in lost_before:
                assert sessions.lost(name), "lost stays lost until seeded again or popped"


def test_busy_entries_are_not_evicted_and_closes_run_in_the_background():
    closed: list[str] = []
    busy = {"a"}

    async def close(value: str) -> None:
        await asyncio.sleep(0)
        closed.append(value)

    async def main() -> None:
        now = [0.0]
        sessions: SessionStore[str] = SessionStore(idle_s=1, clock=lambda: now[0], close=close,
                                                   busy=lambda value: value in busy)
        sessions.put("a", "a")
        sessions.put("b", "b")
        now[0] = 5
        sessions.expire()
        assert "a" in sessions and "b" not in sessions and sessions.lost("b")
        busy.clear()
        sessions.put("c", "c")  # expires a, now idle and no longer busy
        assert sessions.lost("a") and "c" in sessions
        await sessions.close_all()
        assert sorted(closed) == ["a", "b", "c"] and len(sessions) == 0

    asyncio.run(main())


def test_a_lost_session_answers_410_session_lost():
    sessions: SessionStore[int] = SessionStore(idle_s=1, limit=1, name="env")
    answer = sessions.lost_answer("POST /tool")
    assert answer.status_code == 410 and b'"error_type":"session_lost"' in answer.body
    assert sessions.lost_fields()["_ng_failure_class"] == "session_lost"
