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
