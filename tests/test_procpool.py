"""gymfleet.grading.procpool with real worker processes: deadlines, kill-and-replace, demotion, crashes, shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from contextlib import closing
from pathlib import Path

import pytest

from gymfleet.errors import SandboxError
from gymfleet.grading.procpool import ItemTimeout, PoolError, ProcessPool, RemoteError, WorkerCrashed

# Targets run in the workers; the fork server imports this module to find them.


def echo(value):
    return value, os.getpid()


def spin(seconds: float = 3600.0, held_until: str | None = None, demoted_first: bool = False):
    """Spin for `seconds` of wall time. With `held_until` (a path), first wait for it to exist without using CPU
    (after spinning until this worker is reniced to 19, with `demoted_first`): an item that burns its CPU budget
    only once the test has checked what happens while it runs, so that budget can be short and still never run out
    too early on a fast machine."""
    if demoted_first:
        while os.getpriority(os.PRIO_PROCESS, 0) < 19:
            pass
    if held_until is not None:
        wait_for_file(held_until, limit_s=120)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "spun"


def nap(seconds: float):
    time.sleep(seconds)
    return "rested"


def fail(message: str):
    raise ValueError(message)


def die(marker: str | None = None):
    """Kill this worker, or (with a marker file) only the first time it is called."""
    if marker is not None:
        path = Path(marker)
        if path.exists():
            return "survived"
        path.touch()
    os._exit(3)


def allocate(megabytes: int):
    return len(bytearray(megabytes * 2**20))


def slow_initializer():
    time.sleep(1.5)  # as a heavy preload would


def initializer_waiting_for_a_file():
    """Start like a heavy preload that lasts until the test's event loop has run (it creates the file)."""
    global _SAW_FILE_WHILE_STARTING
    _SAW_FILE_WHILE_STARTING = wait_for_file(os.environ["PROCPOOL_TEST_FILE"])


_SAW_FILE_WHILE_STARTING = None


def saw_file_while_starting():
    return _SAW_FILE_WHILE_STARTING


def wait_for_file(path: str, limit_s: float = 30.0) -> bool:
    """Block until `path` exists (True), or give up after `limit_s` (False: whoever should create it never ran)."""
    end = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def broken_initializer():
    raise RuntimeError("cannot warm up")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:  # gone (possibly between the open and the read)
        return False


async def _wait_dead(pid: int, within_s: float = 30.0) -> bool:
    """Whether `pid` is gone (polled; `within_s` only bounds a failing test)."""
    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return not _alive(pid)


@pytest.fixture
def pool():
    pool = ProcessPool(echo, size=2, slow_after_s=None)
    yield pool
    pool.close()


async def test_runs_items_and_reuses_workers(pool):
    (value, first_pid), (_, second_pid) = [await pool.run(x, timeout_s=10) for x in ("a", "b")]
    assert value == "a" and first_pid == second_pid != os.getpid()
    assert pool.stats["started"] == 1 and pool.stats["items"] == 2


async def test_start_is_lazy_and_can_be_forced(pool):
    assert pool.stats["started"] == 0
    await pool.start()
    assert pool.stats["started"] == 2


async def test_timeout_kills_the_worker_and_the_pool_recovers():
    with closing(ProcessPool(spin, size=1, slow_after_s=None)) as pool:
        await pool.start()
        (pid,) = [worker.pid for worker in pool._workers]
        with pytest.raises(ItemTimeout):  # without the deadline the item would spin for a minute and return
            await pool.run(60, timeout_s=0.5)
        assert await _wait_dead(pid)
        assert await pool.run(0.01, timeout_s=10) == "spun"
        assert pool.stats["timeouts"] == 1 and pool.stats["started"] == 2


async def test_the_budget_is_cpu_time_so_a_starved_item_is_not_failed():
    with closing(ProcessPool(spin, size=1, slow_after_s=None, wall_factor=20)) as pool:
        await pool.start()
        (pid,) = [worker.pid for worker in pool._workers]
        item = asyncio.ensure_future(pool.run(0.3, timeout_s=1))
        await asyncio.sleep(0.05)
        os.kill(pid, signal.SIGSTOP)  # as if the machine were too busy to run it
        await asyncio.sleep(1.5)
        assert not item.done()
        os.kill(pid, signal.SIGCONT)
        assert await item == "spun"


async def test_a_blocked_item_is_killed_at_the_wall_clock_backstop():
    with closing(ProcessPool(nap, size=1, wall_factor=3)) as pool:
        await pool.start()
        with pytest.raises(ItemTimeout):  # it uses no CPU, so only the wall-clock backstop can stop it
            await pool.run(60, timeout_s=0.2)
        assert pool.stats["timeouts"] == 1
        assert await pool.run(0, timeout_s=5) == "rested"


async def test_a_hung_item_does_not_fail_or_stall_others(tmp_path):
    released = tmp_path / "released"
    # The hung item holds its worker, then spins out its 0.5 s of CPU once the ten 1 ms items are back (the wall
    # backstop, 100x, never decides: a busy machine may take long over the ten).
    with closing(ProcessPool(spin, size=2, slow_after_s=None, initializer=slow_initializer, wall_factor=100)) as pool:
        hung = asyncio.ensure_future(pool.run(3600, str(released), timeout_s=0.5))
        quick = await asyncio.gather(*(pool.run(0.001, timeout_s=10) for _ in range(10)))
        assert quick == ["spun"] * 10 and not hung.done()
        released.touch()
        with pytest.raises(ItemTimeout):
            await hung


