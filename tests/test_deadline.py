"""`gymfleet.serving.deadline.Deadline` behaves as `asyncio.timeout_at`: a timeout, an outside cancel, no hit."""

from __future__ import annotations

import asyncio

import pytest

from gymfleet.serving.deadline import Deadline, deadline_in


def test_a_block_past_its_deadline_raises_timeout_error():
    async def main():
        with pytest.raises(TimeoutError):
            async with deadline_in(0.01) as deadline:
                await asyncio.sleep(5)
        assert deadline.expired
        assert asyncio.current_task().cancelling() == 0  # the deadline's own cancel was taken back

    asyncio.run(main())


def test_a_block_within_its_deadline_is_untouched():
    async def main():
        async with Deadline(asyncio.get_running_loop().time() + 5) as deadline:
            await asyncio.sleep(0)
            value = 7
        await asyncio.sleep(0.02)  # the timer was cancelled: nothing fires later
        return value, deadline.expired

    assert asyncio.run(main()) == (7, False)


def test_a_cancel_from_outside_goes_through_as_a_cancel():
    async def guarded():
        async with deadline_in(5):
            await asyncio.sleep(5)

    async def main():
        task = asyncio.create_task(guarded())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


@pytest.mark.parametrize("deadline", [Deadline, asyncio.timeout_at], ids=["Deadline", "asyncio.timeout_at"])
def test_an_outside_cancel_at_the_deadline_is_not_swallowed_as_a_timeout(deadline):
    """The deadline and another cancel land in the same loop iteration: the task was cancelled twice, and the
    outside cancel wins, as with `asyncio.timeout_at` (the second parameter, as the reference)."""

    async def guarded():
        loop = asyncio.get_running_loop()
        async with deadline(loop.time() - 1):  # already past: fires at the loop's next iteration ...
            loop.call_soon(asyncio.current_task().cancel)  # ... as does this cancel from outside
            await asyncio.sleep(5)

    async def main():
        with pytest.raises(asyncio.CancelledError):
            await asyncio.create_task(guarded())

    asyncio.run(main())


# ------------------------------------------------------------------------------------------ finish_by


async def _no_wait(value):
    return value


async def _waits(steps, value, log=None):
    try:
        total = 0
        for step in range(steps):
            total += await _later(step)
        return value, total
    finally:
        if log is not None:
            log.append("closed")


async def _later(value):
    future = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.001, future.set_result, value)
    return await future


def test_finish_by_arms_no_timer_for_a_coroutine_that_does_not_wait(monkeypatch):
    import gymfleet.serving.deadline as module

    armed = []
    monkeypatch.setattr(module.Deadline, "__aenter__", lambda self: armed.append(self))

    async def main():
        return await module.finish_by(asyncio.get_running_loop().time() - 1, _no_wait(7))

    assert asyncio.run(main()) == 7  # even a deadline already past: nothing waited, nothing to interrupt
    assert armed == []


def test_finish_by_passes_every_step_of_a_waiting_coroutine_through():
    from gymfleet.serving.deadline import finish_by

    async def main():
        return await finish_by(asyncio.get_running_loop().time() + 5, _waits(4, "done"))

    assert asyncio.run(main()) == ("done", 0 + 1 + 2 + 3)


def test_finish_by_times_out_a_coroutine_that_waits_too_long_and_closes_it():
    from gymfleet.serving.deadline import finish_by

    log = []

    async def main():
        with pytest.raises(TimeoutError):
            await finish_by(asyncio.get_running_loop().time() + 0.01, _waits(10_000, None, log))
        assert asyncio.current_task().cancelling() == 0

    asyncio.run(main())
    assert log == ["closed"]


@pytest.mark.parametrize("when", ["first step", "after waiting"])
def test_finish_by_raises_the_coroutines_own_error(when):
    from gymfleet.serving.deadline import finish_by

    async def failing():
        if when == "after waiting":
            await _later(0)
        raise ValueError("its own")

    async def main():
        await finish_by(asyncio.get_running_loop().time() + 5, failing())

    with pytest.raises(ValueError, match="its own"):
        asyncio.run(main())


def test_finish_by_lets_a_cancel_from_outside_through_as_a_cancel():
    from gymfleet.serving.deadline import finish_by

    log = []

    async def main():
        task = asyncio.create_task(finish_by(asyncio.get_running_loop().time() + 5, _waits(10_000, None, log)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert log == ["closed"]


def test_finish_by_awaits_a_future_under_the_deadline():
    from gymfleet.serving.deadline import finish_by

    async def main():
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        loop.call_later(0.001, done.set_result, "set")
        assert await finish_by(loop.time() + 5, done) == "set"
        with pytest.raises(TimeoutError):
            await finish_by(loop.time() + 0.01, loop.create_future())

    asyncio.run(main())
