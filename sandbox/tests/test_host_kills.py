"""A sandbox killed from outside (the host's OOM killer, an operator) is an infrastructure failure, `sandbox_failed`:
never the program's fault, and code_gen gives no reward for it. The program cannot reach the outer bwrap process,
so a signal death of it is never the program's doing."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from gymfleet.testing import make_response
from gymfleet.testing.fleets import served
from resources_servers.code_gen.app import CodeGenServer
from sandbox.tests.conftest import assert_no_leftovers

ROOT = Path(__file__).resolve().parents[2]
CODE_GEN_ROW = json.loads((ROOT / "resources_servers/code_gen/data/example.jsonl").read_text().splitlines()[0])


def kill_outer_sandbox(marker: str, signum: int) -> None:
    """Send `signum` to the outer process (bwrap, a child of this test's in-process server) of the sandbox running
    `sleep <marker>`, as the host would; waits for that sandbox to appear."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for outer in psutil.Process().children():
            try:
                if any(p.cmdline() == ["sleep", marker] for p in outer.children(recursive=True)):
                    outer.send_signal(signum)
                    return
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.05)
    raise AssertionError(f"no sandbox running `sleep {marker}` appeared")


def post_while_killing(url: str, path: str, body: dict, marker: str, signum: int) -> httpx.Response:
    """POST `body` to `url + path` and kill its sandbox from outside while it runs."""
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(httpx.post, url + path, json=body, timeout=120)
        kill_outer_sandbox(marker, signum)
        return answer.result()


PROGRAMS = {  # each starts `sleep <marker>` (to be found by) and then sleeps itself
    "python-run": ("/run", {"code": "import subprocess, time\nsubprocess.Popen(['sleep', '3601'])\ntime.sleep(3600)"}),
    "bash-run": ("/run", {"code": "sleep 3602 & wait", "language": "bash"}),
    "batch": ("/run_batch", {"code": "import subprocess, time\nsubprocess.Popen(['sleep', '3603'])\ntime.sleep(3600)",
                             "cases": [{}, {}]}),
}


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("name", PROGRAMS)
def test_a_sandbox_killed_from_outside_is_an_infrastructure_failure(sandbox_url, name, signum):
    path, body = PROGRAMS[name]
    marker = {"python-run": "3601", "bash-run": "3602", "batch": "3603"}[name]
    answer = post_while_killing(sandbox_url, path, {**body, "timeout_s": 30}, marker, signum)
    assert answer.status_code == 200, answer.text
    result = answer.json()["results"][0] if path == "/run_batch" else answer.json()
    assert result["status"] == "sandbox_failed", result
    assert signal.Signals(signum).name in result["message"] and "outside" in result["message"], result
    assert_no_leftovers()


def test_a_session_killed_from_outside_is_an_infrastructure_failure(sandbox_url):
    session = httpx.post(f"{sandbox_url}/sessions", json={"timeout_s": 30}, timeout=60).json()["session_id"]
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '3604'])\ntime.sleep(3600)"
    answer = post_while_killing(sandbox_url, f"/sessions/{session}/exec", {"code": code}, "3604", signal.SIGKILL)
    assert answer.json()["status"] == "sandbox_failed", answer.text
    assert httpx.post(f"{sandbox_url}/sessions/{session}/exec", json={"code": "1"}).status_code == 404
    assert_no_leftovers()


def test_the_sandbox_limits_still_say_timeout_and_oom(sandbox_url):
    # The service's own kills (the wall-clock limit, the memory watch) are never taken for the host's.
    slow = httpx.post(f"{sandbox_url}/run", json={"code": "import time\ntime.sleep(60)", "timeout_s": 1}, timeout=60)
    assert slow.json()["status"] == "timeout", slow.text
    hog = "import os, time\nos.fork()\nx = bytearray(100 << 20)\ntime.sleep(60)"
    big = httpx.post(f"{sandbox_url}/run", json={"code": hog, "timeout_s": 5, "memory_mb": 128}, timeout=60)
    assert big.json()["status"] == "oom", big.text


@pytest.fixture(scope="module")
def code_gen_url(sandbox_url):
    with served(CodeGenServer({"name": "code_gen", "domain": "coding", "sandbox_url": sandbox_url,
                               "unit_test_timeout_secs": 30, "memory_mb": 512})) as url:
        yield url


def test_code_gen_gives_no_reward_for_a_sandbox_killed_from_outside(code_gen_url):
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '3605'])\ntime.sleep(3600)"
    body = {**CODE_GEN_ROW, "response": make_response(f"Here it is.\n\n```python\n{code}\n```\n")}
    answer = post_while_killing(code_gen_url, "/verify", body, "3605", signal.SIGKILL)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result.get("_ng_failure_class") == "sandbox_failed" and "outside" in result["failure"], result
    assert_no_leftovers()
