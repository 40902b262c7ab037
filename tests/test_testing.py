"""gymfleet.testing's process helper (a server process is waited for until it answers HTTP, or reported) and its
waits (`wait_until`: the state a test asserts on, or a failure naming what never happened)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import httpx
import psutil
import pytest

from gymfleet.testing import free_port, processes_gone, spawn_server, wait_until, wait_until_async


def test_spawn_server_returns_once_the_process_answers_http(tmp_path):
    port = free_port()
    process, url = spawn_server([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], port,
                                cwd=tmp_path, stderr=subprocess.DEVNULL)
    try:
        assert httpx.get(url + "/").status_code == 200
    finally:
        process.terminate()
        process.wait(10)


def test_spawn_server_reports_a_process_that_exits_instead_of_serving():
    port = free_port()
    with pytest.raises(RuntimeError, match="did not start serving"):
        spawn_server([sys.executable, "-c", "raise SystemExit(3)"], port)


def test_wait_until_returns_the_state_once_another_thread_sets_it():
    state: list[int] = []
    timer = threading.Timer(0.05, state.append, (7,))
    timer.start()
    assert wait_until(lambda: state and state[0], "the timer set the state") == 7


def test_wait_until_fails_naming_what_never_happened_with_the_last_value_or_error_and_an_explanation():
    with pytest.raises(AssertionError, match=r"gave up after 0\.05s waiting until the answer came; the last value: 0"
                                             r"\nthe log's tail"):
        wait_until(lambda: 0, "the answer came", timeout_s=0.05, explain=lambda: "the log's tail")
    errors = iter([ConnectionError("refused"), ConnectionError("refused again")])

    def not_listening() -> bool:
        raise next(errors, KeyError("not ignored"))

    with pytest.raises(KeyError, match="not ignored"):  # only the exceptions it is told to ignore mean "not yet"
        wait_until(not_listening, "the server answered", timeout_s=30, ignore=(ConnectionError,))
    with pytest.raises(AssertionError, match=r"the last error: ConnectionError\('down'\)"):
        wait_until(lambda: (_ for _ in ()).throw(ConnectionError("down")), "it answered", timeout_s=0.05,
                   ignore=(ConnectionError,))


async def test_wait_until_async_awaits_a_coroutine_predicate_and_lets_the_loop_run():
    done = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, done.set)

    async def is_set() -> bool:
        return done.is_set()

    assert await wait_until_async(is_set, "the loop ran the callback") is True
    with pytest.raises(AssertionError, match="gave up after 0.05s waiting until never"):
        await wait_until_async(lambda: None, "never", timeout_s=0.05)


def test_processes_gone_counts_an_exited_process_and_a_zombie_as_gone():
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    # psutil.Process: a pid the OS hands to a new process once these are reaped is not theirs
    processes = [psutil.Process(running.pid), psutil.Process(exited.pid)]
    try:
        assert not processes_gone(processes)
        wait_until(lambda: processes_gone(processes[1:]), "the exited child is gone (a zombie: not reaped yet)")
        assert not processes_gone(processes)
    finally:
        running.kill()
        running.wait(10)
        exited.wait(10)
    assert processes_gone(processes)
