"""1024 concurrent verifications through the real code_gen server and a real sandbox server (its own process):
every one is queued and answered, none fails, and no sandbox process outlives them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gymfleet import http
from gymfleet.testing import free_port, make_response, serve
from resources_servers.code_gen.app import CodeGenServer
from resources_servers.code_gen.tests.conftest import fenced
from sandbox.tests.conftest import assert_no_leftovers

ROW = json.loads((Path(__file__).resolve().parents[1] / "data/example.jsonl").read_text().splitlines()[0])
CONCURRENCY = 1024


@pytest.fixture
def sandbox_process_url():
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "sandbox", "--port", str(port), "--queue-length", "4096"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _answers(url):
            assert process.poll() is None and time.monotonic() < deadline, "the sandbox server did not start"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/", timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.slow
async def test_1024_concurrent_verifications_are_queued_not_failed(sandbox_process_url):
    tests = ROW["verifier_metadata"]["unit_tests"]
    row = {**ROW, "verifier_metadata": {"unit_tests": {**tests, "inputs": tests["inputs"][:1],
                                                       "outputs": tests["outputs"][:1]}}}
    body = {**row, "response": make_response(fenced("print(5)"))}
    server = CodeGenServer({"name": "code_gen", "domain": "coding", "sandbox_url": sandbox_process_url})
    with serve(server.create_app()) as url:
        answers = await asyncio.gather(
            *(http.request("POST", f"{url}/verify", json=body, timeout_s=600) for _ in range(CONCURRENCY))
        )
    results = [answer.json() for answer in answers]
    assert [answer.status for answer in answers] == [200] * CONCURRENCY
    failures = [result for result in results if "_ng_failure_class" in result or result["reward"] != 1.0]
    assert not failures, failures[:3]
    assert_no_leftovers()
