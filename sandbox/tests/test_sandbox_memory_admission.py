"""Admission by memory: the `memory_mb` of what runs at once stays within `memory_budget_mb`; the rest queue, FIFO.

Which runs overlapped is read from inside them (each prints when it started and ended, on the host's clock) and
from `/metrics`, never from how long a test took.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections.abc import Callable

import httpx
import psutil
import pytest

from gymfleet.errors import ConfigError
from gymfleet.testing import serve
from sandbox.admission import Admission
from sandbox.app import SandboxServer

BUDGET_MB = 300
SLEEPER = "import time\nstart = time.time()\ntime.sleep({seconds})\nprint(start, time.time())"
WAITING = "gymfleet_sandbox_waiting_for_memory"
ADMITTED = "gymfleet_sandbox_memory_admitted_bytes"


@pytest.fixture(scope="module")
def budget_server_url():
    """A sandbox with a 300 MiB memory budget and slots to spare (4 runs at once), so memory is what limits."""
    server = SandboxServer({"name": "sandbox", "memory_budget_mb": BUDGET_MB, "default_memory_mb": 64,
                            "max_concurrent_runs": 4, "queue_length": 2})
    with serve(server.create_app()) as url:
        yield url


@pytest.fixture
def budget_url(budget_server_url):
    """That sandbox, once the previous test's sandboxes have been torn down (they hold their memory until then)."""
    deadline = time.monotonic() + 60
    while gauge(httpx.get(f"{budget_server_url}/metrics").text, ADMITTED):
        assert time.monotonic() < deadline, "the previous test's runs never gave their memory back"
        time.sleep(0.02)
    return budget_server_url


