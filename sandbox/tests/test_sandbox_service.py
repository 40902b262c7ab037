"""The service around the runs: overload answers, start-up checks, `isolation: none`, `python -m sandbox`."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from gymfleet.errors import ConfigError
from gymfleet.fleet.config_checks import validate_fields
from gymfleet.testing import free_port, serve
from sandbox.__main__ import main as sandbox_main
from sandbox.app import SandboxConfig, SandboxServer
from sandbox.tests.conftest import assert_no_leftovers

REPO = Path(__file__).resolve().parents[2]


async def test_overload_is_a_429_with_retry_after_not_a_hang():
    server = SandboxServer({"name": "sandbox", "max_concurrent_runs": 1, "queue_length": 1})
    with serve(server.create_app()) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            body = {"code": "import time; time.sleep(1)"}
            answers = await asyncio.gather(*(client.post("/run", json=body) for _ in range(4)))
            metrics = (await client.get("/metrics")).text
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [200, 200, 429, 429], codes
    refused = next(answer for answer in answers if answer.status_code == 429)
    assert int(refused.headers["Retry-After"]) >= 1 and refused.json()["error_type"] == "overloaded"
    assert 'gymfleet_sandbox_rejected_total{reason="queue_full"} 2.0' in metrics


async def test_start_up_fails_clearly_without_bubblewrap():
    server = SandboxServer({"name": "sandbox", "bwrap": "/nonexistent/bwrap"})
    with pytest.raises(ConfigError, match="bubblewrap") as raised:
        await server.startup()
    assert "isolation: none" in str(raised.value)


def _fake_bwrap(folder: str) -> str:
    """A `bwrap` that cannot sandbox (as on a host without unprivileged user namespaces)."""
    fake = Path(folder) / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    Path(folder).chmod(0o755)
    return str(fake)


# Every route that runs, opens or touches a sandbox, with a body it accepts: each must wait for the warm-up, and be
# refused with its error when it failed. `test_every_sandbox_route_is_listed` keeps the list whole.
GATED_ROUTES = {
    ("POST", "/run"): {"code": "print(1)"},
    ("POST", "/run_batch"): {"code": "print(1)", "cases": [{"stdin": ""}]},
    ("POST", "/sessions"): {},
    ("POST", "/sessions/{session_id}/exec"): {"code": "print(1)"},
    ("DELETE", "/sessions/{session_id}"): None,
    ("GET", "/info"): None,
}


def test_every_sandbox_route_is_listed():
    app = SandboxServer({"name": "sandbox", "isolation": "none"}).create_app()
    base = {"/", "/metrics", "/docs", "/openapi.json", "/docs/oauth2-redirect"}
    routes = {(method, route.path) for route in app.routes if route.path not in base
              for method in getattr(route, "methods", None) or () if method != "HEAD"}
    assert routes == set(GATED_ROUTES), routes ^ set(GATED_ROUTES)


def test_a_failed_isolation_check_refuses_every_request_with_its_error():
    """The server answers `GET /` at once; the check runs after, and when it fails every request that needs a
    sandbox (each route, and again on a second try) is refused with the check's error and how to fix it."""
    with tempfile.TemporaryDirectory() as folder:  # not pytest's tmp_path: the sandbox uid must reach the file
        server = SandboxServer({"name": "sandbox", "bwrap": _fake_bwrap(folder)})
        with serve(server.create_app()) as url, httpx.Client(base_url=url, timeout=60) as client:
            assert client.get("/").json() == {"status": "ok"}
            for _ in range(2):
                for (method, path), body in GATED_ROUTES.items():
                    answer = client.request(method, path.replace("{session_id}", "abc"), json=body)
                    assert answer.status_code == 500, (method, path, answer.text)
                    error = answer.json()
                    assert error["error_type"] == "isolation_failed", error
                    assert "exited before it was ready: bwrap: No permissions" in error["detail"], error
                    assert "isolation: none" in error["detail"], error  # how to fix it
            metrics = client.get("/metrics").text
            state, detail = server.readiness()  # what a fleet's probe is told (`GET /` with the fleet's token)
        assert state == "failed" and "bwrap: No permissions" in detail and "isolation: none" in detail, detail
        assert 'gymfleet_failures_total{failure_class="isolation_failed"' in metrics
    assert_no_leftovers()  # what the failed check started is gone


