"""`gymfleet.grading.sandbox_client` against a real sandbox server: results, batches, sessions, overload retries, and
every way the sandbox itself can fail becoming `SandboxError`."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from gymfleet import http
from gymfleet.errors import SandboxError
from gymfleet.grading.sandbox_client import RunResult, SandboxClient, tar_directory
from gymfleet.testing import free_port, serve, wait_until_async
from sandbox.app import SandboxServer


def _fleet_config(url: str) -> dict:
    host, port = url.removeprefix("http://").split(":")
    return {"sandbox": {"sandbox_servers": {"sandbox": {"host": host, "port": int(port)}}}}


async def test_run_by_instance_name(sandbox_url):
    client = SandboxClient("sandbox", config=http.ServerClient(_fleet_config(sandbox_url)))
    result = await client.run("print(input()[::-1])", "python", stdin="abc", timeout_s=5, memory_mb=256)
    assert result == RunResult(status="ok", stdout="cba\n", stderr="", return_code=0, duration_s=result.duration_s)
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
        busy = asyncio.create_task(client.run("import time; time.sleep(1)"))
        await _until(url, 'gymfleet_sandbox_running 1.0')
        queued = await client.run("print('queued')")  # refused while the slot is taken, retried until it is free
        assert (await busy).status == "ok" and queued.stdout == "queued\n"
        assert 'gymfleet_sandbox_rejected_total{reason="queue_full"}' in await _metrics(url)
        await _until(url, 'gymfleet_sandbox_running 0.0')  # the teardown that held the slot is over
        impatient = SandboxClient(url=url, retry=http.RetryPolicy(max_attempts=2, max_backoff_s=0.1))
        busy = asyncio.create_task(client.run("import time; time.sleep(3)"))
        await _until(url, 'gymfleet_sandbox_running 1.0')
        with pytest.raises(SandboxError, match="HTTP 429"):
            await impatient.run("print(1)")
        assert (await busy).status == "ok"


async def _metrics(url: str) -> str:
    return (await http.request("GET", f"{url}/metrics", timeout_s=10)).text


async def _until(url: str, line: str) -> None:
    """Wait until the sandbox's metrics show `line` (its state, not a duration, says when to go on)."""

    async def shown() -> bool:
        return line in (await _metrics(url)).splitlines()

    await wait_until_async(shown, f"the sandbox's /metrics shows {line!r}", interval_s=0.02)


async def test_runs_and_sessions_start_from_a_repository_snapshot(sandbox_url, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("def answer():\n    return 42\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    snapshot = tar_directory(tmp_path)
    client = SandboxClient(url=sandbox_url)
    result = await client.run("import pkg, os\nprint(pkg.answer(), sorted(os.listdir('.')))", archive=snapshot)
    assert result.stdout == "42 ['main.py', 'pkg']\n", result
    async with await client.session(archive=snapshot, files={"extra.txt": "x"}) as session:
        assert (await session.exec("ls", "bash")).stdout.split() == ["extra.txt", "pkg"]
        assert (await session.exec("import pkg\npkg.answer()")).stdout == "42\n"
    results = await client.run_batch("import pkg\nprint(pkg.answer() + int(input()))", [{"stdin": "1"}],
                                     archive=snapshot)
    assert results[0].stdout == "43\n"


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
