"""`gymfleet.sandbox_client` against a real sandbox server: results, batches, sessions, overload retries, and
every way the sandbox itself can fail becoming `SandboxError`."""

from __future__ import annotations

import asyncio
import time

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from gymfleet import http
from gymfleet.errors import SandboxError
from gymfleet.sandbox_client import RunResult, SandboxClient
from gymfleet.testing import free_port, serve
from sandbox.app import SandboxServer


def _fleet_config(url: str) -> dict:
    host, port = url.removeprefix("http://").split(":")
    return {"sandbox": {"sandbox_servers": {"sandbox": {"host": host, "port": int(port)}}}}


async def test_run_by_instance_name(sandbox_url):
    client = SandboxClient("sandbox", config=http.ServerClient(_fleet_config(sandbox_url)))
    result = await client.run("print(input()[::-1])", "python", stdin="abc", timeout_s=5, memory_mb=256)
    assert result == RunResult("ok", "cba\n", "", 0, result.duration_s, False, None)
    failed = await client.run("exit 3", "bash", timeout_s=5, memory_mb=256)
    assert (failed.status, failed.return_code, failed.ok) == ("failed", 3, False)


async def test_run_batch_and_files(sandbox_url):
    client = SandboxClient(url=sandbox_url)
    results = await client.run_batch("import sys, lib\nprint(lib.f(int(sys.argv[1])))",
                                     [{"args": ["1"]}, {"args": ["x"]}, {"args": ["3"]}],
                                     files={"lib.py": "def f(n): return n * 10"}, stop_on_failure=True)
    assert [r.status for r in results] == ["ok", "failed"] and results[0].stdout == "10\n"


async def test_overload_is_retried_honouring_retry_after():
    server = SandboxServer({"name": "sandbox", "max_concurrent_runs": 1, "queue_length": 0})
    with serve(server.create_app()) as url:
        client = SandboxClient(url=url)
        started = time.monotonic()
        slow, fast = await asyncio.gather(client.run("import time; time.sleep(0.5)"), client.run("print('queued')"))
        assert (slow.status, fast.stdout) == ("ok", "queued\n")
        assert time.monotonic() - started >= 1.0  # the refused call waited Retry-After (1 s) before retrying
        impatient = SandboxClient(url=url, retry=http.RetryPolicy(max_attempts=2, max_backoff_s=0.1))
        await asyncio.sleep(0.5)  # the last sandbox's teardown, which holds the only slot, is over
        busy, refused = await asyncio.gather(client.run("import time; time.sleep(2)"),
                                             _after(0.3, impatient.run("print(1)")), return_exceptions=True)
        assert busy.status == "ok" and isinstance(refused, SandboxError) and "HTTP 429" in str(refused)


async def _after(delay_s: float, call):
    await asyncio.sleep(delay_s)
    return await call


async def test_an_unreachable_sandbox_is_a_sandbox_error():
    with pytest.raises(SandboxError, match="sandbox call failed"):
        await SandboxClient(url=f"http://127.0.0.1:{free_port()}", retry=http.RetryPolicy(max_attempts=2)).run("1")


async def test_an_unknown_instance_is_a_sandbox_error():
    with pytest.raises(SandboxError, match="unknown server 'sandbox'"):
        await SandboxClient("sandbox", config={"other": {}}).run("print(1)")


@pytest.mark.parametrize(("status", "body", "match"), [
    (500, {"detail": "boom"}, "HTTP 500"),
    (200, {"status": "exploded", "stdout": ""}, "malformed run result"),
    (200, ["not", "a", "result"], "malformed run result"),
], ids=["5xx", "unknown-status", "not-an-object"])
async def test_a_broken_sandbox_answer_is_a_sandbox_error(status, body, match):
    app = FastAPI()

    @app.post("/run")
    async def run():
        return JSONResponse(body, status_code=status)

    with serve(app) as url:
        with pytest.raises(SandboxError, match=match):
            await SandboxClient(url=url, retry=http.NO_RETRY).run("print(1)")