def test_ng_run_stops_with_the_error_and_its_fix_when_the_sandbox_cannot_isolate():
    """A fleet's readiness waits for the sandbox's self-test verdict: `ng_run` with a sandbox whose bwrap cannot make
    namespaces stops with the check's error and how to fix it (exit 2, never "servers ready"), the other servers
    having started beside it, and leaves no server running."""
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryFile("w+") as errors:
        command = [sys.executable, "-m", "gymfleet.cli.run",
                   "+config_paths=[configs/quickstart.yaml,sandbox/configs/sandbox.yaml]",
                   f"+head_server.port={free_port()}", f"+sandbox.sandbox_servers.sandbox.bwrap={_fake_bwrap(folder)}"]
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=errors, text=True,
                                   start_new_session=True)
        try:
            said = []
            for line in process.stdout:  # until ng_run exits, or says it is ready (the failure this test is for)
                said.append(line)
                if "servers ready!" in line:
                    break
            code = process.wait(60) if "servers ready!" not in line else None
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGINT)
                process.wait(60)
            process.stdout.close()
        errors.seek(0)
        done = subprocess.CompletedProcess(command, code, "".join(said), errors.read())
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stderr.splitlines()
    first = next(index for index, line in enumerate(lines) if line.startswith("error: "))
    assert lines[first].startswith("error: server 'sandbox' failed its start-up check: sandbox isolation (bwrap) "
                                   "does not work here: "), lines[first]
    assert "bwrap: No permissions to create new namespace" in lines[first], lines[first]
    assert "set `isolation: none`" in lines[first + 1] and "apt-get install bubblewrap" in lines[first + 1]
    assert "servers ready" not in done.stdout + done.stderr
    started = {name: int(pid) for name, pid in re.findall(r"^started (\S+) .* pid (\d+),", done.stdout, re.M)}
    assert set(started) == {"policy_model", "mcqa", "mcqa_simple_agent", "scripted_llm", "sandbox"}, started
    deadline = time.monotonic() + 30
    while (alive := [name for name, pid in started.items() if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, f"left running after ng_run stopped: {alive}"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_requests_during_the_warm_up_wait_for_it_within_the_queue():
    """While the isolation check is held, `GET /` answers, requests up to the service's capacity (run slots + queue)
    wait and are then served in full, and the rest are refused at once with a 429 (never a hang, never a run in a
    half-prepared sandbox)."""
    release = threading.Event()

    class Held(SandboxServer):
        async def _check_isolation(self) -> None:
            await asyncio.to_thread(release.wait, 120)
            await super()._check_isolation()

    server = Held({"name": "sandbox", "max_concurrent_runs": 1, "queue_length": 1})
    try:
        with serve(server.create_app()) as url:
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                assert (await client.get("/")).status_code == 200
                posts = [asyncio.ensure_future(client.post("/run", json={"code": "print(6 * 7)"})) for _ in range(4)]
                done: set[asyncio.Future] = set()
                while len(done) < 2:
                    finished, _ = await asyncio.wait(posts, timeout=60, return_when=asyncio.FIRST_COMPLETED)
                    assert finished, "no request was refused while the sandbox was held starting"
                    done = {post for post in posts if post.done()}
                assert len(done) == 2 and all(post.result().status_code == 429 for post in done)
                assert not server._warming.done()  # the other two still wait for the warm-up
                release.set()
                answers = [await post for post in posts if post not in done]
        assert [answer.json()["stdout"] for answer in answers] == ["42\n", "42\n"], [a.text for a in answers]
    finally:
        release.set()


def test_python_dash_m_sandbox_check_fails_clearly(tmp_path, capsys):
    with tempfile.TemporaryDirectory() as folder:
        (tmp_path / "fake.yaml").write_text(f"bwrap: {_fake_bwrap(folder)}\n")
        with pytest.raises(SystemExit) as exited:
            sandbox_main(["--check", "--config", str(tmp_path / "fake.yaml")])  # what `python -m sandbox` runs
    assert "bwrap: No permissions" in str(exited.value.code) and "isolation: none" in str(exited.value.code)
    assert "isolation works" not in capsys.readouterr().out


def test_isolation_none_runs_but_says_so(caplog):
    server = SandboxServer({"name": "sandbox", "isolation": "none"})
    with caplog.at_level(logging.WARNING), serve(server.create_app()) as url:
        result = httpx.post(f"{url}/run", json={"code": "import os; print(os.getcwd())"}, timeout=60).json()
        info = httpx.get(f"{url}/info").json()
    assert result["status"] == "ok" and result["stdout"].startswith("/tmp/gymfleet-run-")
    assert info["isolation"] == "none"
    assert any("ISOLATION IS DISABLED" in record.message for record in caplog.records)


def test_the_fleet_config_block_is_valid():
    block = yaml.safe_load((REPO / "sandbox/configs/sandbox.yaml").read_text())["sandbox"]
    (server_type, impls), = block.items()
    (impl, fields), = impls.items()
    path = f"sandbox.{server_type}.{impl}"
    config = validate_fields(SandboxConfig, {**fields, "name": "sandbox"}, path)
    assert (REPO / impl / config.entrypoint).is_file() and config.isolation == "bwrap"
    code_gen = yaml.safe_load((REPO / "resources_servers/code_gen/configs/code_gen.yaml").read_text())
    assert code_gen["code_gen"]["resources_servers"]["code_gen"]["sandbox"] == {"type": server_type, "name": "sandbox"}


def test_python_dash_m_sandbox_serves_and_checks(tmp_path):
    check = subprocess.run([sys.executable, "-m", "sandbox", "--check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and "isolation works" in check.stdout, check.stderr
    (tmp_path / "typo.yaml").write_text("isolaton: none\n")
    typo = subprocess.run([sys.executable, "-m", "sandbox", "--check", "--config", str(tmp_path / "typo.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert typo.returncode != 0 and "Did you mean 'isolation'?" in typo.stderr, typo.stderr
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "sandbox", "--port", str(port)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.post(f"http://127.0.0.1:{port}/run", json={"code": "print(6 * 7)"}, timeout=30)
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, "python -m sandbox did not start"
                time.sleep(0.2)
        assert answer.json()["stdout"] == "42\n"
    finally:
        process.terminate()
        process.wait(30)
        process.stderr.close()
    assert_no_leftovers()