def gauge(metrics: str, name: str) -> float:
    """The value of a label-less gauge in a Prometheus text page."""
    found = re.search(rf"^{name} (\S+)$", metrics, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


async def wait_for_metrics(client: httpx.AsyncClient, condition: Callable[[str], bool], what: str) -> str:
    """Poll /metrics until `condition` holds (a liveness deadline, not a measurement)."""
    deadline = time.monotonic() + 60
    while not condition(metrics := (await client.get("/metrics")).text):
        assert time.monotonic() < deadline, f"never saw {what} in /metrics:\n{metrics}"
        await asyncio.sleep(0.02)
    return metrics


async def run_span(client: httpx.AsyncClient, memory_mb: int, seconds: float) -> tuple[float, float]:
    """Run a program that sleeps; returns when it started and ended, as it saw it."""
    answer = await client.post("/run", json={"code": SLEEPER.format(seconds=seconds), "memory_mb": memory_mb})
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "ok", answer.json()
    start, end = map(float, answer.json()["stdout"].split())
    return start, end


async def test_runs_that_do_not_fit_together_run_one_at_a_time(budget_url):
    async with httpx.AsyncClient(base_url=budget_url, timeout=120) as client:
        runs = [asyncio.create_task(run_span(client, 200, 1)) for _ in range(3)]
        metrics = await wait_for_metrics(client, lambda text: gauge(text, WAITING) == 2, "two runs waiting")
        assert gauge(metrics, ADMITTED) == 200 << 20 and gauge(metrics, "gymfleet_sandbox_running") == 1
        assert gauge(metrics, "gymfleet_sandbox_memory_budget_bytes") == BUDGET_MB << 20
        spans = sorted(await asyncio.gather(*runs))
        metrics = await wait_for_metrics(client, lambda text: gauge(text, ADMITTED) == 0, "all memory given back")
    for (_, first_end), (second_start, _) in itertools.pairwise(spans):
        assert first_end <= second_start, f"runs of 200 MiB overlapped under a 300 MiB budget: {spans}"
    assert gauge(metrics, WAITING) == 0 and gauge(metrics, "gymfleet_sandbox_queue_depth") == 0


async def test_a_big_run_is_not_overtaken_by_small_ones(budget_url):
    async with httpx.AsyncClient(base_url=budget_url, timeout=120) as client:
        first = asyncio.create_task(run_span(client, 200, 1.5))
        await wait_for_metrics(client, lambda text: gauge(text, ADMITTED) == 200 << 20, "the first run admitted")
        big = asyncio.create_task(run_span(client, BUDGET_MB, 0.2))
        await wait_for_metrics(client, lambda text: gauge(text, WAITING) == 1, "the big run waiting")
        small = asyncio.create_task(run_span(client, 100, 0))  # would fit beside the first run, but came later
        (_, first_end), (big_start, big_end), (small_start, _) = await asyncio.gather(first, big, small)
    assert first_end <= big_start and big_end <= small_start, (first_end, big_start, big_end, small_start)


async def test_the_queue_length_still_bounds_runs_waiting_for_memory(budget_url):
    body = {"code": SLEEPER.format(seconds=1), "memory_mb": 200}
    async with httpx.AsyncClient(base_url=budget_url, timeout=120) as client:
        answers = await asyncio.gather(*(client.post("/run", json=body) for _ in range(5)))
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [200, 200, 200, 429, 429], codes  # one running, queue_length (2) waiting, the rest refused
    refused = next(answer for answer in answers if answer.status_code == 429)
    assert int(refused.headers["Retry-After"]) >= 1 and refused.json()["error_type"] == "overloaded"


@pytest.mark.parametrize(("path", "extra"), [("/run", {}), ("/run_batch", {"cases": [{}]}), ("/sessions", None)],
                         ids=["run", "batch", "session"])
def test_asking_more_than_the_whole_budget_is_a_clear_400(budget_url, path, extra):
    body = {"memory_mb": BUDGET_MB + 1} if extra is None else {"code": "print(1)", "memory_mb": BUDGET_MB + 1, **extra}
    answer = httpx.post(f"{budget_url}{path}", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    detail = answer.json()["detail"]
    assert f"memory_mb={BUDGET_MB + 1}" in detail and f"memory budget of {BUDGET_MB} MiB" in detail, detail
    assert "memory_budget_mb" in detail


async def test_a_session_holds_its_memory_and_its_execs_pass_runs_waiting_for_it(budget_url):
    async with httpx.AsyncClient(base_url=budget_url, timeout=120) as client:
        created = await client.post("/sessions", json={"memory_mb": 200})
        assert created.status_code == 200, created.text
        session = created.json()["session_id"]
        metrics = (await client.get("/metrics")).text
        assert gauge(metrics, ADMITTED) == 200 << 20, "an idle session holds its memory"
        waiting = asyncio.create_task(client.post("/run", json={"code": "print('ran')", "memory_mb": 200}))
        await wait_for_metrics(client, lambda text: gauge(text, WAITING) == 1, "the run waiting for memory")
        executed = await client.post(f"/sessions/{session}/exec", json={"code": "6 * 7"})
        assert executed.json()["stdout"] == "42\n", executed.text  # not stuck behind the run that waits for it
        assert not waiting.done()
        assert (await client.delete(f"/sessions/{session}")).status_code == 200
        assert (await waiting).json()["stdout"] == "ran\n"
        await wait_for_metrics(client, lambda text: gauge(text, ADMITTED) == 0, "all memory given back")


def test_a_budget_below_the_default_memory_is_a_config_error():
    with pytest.raises(ConfigError, match="memory_budget_mb is below default_memory_mb"):
        SandboxServer({"name": "sandbox", "memory_budget_mb": 512, "default_memory_mb": 1024})


def test_the_default_budget_is_a_share_of_the_machines_memory(client):
    budget = client.get("/info").json()["memory_budget_mb"]
    assert 1024 <= budget < psutil.virtual_memory().total >> 20, budget


async def test_a_waiter_that_goes_away_leaves_the_line():
    admission = Admission(max_running=4, max_queued=10, memory_budget_mb=BUDGET_MB)
    release = await admission.acquire(200)
    gone = asyncio.create_task(admission.acquire(200))
    behind = asyncio.create_task(admission.acquire(100))
    await asyncio.sleep(0)
    assert (admission.waiting, admission.waiting_for_memory) == (2, 2)  # the small one waits behind the big one
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert (admission.waiting, admission.admitted_mb) == (0, 300)  # the one behind took the freed place
    release()
    release()  # a second call gives nothing back twice
    (await behind)()
    assert (admission.running, admission.admitted_mb, admission.waiting_for_memory) == (0, 0, 0)


async def test_a_request_not_admitted_within_admission_timeout_s_is_a_429_and_never_runs():
    """A queued run past its admission deadline is refused (429, Retry-After) and its program never starts."""
    server = SandboxServer({"name": "sandbox", "memory_budget_mb": BUDGET_MB, "default_memory_mb": 64,
                            "max_concurrent_runs": 1, "admission_timeout_s": 0.5})
    marker = "print('the late run ran')"
    with serve(server.create_app()) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            holder = asyncio.create_task(run_span(client, 64, 3))
            await wait_for_metrics(client, lambda text: gauge(text, "gymfleet_sandbox_running") == 1, "a run")
            late = await client.post("/run", json={"code": marker})
            assert late.status_code == 429, late.text
            assert late.json()["error_type"] == "overloaded" and "admission_timeout_s" in late.json()["detail"]
            assert int(late.headers["Retry-After"]) >= 1
            await holder
            metrics = (await client.get("/metrics")).text
    assert gauge(metrics, "gymfleet_sandbox_queue_depth") == 0
    assert 'reason="admission_timeout"' in metrics
    assert server.admission.running == 0 and server.admission.admitted_mb == 0


def _runs(metrics: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("gymfleet_sandbox_runs_total{"))


async def test_fifty_abandoned_requests_run_nothing():
    """Callers that hang up while their run waits for admission leave the line: none of their programs runs."""
    server = SandboxServer({"name": "sandbox", "memory_budget_mb": BUDGET_MB, "default_memory_mb": 64})
    with serve(server.create_app()) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            session = await client.post("/sessions", json={"memory_mb": BUDGET_MB})  # holds the whole budget
            assert session.status_code == 200, session.text
            before = _runs((await client.get("/metrics")).text)  # the start-up self-test counts as one

            async def abandon() -> None:
                async with httpx.AsyncClient(base_url=url) as impatient:
                    with contextlib.suppress(httpx.TimeoutException):
                        await impatient.post("/run", json={"code": "print(1)"}, timeout=httpx.Timeout(120, read=0.3))

            await asyncio.gather(*(abandon() for _ in range(50)))
            await wait_for_metrics(client, lambda text: gauge(text, "gymfleet_sandbox_queue_depth") == 0,
                                   "the abandoned requests leaving the line")
            assert (await client.delete(f"/sessions/{session.json()['session_id']}")).status_code == 200
            await run_span(client, 64, 0)  # first come, first served: anything still queued would run before it
            metrics = (await client.get("/metrics")).text
    assert _runs(metrics) == before + 1, "only the last run ran"
    assert 'gymfleet_requests_total{method="POST",route="/run",status="499"} 50.0' in metrics


async def test_abandoned_session_starts_open_nothing_and_a_command_cut_off_closes_its_session():
    """Callers that hang up while their session waits for memory leave the line (no session is opened for them);
    one that hangs up during a session's command ends that session (its kernel is killed, its memory freed), so
    the next command cannot read the abandoned one's result."""
    server = SandboxServer({"name": "sandbox", "memory_budget_mb": BUDGET_MB, "default_memory_mb": 64})
    with serve(server.create_app()) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            holder = await client.post("/sessions", json={"memory_mb": BUDGET_MB})  # holds the whole budget
            assert holder.status_code == 200, holder.text

            async def hang_up(path: str, body: dict, after_s: float) -> None:
                async with httpx.AsyncClient(base_url=url) as impatient:
                    with contextlib.suppress(httpx.TimeoutException):
                        await impatient.post(path, json=body, timeout=httpx.Timeout(120, read=after_s))

            await asyncio.gather(*(hang_up("/sessions", {"memory_mb": 64}, 0.3) for _ in range(20)))
            await wait_for_metrics(client, lambda text: gauge(text, "gymfleet_sandbox_queue_depth") == 0,
                                   "the abandoned session starts leaving the line")
            holder_id = holder.json()["session_id"]
            assert (await client.delete(f"/sessions/{holder_id}")).status_code == 200
            assert server.sessions._open == {}, "a session was opened for a caller that had hung up"

            opened = await client.post("/sessions", json={"memory_mb": 64})
            session_id = opened.json()["session_id"]
            kernel = psutil.Process(server.sessions._open[session_id].process.popen.pid)
            await hang_up(f"/sessions/{session_id}/exec", {"code": "import time\ntime.sleep(60)\nprint('late')"}, 0.5)
            await wait_for_metrics(client, lambda text: gauge(text, "gymfleet_sandbox_sessions") == 0,
                                   "the session whose command was cut off closing")
            after = await client.post(f"/sessions/{session_id}/exec", json={"code": "print(1)"})
            assert after.status_code == 404, after.text
            with contextlib.suppress(psutil.NoSuchProcess):
                kernel.wait(timeout=30)  # killed as the session closed (raises TimeoutExpired if it lives on)
            metrics = (await client.get("/metrics")).text
    assert 'gymfleet_requests_total{method="POST",route="/sessions",status="499"} 20.0' in metrics


async def test_an_idle_session_cannot_hold_the_memory_budget():
    """A caller that opens a session holding the whole budget and goes quiet loses it after
    `session_idle_timeout_s`: the run waiting for that memory then runs, and the session is gone (404)."""
    server = SandboxServer({"name": "sandbox", "memory_budget_mb": BUDGET_MB, "default_memory_mb": 64,
                            "session_idle_timeout_s": 1.0})
    with serve(server.create_app()) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            created = await client.post("/sessions", json={"memory_mb": BUDGET_MB})
            assert created.status_code == 200, created.text
            waiting = asyncio.create_task(client.post("/run", json={"code": "print('ran')", "memory_mb": 64}))
            answer = await waiting
            assert answer.status_code == 200 and answer.json()["stdout"] == "ran\n", answer.text
            gone = await client.post(f"/sessions/{created.json()['session_id']}/exec", json={"code": "1"})
            assert gone.status_code == 404, gone.text
            metrics = (await client.get("/metrics")).text
    assert 'reason="admission_timeout"' not in metrics
