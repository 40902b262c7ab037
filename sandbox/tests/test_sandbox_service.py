"""The service around the runs: overload answers, start-up checks, `isolation: none`, `python -m sandbox`."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gymfleet.errors import ConfigError
from gymfleet.fleet.config_checks import validate_fields
from gymfleet.testing import free_port, serve
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


async def test_start_up_fails_clearly_when_bwrap_cannot_sandbox():
    with tempfile.TemporaryDirectory() as folder:  # not pytest's tmp_path: the sandbox uid must reach the file
        fake = Path(folder) / "bwrap"
        fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
        fake.chmod(0o755)
        Path(folder).chmod(0o755)
        server = SandboxServer({"name": "sandbox", "bwrap": str(fake)})
        with pytest.raises(ConfigError, match="exited before it was ready: bwrap: No permissions"):
            await server.startup()


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