async def test_starting_the_fork_server_does_not_block_the_event_loop(tmp_path, monkeypatch):
    # The fork server's initializer lasts until this coroutine creates the file: a start that blocked the event
    # loop would keep it from ever doing so (the initializer then gives up and reports it).
    signal_file = tmp_path / "the-loop-ran"
    monkeypatch.setenv("PROCPOOL_TEST_FILE", str(signal_file))
    with closing(ProcessPool(saw_file_while_starting, size=1, initializer=initializer_waiting_for_a_file)) as pool:
        item = asyncio.ensure_future(pool.run(timeout_s=10))
        await asyncio.sleep(0.2)
        signal_file.touch()
        assert await item is True


async def test_waiting_for_an_item_does_not_block_the_event_loop(tmp_path):
    signal_file = tmp_path / "the-loop-ran"
    with closing(ProcessPool(wait_for_file, size=1)) as pool:
        item = asyncio.ensure_future(pool.run(str(signal_file), timeout_s=60))
        await asyncio.sleep(0.2)
        signal_file.touch()  # the item ends only once this line has run while it waits
        assert await item is True


async def test_slow_items_are_demoted_so_a_one_worker_pool_keeps_serving(tmp_path):
    released = tmp_path / "released"
    with closing(ProcessPool(spin, size=1, slow_after_s=0.2, wall_factor=100)) as pool:
        await pool.start()
        # The item spins until it is demoted (0.2 s of CPU), holds its worker while five short items pass it, then
        # spins out the rest of its 0.5 s of CPU at nice 19 (the wall backstop, 100x, never decides).
        hung = asyncio.ensure_future(pool.run(3600, str(released), True, timeout_s=0.5))
        for _ in range(600):  # demotion needs 0.2 s of CPU, which a busy machine may take a while to give
            await asyncio.sleep(0.05)
            if pool.stats["demoted"]:
                break
        (demoted,) = [worker for worker in pool._workers if worker.demoted]
        assert os.getpriority(os.PRIO_PROCESS, demoted.pid) == 19
        assert await asyncio.gather(*(pool.run(0.001, timeout_s=10) for _ in range(5))) == ["spun"] * 5
        assert not hung.done()
        released.touch()
        with pytest.raises(ItemTimeout):
            await hung
        assert await _wait_dead(demoted.pid)
        assert pool.stats["demoted"] == 1


async def test_caller_cancellation_kills_the_worker_and_frees_its_slot():
    with closing(ProcessPool(spin, size=1, slow_after_s=None)) as pool:
        await pool.start()
        (pid,) = [worker.pid for worker in pool._workers]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pool.run(timeout_s=60), 0.3)
        assert await _wait_dead(pid)
        assert await pool.run(0.001, timeout_s=10) == "spun"


async def test_target_exceptions_are_remote_errors_and_the_worker_survives():
    with closing(ProcessPool(fail, size=1)) as pool:
        with pytest.raises(RemoteError, match="ValueError: bad input"):
            await pool.run("bad input", timeout_s=10)
        with pytest.raises(RemoteError):
            await pool.run("again", timeout_s=10)
        assert pool.stats["started"] == 1


async def test_a_worker_death_is_retried_once(tmp_path):
    with closing(ProcessPool(die, size=1)) as pool:
        assert await pool.run(str(tmp_path / "marker"), timeout_s=10) == "survived"
        with pytest.raises(WorkerCrashed):
            await pool.run(timeout_s=10)
        assert pool.stats["crashes"] == 3


async def test_memory_limit_turns_a_huge_allocation_into_an_error():
    with closing(ProcessPool(allocate, size=1, memory_mb=1024)) as pool:
        with pytest.raises(RemoteError, match="MemoryError"):
            await pool.run(4096, timeout_s=30)
        assert await pool.run(1, timeout_s=10) == 2**20


async def test_a_worker_that_cannot_start_is_a_pool_error():
    with closing(ProcessPool(echo, size=1, initializer=broken_initializer, start_timeout_s=20)) as pool:
        with pytest.raises(PoolError, match="cannot start a worker") as info:
            await pool.run("x", timeout_s=10)
        assert isinstance(info.value, SandboxError)


async def test_close_kills_everything_and_refuses_new_items():
    pool = ProcessPool(spin, size=2, slow_after_s=None)
    await pool.start()
    pids = [worker.pid for worker in pool._workers]
    zygote = pool._zygote.process
    running = asyncio.ensure_future(pool.run(timeout_s=60))
    await asyncio.sleep(0.2)
    pool.close()
    with pytest.raises(PoolError):
        await running
    with pytest.raises(PoolError):
        await pool.run(0.001, timeout_s=10)
    assert zygote.poll() is not None
    for pid in pids:
        assert await _wait_dead(pid)


async def test_many_kills_leak_no_file_descriptors():
    with closing(ProcessPool(spin, size=2, slow_after_s=None)) as pool:
        await pool.start()
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(5):
            with pytest.raises(ItemTimeout):
                await pool.run(timeout_s=0.05)
        await pool.start()
        assert len(os.listdir("/proc/self/fd")) <= before
